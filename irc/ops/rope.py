"""Rotary position embedding: the ``rope`` op and the NumPy math behind it.

The frequency formulas follow Hugging Face ``modeling_rope_utils`` exactly (default, linear,
dynamic NTK, YaRN, Llama 3, LongRoPE). Scaling is a plain dict with snake_case keys:

- ``{"kind": "linear", "factor": f}``
- ``{"kind": "dynamic", "factor": f, "original_max_position": n}``; ``n`` is HF's
  ``max_position_embeddings`` and the sequence length is ``max(position_ids) + 1``
  (at least ``n``), as HF's dynamic update computes it
- ``{"kind": "yarn", "factor": f, "original_max_position": n, "beta_fast": 32,
  "beta_slow": 1, "mscale": .., "mscale_all_dim": .., "attention_factor": .., "truncate": True}``
- ``{"kind": "llama3", "factor": f, "low_freq_factor": l, "high_freq_factor": h,
  "original_max_position": n}``
- ``{"kind": "proportional", "factor": f, "partial_rotary_factor": p}`` (Gemma-4's global
  layers): the whole head's frequencies base^(-2j/D), of which only the first
  int(p·D // 2) are kept, the rest zero (those pairs do not rotate), all divided by f
- ``{"kind": "longrope", "short_factor": [R/2 numbers], "long_factor": [R/2 numbers],
  "original_max_position": n, "factor": f, "attention_factor": ..}`` (Phi-3, Phi-4-mini):
  inv_freq = 1 / (ext * base^(2i/R)) with ``ext`` the short factors while the sequence
  length ``max(position_ids) + 1`` is at most ``n`` and the long factors past it (HF's
  ``longrope_frequency_update``: one choice for the whole batch, per call; within a call
  keys already cached keep the rotation they got); cos and sin are multiplied by the
  attention factor, ``sqrt(1 + ln f / ln n)`` (1 when f <= 1) unless given. ``rope_switch``
  gives the two sets a backend selects between at run time. transformers' *generate* adds
  one rule on top (``Phi3ForCausalLM.prepare_inputs_for_generation``, Phi-MoE alike): the
  step that brings the sequence to n + 1 tokens drops the cache and runs the whole
  sequence again, so every key is rotated by the long set from then on; generate loops
  read that length from ``cache_refresh_length``.

Conventions: ``"half"`` rotates pairs (i, i + R/2) of each head (HF ``rotate_half``);
``"interleaved"`` rotates pairs (2i, 2i + 1) and keeps that layout (GPT-J, Cohere, the complex
form of DeepSeek-V2). With ``rotary_dim`` R < head_dim only the first R dims of each head
rotate; the rest pass through.

Multi-axis positions (``mrope``: Qwen-VL's multimodal RoPE and its vision towers' 2-D RoPE):
``position_ids`` [A, B, T] hold A positions per token and ``mrope`` ``{"sections": [s_0, ...],
"layout": ...}`` (sum s_a = R/2) says which axis each rotated pair reads: ``"sections"``, pairs
in runs of s_0, s_1, ... (Qwen2-VL's ``mrope_section``); ``"interleaved"``, pair j reads axis 1
when j % 3 == 1 and j < 3·s_1, axis 2 when j % 3 == 2 and j < 3·s_2, else axis 0 (Qwen3-VL's
and Qwen3.5's recomposition; there the sum need not be R/2, the strides clipped to the pairs
as transformers' slices clip); ``"per_axis"``, runs as with sections, each run with the
frequencies of a rotary width 2·s_a of its own (the vision towers' ``VisionRotaryEmbedding``:
height then width); ``"alternating"``, two equal runs, the first with the even frequencies of
the whole rotary width, the second with the odd ones (Pixtral's ``PixtralVisionRotaryEmbedding``:
row, then column). ``mrope_tables`` gives the axis and the frequency of each pair; the
angle of pair j is position[axis_j] · inv_freq_j. Scaling does not combine with it.

``cos`` and ``sin`` here hold one angle per rotated pair: shape [B, T, R/2], not the
duplicated [B, T, R] tensors HF builds; ``apply_rope`` places them for either convention.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.nn import f32
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, expect, register, same_dims

CONVENTIONS = ("half", "interleaved")
MROPE_LAYOUTS = ("sections", "interleaved", "per_axis", "alternating")
SCALING_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position"),
    "yarn": ("factor", "original_max_position"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position"),
    "longrope": ("short_factor", "long_factor", "original_max_position", "factor"),
    "proportional": ("factor", "partial_rotary_factor"),
}
# scaling kinds whose frequencies depend on the sequence length max(position_ids) + 1
LENGTH_DEPENDENT = ("dynamic", "longrope")
FACTOR_LISTS = ("short_factor", "long_factor")


# ---- frequencies -----------------------------------------------------------------------

def _base_inv_freq(dim: int, base: float) -> np.ndarray:
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (float(base) ** exponents.astype(np.float64))).astype(np.float32)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, base: float, scaling: dict) -> tuple[np.ndarray, float]:
    factor = float(scaling["factor"])
    original = scaling["original_max_position"]
    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation = _base_inv_freq(dim, base)
    interpolation = (extrapolation.astype(np.float64) / factor).astype(np.float32)
    keep = 1 - ramp  # share of the unscaled (extrapolated) frequency
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.astype(np.float32), float(attention_factor)


def _llama3(dim: int, base: float, scaling: dict) -> np.ndarray:
    inv_freq = _base_inv_freq(dim, base).astype(np.float64)
    factor = scaling["factor"]
    low_factor, high_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position"]
    low_wavelen, high_wavelen = old_context / low_factor, old_context / high_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    with np.errstate(divide="ignore", invalid="ignore"):  # low == high (Llama-4 Scout): no medium band to smooth
        smooth = (old_context / wavelen - low_factor) / (high_factor - low_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def longrope_attention_factor(scaling: dict) -> float:
    """LongRoPE's cos/sin multiplier: ``attention_factor`` if given, else
    sqrt(1 + ln(factor) / ln(original_max_position)), 1.0 when factor <= 1 (HF)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(scaling["original_max_position"]))


def _longrope(dim: int, base: float, scaling: dict, seq_len: Optional[int]) -> np.ndarray:
    """1 / (ext * base^(2i/dim)) in float32, as HF computes it; ``ext`` the long factors
    when ``seq_len`` > original_max_position, else the short ones."""
    long = bool(seq_len) and seq_len > scaling["original_max_position"]
    ext = np.asarray(scaling["long_factor" if long else "short_factor"], np.float32)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    powers = (float(base) ** exponents.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / (ext * powers)).astype(np.float32)


def rope_switch(dim: int, base: float, scaling: Optional[dict]) -> Optional[tuple[np.ndarray, np.ndarray, int]]:
    """For a scaling that switches frequency sets on the sequence length (LongRoPE):
    (short inv_freq, long inv_freq, n), the long set applying when max(position_ids) + 1 > n.
    None for every other scaling (fixed frequencies, or dynamic NTK's continuous ones)."""
    if (scaling or {}).get("kind") != "longrope":
        return None
    original = int(scaling["original_max_position"])
    return _longrope(dim, base, scaling, None), _longrope(dim, base, scaling, original + 1), original


CACHE_REFRESH_KEY = "irc.cache_refresh_length"  # an ONNX model's metadata entry holding it


def cache_refresh_length(graph) -> Optional[int]:
    """The sequence length (past + new tokens) at which a generate loop drops its KV cache
    and runs the whole sequence again, as transformers' generate does for LongRoPE models:
    original_max_position + 1 when a ``rope`` (or an attention's ``rope``) of ``graph`` uses
    LongRoPE, else None. A loop does it on the decode step whose past holds exactly
    original_max_position tokens (HF: input length >= n + 1 while the cache holds <= n)."""
    lengths = set()
    for node in graph.nodes:
        rope = node.attrs if node.op == "rope" else node.attrs.get("rope")
        scaling = rope.get("scaling") if isinstance(rope, dict) else None
        if (scaling or {}).get("kind") == "longrope":
            lengths.add(int(scaling["original_max_position"]) + 1)
    return min(lengths) if lengths else None


def rope_inv_freq(dim: int, base: float, scaling: Optional[dict] = None,
                  seq_len: Optional[int] = None) -> tuple[np.ndarray, float]:
    """Inverse frequencies [dim/2] (float32) for a rotary width ``dim`` and the attention
    factor that multiplies cos and sin (1.0 except for YaRN and LongRoPE). ``seq_len``
    (max(position_ids) + 1) matters only for the ``LENGTH_DEPENDENT`` kinds; None reads as
    a short sequence (LongRoPE's short factors)."""
    kind = (scaling or {}).get("kind", "default")
    if kind == "default":
        return _base_inv_freq(dim, base), 1.0
    if kind == "linear":
        return (_base_inv_freq(dim, base) / np.float32(scaling["factor"])).astype(np.float32), 1.0
    if kind == "dynamic":
        original = scaling["original_max_position"]
        factor = scaling["factor"]
        length = original if seq_len is None else max(int(seq_len), original)
        base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(dim, base), 1.0
    if kind == "yarn":
        return _yarn(dim, base, scaling)
    if kind == "llama3":
        return _llama3(dim, base, scaling), 1.0
    if kind == "longrope":
        return _longrope(dim, base, scaling, seq_len), longrope_attention_factor(scaling)
    if kind == "proportional":
        inv_freq = _base_inv_freq(dim, base)
        inv_freq[int(float(scaling["partial_rotary_factor"]) * dim // 2):] = 0.0
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32), 1.0
    raise ValueError(f"unknown rope scaling kind {kind!r}")


def yarn_softmax_mscale(scaling: Optional[dict]) -> float:
    """DeepSeek's extra softmax scale: mscale(factor, mscale_all_dim) ** 2 when the scaling
    sets ``mscale_all_dim``, else 1.0 (HF ``yarn_apply_mscale``)."""
    if not scaling or not scaling.get("mscale_all_dim"):
        return 1.0
    m = yarn_get_mscale(float(scaling["factor"]), scaling["mscale_all_dim"])
    return m * m


def mrope_tables(rotary: int, base: float, mrope: dict) -> tuple[np.ndarray, np.ndarray]:
    """(axis [R/2] int64, inv_freq [R/2] float32): which position axis each rotated pair reads
    and its frequency (the module docstring's layouts)."""
    sections, layout = [int(s) for s in mrope["sections"]], mrope["layout"]
    run = np.repeat(np.arange(len(sections)), sections)
    if layout == "per_axis":
        return run, np.concatenate([_base_inv_freq(2 * s, base) for s in sections]).astype(np.float32)
    inv_freq = _base_inv_freq(rotary, base)
    if layout == "alternating":
        return run, np.concatenate([inv_freq[0::2], inv_freq[1::2]]).astype(np.float32)
    if layout == "sections":
        return run, inv_freq
    axis = np.zeros(rotary // 2, np.int64)
    for a, offset in ((1, 1), (2, 2)):
        axis[offset:3 * sections[a]:3] = a
    return axis, inv_freq


def check_mrope(op: str, mrope, rotary: int, scaling) -> None:
    """Plain ShapeErrors for an ``mrope`` setting that does not fit the rotary width."""
    if mrope is None:
        return
    expect(isinstance(mrope, dict) and mrope.get("layout") in MROPE_LAYOUTS,
           f"{op}: mrope must be a dict with a layout in {', '.join(MROPE_LAYOUTS)}, got {mrope!r}")
    sections = mrope.get("sections")
    expect(isinstance(sections, (list, tuple)) and sections and all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sections),
        f"{op}: mrope sections must be positive ints, got {sections!r}")
    if mrope["layout"] == "interleaved":  # the sections only bound the axes' strides: any rotary width
        expect(len(sections) == 3, f"{op}: interleaved mrope takes three sections, got {list(sections)}")
    else:
        expect(sum(sections) == rotary // 2, f"{op}: mrope sections {list(sections)} add up to {sum(sections)}, "
                                             f"not the {rotary // 2} rotated pairs")
    if mrope["layout"] == "alternating":
        expect(len(sections) == 2 and sections[0] == sections[1],
               f"{op}: alternating mrope takes two equal sections, got {list(sections)}")
    expect(scaling is None, f"{op}: mrope does not combine with rope scaling")


def mrope_angles(position_ids, rotary: int, base: float, mrope: dict) -> np.ndarray:
    """Angles [B, T, R/2] of multi-axis ``position_ids`` [A, B, T] (float32)."""
    axis, inv_freq = mrope_tables(rotary, base, mrope)
    positions = np.asarray(position_ids).astype(np.float32)  # [A, B, T]
    return positions[axis].transpose(1, 2, 0) * inv_freq


def rope_seq_len(position_ids) -> int:
    """Sequence length dynamic and LongRoPE scaling see: max(position_ids) + 1 over the
    whole batch, as HF computes it."""
    return int(np.max(position_ids)) + 1 if np.size(position_ids) else 0


# ---- rotation --------------------------------------------------------------------------

def rope_cos_sin(position_ids, inv_freq, attention_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [B, T, R/2] of position * inv_freq, times the attention factor (float32)."""
    angles = np.asarray(position_ids).astype(np.float32)[..., None] * np.asarray(inv_freq, np.float32)
    factor = np.float32(attention_factor)
    return (np.cos(angles) * factor).astype(np.float32), (np.sin(angles) * factor).astype(np.float32)


def apply_rope(x4, cos, sin, convention: str = "half", rotary_dim: Optional[int] = None) -> np.ndarray:
    """Rotate x4 [B, T, N, D] by cos/sin [B, T, R/2]; float32 result.

    "half": (x1, x2) = (x[:R/2], x[R/2:R]) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    "interleaved": the same on (x[0:R:2], x[1:R:2]), written back to the even/odd slots.
    """
    x = f32(x4)
    rotary = x.shape[-1] if rotary_dim is None else rotary_dim
    half = rotary // 2
    cos = np.asarray(cos, np.float32)[:, :, None, :]
    sin = np.asarray(sin, np.float32)[:, :, None, :]
    out = x.copy()
    if convention == "half":
        x1, x2 = x[..., :half], x[..., half:rotary]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rotary] = x2 * cos + x1 * sin
    elif convention == "interleaved":
        x1, x2 = x[..., 0:rotary:2], x[..., 1:rotary:2]
        out[..., 0:rotary:2] = x1 * cos - x2 * sin
        out[..., 1:rotary:2] = x2 * cos + x1 * sin
    else:
        raise ValueError(f"unknown rope convention {convention!r}")
    return out


def rope(x, position_ids, head_dim: int, base: float, rotary_dim: Optional[int] = None,
         convention: str = "half", scaling: Optional[dict] = None, mrope: Optional[dict] = None) -> np.ndarray:
    """The whole op on x [B, T, N*D]: frequencies, cos/sin, rotation; float32 result."""
    rotary = head_dim if rotary_dim is None else rotary_dim
    if mrope is not None:
        angles = mrope_angles(position_ids, rotary, base, mrope)
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    else:
        inv_freq, attention_factor = rope_inv_freq(rotary, base, scaling, rope_seq_len(position_ids))
        cos, sin = rope_cos_sin(position_ids, inv_freq, attention_factor)
    batch, seq = x.shape[:2]
    x4 = np.asarray(x).reshape(batch, seq, -1, head_dim)
    return apply_rope(x4, cos, sin, convention, rotary).reshape(batch, seq, -1)


# ---- the op ----------------------------------------------------------------------------

def check_rope_config(op: str, dim, base, convention, scaling) -> None:
    """Plain ShapeErrors for a bad rotary width, base, convention or scaling dict."""
    expect(isinstance(dim, int) and dim > 0 and dim % 2 == 0,
           f"{op}: rotary dim must be a positive even int, got {dim!r}")
    expect(isinstance(base, (int, float)) and base > 0, f"{op}: rope base must be a positive number, got {base!r}")
    expect(convention in CONVENTIONS,
           f"{op}: rope convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    if scaling is None:
        return
    expect(isinstance(scaling, dict), f"{op}: rope scaling must be a dict or None, got {scaling!r}")
    kind = scaling.get("kind")
    expect(kind in SCALING_KEYS, f"{op}: rope scaling kind must be one of {', '.join(SCALING_KEYS)}, got {kind!r}")
    missing = [key for key in SCALING_KEYS[kind] if scaling.get(key) is None]
    expect(not missing, f"{op}: {kind} rope scaling needs {', '.join(missing)}")
    if kind == "dynamic":
        expect(dim > 2, f"{op}: dynamic rope scaling needs a rotary dim above 2, got {dim}")
    if kind == "proportional":
        fraction = scaling["partial_rotary_factor"]
        expect(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 < fraction <= 1,
               f"{op}: proportional partial_rotary_factor must be in (0, 1], got {fraction!r}")
    if kind == "longrope":
        for key in FACTOR_LISTS:
            factors = scaling[key]
            expect(isinstance(factors, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                for v in factors), f"{op}: longrope {key} must be a list of positive numbers")
            expect(len(factors) == dim // 2,
                   f"{op}: longrope {key} has {len(factors)} entries for a rotary dim of {dim} (needs {dim // 2})")
        original = scaling["original_max_position"]
        expect(isinstance(original, int) and not isinstance(original, bool) and original > 1,
               f"{op}: longrope original_max_position must be an int above 1, got {original!r}")


def _rope_infer(inputs, attrs):
    x, position_ids = inputs
    head_dim = attrs["head_dim"]
    rotary = head_dim if attrs["rotary_dim"] is None else attrs["rotary_dim"]
    expect(isinstance(head_dim, int) and head_dim > 0, f"rope: head_dim must be a positive int, got {head_dim!r}")
    check_rope_config("rope", rotary, attrs["base"], attrs["convention"], attrs["scaling"])
    expect(rotary <= head_dim, f"rope: rotary_dim {rotary} exceeds head_dim {head_dim}")
    expect(x.dtype.is_float, f"rope: x must be float, got {x.dtype}")
    expect(len(x.shape) == 3, f"rope: x must be [B,T,N*D], got {dims.format_shape(x.shape)}")
    expect(not isinstance(x.shape[-1], int) or x.shape[-1] % head_dim == 0,
           f"rope: features {x.shape[-1]} are not a multiple of head_dim {head_dim}")
    expect(position_ids.dtype in (DType.i64, DType.i32),
           f"rope: position_ids must be integer, got {position_ids.dtype}")
    mrope = attrs.get("mrope")
    check_mrope("rope", mrope, rotary, attrs["scaling"])
    axes = () if mrope is None else (len(mrope["sections"]),)  # multi-axis positions: [A, B, T]
    shape = tuple(position_ids.shape)
    expect(len(shape) == 2 + len(axes) and all(same_dims(a, b) for a, b in zip(shape, axes + tuple(x.shape[:2]))),
           f"rope: position_ids {dims.format_shape(shape)} do not match x {dims.format_shape(x.shape)}"
           + (f" with {axes[0]} position axes" if axes else ""))
    return [TensorType(x.dtype, x.shape)]


def _rope_reference(inputs, attrs):
    """Rotate each head of x [B, T, N*D] by its position (HF RoPE, scaling and all)."""
    x, position_ids = inputs
    out = rope(x, position_ids, attrs["head_dim"], attrs["base"], attrs["rotary_dim"], attrs["convention"],
               attrs["scaling"], attrs.get("mrope"))
    return [out.astype(x.dtype)]


def _rope_cost(inputs, outputs, attrs):
    """About 3 operations (two multiplies, one add) per rotated element."""
    x = inputs[0]
    rotary = attrs["head_dim"] if attrs["rotary_dim"] is None else attrs["rotary_dim"]
    rotated = x.numel // attrs["head_dim"] * rotary
    return Cost(other_flops=3 * rotated, bytes_read=sum(t.nbytes for t in inputs),
                bytes_written=outputs[0].nbytes)


register(OpDef("rope", ("x", "position_ids"),
               {"head_dim": REQUIRED, "rotary_dim": None, "base": REQUIRED, "convention": "half", "scaling": None,
                "mrope": None},
               _rope_infer, _rope_reference, _rope_cost, level="model"))
