"""RoPE in the DSL: the ``Rope`` settings, and how a layer emits them — one ``rope`` op,
or (``decomposed=True``) the primitives model code writes, so ``rope-fuse`` has real input."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import ArgError, call_site, one_of, positive, positive_float
from irc.graph import Value
from irc.ops import rope as rope_op

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor

ROPE_CONVENTIONS = rope_op.CONVENTIONS
SCALING_NEEDS = rope_op.SCALING_KEYS  # kind -> the fields it needs
SCALING_KINDS = tuple(SCALING_NEEDS)
SCALING_FIELDS = {"factor": float, "original_max_position": int, "low_freq_factor": float,
                  "high_freq_factor": float, "beta_fast": float, "beta_slow": float, "mscale": float,
                  "mscale_all_dim": float, "attention_factor": float, "truncate": bool,
                  "partial_rotary_factor": float, "short_factor": list, "long_factor": list}


class Rope:
    """Rotary position embedding settings: ``base`` (theta), ``convention`` ("half":
    rotate-half as in Llama; "interleaved": adjacent pairs as in GPT-J/DeepSeek),
    ``scaling`` (None or a dict with ``kind`` linear|dynamic|yarn|llama3|proportional|longrope
    and its fields: ``irc.ops.rope``)
    and ``rotary_dim`` (partial rotary; None rotates the whole head). ``decomposed=True``
    writes RoPE out as model code does (cos/sin from positions, rotate-half or pairs) instead
    of one ``rope`` op; ``rope-fuse`` turns it back. It needs fixed frequencies (not dynamic)
    and applies to ``attention`` only. ``mrope`` ``{"sections": [...], "layout": "sections" |
    "interleaved" | "per_axis"}`` rotates by multi-axis positions [A, B, T] (Qwen-VL's;
    ``irc.ops.rope``): the model's ``position_ids`` then have A axes
    (``Model.input_ids(position_axes=A)``)."""

    def __init__(self, base: float = 10000.0, convention: str = "half", scaling: Optional[dict] = None,
                 rotary_dim: Optional[int] = None, decomposed: bool = False, mrope: Optional[dict] = None):
        self.base = positive_float("rope.base", base)
        self.mrope = None if mrope is None else self._mrope(mrope)
        if self.mrope is not None and (scaling is not None or decomposed):
            raise ArgError("rope.mrope", "multi-axis positions take plain frequencies: no scaling, not decomposed",
                           call_site())
        self.convention = one_of("rope.convention", convention, ROPE_CONVENTIONS)
        self.rotary_dim = None if rotary_dim is None else positive("rope.rotary_dim", rotary_dim)
        self.scaling = None if scaling is None else self._scaling(scaling)
        if not isinstance(decomposed, bool):
            raise ArgError("rope.decomposed", f"expected True or False, got {decomposed!r}", call_site())
        if decomposed and self.scaling and self.scaling["kind"] in rope_op.LENGTH_DEPENDENT:
            raise ArgError("rope.decomposed", f"{self.scaling['kind']} scaling depends on the sequence length; "
                                              "a decomposed RoPE needs fixed frequencies", call_site())
        self.decomposed = decomposed

    @staticmethod
    def _mrope(mrope: dict) -> dict:
        if not isinstance(mrope, dict) or set(mrope) != {"sections", "layout"}:
            raise ArgError("rope.mrope", f"expected {{'sections': [...], 'layout': ...}}, got {mrope!r}", call_site())
        layout = one_of("rope.mrope.layout", mrope["layout"], rope_op.MROPE_LAYOUTS)
        sections = mrope["sections"]
        if not isinstance(sections, (list, tuple)) or not sections:
            raise ArgError("rope.mrope.sections", f"expected a list of pair counts, got {sections!r}", call_site())
        return {"sections": [positive("rope.mrope.sections", s) for s in sections], "layout": layout}

    @staticmethod
    def _scaling(scaling: dict) -> dict:
        if not isinstance(scaling, dict):
            raise ArgError("rope.scaling", f"expected a dict, got {scaling!r}", call_site())
        kind = one_of("rope.scaling.kind", scaling.get("kind"), SCALING_KINDS)
        out = {"kind": kind}
        for key in sorted(scaling):
            if key == "kind":
                continue
            if key not in SCALING_FIELDS:
                raise ArgError(f"rope.scaling.{key}", "unknown scaling field", call_site(),
                               hint=f"fields: {', '.join(SCALING_FIELDS)}")
            if SCALING_FIELDS[key] is bool:
                if not isinstance(scaling[key], bool):
                    raise ArgError(f"rope.scaling.{key}", f"expected True or False, got {scaling[key]!r}", call_site())
                out[key] = scaling[key]
            elif SCALING_FIELDS[key] is int:
                out[key] = positive(f"rope.scaling.{key}", scaling[key])
            elif SCALING_FIELDS[key] is list:  # LongRoPE's per-frequency factors
                if not isinstance(scaling[key], (list, tuple)):
                    raise ArgError(f"rope.scaling.{key}", f"expected a list of positive numbers, got "
                                                          f"{scaling[key]!r}", call_site())
                out[key] = [positive_float(f"rope.scaling.{key}", value) for value in scaling[key]]
            else:
                out[key] = positive_float(f"rope.scaling.{key}", scaling[key])
        for key in SCALING_NEEDS[kind]:
            if key not in out:
                raise ArgError(f"rope.scaling.{key}", f"{kind} scaling needs {key}", call_site())
        return dict(sorted(out.items()))

    def attrs(self, head_dim: int) -> dict:
        """Attributes of the ``rope`` op for heads of ``head_dim``."""
        attrs = {"head_dim": head_dim, "rotary_dim": self.rotary_dim, "base": self.base,
                 "convention": self.convention, "scaling": _copy(self.scaling)}
        return attrs if self.mrope is None else {**attrs, "mrope": _copy(self.mrope)}

    def mla_attrs(self) -> dict:
        """The ``rope`` attribute of ``mla_attention``."""
        return {"base": self.base, "convention": self.convention, "scaling": _copy(self.scaling)}

    def meta(self) -> dict:
        meta = {"base": self.base, "convention": self.convention, "rotary_dim": self.rotary_dim,
                "scaling": _copy(self.scaling)}
        return meta if self.mrope is None else {**meta, "mrope": _copy(self.mrope)}


def _copy(value):
    return None if value is None else dict(value)


def emit_rope(m: "Model", x: "Tensor", positions: Value, rope: Rope, heads: int, head_dim: int, name: str) -> "Tensor":
    """RoPE on x [B, T, heads*head_dim]: one ``rope`` op, or (``rope.decomposed``) the
    primitives model code writes, on x viewed as [B, T, N, D]:

    half:        x * cos + cat(-x2, x1) * sin,   cos = cos(cat(f, f))     [B, T, 1, R]
    interleaved: the same on pairs [B, T, N, R/2, 2] (x2 the odd, x1 the even slot),
                 cos = cos(f)                                             [B, T, 1, R/2, 1]

    with f = position * inv_freq (a constant; YaRN's attention factor multiplies cos and
    sin) shared by every layer, and the last D - R dims of a partial head passed through."""
    if not rope.decomposed:
        return m.emit("rope", [x, positions], rope.attrs(head_dim), name)[0]
    batch, seq = x.shape[:2]
    rotary = rope.rotary_dim or head_dim
    half = rotary // 2

    def op(kind: str, inputs, attrs, role: str) -> "Tensor":
        return m.emit(kind, inputs, attrs, f"{name}.{role}")[0]

    def last(t: Tensor, start: int, end: int, role: str) -> "Tensor":
        return op("slice", [t], {"axis": -1, "start": start, "end": end}, role)

    cos, sin = _rope_tables(m, positions, rope, rotary)
    split = op("reshape", [x], {"shape": [batch, seq, heads, head_dim]}, "heads")
    part = split if rotary == head_dim else last(split, 0, rotary, "rotary")
    if rope.convention == "half":
        first, second = last(part, 0, half, "x1"), last(part, half, rotary, "x2")
    else:
        part = op("reshape", [part], {"shape": [batch, seq, heads, half, 2]}, "pairs")
        first, second = last(part, 0, 1, "even"), last(part, 1, 2, "odd")
    rotated = op("concat", [op("neg", [second], None, "neg"), first], {"axis": -1}, "rotated")
    out = op("add", [op("mul", [part, cos], None, "cos_part"), op("mul", [rotated, sin], None, "sin_part")], None,
             "sum")
    if rope.convention == "interleaved":
        out = op("reshape", [out], {"shape": [batch, seq, heads, rotary]}, "unpaired")
    if rotary < head_dim:
        out = op("concat", [out, op("slice", [split], {"axis": -1, "start": rotary}, "pass")], {"axis": -1}, "joined")
    return m.emit("reshape", [out], {"shape": [batch, seq, heads * head_dim]}, name)[0]


def _rope_tables(m: "Model", positions: Value, rope: Rope, rotary: int) -> tuple["Tensor", "Tensor"]:
    """cos and sin for the decomposed RoPE, made once per model and configuration."""
    key = (rotary, rope.convention, rope.base, repr(rope.scaling))
    if key not in m._rope_tables:
        inv_freq, factor = rope_op.rope_inv_freq(rotary, rope.base, rope.scaling)
        batch, seq = positions.shape
        const = m.emit("constant", [], {"value": inv_freq.astype(float).tolist(), "dtype": "f32"}, "rope.inv_freq")[0]
        pos = m.emit("cast", [positions], {"to": "f32"}, "rope.positions")[0]
        pos = m.emit("reshape", [pos], {"shape": [batch, seq, 1]}, "rope.positions_BT1")[0]
        freqs = m.emit("mul", [pos, const], None, "rope.freqs")[0]
        if rope.convention == "half":
            angles, shape = m.emit("concat", [freqs, freqs], {"axis": -1}, "rope.angles")[0], [batch, seq, 1, rotary]
        else:
            angles, shape = freqs, [batch, seq, 1, rotary // 2, 1]
        tables = []
        for fn in ("cos", "sin"):
            table = m.emit(fn, [angles], None, f"rope.{fn}")[0]
            if factor != 1.0:
                scale = m.emit("constant", [], {"value": float(factor), "dtype": "f32"}, "rope.attention_factor")[0]
                table = m.emit("mul", [table, scale], None, f"rope.{fn}_scaled")[0]
            tables.append(m.emit("reshape", [table], {"shape": shape}, f"rope.{fn}_heads")[0])
        m._rope_tables[key] = (tables[0], tables[1])
    return m._rope_tables[key]
