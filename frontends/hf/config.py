"""config.json -> a normalised architecture description (``Arch``).

``Config`` reads a Hugging Face ``config.json`` with typed getters whose errors are
``SpecError``s naming the file (with the line of the key where it can be found), the key
path and the value: ``.../config.json:17: rope_parameters.rope_type: longrope is not
supported``. Families (``frontends.hf.families``) turn a ``Config`` into an ``Arch``: one
plain description of the decoder that ``frontends.hf.build`` expands through the DSL.

RoPE settings come in two forms and both are read (``read_rope``):

- current (transformers 5.x): ``rope_parameters: {rope_type, rope_theta, factor, ...}``,
  nested per layer type for Gemma 3 (``{sliding_attention: {...}, full_attention: {...}}``);
- older: ``rope_theta`` next to ``rope_scaling: {type | rope_type, factor, ...}`` (or null).

HF names map to irc's scaling dict (``irc.ops.rope``): ``rope_type`` -> ``kind``, ``original_max_
position_embeddings`` -> ``original_max_position``, ``partial_rotary_factor`` -> rotary width.

The Mamba mixers' settings (``mamba_config``, ``mamba2_config``) are read under whichever
keys a family gives them (``MAMBA_KEYS``, ``MAMBA2_KEYS``: Mamba's ``state_size`` is
Jamba's ``mamba_d_state``), with transformers' checks: heads x head_dim = expand x
hidden_size where the family validates it, n_groups dividing the heads.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from irc.yamlloc import Bad, boolean, positive_int, positive_number, size
from irc.errors import SpecError
from frontends.hf.longrope import read_longrope

CONFIG = "config.json"
_MISSING = object()

DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
ROPE_KEYS = ("rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
             "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
             "truncate", "partial_rotary_factor", "short_factor", "long_factor")
# model_type -> old RoPE type names its config class renames (Phi-3: "su" and "yarn" are LongRoPE)
KIND_ALIASES = {"phi3": {"su": "longrope", "yarn": "longrope"}}
SCALING_FIELDS = {  # HF name -> irc name, for the scaling kinds irc implements
    "factor": "factor", "original_max_position_embeddings": "original_max_position",
    "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor", "beta_fast": "beta_fast",
    "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
    "attention_factor": "attention_factor", "truncate": "truncate",
}
SCALING_USES = {  # the HF fields each kind reads (the others are ignored, as HF does)
    "linear": ("factor",), "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


# ---- the description ---------------------------------------------------------------------

@dataclass
class RopeSpec:
    """The arguments of ``dsl.Rope``."""
    base: float
    convention: str = "half"
    scaling: Optional[dict] = None
    rotary_dim: Optional[int] = None
    mrope: Optional[dict] = None  # multi-axis positions (Qwen-VL's text model: frontends.hf.vlm_qwen)


def dsl_rope(spec: Optional[RopeSpec]):
    """``spec`` as the DSL's ``Rope`` (None: a layer without rotary)."""
    if spec is None:
        return None
    from frontends.dsl import Rope

    return Rope(**asdict(spec))


@dataclass
class Attention:
    """``kind`` "gqa" (any grouping, MHA and MQA included) or "mla"; ``mla`` holds the
    DeepSeek ranks and head widths (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim)."""
    kind: str
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    qk_norm: bool = False
    softcap: Optional[float] = None
    scale: Optional[float] = None
    mla: Optional[dict] = None
    query_scale: Optional[tuple] = None  # Llama-4's by position (Ministral-3): (beta, original, max positions)
    alibi: Optional[tuple] = None  # ALiBi's per-head slopes (irc.ops.alibi), in place of RoPE
    clip_qkv: Optional[float] = None  # q, k and v clamped to [-c, c] (MPT)
    out_bias: bool = False  # a bias on the output projection, attn.bo (Seed-OSS, Llama's attention_bias)


@dataclass
class LayerSpec:
    """What varies per layer: the sliding window, the RoPE, dense MLP or MoE, the mixer
    (``attention``, ``mamba``, ``mamba2``, or None for a layer that is only a feed-forward
    block) and whether an MLP/MoE block follows it (``ffn``)."""
    window: Optional[int]
    rope: Optional[RopeSpec]
    moe: bool = False
    mixer: Optional[str] = "attention"
    ffn: bool = True


@dataclass
class Arch:
    """A decoder as irc builds it. ``mlp`` is ``{"kind": swiglu | geglu | relu2, "d_ff": n,
    "approximate": tanh | none, "bias": relu2's biases}`` (None when no layer has a dense
    MLP); ``moe`` holds the keyword arguments of ``Layer.moe``; ``ssm`` those of ``Layer.mamba`` / ``Layer.mamba2`` (its
    ``kind`` names which) for the layers whose mixer is a state-space one; ``attention`` is
    None in a model without attention layers; ``checkpoint`` names the family's weight
    layout."""
    name: str
    model_type: str
    dtype: str
    vocab_size: int
    d_model: int
    n_layers: int
    norm_eps: float
    attention: Optional[Attention]
    layers: list[LayerSpec]
    mlp: Optional[dict]
    moe: Optional[dict] = None
    norm_offset: float = 0.0
    sandwich: bool = False
    tied: bool = False
    final_softcap: Optional[float] = None
    embedding_scale: Optional[float] = None
    checkpoint: str = "llama"
    quantized: bool = False
    ssm: Optional[dict] = None
    residual_scale: Optional[float] = None  # each branch times this before its residual add (Granite)
    logits_scale: Optional[float] = None  # the logits times this (Granite: 1 / logits_scaling)
    expand: Optional[Callable] = None  # a family the shared loop cannot express: (arch, origin) -> Graph
    encoder: Optional[Any] = None  # the embedding-model form (frontends.hf.encoder.Encoder): no caches, no logits
    mtp: Optional[Any] = None  # the checkpoint's multi-token-prediction head (frontends.hf.mtp.MtpHead)
    image_token: Optional[int] = None  # a VLM's: image features take this token's rows (frontends.hf.vlm)
    image_blocks: str = "none"  # ... and what its image opens in the mask (dsl_vision.BIDIRECTIONAL)
    deepstack: int = 0  # ... and the DeepStack levels its first layers add (Qwen3-VL)


# ---- reading config.json ----------------------------------------------------------------

class Config:
    """A parsed config.json plus the family's defaults for keys it leaves out."""

    def __init__(self, data: dict, path: str, text: str = "", defaults: Optional[dict] = None):
        self.data, self.path, self.text = data, path, text
        self.defaults = dict(defaults or {})

    @classmethod
    def read(cls, folder: str) -> "Config":
        path = os.path.join(folder, CONFIG)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise SpecError(f"cannot read {CONFIG}: {err.strerror}", location=path) from None
        except UnicodeDecodeError as err:
            raise SpecError(f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})",
                            location=path) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"invalid JSON: {err.msg}", location=f"{path}:{err.lineno}:{err.colno}") from None
        except (ValueError, RecursionError) as err:  # an integer of thousands of digits; runaway nesting
            reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(":")[0]
            raise SpecError(f"invalid JSON: {reason}", location=path) from None
        if not isinstance(data, dict):
            raise SpecError("expected a JSON object at the top level", location=path)
        return cls(data, path, text)

    # ---- locations and errors ----------------------------------------------------------
    def where(self, key: str) -> str:
        """``path:line`` of a (dotted) key, or of the deepest part of it the text has; the
        bare path when not even the first part is there (a missing key)."""
        position = None
        for part in key.split("."):
            match = re.compile(r'"%s"\s*:' % re.escape(part)).search(self.text, position or 0)
            if match is None:
                break
            position = match.start()
        if position is None:
            return self.path
        return f"{self.path}:{self.text.count(chr(10), 0, position) + 1}"

    def error(self, key: str, detail: str, hint: Optional[str] = None) -> SpecError:
        return SpecError(f"{key}: {detail}", location=self.where(key), hint=hint)

    def unsupported(self, key: str, value: Any, hint: Optional[str] = None) -> SpecError:
        return self.error(key, f"{_show(value)} is not supported", hint)

    # ---- getters -----------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        """The value as written (null included), else the family default, else ``default``."""
        if key in self.data:
            return self.data[key]
        return self.defaults.get(key, default)

    def get(self, key: str, kind: Callable, default: Any = _MISSING):
        """``kind(value)`` of a key. A key left out takes the family default (what
        transformers' config class would use), else ``default``; a key written as null
        means None, as it does to transformers: ``default``, if one is given."""
        if key in self.data:
            value = self.data[key]
            if value is None:
                if default is _MISSING:
                    raise self.error(key, "expected a value, got null")
                return default
        elif key in self.defaults:
            value = self.defaults[key]
            if value is None:
                return None
        elif default is not _MISSING:
            return default
        else:
            raise self.error(key, "missing required key")
        try:
            return kind(value)
        except Bad as err:
            raise self.error(key, str(err)) from None

    def check(self, key: str, allowed: Callable[[Any], bool], hint: Optional[str] = None) -> None:
        """Refuse a setting irc does not implement (``allowed(value)`` false)."""
        value = self.raw(key)
        if not allowed(value):
            raise self.unsupported(key, value, hint)

    def dtype(self) -> str:
        for key in ("dtype", "torch_dtype"):
            value = self.data.get(key)
            if value is not None:
                if not isinstance(value, str) or value not in DTYPES:
                    raise self.unsupported(key, value, hint=f"dtypes: {', '.join(DTYPES)}")
                return DTYPES[value]
        return "f32"


class NestedConfig(Config):
    """One object inside config.json (a multimodal config's ``text_config`` or
    ``vision_config``): keys are read inside it, errors name ``<key>.<inner key>`` at its line,
    and ``defaults`` are the inner config class's."""

    def __init__(self, outer: Config, key: str, defaults: dict, what: str, hint: Optional[str] = None):
        data = outer.data.get(key)
        if not isinstance(data, dict):
            raise outer.error(key, f"expected {what} (an object)", hint=hint)
        super().__init__(data, outer.path, outer.text, defaults)
        self.key = key

    def where(self, key: str) -> str:
        return super().where(f"{self.key}.{key}")

    def error(self, key: str, detail: str, hint: Optional[str] = None) -> SpecError:
        return SpecError(f"{self.key}.{key}: {detail}", location=self.where(key), hint=hint)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, bool)) or value is None else repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


# ---- value kinds (raise Bad; Config.get names the key) ------------------------------------

def int_list(value):
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise Bad(f"expected a list of integers, got {_show(value)}")
    return value


def string_list(value):
    if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
        raise Bad(f"expected a list of strings, got {_show(value)}")
    return value


# ---- RoPE --------------------------------------------------------------------------------

def rope_dict(cfg: Config, layer_type: Optional[str] = None) -> tuple[dict, str]:
    """The RoPE settings as one flat dict in the current form, and the key path to blame.

    ``layer_type`` picks a per-layer-type entry of a nested ``rope_parameters`` (Gemma 3)."""
    params = cfg.data.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise cfg.error("rope_parameters", f"expected an object, got {_show(params)}")
        key = "rope_parameters"
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params, key = params[layer_type], f"rope_parameters.{layer_type}"
        elif any(isinstance(v, dict) for v in params.values()):
            raise cfg.error("rope_parameters", "per-layer-type RoPE settings are not supported for this model",
                            hint="only Gemma 3 nests rope_parameters by layer type")
        return dict(params), key
    scaling = cfg.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise cfg.error("rope_scaling", f"expected an object or null, got {_show(scaling)}")
    merged = dict(scaling or {})
    return merged, "rope_scaling"


def read_rope(cfg: Config, head_dim: int, params: dict, key: str, *, default_base: float = 10000.0,
              convention: str = "half", original_max: Optional[int] = None) -> RopeSpec:
    """A ``RopeSpec`` from a flat settings dict (``rope_dict``) for heads of ``head_dim``.

    ``rope_theta`` and ``partial_rotary_factor`` fall back to top-level keys, then to
    ``default_base`` and the family's default (1 without one). ``original_max`` is the pretraining length YaRN and Llama 3 use
    when the dict does not give one (HF: ``max_position_embeddings``)."""
    kind = params.get("rope_type", params.get("type", "default"))
    kind_key = f"{key}.rope_type" if "rope_type" in params else f"{key}.type"
    if not isinstance(kind, str):
        raise cfg.error(kind_key, f"expected a string, got {_show(kind)}")
    kind = KIND_ALIASES.get(cfg.data.get("model_type"), {}).get(kind, kind)
    if kind not in ("default", "longrope") and kind not in SCALING_USES:
        raise cfg.unsupported(kind_key, kind, hint=f"RoPE types irc implements: default, longrope, "
                                                   f"{', '.join(SCALING_USES)}")
    for name in params:
        if name not in ROPE_KEYS:
            raise cfg.error(f"{key}.{name}", "unknown RoPE setting",
                            hint=f"irc reads {', '.join(k for k in ROPE_KEYS if k != 'type')}")
    base = params.get("rope_theta", cfg.data.get("rope_theta", default_base))
    try:
        base = positive_number(base)
    except Bad as err:
        raise cfg.error(f"{key}.rope_theta" if "rope_theta" in params else "rope_theta", str(err)) from None
    partial = params.get("partial_rotary_factor", cfg.raw("partial_rotary_factor"))  # the file's, else the class's
    rotary_dim = None
    if partial is not None:
        where = f"{key}.partial_rotary_factor" if "partial_rotary_factor" in params else "partial_rotary_factor"
        if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
            raise cfg.error(where, f"expected a number in (0, 1], got {_show(partial)}")
        rotary_dim = int(head_dim * partial)
        if rotary_dim % 2:
            raise cfg.error(where, f"rotates {rotary_dim} of {head_dim} dims, an odd number",
                            hint="irc rotates pairs; the rotary width must be even")
        rotary_dim = None if rotary_dim == head_dim else rotary_dim
    if kind == "default":
        return RopeSpec(base, convention, None, rotary_dim)
    if kind == "longrope":
        return RopeSpec(base, convention, read_longrope(cfg, params, key, rotary_dim or head_dim, original_max),
                        rotary_dim)
    scaling = {"kind": kind}
    for hf_name in SCALING_USES[kind]:
        value = params.get(hf_name)
        if value is None or (hf_name != "truncate" and value == 0):
            continue  # HF treats an absent, null or zero setting as unset
        if hf_name == "truncate":
            if not isinstance(value, bool):
                raise cfg.error(f"{key}.truncate", f"expected true or false, got {_show(value)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise cfg.error(f"{key}.{hf_name}", f"expected a positive number, got {_show(value)}")
        scaling[SCALING_FIELDS[hf_name]] = value
    if kind in ("yarn", "llama3") and "original_max_position" not in scaling:
        top = cfg.data.get("original_max_position_embeddings") or original_max
        if top is None:
            raise cfg.error(f"{key}.original_max_position_embeddings", f"{kind} RoPE needs it")
        if isinstance(top, bool) or not isinstance(top, (int, float)) or not math.isfinite(top) or top <= 0:
            raise cfg.error("original_max_position_embeddings", f"expected a positive number, got {_show(top)}")
        scaling["original_max_position"] = top
    if kind == "dynamic":  # HF's dynamic NTK measures against max_position_embeddings
        if original_max is None:
            raise cfg.error("max_position_embeddings", "dynamic RoPE needs it")
        scaling["original_max_position"] = original_max
    if kind == "yarn" and "factor" not in scaling and original_max:  # HF: the ratio of the two lengths
        scaling["factor"] = original_max / scaling["original_max_position"]
    if "factor" not in scaling:
        raise cfg.error(f"{key}.factor", f"{kind} RoPE needs a factor")
    for name, value in list(scaling.items()):
        if name == "original_max_position":
            scaling[name] = int(value)
        elif name not in ("kind", "truncate"):
            scaling[name] = float(value)
    if kind == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if name not in scaling:
                raise cfg.error(f"{key}.{name}", "llama3 RoPE needs it")
    return RopeSpec(base, convention, scaling, rotary_dim)


# ---- attention sizes, layer kinds and the Mamba mixers ------------------------------------------

def layer_types(cfg: Config, n_layers: int, kinds, family: str = "") -> list:
    """``layer_types`` checked: each entry one of ``kinds``, one entry per layer."""
    types = cfg.get("layer_types", string_list)
    for kind in types:
        if kind not in kinds:
            raise cfg.unsupported("layer_types", kind, hint=f"{family + ' ' if family else ''}layer kinds: "
                                                           f"{', '.join(kinds)}")
    if len(types) != n_layers:
        raise cfg.error("layer_types", f"has {len(types)} entries for {n_layers} layers (num_hidden_layers)")
    return types


def attention_dims(cfg: Config) -> tuple[int, int, int, int]:
    """(hidden_size, heads, kv heads, head_dim); head_dim defaults to hidden_size / heads."""
    d = cfg.get("hidden_size", size)
    heads = cfg.get("num_attention_heads", size)
    kv_heads = cfg.get("num_key_value_heads", size, heads)
    head_dim = cfg.get("head_dim", size, None)
    if head_dim is None:
        if d % heads:
            raise cfg.error("num_attention_heads", f"hidden_size {d} is not divisible by {heads} heads",
                            hint="give head_dim")
        head_dim = d // heads
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    return d, heads, kv_heads, head_dim


# a mixer setting -> the config.json key it is read from (transformers' Mamba / Mamba2 names;
# a family passes its own); "d_inner" and "expand" may be None: d_inner = expand x hidden_size,
# and no heads x head_dim check
MAMBA_KEYS = {"expand": "expand", "d_inner": "intermediate_size", "state_size": "state_size",
              "conv_kernel": "conv_kernel", "dt_rank": "time_step_rank", "conv_bias": "use_conv_bias",
              "proj_bias": "use_bias"}
MAMBA2_KEYS = {"heads": "num_heads", "head_dim": "head_dim", "state_size": "state_size", "groups": "n_groups",
               "conv_kernel": "conv_kernel", "expand": "expand", "conv_bias": "use_conv_bias",
               "proj_bias": "use_bias", "time_step_limit": "time_step_limit"}


def mamba_config(cfg: Config, d: int, keys: dict = MAMBA_KEYS, bcdt_norm: Optional[str] = None,
                 eps: Optional[float] = None) -> dict:
    """``Layer.mamba`` arguments from a Mamba-1 mixer's keys; ``bcdt_norm`` "plain"
    (Falcon-Mamba) or "weighted" (Jamba) RMS-normalises dt, B and C with ``eps``. The time
    step rank "auto" is ceil(hidden_size / 16)."""
    d_inner = keys["d_inner"]
    if d_inner is not None and cfg.has(d_inner):
        d_inner = cfg.get(d_inner, positive_int)
    else:
        d_inner = cfg.get(keys["expand"], positive_int) * d
    rank = keys["dt_rank"]
    config = {"kind": "mamba", "d_inner": d_inner, "state_size": cfg.get(keys["state_size"], positive_int),
              "conv_kernel": cfg.get(keys["conv_kernel"], positive_int),
              "dt_rank": math.ceil(d / 16) if cfg.raw(rank) == "auto" else cfg.get(rank, positive_int),
              "conv_bias": cfg.get(keys["conv_bias"], boolean), "proj_bias": cfg.get(keys["proj_bias"], boolean),
              "bcdt_norm": bcdt_norm}
    if bcdt_norm is not None:
        config["norm_eps"] = eps
    return config


def _special_float(value):
    """transformers 5 writes an infinite float as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict) and set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity"):
        return float(value["__float__"].replace("Infinity", "inf"))
    return value


def time_step_limit(cfg: Config, key: str = "time_step_limit") -> tuple[float, Optional[float]]:
    """(dt_min, dt_max) from a [low, high] pair (high infinite: None)."""
    value = cfg.raw(key)
    if isinstance(value, (list, tuple)):
        value = [_special_float(v) for v in value]
    if not isinstance(value, (list, tuple)) or len(value) != 2 or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise cfg.error(key, f"expected [low, high], got {_show(value)}")
    low, high = float(value[0]), float(value[1])
    if not 0 <= low <= high:
        raise cfg.error(key, f"expected 0 <= low <= high, got {_show(value)}")
    return low, None if math.isinf(high) else high


def mamba2_config(cfg: Config, d: int, keys: dict = MAMBA2_KEYS, eps: Optional[float] = None,
                  group_norm: bool = True) -> dict:
    """``Layer.mamba2`` arguments from a Mamba-2 mixer's keys, with the checks of
    transformers' ``validate_architecture``; a head_dim of "auto" is expand x hidden_size /
    heads (Bamba, Granite). The gated norm's eps is ``eps``, else ``layer_norm_epsilon``;
    it is grouped by n_groups unless ``group_norm`` is false."""
    heads_key, head_dim_key, groups_key, expand_key = keys["heads"], keys["head_dim"], keys["groups"], keys["expand"]
    heads = cfg.get(heads_key, positive_int)
    groups = cfg.get(groups_key, positive_int)
    expand = cfg.get(expand_key, positive_int) if expand_key is not None else None
    if expand is not None and cfg.raw(head_dim_key) == "auto":
        head_dim = max(expand * d // heads, 1)
    else:
        head_dim = cfg.get(head_dim_key, positive_int)
    if expand is not None and heads * head_dim != expand * d:
        raise cfg.error(heads_key, f"{heads} heads x {head_dim} head_dim ({head_dim_key}) = {heads * head_dim} is "
                                   f"not {expand_key} x hidden_size = {expand * d}")
    if heads % groups:
        raise cfg.error(groups_key, f"{groups} groups do not divide {heads} heads ({heads_key})")
    dt_min, dt_max = time_step_limit(cfg, keys["time_step_limit"]) if keys["time_step_limit"] else (0.0, None)
    d_inner = heads * head_dim
    return {"kind": "mamba2", "heads": heads, "head_dim": head_dim,
            "state_size": cfg.get(keys["state_size"], positive_int), "groups": groups,
            "conv_kernel": cfg.get(keys["conv_kernel"], positive_int),
            "conv_bias": cfg.get(keys["conv_bias"], boolean), "proj_bias": cfg.get(keys["proj_bias"], boolean),
            "dt_min": dt_min, "dt_max": dt_max,
            "norm_eps": eps if eps is not None else cfg.get("layer_norm_epsilon", positive_number),
            "norm_group_size": d_inner // groups if group_norm else None}
