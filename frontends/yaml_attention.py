"""The YAML architecture form's attention section (part of ``frontends.yaml_spec``, whose
docstring documents the keys): ``model.attention`` and its ``rope`` read into the arguments
of ``Layer.attention`` / ``Layer.mla_attention``, per layer (windows, NoPE layers)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from frontends.dsl import ArgError, Rope
from frontends.dsl_rope import SCALING_FIELDS, SCALING_KINDS
from irc.ops.alibi import bloom_slopes, mpt_slopes
from irc.yamlloc import Bad, Fields, boolean, choice, non_negative_int, optional, positive_int, positive_number

MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "norm_eps")
NOT_MLA_KEYS = ("n_kv_heads", "head_dim", "qkv_bias", "qk_norm", "output_gate", "window", "window_pattern",
                "softcap", "out_bias", "sinks", "alibi")
ATTENTION_KEYS = ("kind", "n_heads", "rope", "scale", "query_pre_attn_scalar", "nope_layers") + NOT_MLA_KEYS + MLA_KEYS
ALIBI_RULES = {"bloom": bloom_slopes, "mpt": mpt_slopes}  # the slopes' rule for a head count
ROPE_KEYS = ("base", "convention", "rotary_dim", "scaling", "decomposed")


def _qk_norm(value):
    """false, true (per head), head, full (over all of q's and k's features: OLMo-2's) or
    layer (a LayerNorm per head with a weight per head: Cohere's)."""
    if value in (False, True, "head", "full", "layer") and not (value == 0 and value is not False) and \
            not (value == 1 and value is not True):
        return value
    raise Bad(f"expected false, true, head, full or layer, got {value!r}")


def _numbers(value):
    """A list of positive numbers (LongRoPE's short_factor / long_factor)."""
    if not isinstance(value, list):
        raise Bad(f"expected a list of positive numbers, got {value!r}")
    return [positive_number(v) for v in value]


@contextmanager
def blame(fields: Fields, table: Optional[dict] = None):
    """Re-raise a DSL ArgError at the YAML key it came from: ``table`` maps a DSL argument
    to (Fields, key); other arguments are taken as keys of ``fields``."""
    try:
        yield
    except ArgError as err:
        owner, key = (table or {}).get(err.arg, (fields, err.arg))
        raise (owner or fields).error(key, err.detail, hint=err.hint) from None


class AttentionReader:
    """Mixin of ``yaml_spec._Expander``: needs its ``n_layers``, ``norm_eps`` and
    ``norm_offset``."""

    n_layers: int
    norm_eps: float
    norm_offset: float

    def _read_attention(self, a: Fields) -> None:
        self.kind = a.get("kind", choice("mha", "gqa", "mqa", "mla"))
        self.heads = a.get("n_heads", positive_int)
        self.rope_f = a.sub("rope", ROPE_KEYS)
        self.scaling_f = self.rope_f.sub("scaling", ("kind",) + tuple(SCALING_FIELDS)) if self.rope_f else None
        self.rope = self._read_rope()
        nope = a.items("nope_layers", non_negative_int) or []
        for i in nope:
            if i >= self.n_layers:
                raise a.error("nope_layers", f"layer {i} is past the last layer ({self.n_layers - 1})")
        if nope and self.rope is None:
            raise a.error("nope_layers", "NoPE layers need a rope to leave out")
        self.nope_layers = set(nope)
        self.scale = a.get("scale", optional(positive_number), None)
        scalar = a.get("query_pre_attn_scalar", optional(positive_number), None)
        if scalar is not None:
            if self.scale is not None:
                raise a.error("query_pre_attn_scalar", "give scale or query_pre_attn_scalar, not both")
            self.scale = scalar ** -0.5
        if self.kind == "mla":
            for key in NOT_MLA_KEYS:
                if a.has(key):
                    raise a.error(key, "does not apply to kind mla")
            self.q_lora_rank = a.get("q_lora_rank", optional(positive_int), None)
            self.mla = {key: a.get(key, positive_int) for key in MLA_KEYS[1:-1]}
            self.mla_eps = a.get("norm_eps", positive_number, self.norm_eps)
            if a.has("rope") and a.data["rope"] is None:  # rope: null on MLA -> no rotation (Kimi-Linear)
                self.rope = False
            return
        for key in MLA_KEYS:
            if a.has(key):
                raise a.error(key, "applies to kind mla only")
        kv = a.get("n_kv_heads", positive_int, None)
        if self.kind == "mha" and kv not in (None, self.heads):
            raise a.error("n_kv_heads", f"mha has one kv head per head ({self.heads}), got {kv}",
                          hint="use kind: gqa")
        if self.kind == "mqa" and kv not in (None, 1):
            raise a.error("n_kv_heads", f"mqa has a single kv head, got {kv}", hint="use kind: gqa")
        if self.kind == "gqa" and kv is None:
            raise a.error("n_kv_heads", "kind gqa needs n_kv_heads")
        self.kv_heads = {"mha": self.heads, "mqa": 1}.get(self.kind, kv)
        self.head_dim = a.get("head_dim", positive_int, None)
        self.qkv_bias = a.get("qkv_bias", boolean, False)
        self.qk_norm = a.get("qk_norm", _qk_norm, False)
        self.out_bias = a.get("out_bias", boolean, False)
        self.sinks = a.get("sinks", boolean, False)
        self.alibi = a.get("alibi", optional(choice(*ALIBI_RULES)), None)
        if self.alibi is not None and self.rope is not None:
            raise a.error("alibi", "ALiBi and RoPE are two position encodings: give rope: null (or no rope) with it")
        self.output_gate = a.get("output_gate", boolean, False)
        self.softcap = a.get("softcap", optional(positive_number), None)
        self.window = a.get("window", optional(positive_int), None)
        pattern = a.items("window_pattern", choice("local", "global"))
        if pattern is not None:
            if self.window is None:
                raise a.error("window_pattern", "a window pattern needs window")
            if not pattern:
                raise a.error("window_pattern", "expected at least one entry")
        self.window_pattern = pattern or ["local"]

    def _read_rope(self) -> Optional[Rope]:
        r = self.rope_f
        if r is None:
            return None
        base = r.get("base", positive_number, 10000.0)
        convention = r.get("convention", choice("half", "interleaved"), "half")
        rotary_dim = r.get("rotary_dim", optional(positive_int), None)
        decomposed = r.get("decomposed", boolean, False)
        scaling = None
        s = self.scaling_f
        if s is not None:
            scaling = {"kind": s.get("kind", choice(*SCALING_KINDS))}
            for key, kind in SCALING_FIELDS.items():
                if s.has(key):
                    scaling[key] = s.get(key, {int: positive_int, bool: boolean, list: _numbers}.get(kind,
                                                                                                    positive_number))
        with blame(r, self._rope_table()):
            return Rope(base=base, convention=convention, scaling=scaling, rotary_dim=rotary_dim,
                        decomposed=decomposed)

    def _rope_table(self) -> dict:
        table = {f"rope.{key}": (self.rope_f, key) for key in ROPE_KEYS}
        if self.scaling_f is not None:
            table.update({f"rope.scaling.{key}": (self.scaling_f, key) for key in ("kind",) + tuple(SCALING_FIELDS)})
        return table

    def _attention_table(self) -> dict:
        a = self.attn_f
        table = {"heads": (a, "n_heads"), "kv_heads": (a, "n_kv_heads"), "rope": (a, "rope"), "alibi": (a, "alibi")}
        if self.rope_f is not None:
            table.update(self._rope_table())
        return table

    def _attention(self, layer, h):
        if self.kind == "mla":
            return layer.mla_attention(h, self.heads, q_lora_rank=self.q_lora_rank, rope=self.rope,
                                       eps=self.mla_eps, scale=self.scale, **self.mla)
        local = self.window_pattern[layer.index % len(self.window_pattern)] == "local"
        return layer.attention(h, self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                               rope=None if layer.index in self.nope_layers else self.rope, window=self.window if local else None, softcap=self.softcap,
                               scale=self.scale, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
                               qk_norm_eps=self.norm_eps, qk_norm_offset=self.norm_offset,
                               output_gate=self.output_gate, out_bias=self.out_bias, sinks=self.sinks,
                               alibi=None if self.alibi is None else ALIBI_RULES[self.alibi](self.heads))

