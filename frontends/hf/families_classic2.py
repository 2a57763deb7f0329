"""BitNet, CTRL, GPT-NeoX-Japanese and ModernBERT-decoder (``frontends.hf.families`` registers
them), each built by its own loop through the DSL (``expand``, set as ``Arch.expand``).

=================  ==========================================================================
bitnet             BitNet b1.58 (``BitNetForCausalLM``) with float weights: Llama's RMS-normed
                   layers, GQA and RoPE, plus an RMS norm of the heads' output before
                   ``o_proj`` (``attn_sub_norm``) and one of the gated MLP's product before
                   ``down_proj`` (``ffn_sub_norm``); the MLP relu(gate)² · up (``relu2``);
                   q/k/v/o biases with ``attention_bias``; untied by default
ctrl               CTRL (``CTRLLMHeadModel``): the token embeddings times √d plus sinusoidal
                   positions (``irc.ops.positions``, ``frequencies`` "transformer": sines |
                   cosines of position / 10000^(2i/d)); pre-LayerNorm layers (``layernorm1``,
                   ``layernorm2``, eps 1e-6 whatever the config says) with ``Wq``/``Wk``/
                   ``Wv``/``dense`` and the ReLU ``ffn`` all with biases, softmax scale
                   head_dim^-0.5; the final LayerNorm (``layer_norm_epsilon``); the head tied
                   to ``transformer.w`` with a bias of its own (``lm_head.bias``); positions
                   past ``n_positions`` (where transformers' table ends) are computed alike
gpt_neox_japanese  GPT-NeoX-Japanese: GPT-NeoX's fused per-head q | k | v (no biases), partial
                   rotary (``rotary_pct`` / ``rope_parameters.partial_rotary_factor``, default
                   1), sequential pre-LayerNorm layers, the MLP ``dense_h_to_4h`` /
                   ``dense_4h_to_h`` without biases of width hidden_size ·
                   ``intermediate_multiple_size`` (GELU's forms), the last layer's
                   ``attention.dense_bias`` added after its dense (read as that layer's
                   output bias); ``embed_out`` tied to ``embed_in`` by default
modernbert-decoder ModernBERT's decoder: a LayerNorm of the token embeddings (``embeddings.norm``),
                   pre-LayerNorm layers (none before layer 0's attention; biases with
                   ``norm_bias``, ``attention_bias``), full and sliding layers (``layer_types``,
                   else layers 0, n, 2n, ... full, n ``global_attn_every_n_layers``; a window of
                   ``local_attention`` // 2) with RoPE per layer type (``rope_parameters``, or
                   ``global_rope_theta`` / ``local_rope_theta``), the gated ``Wi`` [activated
                   half | gate half] and ``Wo`` (GeGLU; silu: SwiGLU), the final norm, the
                   prediction head (``lm_head.dense``, bias ``classifier_bias``;
                   ``classifier_activation``; ``lm_head.norm``) and ``decoder`` (tied; bias
                   ``decoder_bias``)
=================  ==========================================================================

A tied model whose checkpoint still holds its head's own tensor (``lm_head.weight``,
``embed_out.weight``, ``decoder.weight``) reads the head from it, as transformers 5 does where
the copy differs from the embeddings (it ties only where the two agree or the copy is absent).

Refused, naming config.json and the key: BitNet's activations other than relu2 and a partial
rotary factor; CTRL's odd ``n_embd`` (its sines and cosines take unequal halves) and
``n_embd`` not divisible by ``n_head``; GPT-NeoX-Japanese's activations other than GELU's
forms; ModernBERT-decoder's ``mlp_bias``, a ``head_dim`` other than hidden_size /
num_attention_heads, a ``local_attention`` under 2 where layers slide, ``rope_scaling``,
``rope_parameters`` not given per layer type, activations other than GELU's forms (the MLP: and
silu). A BitNet checkpoint with a ``quantization_config`` (packed ternary weights) is refused
when its weights are loaded (``frontends.hf.load_hf``): transformers' ``BitLinear`` /
``AutoBitLinear`` also round every linear's input to int8 per token
(``integrations/bitnet.py`` ``activation_quant`` / ``ActQuant``), which unpacking the weights
would not reproduce; the structure compiles (``weights=False``).
"""
from __future__ import annotations

import math
import os

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope
from frontends.hf.families_classic import GELU, _neox_rows, neox_rope
from frontends.hf.families_xglm import _mapped
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _rope
from frontends.hf.weights import Rows
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's config classes
    "bitnet": {"vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 30,
               "num_attention_heads": 20, "num_key_value_heads": 5, "hidden_act": "relu2",
               "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
               "attention_bias": False, "rope_theta": 500000.0},
    "ctrl": {"vocab_size": 246534, "n_positions": 256, "n_embd": 1280, "dff": 8192, "n_layer": 48, "n_head": 16,
             "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True},
    "gpt_neox_japanese": {"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "intermediate_multiple_size": 4, "hidden_act": "gelu",
                          "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "tie_word_embeddings": True,
                          "rope_theta": 10000.0},
    "modernbert-decoder": {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
                           "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192,
                           "norm_eps": 1e-5, "norm_bias": False, "attention_bias": False, "mlp_bias": False,
                           "decoder_bias": True, "classifier_bias": False, "classifier_activation": "gelu",
                           "local_attention": 128, "tie_word_embeddings": True},
}
CTRL_LAYER_NORM_EPS = 1e-6  # EncoderLayer's nn.LayerNorm(eps=1e-6): layer_norm_epsilon is the final norm's


def _tied(cfg: Config, head: str) -> bool:
    """``tie_word_embeddings``, unless the folder's checkpoint holds the head's own tensor
    ``head``: transformers 5 ties the head to the embeddings only where the checkpoint lacks
    it or holds the same values, so the head is read from it wherever it is there."""
    from frontends.hf.weights import Checkpoint

    if not cfg.get("tie_word_embeddings", boolean):
        return False
    folder = os.path.dirname(cfg.path)
    checkpoint = Checkpoint.find(folder) if os.path.isdir(folder) else None
    return checkpoint is None or head not in checkpoint.files


# ---- BitNet -------------------------------------------------------------------------------

def _bitnet(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    cfg.check("hidden_act", lambda v: v == "relu2", hint="BitNet's gated MLP is squared ReLU (relu2)")
    rope = _rope(cfg, dims["head_dim"])
    if rope.rotary_dim is not None:
        raise cfg.unsupported("partial_rotary_factor", cfg.raw("partial_rotary_factor"),
                              hint="BitNet rotates the whole head")
    bias = cfg.get("attention_bias", boolean)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias, out_bias=bias)
    mlp = {"kind": "relu2_glu", "d_ff": cfg.get("intermediate_size", positive_int)}
    arch = _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"], mlp,
                 checkpoint="bitnet", expand=_bitnet_expand)
    arch.tied = _tied(cfg, "lm_head.weight")
    return arch


def _bitnet_mlp(layer, x, d_ff: int, eps: float):
    """down(ffn_sub_norm(relu(gate(x))² · up(x))), as primitives."""
    m, p = layer.model, layer.prefix
    d = m._features(x)
    w_gate, w_up = m.param(f"{p}mlp.w_gate", (d_ff, d)), m.param(f"{p}mlp.w_up", (d_ff, d))
    w_down = m.param(f"{p}mlp.w_down", (d, d_ff))
    layer._note_mlp("relu2_glu", d_ff)
    gate = m.emit("linear", [x, w_gate], None, f"{p}mlp_gate")[0]
    zero = m.emit("constant", [], {"value": 0.0}, f"{p}mlp_zero")[0]
    relu = m.emit("maximum", [gate, zero], None, f"{p}mlp_relu")[0]
    act = m.emit("mul", [relu, relu], None, f"{p}mlp_act")[0]
    product = m.emit("mul", [act, m.emit("linear", [x, w_up], None, f"{p}mlp_up")[0]], None, f"{p}mlp_product")[0]
    normed = m.norm(product, f"{p}mlp.sub_norm", "rms", eps)
    return m.emit("linear", [normed, w_down], None, f"{p}mlp_out")[0]


def _bitnet_expand(arch: Arch, origin: str):
    """The decoder through the DSL (the module docstring)."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    qkv_bias=a.qkv_bias, out_bias=a.out_bias, out_norm=eps)
            x = x + _bitnet_mlp(layer, layer.rms_norm(x, "mlp_norm", eps), arch.mlp["d_ff"], eps)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- CTRL ---------------------------------------------------------------------------------

def _ctrl(cfg: Config, name: str, model_type: str) -> Arch:
    d_key, heads_key = _mapped(cfg, "n_embd", "hidden_size"), _mapped(cfg, "n_head", "num_attention_heads")
    d, heads = cfg.get(d_key, positive_int), cfg.get(heads_key, positive_int)
    n = cfg.get(_mapped(cfg, "n_layer", "num_hidden_layers"), layer_count)
    if d % heads:
        raise cfg.error(heads_key, f"hidden size {d} is not divisible by {heads} heads")
    if d % 2 or d < 4:
        raise cfg.unsupported(d_key, d, hint="CTRL's sinusoidal positions here need an even size of at least 4")
    mlp = {"kind": "relu", "d_ff": cfg.get("dff", positive_int),
           "final_eps": cfg.get("layer_norm_epsilon", positive_number)}
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=CTRL_LAYER_NORM_EPS,
                attention=Attention("gqa", heads, heads, d // heads, qkv_bias=True, out_bias=True),
                layers=[LayerSpec(None, None)] * n, mlp=mlp, tied=_tied(cfg, "lm_head.weight"),
                checkpoint="ctrl", embedding_scale=math.sqrt(d))
    arch.expand = _ctrl_expand
    return arch


def _ctrl_expand(arch: Arch, origin: str):
    """x = embed·√d + positions; per layer x + attn(ln1(x)), x + mlp(ln2(x)); the final
    LayerNorm and the head with its bias."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = m.sinusoidal_positions(embedded_inputs(m, arch), frequencies="transformer")
        for layer in m.layers(arch.n_layers):
            h = layer.layer_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, qkv_bias=True,
                                    out_bias=True)
            x = x + layer.relu_mlp(layer.layer_norm(x, "mlp_norm", eps), d_ff=mlp["d_ff"], bias=True)
        m.logits(m.layer_norm(x, "norm", mlp["final_eps"]), tied=arch.tied, bias=True)
    return m.graph


# ---- GPT-NeoX-Japanese --------------------------------------------------------------------

def _gpt_neox_japanese(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = cfg.get("num_attention_heads", positive_int)
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden size {d} is not divisible by {heads} heads")
    approximate = _gelu(cfg, "hidden_act")
    d_ff = int(d * cfg.get("intermediate_multiple_size", positive_number))
    if d_ff < 1:
        raise cfg.error("intermediate_multiple_size", f"gives an MLP of width {d_ff}")
    rope = neox_rope(cfg, d // heads)
    mlp = {"kind": "gelu", "d_ff": d_ff, "approximate": approximate}
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("layer_norm_eps", positive_number),
                attention=Attention("gqa", heads, heads, d // heads), layers=[LayerSpec(None, rope)] * n, mlp=mlp,
                tied=_tied(cfg, "embed_out.weight"), checkpoint="gpt_neox_japanese")
    arch.expand = _gpt_neox_japanese_expand
    return arch


def _gpt_neox_japanese_expand(arch: Arch, origin: str):
    """Per layer x + attn(ln1(x)) [+ the last layer's dense_bias], x + mlp(ln2(x)); the final
    LayerNorm and the (tied) head."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.layer_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    out_bias=layer.index == arch.n_layers - 1)
            h = layer.layer_norm(x, "mlp_norm", eps)
            x = x + layer.gelu_mlp(h, d_ff=mlp["d_ff"], approximate=mlp["approximate"])
        m.logits(m.layer_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- ModernBERT decoder -------------------------------------------------------------------

def _modernbert_decoder(cfg: Config, name: str, model_type: str) -> Arch:
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = cfg.get("num_attention_heads", positive_int)
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden size {d} is not divisible by {heads} heads")
    if cfg.get("head_dim", positive_int, None) not in (None, d // heads):
        raise cfg.unsupported("head_dim", cfg.raw("head_dim"), hint=f"ModernBERT's heads are hidden_size / "
                                                                     f"num_attention_heads = {d // heads} wide")
    cfg.check("mlp_bias", lambda v: not v, hint="irc's gated MLP has no biases")
    every = cfg.get("global_attn_every_n_layers", positive_int, 3)
    types = _layer_types(cfg, n, lambda i: SLIDING if i % every else FULL)
    window = None
    if SLIDING in types:
        local = cfg.raw("local_attention")
        if isinstance(local, bool) or not isinstance(local, int) or local < 2:
            raise cfg.unsupported("local_attention", local, hint="the sliding layers see local_attention // 2 "
                                                                 "tokens: at least 2")
        window = local // 2
    if cfg.raw("rope_scaling") is not None:
        raise cfg.unsupported("rope_scaling", cfg.raw("rope_scaling"), hint="give rope_parameters per layer type")
    ropes = {kind: _modernbert_rope(cfg, d // heads, kind) for kind in set(types)}
    bias = cfg.get("attention_bias", boolean)
    mlp = {**_gated_activation(cfg, "hidden_activation"),
           "d_ff": cfg.get("intermediate_size", positive_int), "norm_bias": cfg.get("norm_bias", boolean),
           "head_bias": cfg.get("classifier_bias", boolean), "decoder_bias": cfg.get("decoder_bias", boolean),
           "head_approximate": _gelu(cfg, "classifier_activation")}
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("norm_eps", positive_number),
                attention=Attention("gqa", heads, heads, d // heads, qkv_bias=bias, out_bias=bias),
                layers=[LayerSpec(window if kind == SLIDING else None, ropes[kind]) for kind in types], mlp=mlp,
                tied=_tied(cfg, "decoder.weight"), checkpoint="modernbert-decoder")
    arch.expand = _modernbert_decoder_expand
    return arch


def _gelu(cfg: Config, key: str) -> str:
    activation = cfg.raw(key)
    if not isinstance(activation, str) or activation not in GELU:
        raise cfg.unsupported(key, activation, hint=f"GELU's forms here: {', '.join(GELU)}")
    return GELU[activation]


def _gated_activation(cfg: Config, key: str) -> dict:
    """The gated MLP's form: GeGLU (GELU's forms) or SwiGLU (silu)."""
    if cfg.raw(key) == "silu":
        return {"kind": "swiglu"}
    return {"kind": "geglu", "approximate": _gelu(cfg, key)}


def _modernbert_rope(cfg: Config, head_dim: int, layer_type: str):
    """RoPE of a layer type: ``rope_parameters.{layer_type}``, or the legacy
    ``global_rope_theta`` / ``local_rope_theta`` (defaults 160000 / 10000)."""
    legacy, default = ("global_rope_theta", 160000.0) if layer_type == FULL else ("local_rope_theta", 10000.0)
    base = cfg.get(legacy, positive_number, default)
    params = cfg.data.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        return _rope(cfg, head_dim, layer_type, default_base=base)
    if params is not None:
        raise cfg.error(f"rope_parameters.{layer_type}", "missing: ModernBERT-decoder gives RoPE per layer type")
    return read_rope(cfg, head_dim, {"rope_theta": base}, legacy)


def _modernbert_decoder_expand(arch: Arch, origin: str):
    """x = embed_norm(embed); per layer x + attn(ln1(x)) (layer 0: no norm), x + mlp(ln2(x));
    the final norm; the head's dense, GELU and norm; the decoder (tied, with its bias)."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    bias = mlp["norm_bias"]
    with m.at(origin):
        x = m.layer_norm(embedded_inputs(m, arch), "embed_norm", eps, bias=bias)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = x if layer.index == 0 else layer.layer_norm(x, "attn_norm", eps, bias=bias)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    window=spec.window, qkv_bias=a.qkv_bias, out_bias=a.out_bias)
            h = layer.layer_norm(x, "mlp_norm", eps, bias=bias)
            if mlp["kind"] == "swiglu":
                x = x + layer.swiglu(h, d_ff=mlp["d_ff"])
            else:
                x = x + layer.geglu(h, d_ff=mlp["d_ff"], approximate=mlp["approximate"])
        x = m.layer_norm(x, "norm", eps, bias=bias)
        weight = m.param("head.dense", (arch.d_model, arch.d_model))
        head_bias = m.param("head.dense.bias", (arch.d_model,)) if mlp["head_bias"] else None
        x = m.emit("linear", [x, weight, head_bias], None, "head_dense")[0]
        x = m.emit("gelu", [x], {"approximate": mlp["head_approximate"]}, "head_act")[0]
        m.logits(m.layer_norm(x, "head.norm", eps, bias=bias), tied=arch.tied, bias=mlp["decoder_bias"])
    return m.graph


def _wi_half(which: int):
    """Rows of ``mlp.Wi``: the activated half (0, irc's gate) or the other (1, irc's up)."""
    def source(arch: Arch, prefix: str) -> Rows:
        d_ff = arch.mlp["d_ff"]
        return Rows(f"{prefix}mlp.Wi.weight", which * d_ff, (which + 1) * d_ff)
    return source


# ---- checkpoint names ---------------------------------------------------------------------

def _ln(names: dict) -> dict:
    return {f"{k}{s}": f"{v}.{w}" for k, v in names.items() for s, w in (("", "weight"), (".bias", "bias"))}


LAYOUTS = {
    "bitnet": {"attn.out_norm": "self_attn.attn_sub_norm.weight", "mlp.sub_norm": "mlp.ffn_sub_norm.weight"},
    "ctrl": {**_ln({"attn_norm": "layernorm1", "mlp_norm": "layernorm2"}),
             **{f"attn.{w}{x}": f"multi_head_attention.W{x}.{n}" for x in "qkv" for w, n in (("w", "weight"),
                                                                                            ("b", "bias"))},
             "attn.wo": "multi_head_attention.dense.weight", "attn.bo": "multi_head_attention.dense.bias",
             "mlp.w_up": "ffn.0.weight", "mlp.b_up": "ffn.0.bias", "mlp.w_down": "ffn.2.weight",
             "mlp.b_down": "ffn.2.bias",
             "_prefix": "transformer.h.",
             "_top": {"embed": "transformer.w.weight", "norm": "transformer.layernorm.weight",
                      "norm.bias": "transformer.layernorm.bias", "lm_head": "lm_head.weight",
                      "lm_head.bias": "lm_head.bias"}},
    "gpt_neox_japanese": {**_ln({"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}),
                          **{f"attn.w{x}": _neox_rows(i)("weight") for i, x in enumerate("qkv")},
                          "attn.wo": "attention.dense.weight", "attn.bo": "attention.dense_bias",
                          "mlp.w_up": "mlp.dense_h_to_4h.weight", "mlp.w_down": "mlp.dense_4h_to_h.weight",
                          "_prefix": "gpt_neox_japanese.layers.",
                          "_top": {"embed": "gpt_neox_japanese.embed_in.weight",
                                   "norm": "gpt_neox_japanese.final_layer_norm.weight",
                                   "norm.bias": "gpt_neox_japanese.final_layer_norm.bias",
                                   "lm_head": "embed_out.weight"}},
}
LAYOUTS["modernbert-decoder"] = {
    **_ln({"attn_norm": "attn_norm", "mlp_norm": "mlp_norm"}),
    **{f"attn.{w}{x}": f"attn.{x}_proj.{n}" for x in "qkv" for w, n in (("w", "weight"), ("b", "bias"))},
    "attn.wo": "attn.Wo.weight", "attn.bo": "attn.Wo.bias",
    "mlp.w_gate": _wi_half(0), "mlp.w_up": _wi_half(1), "mlp.w_down": "mlp.Wo.weight",
    "_top": {"embed": "model.embeddings.tok_embeddings.weight", **_ln({"embed_norm": "model.embeddings.norm",
                                                                      "norm": "model.final_norm",
                                                                      "head.dense": "lm_head.dense",
                                                                      "head.norm": "lm_head.norm"}),
             "lm_head": "decoder.weight", "lm_head.bias": "decoder.bias"}}
FAMILIES = {"bitnet": _bitnet, "ctrl": _ctrl, "gpt_neox_japanese": _gpt_neox_japanese,
            "modernbert-decoder": _modernbert_decoder}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
