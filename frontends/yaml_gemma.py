"""The YAML architecture form's ``model.gemma3n`` and ``model.gemma4`` sections (part of
``frontends.yaml_spec``, whose docstring documents the keys): Gemma-3n's and Gemma-4's
decoders, built by the same functions the Hugging Face frontend calls
(``frontends.dsl_gemma3n.gemma3n_graph``; Gemma-4's decoder loop in
``frontends.hf.families_gemma4`` over ``frontends.dsl_gemma4`` and
``frontends.dsl_gemma_shared``), so a spec and the matching config.json give one graph.

Either section switches the model to that Gemma's layer form: the model keys keep their meaning
(``vocab_size``, ``d_model``, ``n_layers``, ``dtype``, ``norm.eps``, ``attention``'s heads,
head_dim, rope, window and window_pattern, ``mlp.d_ff`` and ``approximate``,
``tied_embeddings``, ``final_softcap``, ``embedding_scale``), and the spec must say what
Gemma-3n is: rms sandwich norms without offset, ``attention.qk_norm: true`` and
``scale: 1.0`` (q, k and v normed per head, unscaled scores), a GeGLU ``mlp``. Keys of other
layer forms (``layers``, ``moe``, the state-space mixers, the residual and logit multipliers,
attention biases, sinks, soft-caps, NoPE layers, decomposed RoPE) are refused at the key.
Local layers (window_pattern ``local``) rotate with ``local_rope_base`` and no scaling,
global ones with ``attention.rope``; the last ``kv_shared_layers`` layers reuse the K/V of the
last earlier layer of their own kind (local or global), as transformers chooses. A sparsity
p becomes the multiplier icdf(p) of the standard normal (what the HF frontend computes).
Gemma-4 (``Gemma4Reader``): global layers take ``global_attention``'s shape and, with
``k_eq_v``, values from the key projection; its last layer must be global (transformers
forces it); every layer ends times its learned ``layer_scalar``; ``moe`` adds the routed
experts beside the MLP; ``double_wide_mlp`` doubles the KV-sharing layers' MLPs.
"""
from __future__ import annotations

from statistics import NormalDist
from typing import Optional

from frontends.dsl_gemma3n import Gemma3nSpec, gemma3n_graph
from frontends.hf.config import Arch, Attention, LayerSpec, RopeSpec
from frontends.hf.families_common import FULL, SLIDING
from frontends.hf.families_gemma4 import Gemma4Arch, Gemma4Layer
from frontends.hf.families_gemma4 import decoder as gemma4_decoder  # Gemma-4's decoder loop, one for both forms
from frontends.yaml_attention import blame
from irc.yamlloc import Bad, Fields, boolean, non_negative_int, number, positive_int, positive_number

GEMMA3N_KEYS = ("altup", "laurel_rank", "per_layer_input", "kv_shared_layers", "activation_sparsity", "d_ff",
                "local_rope_base")
ALTUP_KEYS = ("num_inputs", "active_idx", "correct_scale")
PER_LAYER_INPUT_KEYS = ("hidden_size", "vocab_size")
# model keys of other layer forms, refused beside model.gemma3n and model.gemma4
FOREIGN_MODEL_KEYS = ("layers", "moe", "mamba", "mamba2", "short_conv", "gated_delta", "kimi_delta", "lightning",
                      "normed_residual", "residual_scale", "logits_scale", "learned_positions", "head_bias")
FOREIGN_ATTENTION_KEYS = ("qkv_bias", "out_bias", "sinks", "output_gate", "softcap", "nope_layers",
                          "query_pre_attn_scalar")


def _sparsity(value) -> float:
    p = number(value)
    if not 0 <= p < 1:
        raise Bad(f"sparsity {p} is outside [0, 1) (the cutoff is mean + std * icdf(p))")
    return p


def _per_layer(g: Fields, key: str, kind, n: int, default) -> list:
    """A list of ``n`` values at ``key`` (one per layer), or ``[default] * n`` when absent."""
    values = g.items(key, kind)
    if values is None:
        return [default] * n
    if len(values) != n:
        raise g.error(key, f"{len(values)} entries for {n} layers (model.n_layers)")
    return values


def kv_sources(g: Fields, kinds: list[str]) -> list[Optional[int]]:
    """Per layer the earlier layer whose K/V it reuses (None: its own): the last
    ``kv_shared_layers`` layers, each the last earlier layer of its kind before them."""
    n = len(kinds)
    shared = g.get("kv_shared_layers", non_negative_int, 0)
    if shared and shared >= n:
        raise g.error("kv_shared_layers", f"{shared} shared layers of {n}: no layer computes the keys and values "
                                          "they would share")
    first = n - shared
    sources: list[Optional[int]] = [None] * first
    for i in range(first, n):
        producers = [j for j in range(first) if kinds[j] == kinds[i]]
        if not producers:
            raise g.error("kv_shared_layers", f"layer {i} ({kinds[i]}) reuses the K/V of an earlier {kinds[i]} "
                                              f"layer, and the first {first} layers have none",
                          hint="model.attention.window_pattern sets the kinds")
        sources.append(producers[-1])
    return sources


def _require(fields: Fields, key: str, ok: bool, what: str, family: str) -> None:
    if not ok:
        section = "model." + family.lower().replace("-", "")
        raise fields.error(key, f"{family} {what}", hint=f"{section} fixes this part of the layer form")


def check_form(ex, family: str) -> None:
    """Refuse the model keys that say something other than the Gemmas' layer form (the
    module docstring): ``family`` is Gemma-3n or Gemma-4."""
    section = "model." + family.lower().replace("-", "")
    for key in FOREIGN_MODEL_KEYS:
        if ex.f.data.get(key) is not None:
            raise ex.f.error(key, f"does not apply beside {section}", hint=f"{family}'s layers are its own form")
    if ex.f.data.get("gemma3n") is not None and ex.f.data.get("gemma4") is not None:
        raise ex.f.error("gemma4", "give model.gemma3n or model.gemma4, not both")
    a, n = ex.attn_f, ex.norm_f
    _require(a, "kind", ex.kind != "mla", "attention is grouped-query (gqa, mha or mqa), not mla", family)
    for key in FOREIGN_ATTENTION_KEYS:
        if a.data.get(key) not in (None, False, []):
            raise a.error(key, f"does not apply beside {section}", hint=f"{family}'s attention has none")
    _require(a, "qk_norm", ex.qk_norm in (True, "head"), "norms q, k and v per head: set qk_norm: true", family)
    _require(a, "scale", ex.scale == 1.0, "attention is unscaled: set scale: 1.0", family)
    _require(a, "rope", ex.rope is not None, "rotates q and k: give a rope", family)
    _require(a, "window_pattern", a.has("window_pattern"), "layers are local or global: give window and "
             "window_pattern", family)
    if ex.rope_f.get("decomposed", boolean, False):
        raise ex.rope_f.error("decomposed", f"does not apply beside {section} (its graph writes the rope op)")
    _require(n, "kind", ex.norm_kind == "rms", "norms are rms", family)
    _require(n, "offset", ex.norm_offset == 0.0, "norm weights are plain (offset 0.0), not 1 + w", family)
    _require(n, "sandwich", ex.sandwich, "norms each branch's output too: set sandwich: true", family)
    _require(ex.f if ex.mlp_f is None else ex.mlp_f, "mlp" if ex.mlp_f is None else "kind",
             ex.mlp_f is not None and ex.mlp_kind == "geglu", "MLP is GeGLU: set mlp.kind: geglu", family)


def layer_kinds(ex) -> list[str]:
    """local or global per layer, from ``attention.window_pattern``."""
    return [ex.window_pattern[i % len(ex.window_pattern)] for i in range(ex.n_layers)]


def local_rope(g: Fields) -> RopeSpec:
    return RopeSpec(base=g.get("local_rope_base", positive_number, 10000.0))


class Gemma3nReader:
    """Reads ``model.gemma3n`` over an ``yaml_spec._Expander`` that has read the model keys
    (its ``f``, ``attn_f``, ``norm_f``, ``mlp_f`` and the values they gave), into the
    ``Gemma3nSpec`` and ``Arch`` that ``gemma3n_graph`` takes."""

    def __init__(self, ex, g: Fields):
        self.ex, self.g = ex, g
        check_form(ex, "Gemma-3n")
        n = ex.n_layers
        self.altup_f = g.sub("altup", ALTUP_KEYS, required=True)
        streams = self.altup_f.get("num_inputs", positive_int)
        active = self.altup_f.get("active_idx", non_negative_int, 0)
        if active >= streams:
            raise self.altup_f.error("active_idx", f"{active} is not one of the {streams} streams (num_inputs)")
        self.ple_f = g.sub("per_layer_input", PER_LAYER_INPUT_KEYS, required=True)
        kinds = layer_kinds(ex)
        sparsity = _per_layer(g, "activation_sparsity", _sparsity, n, 0.0)
        self.spec = Gemma3nSpec(
            streams=streams, active=active, correct_scale=self.altup_f.get("correct_scale", boolean, True),
            laurel_rank=g.get("laurel_rank", positive_int),
            per_layer_dim=self.ple_f.get("hidden_size", positive_int),
            per_layer_vocab=self.ple_f.get("vocab_size", positive_int, ex.vocab),
            d_ff=_per_layer(g, "d_ff", positive_int, n, ex.d_ff),
            sparsity=[NormalDist().inv_cdf(p) if p > 0 else None for p in sparsity],
            kv_source=kv_sources(g, kinds), approximate=ex.approximate)
        rope = ex.rope
        ropes = {"local": local_rope(g), "global": RopeSpec(rope.base, rope.convention, rope.scaling, rope.rotary_dim)}
        head_dim = ex.head_dim or ex.d_model // ex.heads
        self.arch = Arch(
            name=ex.name, model_type="gemma3n_text", dtype=ex.dtype, vocab_size=ex.vocab, d_model=ex.d_model,
            n_layers=n, norm_eps=ex.norm_eps,
            attention=Attention("gqa", ex.heads, ex.kv_heads, head_dim, qk_norm=True, scale=1.0),
            layers=[LayerSpec(ex.window if kind == "local" else None, ropes[kind]) for kind in kinds],
            mlp={"kind": "geglu", "d_ff": self.spec.d_ff[0], "approximate": ex.approximate}, sandwich=True,
            tied=ex.tied, final_softcap=ex.final_softcap, embedding_scale=ex.embedding_scale)

    def graph(self):
        ex, g = self.ex, self.g
        table = {"intermediate_size": (g, "d_ff"), "activation_sparsity_pattern": (g, "activation_sparsity"),
                 "num_kv_shared_layers": (g, "kv_shared_layers"), "altup_active_idx": (self.altup_f, "active_idx"),
                 "vocab": (ex.f, "vocab_size"), "d_model": (ex.f, "d_model"), "name": (ex.f, "name"),
                 "n": (ex.f, "n_layers"), "head_dim": (ex.attn_f, "head_dim"), "heads": (ex.attn_f, "n_heads"),
                 "kv_heads": (ex.attn_f, "n_kv_heads"), **ex._rope_table()}
        with blame(g, table):
            return gemma3n_graph(self.spec, self.arch, ex.f.origin("gemma3n"))


GEMMA4_KEYS = ("global_attention", "k_eq_v", "per_layer_input", "kv_shared_layers", "double_wide_mlp", "moe",
               "local_rope_base")
GLOBAL_ATTENTION_KEYS = ("head_dim", "n_kv_heads")
GEMMA4_MOE_KEYS = ("experts", "top_k", "d_ff")


class Gemma4Reader:
    """Reads ``model.gemma4`` over an ``yaml_spec._Expander`` (as ``Gemma3nReader`` does) into
    the ``Gemma4Arch`` that ``frontends.hf.families_gemma4``'s decoder loop takes."""

    def __init__(self, ex, g: Fields):
        self.ex, self.g = ex, g
        check_form(ex, "Gemma-4")
        kinds = layer_kinds(ex)
        if kinds[-1] != "global":
            raise ex.attn_f.error("window_pattern", f"Gemma-4's last layer (layer {ex.n_layers - 1}) is global, "
                                                    "this pattern makes it local",
                                  hint="transformers makes the last layer full attention whatever layer_types says")
        if ex.rope_f.has("rotary_dim"):
            raise ex.rope_f.error("rotary_dim", "does not apply beside model.gemma4",
                                  hint="partial rotation is rope.scaling {kind: proportional, "
                                       "partial_rotary_factor}")
        self.global_f = g.sub("global_attention", GLOBAL_ATTENTION_KEYS)
        head_dim = ex.head_dim or ex.d_model // ex.heads
        shapes = {"local": (ex.kv_heads, head_dim), "global": (ex.kv_heads, head_dim)}
        if self.global_f is not None:
            kv = self.global_f.get("n_kv_heads", positive_int, ex.kv_heads)
            if ex.heads % kv:
                raise self.global_f.error("n_kv_heads", f"{ex.heads} heads are not divisible by {kv} kv heads")
            shapes["global"] = (kv, self.global_f.get("head_dim", positive_int, head_dim))
        k_eq_v = g.get("k_eq_v", boolean, False)
        wide = g.get("double_wide_mlp", boolean, False)
        shares = kv_sources(g, kinds)
        ropes = {"local": local_rope(g), "global": RopeSpec(ex.rope.base, ex.rope.convention, ex.rope.scaling)}
        layers = [Gemma4Layer(FULL if kind == "global" else SLIDING, *shapes[kind], k_eq_v and kind == "global",
                              source, ex.d_ff * (2 if wide and source is not None else 1),
                              ex.window if kind == "local" else None, ropes[kind])
                  for kind, source in zip(kinds, shares)]
        self.ple_f = g.sub("per_layer_input", PER_LAYER_INPUT_KEYS)
        width = self.ple_f.get("hidden_size", positive_int) if self.ple_f is not None else 0
        vocab = self.ple_f.get("vocab_size", positive_int, ex.vocab) if self.ple_f is not None else 0
        self.moe_f = g.sub("moe", GEMMA4_MOE_KEYS)
        moe = None
        if self.moe_f is not None:
            moe = {key: self.moe_f.get(key, positive_int) for key in GEMMA4_MOE_KEYS}
            if moe["top_k"] > moe["experts"]:
                raise self.moe_f.error("top_k", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
            moe.update(norm_topk_prob=True, activation="gelu_tanh" if ex.approximate == "tanh" else "gelu")
        first = layers[0]
        self.arch = Gemma4Arch(
            name=ex.name, model_type="gemma4_text", dtype=ex.dtype, vocab_size=ex.vocab, d_model=ex.d_model,
            n_layers=ex.n_layers, norm_eps=ex.norm_eps,
            attention=Attention("gqa", ex.heads, first.kv_heads, first.head_dim, qk_norm=True, scale=1.0),
            layers=[LayerSpec(spec.window, spec.rope, moe is not None) for spec in layers], moe=moe,
            mlp={"kind": "geglu", "d_ff": ex.d_ff, "approximate": ex.approximate}, sandwich=True, tied=ex.tied,
            final_softcap=ex.final_softcap, embedding_scale=ex.embedding_scale, checkpoint="gemma4",
            expand=gemma4_decoder, gemma4_layers=layers, ple_width=width, ple_vocab=vocab,
            approximate=ex.approximate)

    def graph(self):
        ex, g = self.ex, self.g
        table = {"num_kv_shared_layers": (g, "kv_shared_layers"), "vocab": (ex.f, "vocab_size"),
                 "d_model": (ex.f, "d_model"), "name": (ex.f, "name"), "n": (ex.f, "n_layers"),
                 "head_dim": (self.global_f or ex.attn_f, "head_dim"), "heads": (ex.attn_f, "n_heads"),
                 **ex._rope_table()}
        if self.moe_f is not None:
            table.update({"experts": (self.moe_f, "experts"), "top_k": (self.moe_f, "top_k")})
        with blame(g, table):
            return gemma4_decoder(self.arch, ex.f.origin("gemma4"))
