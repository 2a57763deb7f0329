"""llama.cpp's architectures for the decoders of ``frontends.hf.families_olmo``,
``families_classic`` and ``families_cohere``: their keys -> the ``Arch`` those modules build
from a config.json (the same decoder loops), their tensors -> the same irc params.

==========  =====================================================================================
olmo2       OLMo-2: norms after attention and MLP (``post_attention_norm``, ``post_ffw_norm``),
            full-width ``attn_q_norm`` / ``attn_k_norm``, rotate-half RoPE (not permuted); an
            OLMo-3 file (``attention.sliding_window``) is refused naming the key
starcoder2  LayerNorms with bias (``attention.layer_norm_epsilon``), biases on q, k, v, the
            output and the GELU MLP, ``attention.sliding_window`` on every layer
command-r   Command-R: one LayerNorm (no bias) feeding attention and MLP in parallel, adjacent
            pair RoPE, logits times ``logit_scale``; Command-R+'s per-head q/k LayerNorms
            when the file has ``attn_q_norm`` / ``attn_k_norm`` ([H, D], [K, D])
gpt2        learned positions (``position_embd``), the fused ``attn_qkv`` (the converter
            transposed every Conv1D weight: read as rows), biases, GELU (tanh)
phi2        Phi-2: one LayerNorm, attention and MLP in parallel, partial rotary
            (``rope.dimension_count``), biases, an ``output`` head with bias
==========  =====================================================================================
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from frontends.gguf.arch import Hparams, read_dims, read_rope, _vocab
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc.errors import SpecError


def _arch(hp: Hparams, name: str, model_type: str, dims: dict, attention: Attention, layers: list, mlp: dict,
          eps_key: str, expand, **extra) -> Arch:
    return Arch(name=name, model_type=model_type, dtype="f32", vocab_size=_vocab(hp), d_model=dims["d"],
                n_layers=dims["layers"], norm_eps=hp.number(eps_key), attention=attention, layers=layers, mlp=mlp,
                tied="output.weight" not in hp.gguf.tensors, checkpoint=hp.arch, expand=expand, **extra)


def describe_olmo2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    if hp.has("attention.sliding_window"):  # OLMo-3 files share the arch
        raise hp.error("attention.sliding_window", "OLMo-3's windowed layers (and their per-type RoPE) are not read "
                                                    "from GGUF yet", hint="compile its Hugging Face folder")
    rope = read_rope(hp, dims["head_dim"])
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    return _arch(hp, name, "olmo2", dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                 {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, "attention.layer_norm_rms_epsilon",
                 partial(families_olmo._expand, "post", None))


def describe_starcoder2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    window = hp.count("attention.sliding_window", None)
    bias = "blk.0.attn_q.bias" in hp.gguf.tensors
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "tanh", "bias": bias}
    return _arch(hp, name, "starcoder2", dims, attention, [LayerSpec(window, read_rope(hp, dims["head_dim"]))]
                 * dims["layers"], mlp, "attention.layer_norm_epsilon", partial(families_olmo._expand, "layer", None))


def describe_command_r(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_cohere

    dims = read_dims(hp)
    qk_norm = "layer" if "blk.0.attn_q_norm.weight" in hp.gguf.tensors else False  # Command-R+: per head
    rope = read_rope(hp, dims["head_dim"], convention="interleaved")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    return _arch(hp, name, "cohere", dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                 {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, "attention.layer_norm_epsilon",
                 partial(families_cohere._expand, qk_norm=qk_norm), logits_scale=hp.number("logit_scale", None))


def describe_gpt2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    if "position_embd.weight" not in hp.gguf.tensors:
        raise hp.gguf.error("position_embd.weight", "GPT-2's learned position table is missing")
    positions = hp.gguf.tensor("position_embd.weight").shape[0]
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "bias": True, "approximate": "tanh",
           "positions": positions}
    attention = Attention("gqa", dims["heads"], dims["heads"], dims["head_dim"], qkv_bias=True)
    return _arch(hp, name, "gpt2", dims, attention, [LayerSpec(None, None)] * dims["layers"], mlp,
                 "attention.layer_norm_epsilon", partial(families_classic._expand, "gpt2"))


def describe_phi2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "tanh", "bias": True,
           "head_bias": "output.bias" in hp.gguf.tensors}
    attention = Attention("gqa", dims["heads"], dims["heads"], dims["head_dim"], qkv_bias=True)
    return _arch(hp, name, "phi", dims, attention, [LayerSpec(None, read_rope(hp, dims["head_dim"]))] * dims["layers"],
                 mlp, "attention.layer_norm_epsilon", partial(families_classic._expand, "parallel_one_norm"))


# ---- tensors -------------------------------------------------------------------------------

BIASES = {"attn_norm.bias": "attn_norm.bias", "mlp_norm.bias": "ffn_norm.bias", "attn.bo": "attn_output.bias",
          "mlp.b_up": "ffn_up.bias", "mlp.b_down": "ffn_down.bias", "mlp.w_up": "ffn_up.weight",
          "mlp.w_down": "ffn_down.weight"}
TOP = {"norm.bias": "output_norm.bias", "lm_head.bias": "output.bias", "embed_positions": "position_embd.weight"}


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where these archs depart from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if param in TOP:
        return TensorSource(TOP[param])
    if suffix in BIASES:
        return TensorSource(block + BIASES[suffix])
    if gguf.arch == "gpt2" and suffix in ("attn.wq", "attn.wk", "attn.wv", "attn.bq", "attn.bk", "attn.bv"):
        part, d = "qkv".index(suffix[-1]), arch.d_model
        kind = "weight" if suffix.startswith("attn.w") else "bias"
        name = f"{block}attn_qkv.{kind}"
        if name not in gguf.tensors:
            raise SpecError(f"tensor {name} is missing: GPT-2 keeps q, k and v fused", location=gguf.path)
        return TensorSource(name, rows=(part * d, (part + 1) * d))
    if gguf.arch == "phi2" and suffix in ("attn.wq", "attn.wk", "attn.wv", "attn.bq", "attn.bk", "attn.bv") \
            and f"{block}attn_qkv.weight" in gguf.tensors:  # an older Phi-2 file: Wqkv fused, q | k | v
        part, d = "qkv".index(suffix[-1]), arch.d_model
        kind = "weight" if suffix.startswith("attn.w") else "bias"
        return TensorSource(f"{block}attn_qkv.{kind}", rows=(part * d, (part + 1) * d))
    return None


FAMILIES = {"olmo2": describe_olmo2, "starcoder2": describe_starcoder2, "command-r": describe_command_r,
            "gpt2": describe_gpt2, "phi2": describe_phi2}
