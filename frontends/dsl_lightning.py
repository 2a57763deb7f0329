"""The DSL's MiniMax lightning-attention mixer (part of ``frontends.dsl.Layer``), over
``irc.ops.delta.gated_delta_rule`` with ``update_rule="gated"`` and a constant per-head
decay.

    y = layer.lightning_attention(h, heads=64, head_dim=128, slopes=lightning_slopes(64, i, 80))

It returns the mixer's output (after ``ssm.out_proj``); the norm before it and the residual
are the caller's. Per token, per head h (slope s_h, no q/k normalisation or scaling)::

    q | k | v = silu(qkv_proj(x))              per head its q, then its k, then its v
    S = exp(-s_h)·S + k ⊗ v;   o = Sᵀ q         (transformers' linear_cache K.T @ V)
    y = out_proj(rms_norm(o over all H·D features) · sigmoid(output_gate(x)))

The state is the layer's ``past_key_values.{i}.recurrent_state`` [B, H, D, D] (key-major),
returned as ``present.{i}.recurrent_state``; there is no convolution and so no conv state.
The slopes are constants in the graph (``ssm_A_log`` = log s_h, the op's decay -exp(A_log)):
MiniMax derives them from the head and layer index (``lightning_slopes``), or a checkpoint
holds them as buffers. Weights (``layers.{i}.ssm.*``, checkpoint shapes): ``qkv_proj``
[3·H·D, d], ``output_gate`` [H·D, d], ``norm`` [H·D], ``out_proj`` [d, H·D], no biases.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from frontends.dsl_args import positive, positive_float
from frontends.dsl_delta import _flat, _heads_view

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


def lightning_slopes(heads: int, layer: int, layers: int) -> list[float]:
    """transformers' ``MiniMaxLightningAttention.get_slope_rate``: base^(h+1) · (1 - i /
    (L - 1 + 1e-5) + 1e-5) with base = 1 / 2^(8 / H), for head h of layer i of L."""
    base = 1 / (2 ** (8 / heads))
    factor = 1 - layer / (layers - 1 + 1e-5) + 1e-5
    return [base ** (h + 1) * factor for h in range(heads)]


class LightningLayer:
    """Mixin: needs the layer's ``model``, ``prefix``, ``index`` and ``frontends.dsl_ssm``'s
    helpers."""

    model: Model
    prefix: str
    index: int

    def lightning_attention(self, x: Tensor, heads: int, head_dim: int, slopes: Sequence[float],
                            norm_eps: float = 1e-6) -> Tensor:
        """MiniMax's lightning attention (see the module docstring); ``slopes`` holds one
        positive decay rate per head."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        positive("heads", heads, where)
        positive("head_dim", head_dim, where)
        norm_eps = positive_float("norm_eps", norm_eps, where)
        slopes = list(slopes)
        if len(slopes) != heads:
            raise m.error("slopes", f"expected {heads} slopes (one per head), got {len(slopes)}")
        for slope in slopes:
            positive_float("slopes", slope, where)
        width = heads * head_dim
        qkv = m.emit("silu", [self._linear(x, "qkv_proj", 3 * width, False, "ssm_qkv")], None, f"{p}ssm_qkv_act")[0]
        parts = self._split(_heads_view(m, qkv, heads, 3 * head_dim, f"{p}ssm_qkv_heads"), [head_dim] * 3,
                            ["ssm_q_heads", "ssm_k_heads", "ssm_v_heads"])
        q, k, v = (_flat(m, t, f"{p}ssm_{n}") for t, n in zip(parts, "qkv"))
        A_log = m.emit("constant", [], {"value": [math.log(s) for s in slopes]}, f"{p}ssm_A_log")[0]
        past = m._state(i, "recurrent_state", (heads, head_dim, head_dim))
        mask, _ = m._context()
        attrs = {"key_heads": heads, "value_heads": heads, "key_dim": head_dim, "value_dim": head_dim,
                 "l2_norm": False, "scale": 1.0, "update_rule": "gated"}
        y, present = m.emit("gated_delta_rule", [q, k, v, None, None, A_log, None, past, mask], attrs,
                            [f"{p}ssm_y", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        y = m.norm(y, f"{p}ssm.norm", "rms", norm_eps)
        gate = m.emit("sigmoid", [self._linear(x, "output_gate", width, False, "ssm_gate")], None,
                      f"{p}ssm_gate_sigmoid")[0]
        y = m.emit("mul", [y, gate], None, f"{p}ssm_gated")[0]
        self._note_ssm("lightning_attention", heads=heads, head_dim=head_dim)
        return self._linear(y, "out_proj", m._features(x), False, "ssm_out")
