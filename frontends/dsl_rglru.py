"""The DSL's Griffin recurrent block (part of ``frontends.dsl.Layer``): transformers'
``RecurrentGemmaRecurrentBlock`` over ``causal_conv1d`` (``irc.ops.ssm``) and the RG-LRU
recurrence ``rg_lru`` (``irc.ops.rglru``).

    y = layer.rglru_block(layer.rms_norm(x, "attn_norm", offset=1.0), lru_width=32, heads=4)

Returns the block's output (norms and the residual are the caller's):
gelu_tanh(linear_y(x)) · RG-LRU(conv1d(linear_x(x))) -> ``linear_out``. The RG-LRU's gates
are block-diagonal projections (one [w, w] matrix per head, w = W / heads, as transformers'
``baddbmm`` computes x_h @ W_h + b_h) written as a batched ``matmul`` then sigmoid; a token at
position 0 resets the recurrence (``position_ids``). The states are graph inputs named like
the cache: ``past_key_values.{i}.conv_state`` [B, W, K-1] and ``.recurrent_state`` [B, W],
returned as ``present.{i}.*``. Weights (``layers.{i}.rglru.*``, checkpoint shapes):
``linear_x``, ``linear_y`` [W, d] with ``*_bias`` [W]; ``linear_out`` [d, W] with
``linear_out_bias`` [d]; ``conv`` [W, 1, K], ``conv_bias`` [W]; ``a_param`` [W];
``input_gate``, ``recurrence_gate`` [H, w, w] with ``*_bias`` [H, w].
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import one_of, positive

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


class RglruLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` (``layers.{i}.``) and ``index``."""

    model: Model
    prefix: str
    index: int

    def _rglru_linear(self, x: Tensor, name: str, rows: int) -> Tensor:
        m, p = self.model, self.prefix
        weight = m.param(f"{p}rglru.{name}", (rows, m._features(x)))
        bias = m.param(f"{p}rglru.{name}_bias", (rows,))
        return m.emit("linear", [x, weight, bias], None, f"{p}rglru_{name}")[0]

    def _rglru_gate(self, x: Tensor, name: str, heads: int) -> Tensor:
        """sigmoid(x_h @ W_h + b_h) per head h: the block-diagonal gate projection."""
        m, p = self.model, self.prefix
        width = m._features(x)
        block = width // heads
        weight = m.param(f"{p}rglru.{name}", (heads, block, block))
        bias = m.param(f"{p}rglru.{name}_bias", (heads, block))
        blocks = m.emit("reshape", [x], {"shape": ["B", "T", heads, 1, block]}, f"{p}{name}_blocks")[0]
        if weight.dtype != x.dtype:  # a bf16 / f16 checkpoint: the matmul takes the activations' type
            weight = m.emit("cast", [weight], {"to": str(x.dtype)}, f"{p}{name}_weight")[0]
        product = m.emit("matmul", [blocks, weight], None, f"{p}{name}_product")[0]
        flat = m.emit("reshape", [product], {"shape": ["B", "T", width]}, f"{p}{name}_flat")[0]
        row = m.emit("reshape", [bias], {"shape": [width]}, f"{p}{name}_bias_row")[0]
        if bias.dtype != x.dtype:
            row = m.emit("cast", [row], {"to": str(x.dtype)}, f"{p}{name}_bias_cast")[0]
        biased = m.emit("add", [row, flat], None, f"{p}{name}_biased")[0]
        return m.emit("sigmoid", [biased], None, f"{p}{name}")[0]

    def rglru_block(self, x: Tensor, lru_width: Optional[int] = None, heads: int = 1, conv_width: int = 4,
                    approximate: str = "tanh") -> Tensor:
        """Griffin's recurrent block (see the module docstring); ``lru_width`` W defaults to
        d and must divide into ``heads`` blocks; ``approximate``: the y branch's GELU."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d = m._features(x)
        width = positive("lru_width", d if lru_width is None else lru_width, where)
        heads, kernel = positive("heads", heads, where), positive("conv_width", conv_width, where)
        one_of("approximate", approximate, ("tanh", "none"), where)
        if width % heads:
            raise m.error("heads", f"lru_width {width} is not a multiple of heads {heads}")
        branch_y = m.emit("gelu", [self._rglru_linear(x, "linear_y", width)], {"approximate": approximate},
                          f"{p}rglru_y")[0]
        branch_x = self._rglru_linear(x, "linear_x", width)
        weight = m.param(f"{p}rglru.conv", (width, 1, kernel))
        bias = m.param(f"{p}rglru.conv_bias", (width,))
        past = m._state(i, "conv_state", (width, kernel - 1))
        conv, present = m.emit("causal_conv1d", [branch_x, weight, bias, past, None], {"activation": None},
                               [f"{p}rglru_conv", f"present.{i}.conv_state"])
        m._presents.append(present.value)
        input_gate = self._rglru_gate(conv, "input_gate", heads)
        recurrence_gate = self._rglru_gate(conv, "recurrence_gate", heads)
        a_param = m.param(f"{p}rglru.a_param", (width,))
        _, positions = m._context()
        past = m._state(i, "recurrent_state", (width,))
        hidden, present = m.emit("rg_lru", [conv, a_param, input_gate, recurrence_gate, positions, past],
                                 None, [f"{p}rg_lru", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        m._kinds.setdefault(i, []).append("rg_lru")
        if m.meta.get("ssm") is None:
            m.meta["ssm"] = {"kind": "rg_lru", "lru_width": width, "conv_width": kernel}
        gated = m.emit("mul", [hidden, branch_y], None, f"{p}rglru_gated")[0]
        return self._rglru_linear(gated, "linear_out", d)

    def rglru_mlp(self, x: Tensor, d_ff: int, approximate: str = "tanh") -> Tensor:
        """Griffin's MLP: down(gelu(gate(x) + b) · (up(x) + b)) + b (transformers'
        ``RecurrentGemmaMlp``); weights ``mlp.w_gate``, ``mlp.w_up`` [d_ff, d] and ``mlp.w_down``
        [d, d_ff], biases ``mlp.b_gate``, ``mlp.b_up`` [d_ff] and ``mlp.b_down`` [d]."""
        m, p = self.model, self.prefix
        d, d_ff = m._features(x), positive("d_ff", d_ff, m.origin())
        one_of("approximate", approximate, ("tanh", "none"), m.origin())

        def linear(t: Tensor, name: str, rows: int) -> Tensor:
            weight, bias = m.param(f"{p}mlp.w_{name}", (rows, m._features(t))), m.param(f"{p}mlp.b_{name}", (rows,))
            return m.emit("linear", [t, weight, bias], None, f"{p}mlp_{name}")[0]

        gate = m.emit("gelu", [linear(x, "gate", d_ff)], {"approximate": approximate}, f"{p}mlp_act")[0]
        hidden = m.emit("mul", [gate, linear(x, "up", d_ff)], None, f"{p}mlp_hidden")[0]
        if m.meta.get("mlp") is None:
            m.meta["mlp"], m.meta["d_ff"] = "rglru_mlp", d_ff
        return linear(hidden, "down", d)
