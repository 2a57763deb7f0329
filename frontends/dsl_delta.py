"""The DSL's gated DeltaNet mixer (part of ``frontends.dsl.Layer``) and the output gate of
Qwen3-Next's attention, over ``irc.ops.delta.gated_delta_rule``.

    y = layer.gated_delta(h, key_heads=16, value_heads=32, key_dim=128, value_dim=128)
    a = layer.attention(h, heads=16, kv_heads=2, head_dim=256, output_gate=True, ...)

``gated_delta`` returns the mixer's output (after ``ssm.out_proj``); the norm before it and
the residual are the caller's. Its state is the layer's ``past_key_values.{i}.conv_state``
[B, 2·H_k·d_k + H_v·d_v, K-1] and ``.recurrent_state`` [B, H_v, d_k, d_v], returned as
``present.{i}.*``. Weights (``layers.{i}.ssm.*``, checkpoint shapes):

- ``projections="split"`` (Qwen3.5): ``in_proj_qkv`` [2·H_k·d_k + H_v·d_v, d] -> q | k | v,
  ``in_proj_z`` [H_v·d_v, d], ``in_proj_b`` and ``in_proj_a`` [H_v, d];
- ``projections="fused"`` (Qwen3-Next): ``in_proj_qkvz`` [2·H_k·d_k + 2·H_v·d_v, d] and
  ``in_proj_ba`` [2·H_v, d], grouped by key head as the checkpoint stores them (per key
  head q | k | v | z, and b | a, each v, z, b, a part covering the H_v / H_k value heads
  of that key head); the graph views the output as [B, T, H_k, ...], slices the parts and
  flattens them back, as transformers' ``fix_query_key_value_ordering`` does;
- ``conv`` [2·H_k·d_k + H_v·d_v, 1, K] (no bias unless ``conv_bias``) over q | k | v, then
  SiLU; ``A_log``, ``dt_bias`` [H_v]; ``norm`` [d_v], the gated RMS norm
  norm(o)·w·silu(z) per value head (no (1 + w) offset: Qwen's ``RMSNormGated``), its
  weight shared by the heads (expanded in the graph); ``out_proj`` [d, H_v·d_v].

``kimi_delta`` (Kimi-Linear's KimiDeltaAttention) is the same rule with the decay per key
channel (``decay="channel"``), H heads of width d for q, k and v alike. Weights
(``layers.{i}.ssm.*``, checkpoint shapes): ``q_proj``, ``k_proj``, ``v_proj`` [H·d, hidden];
``conv`` [3·H·d, 1, K] over q | k | v (no bias), then SiLU; the forget gate ``f_a_proj``
[d, hidden] -> ``f_b_proj`` [H·d, d] plus ``dt_bias`` [H·d], ``A_log`` [1, 1, H, 1] (viewed as
[H] in the graph); ``b_proj`` [H, hidden] (β = sigmoid, inside the op); the output gate
``g_a_proj`` [d, hidden] -> ``g_b_proj`` [H·d, d]; ``o_norm`` [d], the RMS norm of each
head's d outputs (weight shared by the heads) times sigmoid(gate) (Kimi's
``RMSNormGated``: sigmoid, not SiLU); ``o_proj`` [hidden, H·d]. State: ``conv_state``
[B, 3·H·d, K-1] and ``recurrent_state`` [B, H, d, d]. A padded token changes neither state
(the conv zeroes its input, the op freezes its step; transformers zeroes its hidden state:
the same, as no projection has a bias).

The output gate (``Layer.attention(output_gate=True)``): ``attn.wq`` has 2·H·D rows, per
head its query then its gate (Qwen3-Next's ``q_proj``); the attention's output times
sigmoid(gate) goes into ``attn.wo``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from frontends.dsl_args import one_of, positive, positive_float

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor

PROJECTIONS = ("split", "fused")


def _heads_view(m: Model, t: Tensor, heads: int, width: int, name: str) -> Tensor:
    """``t`` [..., heads·width] viewed as [..., heads, width]."""
    return m.emit("reshape", [t], {"shape": list(tuple(t.shape[:-1]) + (heads, width))}, name)[0]


def _flat(m: Model, t: Tensor, name: str) -> Tensor:
    """``t`` [B, T, h, w] as [B, T, h·w]."""
    lead, tail = tuple(t.shape[:2]), t.shape[2:]
    return m.emit("reshape", [t], {"shape": list(lead + (tail[0] * tail[1],))}, name)[0]


def query_and_gate(layer, q: Tensor, heads: int, head_dim: int) -> tuple:
    """(query, gate), each [B, T, H·D], from a q projection [B, T, H·2D] that holds per
    head its query then its gate."""
    m, p = layer.model, layer.prefix
    pairs = _heads_view(m, q, heads, 2 * head_dim, f"{p}q_and_gate")
    query, gate = layer._split(pairs, [head_dim, head_dim], ["q_heads", "gate_heads"])
    return _flat(m, query, f"{p}q"), _flat(m, gate, f"{p}attn_gate")


def gated_output(layer, out: Tensor, gate: Tensor, name: str = "attn") -> Tensor:
    """The attention's (or mixer's) output times sigmoid(gate); values named ``{name}_gate_sigmoid``
    and ``{name}_gated``."""
    m, p = layer.model, layer.prefix
    sig = m.emit("sigmoid", [gate], None, f"{p}{name}_gate_sigmoid")[0]
    return m.emit("mul", [out, sig], None, f"{p}{name}_gated")[0]


class DeltaLayer:
    """Mixin: needs the layer's ``model``, ``prefix``, ``index`` and ``frontends.dsl_ssm``'s
    ``_linear``, ``_split``, ``_conv`` and ``_note_ssm``."""

    model: Model
    prefix: str
    index: int

    def gated_delta(self, x: Tensor, key_heads: int, value_heads: int, key_dim: int, value_dim: int,
                    conv_kernel: int = 4, projections: str = "split", conv_bias: bool = False,
                    norm_eps: float = 1e-6) -> Tensor:
        """Gated DeltaNet: in-projections -> q | k | v through the causal conv + SiLU ->
        the gated delta rule (decay from a, write strength from b) -> the gated RMS norm
        with z per value head -> out_proj. Value heads are a multiple of key heads."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        for arg, value in (("key_heads", key_heads), ("value_heads", value_heads), ("key_dim", key_dim),
                           ("value_dim", value_dim), ("conv_kernel", conv_kernel)):
            positive(arg, value, where)
        one_of("projections", projections, PROJECTIONS, where)
        norm_eps = positive_float("norm_eps", norm_eps, where)
        if value_heads % key_heads:
            raise m.error("value_heads", f"{value_heads} value heads are not a multiple of {key_heads} key heads")
        key_width, value_width = key_heads * key_dim, value_heads * value_dim
        if projections == "split":
            qkv = self._linear(x, "in_proj_qkv", 2 * key_width + value_width, False, "ssm_qkv")
            z = self._linear(x, "in_proj_z", value_width, False, "ssm_z")
            b = self._linear(x, "in_proj_b", value_heads, False, "ssm_b")
            a = self._linear(x, "in_proj_a", value_heads, False, "ssm_a")
        else:
            qkv, z, b, a = self._fused_projections(x, key_heads, value_heads, key_dim, value_dim)
        qkv = self._conv(qkv, 2 * key_width + value_width, conv_kernel, conv_bias)
        q, k, v = self._split(qkv, [key_width, key_width, value_width], ["ssm_q", "ssm_k", "ssm_v"])
        A_log, dt_bias = (m.param(f"{p}ssm.{n}", (value_heads,)) for n in ("A_log", "dt_bias"))
        past = m._state(i, "recurrent_state", (value_heads, key_dim, value_dim))
        mask, _ = m._context()
        attrs = {"key_heads": key_heads, "value_heads": value_heads, "key_dim": key_dim, "value_dim": value_dim}
        y, present = m.emit("gated_delta_rule", [q, k, v, a, b, A_log, dt_bias, past, mask], attrs,
                            [f"{p}ssm_y", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        norm = m.param(f"{p}ssm.norm", (value_dim,))
        heads_norm = m.emit("reshape", [m.emit("expand", [norm], {"shape": [value_heads, value_dim]},
                                               f"{p}ssm_norm_heads")[0]], {"shape": [value_width]},
                            f"{p}ssm_norm_weight")[0]
        y = m.emit("gated_rms_norm", [y, z, heads_norm], {"eps": norm_eps, "group_size": value_dim,
                                                          "norm_before_gate": True}, f"{p}ssm_normed")[0]
        self._note_ssm("gated_delta", key_heads=key_heads, value_heads=value_heads, key_dim=key_dim,
                       value_dim=value_dim, conv_kernel=conv_kernel)
        return self._linear(y, "out_proj", m._features(x), False, "ssm_out")

    def kimi_delta(self, x: Tensor, heads: int, head_dim: int, conv_kernel: int = 4, norm_eps: float = 1e-5
                   ) -> Tensor:
        """Kimi Delta Attention: q/k/v projections through one causal conv + SiLU -> the
        gated delta rule with a decay per key channel (forget gate f_b(f_a(x)) + dt_bias,
        A_log per head) and β from b_proj -> per-head RMS norm times sigmoid(g_b(g_a(x)))
        -> o_proj."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        for arg, value in (("heads", heads), ("head_dim", head_dim), ("conv_kernel", conv_kernel)):
            positive(arg, value, where)
        norm_eps = positive_float("norm_eps", norm_eps, where)
        width = heads * head_dim
        q, k, v = (self._linear(x, f"{n}_proj", width, False, f"ssm_{n}_in") for n in "qkv")
        qkv = self._conv(m.emit("concat", [q, k, v], {"axis": -1}, f"{p}ssm_qkv")[0], 3 * width, conv_kernel, False)
        q, k, v = self._split(qkv, [width] * 3, ["ssm_q", "ssm_k", "ssm_v"])
        a = self._linear(self._linear(x, "f_a_proj", head_dim, False, "ssm_f_a"), "f_b_proj", width, False,
                         "ssm_a")
        b = self._linear(x, "b_proj", heads, False, "ssm_b")
        A_log = m.emit("reshape", [m.param(f"{p}ssm.A_log", (1, 1, heads, 1))], {"shape": [heads]},
                       f"{p}ssm_A_log")[0]
        dt_bias = m.param(f"{p}ssm.dt_bias", (width,))
        past = m._state(i, "recurrent_state", (heads, head_dim, head_dim))
        mask, _ = m._context()
        attrs = {"key_heads": heads, "value_heads": heads, "key_dim": head_dim, "value_dim": head_dim,
                 "decay": "channel"}
        y, present = m.emit("gated_delta_rule", [q, k, v, a, b, A_log, dt_bias, past, mask], attrs,
                            [f"{p}ssm_y", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        gate = self._linear(self._linear(x, "g_a_proj", head_dim, False, "ssm_g_a"), "g_b_proj", width, False,
                            "ssm_gate")
        normed = _flat(m, m.norm(_heads_view(m, y, heads, head_dim, f"{p}ssm_y_heads"), f"{p}ssm.o_norm", "rms",
                                 norm_eps), f"{p}ssm_normed")
        y = gated_output(self, normed, gate, "ssm")
        self._note_ssm("kimi_delta", heads=heads, head_dim=head_dim, conv_kernel=conv_kernel)
        return self._linear(y, "o_proj", m._features(x), False, "ssm_out")

    def _fused_projections(self, x: Tensor, key_heads: int, value_heads: int, key_dim: int, value_dim: int):
        """(q|k|v, z, b, a) from Qwen3-Next's per-key-head groups of in_proj_qkvz and in_proj_ba."""
        m, p = self.model, self.prefix
        group = value_heads // key_heads
        per_head = 2 * key_dim + 2 * group * value_dim
        qkvz = self._linear(x, "in_proj_qkvz", key_heads * per_head, False, "ssm_qkvz")
        parts = self._split(_heads_view(m, qkvz, key_heads, per_head, f"{p}ssm_qkvz_heads"),
                            [key_dim, key_dim, group * value_dim, group * value_dim],
                            ["ssm_q_heads", "ssm_k_heads", "ssm_v_heads", "ssm_z_heads"])
        q, k, v, z = (_flat(m, t, f"{p}ssm_{n}_in") for t, n in zip(parts, "qkvz"))
        qkv = m.emit("concat", [q, k, v], {"axis": -1}, f"{p}ssm_qkv")[0]
        ba = self._linear(x, "in_proj_ba", 2 * value_heads, False, "ssm_ba")
        b, a = self._split(_heads_view(m, ba, key_heads, 2 * group, f"{p}ssm_ba_heads"), [group, group],
                           ["ssm_b_heads", "ssm_a_heads"])
        return qkv, z, _flat(m, b, f"{p}ssm_b"), _flat(m, a, f"{p}ssm_a")
