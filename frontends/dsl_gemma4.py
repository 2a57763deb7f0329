"""Gemma-4's own layer pieces in the DSL (``frontends.hf.families_gemma4`` builds its decoder
from them and from ``frontends.dsl_gemma_shared``'s per-layer inputs, weightless RMS norm and
KV-sharing attention), over a ``frontends.dsl.Layer`` and its model:

- ``per_layer_block``: x + ple_norm(ple_proj(gelu(ple_gate(x)) · ple[:, :, i])) for layer i,
  weights ``ple_gate`` [P, d], ``ple_proj`` [d, P], ``ple_norm`` [d];
- ``layer_scalar``: x times the layer's learned ``layer_scalar`` [1].
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frontends.dsl import Layer, Tensor


def per_layer_block(layer: Layer, x: Tensor, ple: Tensor, width: int, eps: float, approximate: str) -> Tensor:
    """x + ple_norm(ple_proj(gelu(ple_gate(x)) · ple[:, :, i])) for layer i."""
    m, p, i = layer.model, layer.prefix, layer.index
    d = m._features(x)
    batch, seq = x.shape[:2]
    gate = m.emit("linear", [x, m.param(f"{p}ple_gate", (width, d))], None, f"{p}ple_gate_out")[0]
    gate = m.emit("gelu", [gate], {"approximate": approximate}, f"{p}ple_act")[0]
    mine = m.emit("slice", [ple], {"axis": 2, "start": i, "end": i + 1}, f"{p}ple_slice")[0]
    mine = m.emit("reshape", [mine], {"shape": [batch, seq, width]}, f"{p}ple_input")[0]
    gated = m.emit("mul", [gate, mine], None, f"{p}ple_gated")[0]
    out = m.emit("linear", [gated, m.param(f"{p}ple_proj", (d, width))], None, f"{p}ple_out")[0]
    return m.add(x, layer.rms_norm(out, "ple_norm", eps), f"{p}x")


def layer_scalar(layer: Layer, x: Tensor) -> Tensor:
    """x times the layer's learned ``layer_scalar`` [1] (in float32)."""
    m, p = layer.model, layer.prefix
    scalar = m.param(f"{p}layer_scalar", (1,))
    if scalar.dtype != x.dtype:
        scalar = m.emit("cast", [scalar], {"to": str(x.dtype)}, f"{p}layer_scalar_f32")[0]
    return m.mul(x, scalar, f"{p}x")
