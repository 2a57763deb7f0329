"""The classic decoders, LayerNorm with bias and biases everywhere (``frontends.hf.families``
registers them), each built by its own loop through the DSL (``expand``, set as ``Arch.expand``).

=================  ==========================================================================
gpt2               GPT-2: learned absolute positions (``wpe``), pre-LayerNorm (``ln_1``,
                   ``ln_2``, ``ln_f``), the fused ``c_attn`` and every Conv1D weight stored
                   [in, out] (read transposed), biases, GELU (``activation_function``), softmax
                   scale head_dim^-0.5 (1 without ``scale_attn_weights``), tied
gpt_neox           GPT-NeoX / Pythia: LayerNorms with bias, the fused ``query_key_value`` whose
                   rows hold per head q | k | v, biases (``attention_bias``), partial rotary
                   (``rope_parameters.partial_rotary_factor``), GELU; with
                   ``use_parallel_residual`` x + attn(ln1(x)) + mlp(ln2(x)), else two
                   sequential residual adds; untied ``embed_out``
phi                Phi-1/2: one LayerNorm feeding attention and MLP in parallel, x + attn(h) +
                   mlp(h); biases on q, k, v, ``dense`` and the MLP; partial rotary; GELU; a
                   final LayerNorm and an LM head with bias
falcon             Falcon: ``new_decoder_architecture`` (40B/180B: grouped KV by
                   ``num_kv_heads``, ``ln_attn`` and ``ln_mlp`` in parallel, or one
                   ``input_layernorm`` with ``num_ln_in_parallel_attn`` 1) or the first
                   (7B: ``multi_query``, one norm in parallel with ``parallel_attn``, else
                   sequential); the fused ``query_key_value`` in each layout; biases with
                   ``bias``; GELU; tied by default; with ``alibi``, ALiBi in place of RoPE
                   (BLOOM's slopes in bfloat16, over √head_dim, as transformers adds them;
                   transformers also rounds each slope x position to bfloat16, irc does
                   not: equal where those products are exact, as with 8 heads or fewer)
opt                OPT: learned absolute positions whose table starts 2 rows in (row =
                   position + 2, ``max_position_embeddings`` + 2 rows), pre-LayerNorm
                   (``self_attn_layer_norm``, ``final_layer_norm``, the decoder's
                   ``final_layer_norm``; eps 1e-5), q/k/v/``out_proj`` and ``fc1``/``fc2``
                   with biases (``enable_bias``), softmax scale head_dim^-0.5, ReLU (or a
                   GELU form: ``activation_function``), tied by default; names under
                   ``model.decoder.`` or, as the hub's checkpoints saved from ``OPTModel``
                   have them, under ``decoder.``
=================  ==========================================================================

Refused, naming config.json and the key: GPT-2's ``scale_attn_by_inverse_layer_idx``, Phi's
``qk_layernorm``, an activation other than GELU's forms (OPT: and ReLU), a
partial rotary factor giving an odd rotary width (the DSL's refusal, named at the key), OPT's
post-LayerNorm layers (``do_layer_norm_before`` false: OPT-350m), its ``project_in`` /
``project_out`` (``word_embed_proj_dim`` other than ``hidden_size``), LayerNorms without
weights (``layer_norm_elementwise_affine`` false) and ``_remove_final_layer_norm``.
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from frontends.hf.families_common import embedded_inputs
from frontends.hf.layouts import checkpoint_source
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from frontends.hf.families_common import _rope
from frontends.hf.weights import View
from irc.dtypes import DType
from irc.ops.alibi import bloom_slopes
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.24's config classes
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
             "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True},
    "gpt_neox": {"hidden_act": "gelu", "layer_norm_eps": 1e-5, "use_parallel_residual": True, "attention_bias": True,
                 "tie_word_embeddings": False, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                 "partial_rotary_factor": 0.25},
    "falcon": {"vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
               "num_ln_in_parallel_attn": None, "layer_norm_epsilon": 1e-5, "num_kv_heads": None, "alibi": False,
               "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True, "bias": False,
               "max_position_embeddings": 2048, "rope_theta": 10000.0, "ffn_hidden_size": None, "activation": "gelu",
               "tie_word_embeddings": True},
    "phi": {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "qk_layernorm": False, "tie_word_embeddings": False,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "opt": {"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
            "max_position_embeddings": 2048, "do_layer_norm_before": True, "_remove_final_layer_norm": False,
            "word_embed_proj_dim": None, "num_attention_heads": 12, "activation_function": "relu",
            "enable_bias": True, "layer_norm_elementwise_affine": True, "tie_word_embeddings": True},
}
OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row = position + 2
OPT_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default; OPTConfig has no key for it
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def _gelu(cfg: Config, key: str) -> str:
    activation = cfg.raw(key)
    if activation not in GELU:
        raise cfg.unsupported(key, activation, hint=f"this family's MLP is GELU: {', '.join(GELU)}")
    return GELU[activation]


def _arch(cfg: Config, name: str, model_type: str, d: int, n: int, heads: int, rope, mlp: dict, form: str,
          eps: float, kv_heads=None, **attention) -> Arch:
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=eps,
                attention=Attention("gqa", heads, kv_heads or heads, d // heads, **attention),
                layers=[LayerSpec(None, rope)] * n,
                mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type)
    arch.expand = partial(expand, form)
    return arch


def _heads(cfg: Config, d: int, key: str) -> int:
    heads = cfg.get(key, positive_int)
    if d % heads:
        raise cfg.error(key, f"hidden size {d} is not divisible by {heads} heads")
    return heads


def _gpt2(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("n_embd", positive_int), cfg.get("n_layer", layer_count)
    heads = _heads(cfg, d, "n_head")
    cfg.check("scale_attn_by_inverse_layer_idx", lambda v: not v, hint="irc scales every layer alike")
    mlp = {"kind": "gelu", "d_ff": cfg.get("n_inner", positive_int, None) or 4 * d, "bias": True,
           "approximate": _gelu(cfg, "activation_function"), "positions": cfg.get("n_positions", positive_int)}
    scale = None if cfg.get("scale_attn_weights", boolean) else 1.0
    return _arch(cfg, name, model_type, d, n, heads, None, mlp, "gpt2", cfg.get("layer_norm_epsilon", positive_number),
                 qkv_bias=True, scale=scale)


def _gpt_neox(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    mlp = {"kind": "gelu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": _gelu(cfg, "hidden_act"),
           "bias": True}
    form = "parallel_two_norms" if cfg.get("use_parallel_residual", boolean) else "sequential"
    return _arch(cfg, name, model_type, d, n, heads, neox_rope(cfg, d // heads), mlp, form,
                 cfg.get("layer_norm_eps", positive_number), qkv_bias=cfg.get("attention_bias", boolean))


def neox_rope(cfg: Config, head_dim: int):
    """GPT-NeoX's RoPE (GPT-NeoX-Japanese's too): ``rope_parameters``, else the legacy
    ``rotary_emb_base`` and ``rotary_pct`` Pythia's configs give (both config classes read them)."""
    params, key = rope_dict(cfg)
    for name, legacy in (("rope_theta", "rotary_emb_base"), ("partial_rotary_factor", "rotary_pct")):
        if name not in params and cfg.raw(legacy) is not None:
            params[name] = cfg.raw(legacy)
    return read_rope(cfg, head_dim, params, key, default_base=cfg.defaults["rope_theta"],
                     original_max=cfg.get("max_position_embeddings", positive_int, None))


def _phi(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    cfg.check("qk_layernorm", lambda v: not v, hint="Phi's optional q/k LayerNorms are not supported")
    if cfg.raw("num_key_value_heads") not in (None, heads):
        raise cfg.unsupported("num_key_value_heads", cfg.raw("num_key_value_heads"),
                              hint="Phi-1/2 are multi-head: one kv head per head")
    mlp = {"kind": "gelu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": _gelu(cfg, "hidden_act"),
           "bias": True}
    return _arch(cfg, name, model_type, d, n, heads, _rope(cfg, d // heads), mlp, "parallel_one_norm",
                 cfg.get("layer_norm_eps", positive_number), qkv_bias=True)


def _falcon(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    new = cfg.get("new_decoder_architecture", boolean)
    if new:
        kv_heads = cfg.get("num_kv_heads", positive_int, None) or heads
        if heads % kv_heads:
            raise cfg.error("num_kv_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
        norms = cfg.get("num_ln_in_parallel_attn", positive_int, None) or 2
        if norms not in (1, 2):
            raise cfg.unsupported("num_ln_in_parallel_attn", norms, hint="Falcon has 1 or 2 norms in parallel")
        form = "parallel_two_norms" if norms == 2 else "parallel_one_norm"
    else:
        kv_heads = 1 if cfg.get("multi_query", boolean) else heads
        form = "parallel_one_norm" if cfg.get("parallel_attn", boolean) else "sequential"
    bias = cfg.get("bias", boolean)
    mlp = {"kind": "gelu", "d_ff": cfg.get("ffn_hidden_size", positive_int, None) or 4 * d,
           "approximate": _gelu(cfg, "activation"), "bias": bias, "head_bias": False}
    alibi = _falcon_alibi(heads, d // heads) if cfg.get("alibi", boolean) else None
    arch = _arch(cfg, name, model_type, d, n, heads, None if alibi else _rope(cfg, d // heads), mlp, form,
                 cfg.get("layer_norm_epsilon", positive_number), kv_heads=kv_heads, qkv_bias=bias, alibi=alibi)
    arch.checkpoint = ({2: "falcon_new", 1: "falcon_new_one_norm"}[norms] if new else
                       "falcon_multi_query" if kv_heads == 1 else "falcon")
    return arch


def _falcon_alibi(heads: int, head_dim: int) -> tuple:
    """Falcon's ALiBi slopes: BLOOM's rounded to bfloat16 (transformers' ``build_alibi_tensor``
    multiplies in bfloat16), over √head_dim (its bias joins the mask, after the scale)."""
    rounded = bloom_slopes(heads).astype(DType.bf16.numpy).astype(np.float32)
    return tuple((rounded / np.float32(math.sqrt(head_dim))).tolist())


def _opt(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    _require(cfg, "do_layer_norm_before", True, "OPT-350m's LayerNorms after the residual adds are not "
             "supported: irc builds OPT's pre-LayerNorm layers")
    _require(cfg, "_remove_final_layer_norm", False, "irc builds OPT with its final LayerNorm")
    _require(cfg, "layer_norm_elementwise_affine", True, "irc's LayerNorms have a weight and a bias")
    if cfg.get("word_embed_proj_dim", positive_int, None) not in (None, d):
        raise cfg.unsupported("word_embed_proj_dim", cfg.raw("word_embed_proj_dim"),
                              hint=f"OPT's project_in / project_out are not supported: only {d} (hidden_size)")
    bias = cfg.get("enable_bias", boolean)
    activation = cfg.raw("activation_function")
    if activation != "relu" and (not isinstance(activation, str) or activation not in GELU):
        raise cfg.unsupported("activation_function", activation, hint=f"OPT's MLP here: relu, {', '.join(GELU)}")
    mlp = {"kind": "relu"} if activation == "relu" else {"kind": "gelu", "approximate": GELU[activation]}
    mlp.update(d_ff=cfg.get("ffn_dim", positive_int), bias=bias, position_offset=OPT_POSITION_OFFSET,
               positions=cfg.get("max_position_embeddings", positive_int) + OPT_POSITION_OFFSET)
    arch = _arch(cfg, name, model_type, d, n, heads, None, mlp, "sequential", OPT_LAYER_NORM_EPS, qkv_bias=bias)
    arch.checkpoint = "opt"
    return arch


def _require(cfg: Config, key: str, value: bool, hint: str) -> None:
    """Refuse a boolean setting other than ``value``."""
    if cfg.get(key, boolean) != value:
        raise cfg.unsupported(key, cfg.raw(key), hint=hint)


def _mlp(layer, h, mlp: dict):
    """The dense MLP of ``mlp``'s kind: ReLU (OPT) or GELU, biases with ``bias``."""
    if mlp["kind"] == "relu":
        return layer.relu_mlp(h, d_ff=mlp["d_ff"], bias=mlp["bias"])
    return layer.gelu_mlp(h, d_ff=mlp["d_ff"], bias=mlp["bias"], approximate=mlp["approximate"])


def expand(form: str, arch: Arch, origin: str):
    """The decoder through the DSL: ``sequential`` (x + attn(ln1(x)); x + mlp(ln2(x)); GPT-2's
    ``gpt2`` and OPT), ``parallel_two_norms`` (GPT-NeoX) or ``parallel_one_norm`` (Phi: attn
    and mlp of one norm); LayerNorms with bias throughout; learned positions where ``mlp``
    holds ``positions`` (their rows: ``position_offset`` on, OPT's 2), added after a VLM's
    image features are merged in (``build.embedded_inputs``: BLIP-2's OPT); BLOOM's LayerNorm
    of the embeddings with ``embed_norm``, LayerNorms without bias with ``norm_bias`` false
    (MPT); ALiBi slopes and the q/k/v clamp where ``arch.attention`` has them."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    bias = mlp.get("norm_bias", True)
    with m.at(origin):
        x = embedded_inputs(m, arch)
        if "positions" in mlp:
            x = m.embed_positions(x, mlp["positions"], offset=mlp.get("position_offset", 0))
        if mlp.get("embed_norm"):
            x = m.layer_norm(x, "embed_norm", eps)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            h = layer.layer_norm(x, "attn_norm", eps, bias=bias)
            y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, scale=a.scale,
                                qkv_bias=a.qkv_bias, out_bias=a.qkv_bias, alibi=a.alibi, clip_qkv=a.clip_qkv)
            if form.startswith("parallel"):
                h2 = h if form == "parallel_one_norm" else layer.layer_norm(x, "mlp_norm", eps)
                f = _mlp(layer, h2, mlp)
                x = x + m.add(y, f, f"{layer.prefix}branches")
                continue
            x = x + y
            x = x + _mlp(layer, layer.layer_norm(x, "mlp_norm", eps, bias=bias), mlp)
        m.logits(m.layer_norm(x, "norm", eps, bias=bias), tied=arch.tied,
                 bias=mlp.get("head_bias", form == "parallel_one_norm"))
    return m.graph


def _neox_rows(part: int, name: str = "attention.query_key_value"):
    """The rows of q (0), k (1) or v (2) in a fused ``name`` holding per head q | k | v
    (GPT-NeoX's, BLOOM's)."""
    def source(arch: Arch, prefix: str, suffix: str) -> View:
        heads, dim = arch.attention.heads, arch.attention.head_dim
        rows = [h * 3 * dim + part * dim + i for h in range(heads) for i in range(dim)]
        return View(f"{prefix}{name}.{suffix}", rows=rows)
    return lambda suffix: lambda arch, prefix: source(arch, prefix, suffix)


def _falcon_rows(part: int, layout: str):
    """The rows of q (0), k (1) or v (2) in Falcon's ``query_key_value``: grouped per kv head
    [q_0 .. q_{r-1}, k, v] (the new architecture), [q heads, k, v] (multi-query) or per head
    q | k | v (multi-head)."""
    def source(suffix: str):
        def make(arch: Arch, prefix: str) -> View:
            a = arch.attention
            dim, group = a.head_dim, a.heads // a.kv_heads
            if layout == "new":
                slots = [g * (group + 2) + (j if part == 0 else group + part - 1)
                         for g in range(a.kv_heads) for j in range(group if part == 0 else 1)]
            elif layout == "multi_query":
                slots = list(range(a.heads)) if part == 0 else [a.heads + part - 1]
            else:
                slots = [h * 3 + part for h in range(a.heads)]
            return View(f"{prefix}self_attention.query_key_value.{suffix}",
                        rows=[slot * dim + i for slot in slots for i in range(dim)])
        return make
    return source


def _falcon_layout(layout: str, norms: dict) -> dict:
    return {**{f"{k}{s}": f"{v}.{w}" for k, v in norms.items() for s, w in (("", "weight"), (".bias", "bias"))},
            **{f"attn.w{x}": _falcon_rows(i, layout)("weight") for i, x in enumerate("qkv")},
            **{f"attn.b{x}": _falcon_rows(i, layout)("bias") for i, x in enumerate("qkv")},
            "attn.wo": "self_attention.dense.weight", "attn.bo": "self_attention.dense.bias",
            "mlp.w_up": "mlp.dense_h_to_4h.weight", "mlp.b_up": "mlp.dense_h_to_4h.bias",
            "mlp.w_down": "mlp.dense_4h_to_h.weight", "mlp.b_down": "mlp.dense_4h_to_h.bias",
            "_prefix": "transformer.h.",
            "_top": {"embed": "transformer.word_embeddings.weight", "norm": "transformer.ln_f.weight",
                     "norm.bias": "transformer.ln_f.bias", "lm_head": "lm_head.weight"}}


_FALCON_OLD = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def _gpt2_columns(part: int, suffix: str):
    """GPT-2's ``c_attn`` [d, 3d] Conv1D: the columns of q (0), k (1) or v (2), transposed
    (the bias: its entries)."""
    def source(arch: Arch, prefix: str) -> View:
        d = arch.d_model
        return View(f"{prefix}attn.c_attn.{suffix}", rows=range(part * d, (part + 1) * d),
                    transpose=suffix == "weight")
    return source


def _conv1d(name: str):
    return lambda arch, prefix: View(prefix + name, transpose=True)


def _base_model_resolve(arch: Arch, param: str, checkpoint, prefix: str):
    """Checkpoints saved from the base model (openai-community/gpt2, facebook/opt-*) name
    their tensors without ``prefix`` (``transformer.``, ``model.``): the same source under
    the shorter names where the checkpoint has them (``build.attach_weights`` asks; None:
    the layout's names)."""
    from frontends.hf.weights import Tensor

    source = checkpoint_source(arch, param)
    if all(name in checkpoint.files for name in source.names()):
        return None
    short = [name.removeprefix(prefix) for name in source.names()]
    if not all(name in checkpoint.files for name in short):
        return None
    if isinstance(source, View):
        return View(short[0], rows=source.selection, transpose=source.transpose)
    return Tensor(short[0])


_LN = {"attn_norm": "ln_1", "mlp_norm": "ln_2"}
_NEOX_LN = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
LAYOUTS = {
    "gpt2": {**{f"{k}{s}": f"{v}.{w}" for k, v in _LN.items() for s, w in (("", "weight"), (".bias", "bias"))},
             **{f"attn.w{x}": _gpt2_columns(i, "weight") for i, x in enumerate("qkv")},
             **{f"attn.b{x}": _gpt2_columns(i, "bias") for i, x in enumerate("qkv")},
             "attn.wo": _conv1d("attn.c_proj.weight"), "attn.bo": "attn.c_proj.bias",
             "mlp.w_up": _conv1d("mlp.c_fc.weight"), "mlp.b_up": "mlp.c_fc.bias",
             "mlp.w_down": _conv1d("mlp.c_proj.weight"), "mlp.b_down": "mlp.c_proj.bias",
             "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
             "_spare_suffixes": (".attn.bias", ".attn.masked_bias"),  # old checkpoints' causal-mask buffers
             "_top": {"embed": "transformer.wte.weight", "embed_positions": "transformer.wpe.weight",
                      "norm": "transformer.ln_f.weight", "norm.bias": "transformer.ln_f.bias"}},
    "gpt_neox": {**{f"{k}{s}": f"{v}.{w}" for k, v in _NEOX_LN.items() for s, w in (("", "weight"), (".bias", "bias"))},
                 **{f"attn.w{x}": _neox_rows(i)("weight") for i, x in enumerate("qkv")},
                 **{f"attn.b{x}": _neox_rows(i)("bias") for i, x in enumerate("qkv")},
                 "attn.wo": "attention.dense.weight", "attn.bo": "attention.dense.bias",
                 "mlp.w_up": "mlp.dense_h_to_4h.weight", "mlp.b_up": "mlp.dense_h_to_4h.bias",
                 "mlp.w_down": "mlp.dense_4h_to_h.weight", "mlp.b_down": "mlp.dense_4h_to_h.bias",
                 "_prefix": "gpt_neox.layers.",
                 "_top": {"embed": "gpt_neox.embed_in.weight", "norm": "gpt_neox.final_layer_norm.weight",
                          "norm.bias": "gpt_neox.final_layer_norm.bias", "lm_head": "embed_out.weight"}},
    "phi": {"attn_norm": "input_layernorm.weight", "attn_norm.bias": "input_layernorm.bias",
            **{f"attn.b{x}": f"self_attn.{x}_proj.bias" for x in "qkv"},
            "attn.wo": "self_attn.dense.weight", "attn.bo": "self_attn.dense.bias",
            "mlp.w_up": "mlp.fc1.weight", "mlp.b_up": "mlp.fc1.bias",
            "mlp.w_down": "mlp.fc2.weight", "mlp.b_down": "mlp.fc2.bias",
            "_top": {"embed": "model.embed_tokens.weight", "norm": "model.final_layernorm.weight",
                     "norm.bias": "model.final_layernorm.bias", "lm_head": "lm_head.weight",
                     "lm_head.bias": "lm_head.bias"}},
}
_OPT_LN = {"attn_norm": "self_attn_layer_norm", "mlp_norm": "final_layer_norm"}
LAYOUTS["opt"] = {
    **{f"{k}{s}": f"{v}.{w}" for k, v in _OPT_LN.items() for s, w in (("", "weight"), (".bias", "bias"))},
    **{f"attn.{w}{x}": f"self_attn.{x}_proj.{n}" for x in "qkv" for w, n in (("w", "weight"), ("b", "bias"))},
    "attn.wo": "self_attn.out_proj.weight", "attn.bo": "self_attn.out_proj.bias",
    "mlp.w_up": "fc1.weight", "mlp.b_up": "fc1.bias", "mlp.w_down": "fc2.weight", "mlp.b_down": "fc2.bias",
    "_prefix": "model.decoder.layers.", "_resolve": partial(_base_model_resolve, prefix="model."),
    "_top": {"embed": "model.decoder.embed_tokens.weight", "embed_positions": "model.decoder.embed_positions.weight",
             "norm": "model.decoder.final_layer_norm.weight", "norm.bias": "model.decoder.final_layer_norm.bias",
             "lm_head": "lm_head.weight"}}
LAYOUTS.update({"falcon": _falcon_layout("multi_head", _FALCON_OLD),
                "falcon_multi_query": _falcon_layout("multi_query", _FALCON_OLD),
                "falcon_new": _falcon_layout("new", {"attn_norm": "ln_attn", "mlp_norm": "ln_mlp"}),
                "falcon_new_one_norm": _falcon_layout("new", {"attn_norm": "input_layernorm"})})
FAMILIES = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "phi": _phi, "falcon": _falcon, "opt": _opt}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
