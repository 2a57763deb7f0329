"""The DSL's state-space mixers (part of ``frontends.dsl.Layer``): Mamba-1 and Mamba-2 blocks
as the model code writes them, over the ops of ``irc.ops.ssm``.

    y = layer.mamba(layer.rms_norm(x, "norm"), d_inner=128, state_size=16, conv_kernel=4)
    y = layer.mamba2(h, heads=8, head_dim=16, state_size=16, groups=1, conv_kernel=4)
    y = layer.short_conv(h, conv_kernel=3)           # LFM2's gated short convolution

Each returns the mixer's output (after ``ssm.out_proj``); norms and the residual are the
caller's, as for attention. The layer's state is two graph inputs, named like the KV cache:
``past_key_values.{i}.conv_state`` [B, conv_dim, K-1] and ``past_key_values.{i}.recurrent_state``
(Mamba-1 [B, d_inner, N]; Mamba-2 [B, H, N, P]), returned as ``present.{i}.conv_state`` /
``present.{i}.recurrent_state``. Weights (``layers.{i}.ssm.*``, checkpoint shapes):

- Mamba-1: ``in_proj`` [2·d_inner, d] -> x | z; ``conv`` [d_inner, 1, K] (+ ``conv_bias``);
  ``x_proj`` [dt_rank + 2N, d_inner] -> dt | B | C (optionally RMS-normed: ``bcdt_norm``
  "weighted" with ``dt_norm``/``B_norm``/``C_norm`` as Jamba, "plain" without weights as
  Falcon-Mamba); ``dt_proj`` [d_inner, dt_rank] + ``dt_proj_bias``; ``A_log`` [d_inner, N];
  ``D`` [d_inner]; ``out_proj`` [d, d_inner].
- Mamba-2: ``in_proj`` [2·d_inner + 2·G·N + H, d] -> z | x B C | dt; ``conv`` [d_inner + 2·G·N,
  1, K] (+ ``conv_bias``) over x|B|C with SiLU; ``dt_bias``, ``A_log``, ``D`` [H]; the gated
  RMS norm ``norm`` [d_inner] (over groups of ``norm_group_size``); ``out_proj`` [d, d_inner].
  Falcon-H1's departures are arguments: ``in_scale`` (one factor per z, x, B, C, dt part of
  in_proj's output, a ``mul`` by a constant vector), ``gated_norm=False`` (y * silu(z), no
  norm weight), ``out_bias`` apart from in_proj's ``proj_bias``.
- LFM2's short convolution: ``in_proj`` [3d, d] -> B | C | x; B·x -> ``conv`` [d, 1, K] (no
  activation; K is LFM2's ``conv_L_cache``) -> C · conv -> ``out_proj`` [d, d]; with ``bias``
  all three have biases (``in_proj_bias``, ``conv_bias``, ``out_proj_bias``). Its only state
  is the conv state [B, d, K-1].
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

from frontends.dsl_args import one_of, positive, positive_float

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor

BCDT_NORMS = (None, "weighted", "plain")


def segment_scale(m: Model, widths: Sequence[int], factors: Sequence[float], name: str) -> Tensor:
    """The vector [f0]*w0 | [f1]*w1 | ... (Falcon-H1's "mup vector"), built from one scalar
    constant per segment (``expand`` + ``concat``), not a literal of every element."""
    pieces = []
    for k, (width, factor) in enumerate(zip(widths, factors)):
        const = m.emit("constant", [], {"value": [float(factor)]}, f"{name}_{k}")[0]
        pieces.append(m.emit("expand", [const], {"shape": [width]}, f"{name}_{k}_wide")[0])
    return m.emit("concat", pieces, {"axis": 0}, name)[0]


class SsmLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` (``layers.{i}.``) and ``index``."""

    model: Model
    prefix: str
    index: int

    def _split(self, t: Tensor, widths: list, names: list) -> list:
        """``t`` cut along its last axis into pieces of ``widths``."""
        m, start, pieces = self.model, 0, []
        for width, name in zip(widths, names):
            pieces.append(m.emit("slice", [t], {"axis": -1, "start": start, "end": start + width},
                                 f"{self.prefix}{name}")[0])
            start += width
        return pieces

    def _linear(self, x: Tensor, name: str, rows: int, bias: bool, out: str) -> Tensor:
        m, p = self.model, self.prefix
        weight = m.param(f"{p}ssm.{name}", (rows, m._features(x)))
        b = m.param(f"{p}ssm.{name}_bias", (rows,)) if bias else None
        return m.emit("linear", [x, weight, b], None, f"{p}{out}")[0]

    def _conv(self, x: Tensor, channels: int, kernel: int, bias: bool, activation: Optional[str] = "silu") -> Tensor:
        m, p, i = self.model, self.prefix, self.index
        weight = m.param(f"{p}ssm.conv", (channels, 1, kernel))
        b = m.param(f"{p}ssm.conv_bias", (channels,)) if bias else None
        past = m._state(i, "conv_state", (channels, kernel - 1))
        mask, _ = m._context()
        out, present = m.emit("causal_conv1d", [x, weight, b, past, mask], {"activation": activation},
                              [f"{p}ssm_conv", f"present.{i}.conv_state"])
        m._presents.append(present.value)
        return out

    def _plain_rms(self, x: Tensor, eps: float, name: str) -> Tensor:
        """x / sqrt(mean(x^2) + eps), no weight (Falcon-Mamba's B, C and dt norms)."""
        m, p = self.model, f"{self.prefix}{name}"
        square = m.emit("mul", [x, x], None, f"{p}_sq")[0]
        mean = m.emit("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{p}_ms")[0]
        shifted = m.emit("add", [mean, m.emit("constant", [], {"value": float(eps)}, f"{p}_eps")[0]], None,
                         f"{p}_var")[0]
        return m.emit("mul", [x, m.emit("rsqrt", [shifted], None, f"{p}_rstd")[0]], None, f"{p}_normed")[0]

    def mamba(self, x: Tensor, d_inner: Optional[int] = None, expand: int = 2, state_size: int = 16,
              conv_kernel: int = 4, dt_rank: Optional[int] = None, conv_bias: bool = True,
              proj_bias: bool = False, bcdt_norm: Optional[str] = None, norm_eps: float = 1e-6) -> Tensor:
        """Mamba-1's mixer: in_proj -> causal conv + SiLU -> x_proj -> dt_proj -> selective
        scan (gated by silu(z)) -> out_proj. ``d_inner`` defaults to expand·d and
        ``dt_rank`` to ceil(d / 16), as transformers' MambaConfig."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d = m._features(x)
        positive("expand", expand, where)
        d_inner = positive("d_inner", expand * d if d_inner is None else d_inner, where)
        positive("state_size", state_size, where)
        positive("conv_kernel", conv_kernel, where)
        dt_rank = positive("dt_rank", math.ceil(d / 16) if dt_rank is None else dt_rank, where)
        one_of("bcdt_norm", bcdt_norm, BCDT_NORMS, where)
        norm_eps = positive_float("norm_eps", norm_eps, where)
        xz = self._linear(x, "in_proj", 2 * d_inner, proj_bias, "ssm_in")
        hidden, gate = self._split(xz, [d_inner, d_inner], ["ssm_x", "ssm_z"])
        hidden = self._conv(hidden, d_inner, conv_kernel, conv_bias)
        params = self._linear(hidden, "x_proj", dt_rank + 2 * state_size, False, "ssm_params")
        dt, b, c = self._split(params, [dt_rank, state_size, state_size], ["ssm_dt_low", "ssm_B", "ssm_C"])
        if bcdt_norm == "weighted":
            dt, b, c = (m.norm(t, f"{p}ssm.{n}_norm", "rms", norm_eps) for t, n in ((dt, "dt"), (b, "B"), (c, "C")))
        elif bcdt_norm == "plain":
            dt, b, c = (self._plain_rms(t, norm_eps, f"ssm_{n}") for t, n in ((dt, "dt"), (b, "B"), (c, "C")))
        dt = self._linear(dt, "dt_proj", d_inner, True, "ssm_dt")
        A_log = m.param(f"{p}ssm.A_log", (d_inner, state_size))
        D = m.param(f"{p}ssm.D", (d_inner,))
        past = m._state(i, "recurrent_state", (d_inner, state_size))
        mask, _ = m._context()
        y, present = m.emit("selective_scan", [hidden, dt, A_log, b, c, D, gate, past, mask], None,
                            [f"{p}ssm_y", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        self._note_ssm("mamba", d_inner=d_inner, state_size=state_size, conv_kernel=conv_kernel, dt_rank=dt_rank)
        return self._linear(y, "out_proj", d, proj_bias, "ssm_out")

    def mamba2(self, x: Tensor, heads: int, head_dim: int, state_size: int = 128, groups: int = 1,
               conv_kernel: int = 4, conv_bias: bool = True, proj_bias: bool = False, dt_min: float = 0.0,
               dt_max: Optional[float] = None, norm_eps: float = 1e-5, norm_group_size: Optional[int] = None,
               norm_before_gate: bool = False, gated_norm: bool = True, in_scale: Optional[Sequence[float]] = None,
               out_bias: Optional[bool] = None) -> Tensor:
        """Mamba-2's mixer: in_proj -> z | x B C | dt; causal conv + SiLU over x|B|C -> SSD
        (Δ clamped to [dt_min, dt_max]) -> gated RMS norm with z -> out_proj. d_inner =
        heads·head_dim; ``norm_group_size`` None normalises all d_inner features at once
        (transformers' Mamba-2), d_inner / groups per group elsewhere."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d = m._features(x)
        for arg, value in (("heads", heads), ("head_dim", head_dim), ("state_size", state_size),
                           ("groups", groups), ("conv_kernel", conv_kernel)):
            positive(arg, value, where)
        if heads % groups:
            raise m.error("groups", f"{heads} heads are not divisible by {groups} groups")
        if not isinstance(dt_min, (int, float)) or isinstance(dt_min, bool) or dt_min < 0:
            raise m.error("dt_min", f"expected a non-negative number, got {dt_min!r}")
        dt_max = positive_float("dt_max", dt_max, where)
        if dt_max is not None and dt_max < dt_min:
            raise m.error("dt_max", f"{dt_max} is below dt_min {dt_min}")
        norm_eps = positive_float("norm_eps", norm_eps, where)
        d_inner = heads * head_dim
        if norm_group_size is not None and (positive("norm_group_size", norm_group_size, where)
                                            and d_inner % norm_group_size):
            raise m.error("norm_group_size", f"{norm_group_size} does not divide d_inner {d_inner}")
        bc = groups * state_size
        conv_dim = d_inner + 2 * bc
        zxbcdt = self._linear(x, "in_proj", d_inner + conv_dim + heads, proj_bias, "ssm_in")
        if in_scale is not None and any(f != 1.0 for f in in_scale):
            widths = [d_inner, d_inner, bc, bc, heads]
            if len(in_scale) != len(widths):
                raise m.error("in_scale", f"expected {len(widths)} factors (z, x, B, C, dt), got {len(in_scale)}")
            zxbcdt = m.emit("mul", [zxbcdt, segment_scale(m, widths, in_scale, f"{p}ssm_mup")], None,
                            f"{p}ssm_in_scaled")[0]
        gate, xbc, dt = self._split(zxbcdt, [d_inner, conv_dim, heads], ["ssm_z", "ssm_xBC", "ssm_dt"])
        xbc = self._conv(xbc, conv_dim, conv_kernel, conv_bias)
        hidden, b, c = self._split(xbc, [d_inner, bc, bc], ["ssm_x", "ssm_B", "ssm_C"])
        A_log, D, dt_bias = (m.param(f"{p}ssm.{n}", (heads,)) for n in ("A_log", "D", "dt_bias"))
        past = m._state(i, "recurrent_state", (heads, state_size, head_dim))
        mask, _ = m._context()
        attrs = {"heads": heads, "head_dim": head_dim, "groups": groups, "state_size": state_size,
                 "dt_min": float(dt_min), "dt_max": dt_max}
        y, present = m.emit("ssd", [hidden, dt, A_log, b, c, D, dt_bias, past, mask], attrs,
                            [f"{p}ssm_y", f"present.{i}.recurrent_state"])
        m._presents.append(present.value)
        if gated_norm:
            norm = m.param(f"{p}ssm.norm", (d_inner,))
            y = m.emit("gated_rms_norm", [y, gate, norm], {"eps": norm_eps, "group_size": norm_group_size,
                                                           "norm_before_gate": bool(norm_before_gate)},
                       f"{p}ssm_normed")[0]
        else:
            y = m.emit("mul", [y, m.emit("silu", [gate], None, f"{p}ssm_gate")[0]], None, f"{p}ssm_gated")[0]
        self._note_ssm("mamba2", d_inner=d_inner, state_size=state_size, conv_kernel=conv_kernel, heads=heads,
                       head_dim=head_dim, groups=groups)
        return self._linear(y, "out_proj", d, proj_bias if out_bias is None else out_bias, "ssm_out")

    def short_conv(self, x: Tensor, conv_kernel: int = 3, bias: bool = False) -> Tensor:
        """LFM2's gated short convolution: in_proj -> B | C | x; B·x -> depthwise causal conv
        of ``conv_kernel`` taps (no activation, the layer's conv state of conv_kernel - 1
        columns) -> C · conv -> out_proj. A padded token's input is zeroed in the conv, so it
        changes no state (transformers zeroes it before in_proj: the same without ``bias``)."""
        m = self.model
        d = m._features(x)
        positive("conv_kernel", conv_kernel, m.origin())
        if not isinstance(bias, bool):
            raise m.error("bias", f"expected true or false, got {bias!r}")
        bcx = self._linear(x, "in_proj", 3 * d, bias, "ssm_in")
        b, c, hidden = self._split(bcx, [d, d, d], ["ssm_B", "ssm_C", "ssm_x"])
        gated = m.emit("mul", [b, hidden], None, f"{self.prefix}ssm_Bx")[0]
        conv = self._conv(gated, d, conv_kernel, bias, activation=None)
        y = m.emit("mul", [c, conv], None, f"{self.prefix}ssm_y")[0]
        self._note_ssm("short_conv", conv_kernel=conv_kernel, bias=bias)
        return self._linear(y, "out_proj", d, bias, "ssm_out")

    def _note_ssm(self, kind: str, **config) -> None:
        m = self.model
        m._kinds.setdefault(self.index, []).append(kind)
        if m.meta.get("ssm") is None:
            m.meta["ssm"] = {"kind": kind, **config}
