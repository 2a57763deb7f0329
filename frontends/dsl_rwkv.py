"""The DSL's RWKV-4 blocks (part of ``frontends.dsl.Layer``): the time mixing and the channel
mixing as transformers' ``RwkvSelfAttention`` and ``RwkvFeedForward`` write them, over the
ops of ``irc.ops.rwkv``.

    y = layer.rwkv_time_mix(layer.layer_norm(x, "attn_norm"), attention_size=64)
    y = layer.rwkv_channel_mix(layer.layer_norm(x, "mlp_norm"), d_ff=128)

Each returns the block's output (norms and the residual are the caller's). The token shift
of each block and the WKV state are graph inputs named like the cache:
``past_key_values.{i}.time_shift_state`` [B, d] (transformers' ``state[1]``),
``.channel_shift_state`` [B, d] (``state[0]``) and ``.recurrent_state`` [B, 3, A] (num,
den, max: ``state[2:5]``), returned as ``present.{i}.*``. ``out_scale`` multiplies the
output projection's result (transformers' inference-time ``rescale_every``: a power of two,
exact). Weights (``layers.{i}.rwkv.*``, checkpoint shapes):

- time mixing: ``time_decay``, ``time_first`` [A]; ``time_mix_key``, ``time_mix_value``,
  ``time_mix_receptance`` [1, 1, d]; ``key``, ``value``, ``receptance`` [A, d];
  ``output`` [d, A];
- channel mixing: ``ffn_time_mix_key``, ``ffn_time_mix_receptance`` [1, 1, d]; ``ffn_key``
  [F, d], ``ffn_receptance`` [d, d], ``ffn_value`` [d, F].
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import positive, positive_float

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


class RwkvLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` (``layers.{i}.``) and ``index``."""

    model: Model
    prefix: str
    index: int

    def _rwkv_shift(self, x: Tensor, kind: str) -> Tensor:
        """x shifted one token later, the first token's from the layer's ``{kind}`` state."""
        m, i = self.model, self.index
        past = m._state(i, kind, (m._features(x),))
        shifted, present = m.emit("token_shift", [x, past], None,
                                  [f"{self.prefix}{kind.removesuffix('_state')}", f"present.{i}.{kind}"])
        m._presents.append(present.value)
        return shifted

    def _rwkv_mix(self, x: Tensor, shifted: Tensor, name: str) -> Tensor:
        """x · mix + shifted · (1 - mix), the mix ``@layers.{i}.rwkv.{name}`` [1, 1, d]."""
        m, p = self.model, self.prefix
        mix = m.param(f"{p}rwkv.{name}", (1, 1, m._features(x)))
        one = m.emit("constant", [], {"value": 1.0}, f"{p}{name}_one")[0]
        rest = m.emit("sub", [one, mix], None, f"{p}{name}_rest")[0]
        mine = m.emit("mul", [x, mix], None, f"{p}{name}_x")[0]
        previous = m.emit("mul", [shifted, rest], None, f"{p}{name}_shifted")[0]
        return m.emit("add", [mine, previous], None, f"{p}{name}_mixed")[0]

    def _rwkv_linear(self, x: Tensor, name: str, rows: int, out: Optional[str] = None) -> Tensor:
        m = self.model
        weight = m.param(f"{self.prefix}rwkv.{name}", (rows, m._features(x)))
        return m.emit("linear", [x, weight], None, f"{self.prefix}{out or name}")[0]

    def _rwkv_out(self, y: Tensor, name: str, rows: int, out_scale: Optional[float]) -> Tensor:
        y = self._rwkv_linear(y, name, rows)
        if out_scale is not None and out_scale != 1.0:
            y = self.model.scale(y, out_scale, f"{self.prefix}{name}_rescaled")
        return y

    def rwkv_time_mix(self, x: Tensor, attention_size: Optional[int] = None,
                      out_scale: Optional[float] = None) -> Tensor:
        """RWKV-4's time mixing: token shift; k, v, r from their mixes; sigmoid(r) ·
        WKV(k, v) -> ``output``. ``attention_size`` A defaults to d."""
        m, p, i = self.model, self.prefix, self.index
        d = m._features(x)
        size = positive("attention_size", d if attention_size is None else attention_size, m.origin())
        out_scale = positive_float("out_scale", out_scale, m.origin())
        shifted = self._rwkv_shift(x, "time_shift_state")
        key = self._rwkv_linear(self._rwkv_mix(x, shifted, "time_mix_key"), "key", size)
        value = self._rwkv_linear(self._rwkv_mix(x, shifted, "time_mix_value"), "value", size)
        receptance = self._rwkv_linear(self._rwkv_mix(x, shifted, "time_mix_receptance"), "receptance", size)
        gate = m.emit("sigmoid", [receptance], None, f"{p}receptance_gate")[0]
        decay, first = (m.param(f"{p}rwkv.{n}", (size,)) for n in ("time_decay", "time_first"))
        past = m._state(i, "recurrent_state", (3, size))
        wkv, present = m.emit("rwkv4_wkv", [key, value, decay, first, past], None,
                              [f"{p}wkv", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        gated = m.emit("mul", [gate, wkv], None, f"{p}wkv_gated")[0]
        m._kinds.setdefault(i, []).append("rwkv4")
        if m.meta.get("ssm") is None:
            m.meta["ssm"] = {"kind": "rwkv4", "attention_size": size}
        return self._rwkv_out(gated, "output", d, out_scale)

    def rwkv_channel_mix(self, x: Tensor, d_ff: Optional[int] = None, out_scale: Optional[float] = None) -> Tensor:
        """RWKV-4's channel mixing: token shift; sigmoid(receptance(r mix)) ·
        value(relu(key(k mix))²). ``d_ff`` defaults to 4·d."""
        m, p = self.model, self.prefix
        d = m._features(x)
        d_ff = positive("d_ff", 4 * d if d_ff is None else d_ff, m.origin())
        out_scale = positive_float("out_scale", out_scale, m.origin())
        shifted = self._rwkv_shift(x, "channel_shift_state")
        key = self._rwkv_linear(self._rwkv_mix(x, shifted, "ffn_time_mix_key"), "ffn_key", d_ff)
        zero = m.emit("constant", [], {"value": 0.0}, f"{p}ffn_zero")[0]
        relu = m.emit("maximum", [key, zero], None, f"{p}ffn_relu")[0]
        squared = m.emit("mul", [relu, relu], None, f"{p}ffn_relu_squared")[0]
        receptance = self._rwkv_linear(self._rwkv_mix(x, shifted, "ffn_time_mix_receptance"), "ffn_receptance", d)
        gate = m.emit("sigmoid", [receptance], None, f"{p}ffn_gate")[0]
        value = self._rwkv_out(squared, "ffn_value", d, out_scale)
        if m.meta.get("mlp") is None:
            m.meta["mlp"], m.meta["d_ff"] = "rwkv4_channel_mix", d_ff
        return m.emit("mul", [gate, value], None, f"{p}ffn_out")[0]
