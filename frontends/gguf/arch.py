"""Reading GGUF hyperparameters: typed ``{arch}.*`` keys, the shared dimensions, RoPE.

``Hparams`` reads keys without the architecture prefix and names the full key in every
error (``llama.attention.head_count: missing required key``). RoPE comes from
``rope.freq_base``, ``rope.dimension_count`` (partial rotary) and ``rope.scaling.*``
(linear, yarn; DeepSeek's ``yarn_log_multiplier`` is 0.1 * mscale_all_dim, ``yarn_attn_factor``
HF's ``attention_factor``), or, for
Llama 3's scaling, from the ``rope_freqs`` tensor of per-frequency divisors llama.cpp's
converter writes: irc recognises Llama 3's formula in it (``llama3_factors``) and refuses
any other table. ``frontends.gguf.families`` builds each family from these.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from frontends.gguf.reader import GGUFFile
from frontends.hf.config import Arch, Attention, RopeSpec
from irc import limits

LLAMA3_CANDIDATES = ((1.0, 4.0, 8192), (1.0, 4.0, 4096), (1.0, 4.0, 2048), (1.0, 4.0, 16384))
LLAMA3_ARCHS = ("llama", "llama4", "arcee", "exaone", "exaone4")  # whose converters write Llama 3 RoPE as rope_freqs


_REQUIRED = object()


class Hparams:
    """Typed, checked reads of ``{arch}.*`` keys; errors name the full key."""

    def __init__(self, gguf: GGUFFile):
        self.gguf, self.arch = gguf, gguf.arch

    def key(self, key: str) -> str:
        return self.gguf.arch_key(key)

    def has(self, key: str) -> bool:
        return self.gguf.has(self.key(key))

    def error(self, key: str, detail: str, hint: Optional[str] = None):
        return self.gguf.error(self.key(key), detail, hint)

    def count(self, key: str, default=_REQUIRED, minimum: int = 1):
        """An integer >= ``minimum``; a per-layer array is accepted when its entries agree."""
        full = self.key(key)
        if not self.gguf.has(full):
            if default is _REQUIRED:
                raise self.error(key, "missing required key")
            return default
        if self.gguf.is_array(full):
            values = self.gguf.get(full, list)
            if not values or len(set(values)) != 1:
                raise self.error(key, f"per-layer values {values[:8]} differ; irc needs one value")
            value = values[0]
        else:
            value = self.gguf.get(full, int)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def number(self, key: str, default=_REQUIRED, positive: bool = True):
        full = self.key(key)
        if not self.gguf.has(full):
            if default is _REQUIRED:
                raise self.error(key, "missing required key")
            return default
        value = self.gguf.get(full, float)
        if positive and not value > 0:
            raise self.error(key, f"expected a positive number, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        return self.gguf.get(self.key(key), bool, default)

    def text(self, key: str, default: str) -> str:
        return self.gguf.get(self.key(key), str, default)


# ---- shared readers ---------------------------------------------------------------------

def read_dims(hp: Hparams) -> dict:
    d = hp.count("embedding_length")
    heads = hp.count("attention.head_count")
    kv_heads = hp.count("attention.head_count_kv", heads)
    head_dim = head_size(hp, d, heads, kv_heads)
    layers = hp.count("block_count")
    for key, value, check in (("block_count", layers, limits.check_layers), ("embedding_length", d, limits.check_dim),
                              ("attention.head_count", heads, limits.check_dim)):
        try:  # before anything per layer or per head is made (irc.limits)
            check(value)
        except limits.LimitError as err:
            raise hp.error(key, err.message, err.hint) from None
    return {"d": d, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "layers": layers}


def head_size(hp: Hparams, d: int, heads: int, kv_heads: int) -> int:
    """The attention head size: ``attention.key_length``, else embedding_length / heads
    (``attention.value_length``, where given, must agree; within irc's limits), after
    checking that the kv heads divide the heads."""
    if heads % kv_heads:
        raise hp.error("attention.head_count_kv", f"{heads} heads are not divisible by {kv_heads} kv heads")
    if not hp.has("attention.key_length") and d % heads:
        raise hp.error("attention.head_count", f"embedding_length {d} is not divisible by {heads} heads",
                       hint=f"give {hp.key('attention.key_length')}")
    head_dim = hp.count("attention.key_length", d // heads)
    value_dim = hp.count("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise hp.error("attention.value_length", f"{value_dim} differs from the key length {head_dim}",
                       hint="irc's attention has one head size for keys and values")
    try:
        limits.check_dim(head_dim)
    except limits.LimitError as err:
        raise hp.error("attention.key_length", err.message, err.hint) from None
    return head_dim


def _vocab(hp: Hparams) -> int:
    if hp.has("vocab_size"):
        return hp.count("vocab_size")
    if "token_embd.weight" in hp.gguf.tensors:
        return hp.gguf.tensors["token_embd.weight"].shape[0]
    raise hp.error("vocab_size", "missing required key (and no token_embd.weight to read it from)")


def make_arch(hp: Hparams, name: str, model_type: str, dims: dict, attention: Attention, layers: list, mlp,
               **extra) -> Arch:
    return Arch(name=name, model_type=model_type, dtype="f32", vocab_size=_vocab(hp), d_model=dims["d"],
                n_layers=dims["layers"], norm_eps=hp.number("attention.layer_norm_rms_epsilon"), attention=attention,
                layers=layers, mlp=mlp, tied="output.weight" not in hp.gguf.tensors, checkpoint=hp.arch, **extra)


def moe_layers(hp: Hparams, n: int) -> list[bool]:
    return [f"blk.{i}.ffn_gate_inp.weight" in hp.gguf.tensors for i in range(n)]


def dense_mlp(hp: Hparams, moe_flags: list[bool], kind: str = "swiglu") -> Optional[dict]:
    if all(moe_flags):
        return None
    mlp = {"kind": kind, "d_ff": hp.count("feed_forward_length")}
    return {**mlp, "approximate": "tanh"} if kind == "geglu" else mlp


def window_layers(hp: Hparams, n: int, period: int) -> list[bool]:
    """Which layers are local: ``sliding_window_pattern`` (a period, or one bool per layer)
    or the family's period, by llama.cpp's rule (layer i is local iff i % p < p - 1)."""
    key = "attention.sliding_window_pattern"
    if hp.gguf.is_array(hp.key(key)):
        pattern = hp.gguf.get(hp.key(key), list)
        if len(pattern) != n:
            raise hp.error(key, f"has {len(pattern)} entries for {n} layers")
        return [bool(p) for p in pattern]
    period = hp.count(key, period, minimum=0)
    return [period == 0 or i % period < period - 1 for i in range(n)]


# ---- RoPE --------------------------------------------------------------------------------

def read_rope(hp: Hparams, head_dim: int, convention: str = "half", base: Optional[float] = None,
          scaled: bool = True) -> RopeSpec:
    base = hp.number("rope.freq_base", 10000.0) if base is None else base
    rotary = hp.count("rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise hp.error("rope.dimension_count", f"rotates {rotary} of {head_dim} dims",
                       hint="irc rotates an even number of dims, at most the head size")
    scaling = _scaling(hp, base, rotary) if scaled else None
    return RopeSpec(base, convention, scaling, None if rotary == head_dim else rotary)


def _scaling(hp: Hparams, base: float, dim: int) -> Optional[dict]:
    kind = hp.text("rope.scaling.type", "none")
    if kind == "none" and hp.has("rope.scale_linear"):
        return {"kind": "linear", "factor": hp.number("rope.scale_linear")}
    if kind == "none":
        return _llama3_from_freqs(hp, base, dim)
    if kind == "linear":
        return {"kind": "linear", "factor": hp.number("rope.scaling.factor")}
    if kind != "yarn":
        raise hp.error("rope.scaling.type", f"{kind!r} is not supported", hint="RoPE scaling irc reads from GGUF: "
                       "none, linear, yarn (and Llama 3's rope_freqs)")
    scaling = {"kind": "yarn", "factor": hp.number("rope.scaling.factor"),
               "original_max_position": hp.count("rope.scaling.original_context_length")}
    for field in ("beta_fast", "beta_slow"):
        if hp.has(f"rope.scaling.yarn_{field}"):
            scaling[field] = hp.number(f"rope.scaling.yarn_{field}")
    if hp.has("rope.scaling.yarn_attn_factor"):  # HF's attention_factor, as the converter copies it
        scaling["attention_factor"] = hp.number("rope.scaling.yarn_attn_factor")
    log_multiplier = hp.number("rope.scaling.yarn_log_multiplier", None, positive=False)
    if log_multiplier:  # DeepSeek: 0.1 * mscale_all_dim, and llama.cpp takes mscale equal to it
        scaling["mscale"] = scaling["mscale_all_dim"] = log_multiplier / 0.1
    return scaling


def llama3_factors(dim: int, base: float, factor: float, low: float, high: float, old: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter stores as ``rope_freqs`` for Llama 3
    scaling (its own formula, in float32 as it computes it)."""
    freqs = (1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    smooth = (old / wavelen - low) / (high - low)
    factors = np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor,
                                                           1 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def _llama3_from_freqs(hp: Hparams, base: float, dim: int) -> Optional[dict]:
    """Llama 3 scaling read back from the ``rope_freqs`` tensor (None when there is none)."""
    entry = hp.gguf.tensors.get("rope_freqs.weight")
    if entry is None:
        return None
    stored = np.asarray(entry.data, dtype=np.float32).reshape(-1)
    if hp.arch not in LLAMA3_ARCHS or stored.shape != (dim // 2,):
        raise hp.gguf.error("rope_freqs.weight", f"per-frequency RoPE factors {list(entry.shape)} are not "
                            f"supported for {hp.arch} with {dim} rotary dims")
    if np.all(stored == 1):
        return None
    factor = float(stored.max())
    for low, high, old in LLAMA3_CANDIDATES:
        if np.allclose(llama3_factors(dim, base, factor, low, high, old), stored, rtol=1e-5, atol=0):
            return {"kind": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position": old}
    raise hp.gguf.error("rope_freqs.weight", "per-frequency RoPE factors that are not Llama 3's scaling "
                        "(low 1, high 4, original context 2k-16k) are not supported")
