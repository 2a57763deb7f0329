"""GPT-2's descendants (``frontends.hf.families`` registers them): LayerNorms with bias,
learned positions or GPT-J's rotary, fused or per-projection attention; GPT-BigCode, GPT-J,
CodeGen and BioGPT built by the classic loop (``families_classic.expand``), GPT-Neo and GPT-1
by this module's (``expand``: windows per layer, an output bias without q/k/v biases, norms
after the residual adds).

=================  ==========================================================================
gpt_bigcode        SantaCoder / StarCoder-1: GPT-2's sequential pre-LayerNorm layers and
                   learned positions (``wpe``), the fused ``c_attn`` an ``nn.Linear`` (stored
                   [out, in]: no transpose) of q | k | v with one kv head (``multi_query``),
                   or per head q | k | v without it; biases everywhere, GELU
                   (``activation_function``), scale head_dim^-0.5 (1 without
                   ``scale_attn_weights``), tied
gptj               GPT-J: one LayerNorm feeding attention and MLP in parallel (x + attn(h) +
                   mlp(h)), RoPE on the first ``rotary_dim`` features of each head in
                   adjacent pairs (2i, 2i + 1: "interleaved"), no q/k/v/out biases, a biased
                   MLP (``fc_in``, ``fc_out``), a final LayerNorm, an LM head with bias
codegen            CodeGen: GPT-J's layer with one fused ``qkv_proj`` whose 3·d rows are 4
                   groups (``mp_num``, fixed in transformers) of [q | v | k] slices of d/4
                   rows each: q, k and v are read as the rows each group gives them
gpt_neo            GPT-Neo: GPT-2's layers and learned positions, separate q/k/v without bias,
                   ``out_proj`` with; ``attention_types`` ([[kinds, repeats], ...]) makes each
                   layer global or local, a local one seeing the ``window_size`` latest keys
                   (itself included: irc's window); no score scaling (scale 1); tied
openai-gpt         GPT-1: learned positions, LayerNorms after each residual add
                   (x = ln_1(x + attn(x)); x = ln_2(x + mlp(x))), no final norm; GPT-2's Conv1D
                   weights (stored [in, out], read transposed), biases, ``afn`` gelu (the tanh
                   form, as transformers' ACT_FNS has it) or relu; tied
biogpt             BioGPT: OPT's pre-LayerNorm layers (``self_attn_layer_norm``,
                   ``final_layer_norm``, the model's ``layer_norm``), q/k/v/out and fc1/fc2
                   biases, learned positions 2 rows in (OPT's table), the embeddings times
                   sqrt(d) with ``scale_embedding``, GELU (``hidden_act``) or ReLU, tied
                   (``output_projection``)
=================  ==========================================================================

Transformers' eager GPT-Neo masks a local layer with tril(1) xor tril(1, -window_size) over
cache indices: key j is visible to the query at index i iff i - window_size < j <= i,
``irc.ops.attention``'s window. BioGPT's LayerNorms are ``nn.LayerNorm``'s default eps 1e-5
(transformers reads no ``layer_norm_eps``); irc uses the same.

Refused, naming config.json and the key: GPT-BigCode's ``add_cross_attention``, a
``rotary_dim`` that is odd or exceeds head_dim (GPT-J, CodeGen; transformers fails there too),
CodeGen's hidden size not divisible by 4 (its qkv groups), GPT-Neo's ``attention_types``
giving other than ``num_layers`` layers or a kind other than global / local, an activation
other than GELU's forms (GPT-1 and BioGPT: and ReLU).

Left out: xglm (sinusoidal positions, computed rather than stored: irc has no such position
form).
"""
from __future__ import annotations

import math
from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec
from frontends.hf.families_classic import (GELU, _arch, _base_model_resolve, _conv1d, _gelu, _gpt2_columns, _heads,
                                           _mlp, _neox_rows)
from frontends.hf.weights import View
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

_GPTJ = {"vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
         "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}
DEFAULTS = {  # transformers 5.25's config classes
    "gpt_bigcode": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
                    "n_inner": None, "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5,
                    "scale_attn_weights": True, "multi_query": True, "add_cross_attention": False,
                    "tie_word_embeddings": True},
    "gptj": dict(_GPTJ),
    "codegen": dict(_GPTJ),
    "gpt_neo": {"vocab_size": 50257, "max_position_embeddings": 2048, "hidden_size": 2048, "num_layers": 24,
                "attention_types": [[["global", "local"], 12]], "num_heads": 16, "intermediate_size": None,
                "window_size": 256, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                "tie_word_embeddings": True},
    "openai-gpt": {"vocab_size": 40478, "n_positions": 512, "n_embd": 768, "n_layer": 12, "n_head": 12,
                   "afn": "gelu", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
    "biogpt": {"vocab_size": 42384, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
               "intermediate_size": 4096, "hidden_act": "gelu", "max_position_embeddings": 1024,
               "scale_embedding": True, "tie_word_embeddings": True},
}
CODEGEN_GROUPS = 4  # CodeGenAttention.mp_num: the model-parallel shards its qkv_proj rows are grouped by
CODEGEN_PARTS = "qvk"  # each group's slices, in order
BIOGPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row = position + 2
BIOGPT_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default: BioGPT's norms take no eps from the config
OPENAI_ACT = {"gelu": "tanh", "relu": "relu"}  # transformers' openai ACT_FNS: its "gelu" is gelu_new
NEO_KINDS = ("global", "local")


def _gpt_bigcode(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("n_embd", positive_int), cfg.get("n_layer", layer_count)
    heads = _heads(cfg, d, "n_head")
    cfg.check("add_cross_attention", lambda v: not v, hint="irc builds GPT-BigCode's decoder without "
              "cross-attention (transformers has none with multi_query either)")
    mlp = {"kind": "gelu", "d_ff": cfg.get("n_inner", positive_int, None) or 4 * d, "bias": True,
           "approximate": _gelu(cfg, "activation_function"), "positions": cfg.get("n_positions", positive_int)}
    scale = None if cfg.get("scale_attn_weights", boolean) else 1.0
    kv_heads = 1 if cfg.get("multi_query", boolean) else heads
    return _arch(cfg, name, model_type, d, n, heads, None, mlp, "sequential",
                 cfg.get("layer_norm_epsilon", positive_number), kv_heads=kv_heads, qkv_bias=True, scale=scale)


def _rotary(cfg: Config, d: int, heads: int) -> RopeSpec:
    """GPT-J's rotary: base 10000, adjacent pairs, over ``rotary_dim`` features (None: the
    hidden size, as transformers' table is; only whole heads of one head then work)."""
    head_dim = d // heads
    rotary = cfg.get("rotary_dim", positive_int, None) or d
    if rotary > head_dim:
        raise cfg.error("rotary_dim", f"{rotary} exceeds head_dim {head_dim} (transformers fails there too)")
    if rotary % 2:
        raise cfg.error("rotary_dim", f"RoPE rotates pairs: needs an even dimension, got {rotary}")
    return RopeSpec(10000.0, "interleaved", rotary_dim=None if rotary == head_dim else rotary)


def _gptj(cfg: Config, name: str, model_type: str) -> Arch:
    """GPT-J and CodeGen: the parallel layer, interleaved partial rotary, biases on the MLP
    and the LM head only."""
    d, n = cfg.get("n_embd", positive_int), cfg.get("n_layer", layer_count)
    heads = _heads(cfg, d, "n_head")
    if model_type == "codegen" and d % CODEGEN_GROUPS:
        raise cfg.error("n_embd", f"CodeGen's qkv_proj is {CODEGEN_GROUPS} groups: {d} is not divisible by "
                                  f"{CODEGEN_GROUPS} (transformers fails there too)")
    mlp = {"kind": "gelu", "d_ff": cfg.get("n_inner", positive_int, None) or 4 * d, "bias": True,
           "approximate": _gelu(cfg, "activation_function")}
    return _arch(cfg, name, model_type, d, n, heads, _rotary(cfg, d, heads), mlp, "parallel_one_norm",
                 cfg.get("layer_norm_epsilon", positive_number), qkv_bias=False)


def _neo_kinds(cfg: Config, n: int) -> list[str]:
    """GPT-Neo's ``attention_types`` expanded as its config class does: each [kinds, repeats]
    gives kinds repeats times."""
    raw, kinds = cfg.raw("attention_types"), []
    if not isinstance(raw, list):
        raise cfg.error("attention_types", f"expected a list of [kinds, repeats], got {raw!r}")
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
                and isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 0):
            raise cfg.error("attention_types", f"expected [kinds, repeats], got {item!r}")
        for kind in item[0]:
            if kind not in NEO_KINDS:
                raise cfg.unsupported("attention_types", kind, hint="GPT-Neo's layers are global or local")
        kinds += item[0] * item[1]
    if len(kinds) != n:
        raise cfg.error("attention_types", f"gives {len(kinds)} layers for {n} (num_layers)")
    return kinds


def _gpt_neo(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_layers", layer_count)
    heads = _heads(cfg, d, "num_heads")
    kinds = _neo_kinds(cfg, n)
    window = cfg.get("window_size", positive_int) if "local" in kinds else None
    mlp = {"kind": "gelu", "d_ff": cfg.get("intermediate_size", positive_int, None) or 4 * d, "bias": True,
           "approximate": _gelu(cfg, "activation_function"),
           "positions": cfg.get("max_position_embeddings", positive_int)}
    arch = _arch(cfg, name, model_type, d, n, heads, None, mlp, "sequential",
                 cfg.get("layer_norm_epsilon", positive_number), scale=1.0)
    arch.layers = [LayerSpec(window if kind == "local" else None, None) for kind in kinds]
    arch.expand = partial(expand, "sequential")
    return arch


def _activation(cfg: Config, key: str, forms: dict) -> dict:
    """The ungated MLP's kind for ``key``'s value: ReLU or a GELU form (``forms``)."""
    activation = cfg.raw(key)
    if not isinstance(activation, str) or activation not in forms:
        raise cfg.unsupported(key, activation, hint=f"this family's MLP here: {', '.join(forms)}")
    return {"kind": "relu"} if forms[activation] == "relu" else {"kind": "gelu", "approximate": forms[activation]}


def _openai_gpt(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("n_embd", positive_int), cfg.get("n_layer", layer_count)
    heads = _heads(cfg, d, "n_head")
    mlp = {**_activation(cfg, "afn", OPENAI_ACT), "d_ff": 4 * d, "bias": True,
           "positions": cfg.get("n_positions", positive_int)}
    arch = _arch(cfg, name, model_type, d, n, heads, None, mlp, "sequential",
                 cfg.get("layer_norm_epsilon", positive_number), qkv_bias=True)
    arch.expand = partial(expand, "post_norm")
    return arch


def _biogpt(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    mlp = {**_activation(cfg, "hidden_act", {**GELU, "relu": "relu"}),
           "d_ff": cfg.get("intermediate_size", positive_int), "bias": True, "position_offset": BIOGPT_POSITION_OFFSET,
           "positions": cfg.get("max_position_embeddings", positive_int) + BIOGPT_POSITION_OFFSET}
    arch = _arch(cfg, name, model_type, d, n, heads, None, mlp, "sequential", BIOGPT_LAYER_NORM_EPS, qkv_bias=True)
    arch.embedding_scale = math.sqrt(d) if cfg.get("scale_embedding", boolean) else None
    return arch


def expand(form: str, arch: Arch, origin: str):
    """The decoder through the DSL, learned positions added to the tokens: ``sequential``
    (GPT-Neo: x + attn(ln1(x)); x + mlp(ln2(x)); a final LayerNorm; each layer's window from
    ``arch.layers``) or ``post_norm`` (GPT-1: x = ln1(x + attn(x)); x = ln2(x + mlp(x)), no
    final norm); q/k/v biases with ``qkv_bias``, the output projection's always; the LM head
    without bias."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    post = form == "post_norm"
    with m.at(origin):
        x = m.embed_positions(embedded_inputs(m, arch), mlp["positions"])
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = x if post else layer.layer_norm(x, "attn_norm", eps)
            y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, window=spec.window,
                                scale=a.scale, qkv_bias=a.qkv_bias, out_bias=True)
            if post:
                x = layer.layer_norm(x + y, "post_attn_norm", eps)
                x = layer.layer_norm(x + _mlp(layer, x, mlp), "post_mlp_norm", eps)
            else:
                x = x + y
                x = x + _mlp(layer, layer.layer_norm(x, "mlp_norm", eps), mlp)
        m.logits(x if post else m.layer_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _bigcode_rows(part: int, suffix: str):
    """The rows of q (0), k (1) or v (2) in GPT-BigCode's ``c_attn`` [d + 2·K·D, d]:
    q | k | v with one kv head, per head q | k | v without ``multi_query``."""
    def source(arch: Arch, prefix: str) -> View:
        a = arch.attention
        if a.kv_heads != 1:
            return _neox_rows(part, "attn.c_attn")(suffix)(arch, prefix)
        q = a.heads * a.head_dim
        start = 0 if part == 0 else q + (part - 1) * a.head_dim
        return View(f"{prefix}attn.c_attn.{suffix}", rows=range(start, start + (q if part == 0 else a.head_dim)))
    return source


def _codegen_rows(part: str):
    """The rows of ``part`` (q, k or v) in CodeGen's ``qkv_proj`` [3·d, d]: 4 groups of
    [q | v | k] slices of d/4 rows, q (k, v) the groups' slices in order."""
    def source(arch: Arch, prefix: str) -> View:
        local = arch.d_model // CODEGEN_GROUPS
        slot = CODEGEN_PARTS.index(part)
        rows = [(g * len(CODEGEN_PARTS) + slot) * local + i for g in range(CODEGEN_GROUPS) for i in range(local)]
        return View(f"{prefix}attn.qkv_proj.weight", rows=rows)
    return source


def _norms(names: dict) -> dict:
    return {f"{k}{s}": f"{v}.{w}" for k, v in names.items() for s, w in (("", "weight"), (".bias", "bias"))}


def _mlp_names(up: str, down: str, conv1d: bool = False) -> dict:
    weight = _conv1d if conv1d else (lambda name: name)
    return {"mlp.w_up": weight(f"{up}.weight"), "mlp.b_up": f"{up}.bias",
            "mlp.w_down": weight(f"{down}.weight"), "mlp.b_down": f"{down}.bias"}


def _top(prefix: str, **names) -> dict:
    return {"embed": f"{prefix}wte.weight", "norm": f"{prefix}ln_f.weight", "norm.bias": f"{prefix}ln_f.bias", **names}


_LN = {"attn_norm": "ln_1", "mlp_norm": "ln_2"}
_GPTJ_LAYOUT = {**_norms({"attn_norm": "ln_1"}), "attn.wo": "attn.out_proj.weight",
                **_mlp_names("mlp.fc_in", "mlp.fc_out"),
                "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
                "_top": _top("transformer.", lm_head="lm_head.weight", **{"lm_head.bias": "lm_head.bias"})}
LAYOUTS = {
    "gpt_bigcode": {**_norms(_LN), **{f"attn.w{x}": _bigcode_rows(i, "weight") for i, x in enumerate("qkv")},
                    **{f"attn.b{x}": _bigcode_rows(i, "bias") for i, x in enumerate("qkv")},
                    "attn.wo": "attn.c_proj.weight", "attn.bo": "attn.c_proj.bias",
                    **_mlp_names("mlp.c_fc", "mlp.c_proj"),
                    "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
                    "_top": _top("transformer.", embed_positions="transformer.wpe.weight")},
    "gptj": {**_GPTJ_LAYOUT, **{f"attn.w{x}": f"attn.{x}_proj.weight" for x in "qkv"},
             "_spare_suffixes": (".attn.bias", ".attn.masked_bias")},  # old checkpoints' causal-mask buffers
    "codegen": {**_GPTJ_LAYOUT, **{f"attn.w{x}": _codegen_rows(x) for x in "qkv"},
                "_spare_suffixes": (".attn.causal_mask",)},
    "gpt_neo": {**_norms(_LN), **{f"attn.w{x}": f"attn.attention.{x}_proj.weight" for x in "qkv"},
                "attn.wo": "attn.attention.out_proj.weight", "attn.bo": "attn.attention.out_proj.bias",
                **_mlp_names("mlp.c_fc", "mlp.c_proj"),
                "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
                "_spare_suffixes": (".attn.attention.bias", ".attn.attention.masked_bias"),
                "_top": _top("transformer.", embed_positions="transformer.wpe.weight")},
    "openai-gpt": {**_norms({"post_attn_norm": "ln_1", "post_mlp_norm": "ln_2"}),
                   **{f"attn.w{x}": _gpt2_columns(i, "weight") for i, x in enumerate("qkv")},
                   **{f"attn.b{x}": _gpt2_columns(i, "bias") for i, x in enumerate("qkv")},
                   "attn.wo": _conv1d("attn.c_proj.weight"), "attn.bo": "attn.c_proj.bias",
                   **_mlp_names("mlp.c_fc", "mlp.c_proj", conv1d=True),
                   "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
                   "_spare_suffixes": (".attn.bias",),
                   "_top": {"embed": "transformer.tokens_embed.weight",
                            "embed_positions": "transformer.positions_embed.weight"}},
    "biogpt": {**_norms({"attn_norm": "self_attn_layer_norm", "mlp_norm": "final_layer_norm"}),
               **{f"attn.{w}{x}": f"self_attn.{x}_proj.{n}" for x in "qkv"
                  for w, n in (("w", "weight"), ("b", "bias"))},
               "attn.wo": "self_attn.out_proj.weight", "attn.bo": "self_attn.out_proj.bias", **_mlp_names("fc1", "fc2"),
               "_prefix": "biogpt.layers.", "_resolve": partial(_base_model_resolve, prefix="biogpt."),
               "_spare_suffixes": ("output_projection.weight",),  # the tied head, where a checkpoint keeps it
               "_top": {"embed": "biogpt.embed_tokens.weight", "embed_positions": "biogpt.embed_positions.weight",
                        "norm": "biogpt.layer_norm.weight", "norm.bias": "biogpt.layer_norm.bias",
                        "lm_head": "output_projection.weight"}},
}
FAMILIES = {"gpt_bigcode": _gpt_bigcode, "gptj": _gptj, "codegen": _gptj, "gpt_neo": _gpt_neo,
            "openai-gpt": _openai_gpt, "biogpt": _biogpt}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
