"""The classic decoders, LayerNorm with bias and biases everywhere (``frontends.hf.families``
registers them), each built by its own loop through the DSL (``Arch.expand``).

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
=================  ==========================================================================

Refused, naming config.json and the key: GPT-2's ``scale_attn_by_inverse_layer_idx``, Phi's
``qk_layernorm``, an activation other than GELU's forms, a partial rotary factor giving an odd
rotary width (the DSL's refusal, named at the key).
"""
from __future__ import annotations

from functools import partial

from frontends.hf.config import Arch, Attention, Config, LayerSpec
from frontends.hf.families_common import _rope
from frontends.hf.weights import View
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.24's config classes
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
             "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True},
    "gpt_neox": {"hidden_act": "gelu", "layer_norm_eps": 1e-5, "use_parallel_residual": True, "attention_bias": True,
                 "tie_word_embeddings": False, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                 "partial_rotary_factor": 0.25},
    "phi": {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "qk_layernorm": False, "tie_word_embeddings": False,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def _gelu(cfg: Config, key: str) -> str:
    activation = cfg.raw(key)
    if activation not in GELU:
        raise cfg.unsupported(key, activation, hint=f"this family's MLP is GELU: {', '.join(GELU)}")
    return GELU[activation]


def _arch(cfg: Config, name: str, model_type: str, d: int, n: int, heads: int, rope, mlp: dict, form: str,
          eps_key: str, **attention) -> Arch:
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get(eps_key, positive_number),
                attention=Attention("gqa", heads, heads, d // heads, **attention), layers=[LayerSpec(None, rope)] * n,
                mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type)
    arch.expand = partial(_expand, form)
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
    return _arch(cfg, name, model_type, d, n, heads, None, mlp, "gpt2", "layer_norm_epsilon", qkv_bias=True,
                 scale=scale)


def _gpt_neox(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = _heads(cfg, d, "num_attention_heads")
    mlp = {"kind": "gelu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": _gelu(cfg, "hidden_act"),
           "bias": True}
    form = "parallel_two_norms" if cfg.get("use_parallel_residual", boolean) else "sequential"
    return _arch(cfg, name, model_type, d, n, heads, _rope(cfg, d // heads), mlp, form, "layer_norm_eps",
                 qkv_bias=cfg.get("attention_bias", boolean))


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
                 "layer_norm_eps", qkv_bias=True)


def _expand(form: str, arch: Arch, origin: str):
    """The decoder through the DSL: ``sequential`` (x + attn(ln1(x)); x + mlp(ln2(x)); GPT-2
    with learned positions under ``gpt2``), ``parallel_two_norms`` (GPT-NeoX) or
    ``parallel_one_norm`` (Phi: attn and mlp of one norm); LayerNorms with bias throughout."""
    from frontends.dsl import Model, Rope

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = m.embed(m.input_ids())
        if form == "gpt2":
            x = m.embed_positions(x, mlp["positions"])
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            r = spec.rope
            rope = None if r is None else Rope(base=r.base, convention=r.convention, scaling=r.scaling,
                                               rotary_dim=r.rotary_dim)
            h = layer.layer_norm(x, "attn_norm", eps)
            y = layer.attention(h, a.heads, head_dim=a.head_dim, rope=rope, scale=a.scale, qkv_bias=a.qkv_bias,
                                out_bias=a.qkv_bias)
            if form.startswith("parallel"):
                h2 = h if form == "parallel_one_norm" else layer.layer_norm(x, "mlp_norm", eps)
                f = layer.gelu_mlp(h2, d_ff=mlp["d_ff"], bias=True, approximate=mlp["approximate"])
                x = x + m.add(y, f, f"{layer.prefix}branches")
                continue
            x = x + y
            x = x + layer.gelu_mlp(layer.layer_norm(x, "mlp_norm", eps), d_ff=mlp["d_ff"], bias=True,
                                   approximate=mlp["approximate"])
        m.logits(m.layer_norm(x, "norm", eps), tied=arch.tied, bias=form == "parallel_one_norm")
    return m.graph


def _neox_rows(part: int):
    """GPT-NeoX's ``query_key_value`` rows of q (0), k (1) or v (2): per head q | k | v."""
    def source(arch: Arch, prefix: str, suffix: str) -> View:
        heads, dim = arch.attention.heads, arch.attention.head_dim
        rows = [h * 3 * dim + part * dim + i for h in range(heads) for i in range(dim)]
        return View(f"{prefix}attention.query_key_value.{suffix}", rows=rows)
    return lambda suffix: lambda arch, prefix: source(arch, prefix, suffix)


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


def _gpt2_resolve(arch: Arch, param: str, checkpoint):
    """GPT-2 checkpoints saved from the base model (openai-community/gpt2) name their
    tensors without ``transformer.``: the same source under the shorter names where the
    checkpoint has them (``build.attach_weights`` asks; None: the layout's names)."""
    from frontends.hf.families import checkpoint_source
    from frontends.hf.weights import Tensor

    source = checkpoint_source(arch, param)
    if all(name in checkpoint.files for name in source.names()):
        return None
    short = [name.removeprefix("transformer.") for name in source.names()]
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
             "_prefix": "transformer.h.", "_resolve": _gpt2_resolve,
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
FAMILIES = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "phi": _phi}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
