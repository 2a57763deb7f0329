"""The DSL's mLSTM layer (part of ``frontends.dsl.Layer``): transformers' ``xLSTMLayer`` over the
mLSTM recurrence ``mlstm`` (``irc.ops.mlstm``).

    y = layer.mlstm_block(layer.rms_norm(x, "attn_norm"), heads=8, qk_dim=2048, v_dim=4096)

Returns the layer's output (the pre-norm and the residual are the caller's): q, k, v, the
output gate o = linear(x) without biases; the input and forget gate pre-activations
linear(x) + b, one per head, soft-capped (cap · tanh(g / cap), ``gate_soft_cap``; None: no
cap); the recurrence; a per-head LayerNorm without its own weight (over each head's dv
values, in float32) times the ``mlstm.norm`` weight [v_dim]; sigmoid(o) times that ->
``mlstm.out``. The state is three graph inputs per layer, named like the cache:
``past_key_values.{i}.recurrent_state`` [B, H, dk, dv] (the matrix memory C),
``.normalizer_state`` [B, H, dk] (n) and ``.max_state`` [B, H, 1] (m), returned as
``present.{i}.*``. Weights (``layers.{i}.mlstm.*``, checkpoint shapes): ``wq``, ``wk``
[qk_dim, d], ``wv``, ``wo_gate`` [v_dim, d], ``igate``, ``fgate`` [H, d] with ``igate_bias``,
``fgate_bias`` [H], ``norm`` [v_dim], ``out`` [d, v_dim]; under ``bias`` also ``wq_bias``,
``wk_bias``, ``wv_bias``, ``wo_gate_bias``, ``norm_bias`` and ``out_bias``. ``xlstm_ffn`` and
``biased_rms_norm`` are the block's FFN and norms, with ``use_bias``'s biases when asked.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import positive, positive_float

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


class MlstmLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` (``layers.{i}.``) and ``index``."""

    model: Model
    prefix: str
    index: int

    def _mlstm_linear(self, x: Tensor, name: str, rows: int, bias: bool = False) -> Tensor:
        m, p = self.model, self.prefix
        weight = m.param(f"{p}mlstm.{name}", (rows, m._features(x)))
        b = m.param(f"{p}mlstm.{name}_bias", (rows,)) if bias else None
        return m.emit("linear", [x, weight, b], None, f"{p}mlstm_{name}")[0]

    def _mlstm_gate(self, x: Tensor, name: str, heads: int, cap: Optional[float]) -> Tensor:
        gate = self._mlstm_linear(x, name, heads, bias=True)
        if cap is None:
            return gate
        return self.model.emit("softcap", [gate], {"cap": cap}, f"{self.prefix}{name}_capped")[0]

    def _mlstm_head_norm(self, h: Tensor, heads: int, v_dim: int, eps: float) -> Tensor:
        """transformers' ``xLSTMMultiHeadLayerNorm``: per head (x - mean) · rsqrt(var + eps) in
        float32, then the [v_dim] weight."""
        m, p = self.model, self.prefix
        per_head = m.emit("reshape", [h], {"shape": ["B", "T", heads, v_dim // heads]}, f"{p}mlstm_heads")[0]
        normed = m.plain_layer_norm(per_head, f"{p}mlstm_head_norm", eps)
        flat = m.emit("reshape", [normed], {"shape": ["B", "T", v_dim]}, f"{p}mlstm_head_norm_flat")[0]
        return m.emit("mul", [flat, m.param(f"{p}mlstm.norm", (v_dim,))], None, f"{p}mlstm_normed")[0]

    def mlstm_block(self, x: Tensor, heads: int, qk_dim: int, v_dim: int, gate_soft_cap: Optional[float] = 15.0,
                    eps: float = 1e-6, norm_eps: float = 1e-6, bias: bool = False) -> Tensor:
        """xLSTM's mLSTM layer (see the module docstring): ``eps`` the recurrence's, ``norm_eps``
        the per-head LayerNorm's; qk_dim and v_dim must divide into ``heads``; ``bias``: the
        projections and the per-head norm have biases (``use_bias``)."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d = m._features(x)
        heads, qk_dim, v_dim = (positive(n, v, where) for n, v in (("heads", heads), ("qk_dim", qk_dim),
                                                                     ("v_dim", v_dim)))
        cap = positive_float("gate_soft_cap", gate_soft_cap, where)
        norm_eps = positive_float("norm_eps", norm_eps, where)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
            raise m.error("eps", f"expected a number >= 0, got {eps!r}")
        for name, width in (("qk_dim", qk_dim), ("v_dim", v_dim)):
            if width % heads:
                raise m.error(name, f"{width} is not a multiple of heads {heads}")
        if not isinstance(bias, bool):
            raise m.error("bias", f"expected true or false, got {bias!r}")
        q, k = self._mlstm_linear(x, "wq", qk_dim, bias), self._mlstm_linear(x, "wk", qk_dim, bias)
        v, o = self._mlstm_linear(x, "wv", v_dim, bias), self._mlstm_linear(x, "wo_gate", v_dim, bias)
        igate, fgate = (self._mlstm_gate(x, name, heads, cap) for name in ("igate", "fgate"))
        dk, dv = qk_dim // heads, v_dim // heads
        kinds = (("recurrent_state", (heads, dk, dv)), ("normalizer_state", (heads, dk)), ("max_state", (heads, 1)))
        pasts = [m._state(i, kind, shape) for kind, shape in kinds]
        hidden, *presents = m.emit("mlstm", [q, k, v, igate, fgate, *pasts], {"heads": heads, "eps": float(eps)},
                                   [f"{p}mlstm"] + [f"present.{i}.{kind}" for kind, _ in kinds])
        m._presents.extend(present.value for present in presents)
        m._kinds.setdefault(i, []).append("mlstm")
        if m.meta.get("ssm") is None:
            m.meta["ssm"] = {"kind": "mlstm", "heads": heads, "qk_head_dim": dk, "v_head_dim": dv}
        normed = self._mlstm_head_norm(hidden, heads, v_dim, norm_eps)
        if bias:
            normed = m.emit("add", [normed, m.param(f"{p}mlstm.norm_bias", (v_dim,))], None, f"{p}mlstm_normed_bias")[0]
        gate = m.emit("sigmoid", [o], None, f"{p}mlstm_out_gate")[0]
        gated = m.emit("mul", [gate, normed], None, f"{p}mlstm_gated")[0]
        return self._mlstm_linear(gated, "out", d, bias)

    def xlstm_ffn(self, x: Tensor, d_ff: int, bias: bool = False) -> Tensor:
        """transformers' ``xLSTMFeedForward``: down(silu(gate(x)) · up(x)), the ``swiglu`` op
        (``mlp.w_gate`` / ``w_up`` [d_ff, d], ``mlp.w_down`` [d, d_ff]); with ``bias`` each
        projection adds ``mlp.b_gate`` / ``b_up`` [d_ff] / ``b_down`` [d], as primitives."""
        m, p = self.model, self.prefix
        if not bias:
            return self.swiglu(x, d_ff)
        d, d_ff = m._features(x), positive("d_ff", d_ff, m.origin())
        self._note_mlp("swiglu", d_ff)

        def linear(t: Tensor, name: str, rows: int) -> Tensor:
            weight, b = m.param(f"{p}mlp.w_{name}", (rows, m._features(t))), m.param(f"{p}mlp.b_{name}", (rows,))
            return m.emit("linear", [t, weight, b], None, f"{p}mlp_{name}")[0]

        gate = m.emit("silu", [linear(x, "gate", d_ff)], None, f"{p}mlp_act")[0]
        hidden = m.emit("mul", [gate, linear(x, "up", d_ff)], None, f"{p}mlp_hidden")[0]
        return linear(hidden, "down", d)

    def biased_rms_norm(self, x: Tensor, name: str, eps: float, bias: bool) -> Tensor:
        """``rms_norm`` (weight ``{name}``), plus ``{name}.bias`` [d] with ``bias`` (xLSTM's
        ``xLSTMRMSNorm`` under ``use_bias``)."""
        out = self.rms_norm(x, name, eps)
        if not bias:
            return out
        m = self.model
        b = m.param(f"{self.prefix}{name}.bias", (m._features(x),))
        return m.emit("add", [out, b], None, f"{self.prefix}{name}_biased")[0]
