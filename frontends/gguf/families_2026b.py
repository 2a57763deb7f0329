"""llama.cpp's LayerNorm-era architectures for decoders of ``frontends.hf.families_ln_kin``,
``families_classic``, ``families_2026`` and ``families_2026b`` (``frontends.gguf.families_2026``
registers them): their keys -> the ``Arch`` those modules build from a config.json (the same
graph, through the same ``expand``), their tensors -> the same irc params.

=============  ===================================================================================
stablelm       StableLM: LayerNorms with bias (``attention.layer_norm_epsilon``), SwiGLU, RoPE on
               ``rope.dimension_count`` dims, q/k/v biases where present, per-head q/k LayerNorms
               (``attn_q_norm`` [H, D], ``attn_k_norm`` [K, D]) where present; parallel
               (x + attn(h) + mlp(h) of one norm) exactly when the blocks have no ``ffn_norm``, as
               llama.cpp decides (the converter's ``use_parallel_residual`` agrees)
nemotron       Nemotron-4: LayerNorm1P (the converter stores its weights as 1 + w: read back as w),
               RoPE on ``rope.dimension_count`` dims, the ungated squared-ReLU MLP, biases where present
jais2          Jais-2: Llama (rotate-half, not permuted) with LayerNorms with bias
               (``attention.layer_norm_epsilon``), biases where the file has them (q, k, v, o), the
               ungated squared-ReLU MLP
dbrx           DBRX: LayerNorms without bias (``attn_norm``; ``attn_output_norm`` before the MoE),
               the fused ``attn_qkv`` (q | k | v) read as rows, clamped to ±``attention.clamp_kqv``,
               rotate-half RoPE, every layer a softmax top-k MoE renormalised (llama.cpp's fixed
               routing: transformers' ``moe_normalize_expert_weights`` 1) of
               ``feed_forward_length`` experts (the converter's ``ffn_hidden_size``)
starcoder      StarCoder-1 / SantaCoder (``gpt_bigcode``): learned positions (``position_embd``),
               sequential pre-LayerNorm layers, the fused ``attn_qkv`` (all q | k | v) read as rows,
               ``head_count_kv`` kv heads (the converter always writes 1: multi-query), GELU (tanh),
               biases throughout
=============  ===================================================================================

Every refusal is a SpecError naming the file and the GGUF key (``starcoder.attention.head_count_kv``).
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from frontends.gguf.arch import Hparams, _vocab, dense_mlp, moe_layers, read_dims, read_rope
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec

MODEL_TYPES = {"stablelm": "stablelm", "nemotron": "nemotron", "starcoder": "gpt_bigcode", "jais2": "jais2",
               "dbrx": "dbrx"}


def _has(hp: Hparams, tensor: str) -> bool:
    return tensor in hp.gguf.tensors


def _gqa(dims: dict, **extra) -> Attention:
    return Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], **extra)


def _biases(hp: Hparams) -> dict:
    """q/k/v and o biases as the file has them (the converter writes what the checkpoint has)."""
    return {"qkv_bias": _has(hp, "blk.0.attn_q.bias"), "out_bias": _has(hp, "blk.0.attn_output.bias")}


def _top_k_checked(hp: Hparams, moe: dict) -> dict:
    if moe["top_k"] > moe["experts"]:
        raise hp.error("expert_used_count", f"{moe['top_k']} exceeds the {moe['experts']} experts (expert_count)")
    return moe


def _ln_arch(hp: Hparams, name: str, dims: dict, attention: Attention, layers: list, mlp, expand,
             moe: Optional[dict] = None) -> Arch:
    """A LayerNorm decoder (``attention.layer_norm_epsilon``) built by its HF family's ``expand``."""
    return Arch(name=name, model_type=MODEL_TYPES[hp.arch], dtype="f32", vocab_size=_vocab(hp), d_model=dims["d"],
                n_layers=dims["layers"], norm_eps=hp.number("attention.layer_norm_epsilon"), attention=attention,
                layers=layers, mlp=mlp, moe=moe, tied="output.weight" not in hp.gguf.tensors, checkpoint=hp.arch,
                expand=expand)


def describe_stablelm(hp: Hparams, name: str) -> Arch:
    """StableLM (the module docstring)."""
    from frontends.hf import families_ln_kin

    dims = read_dims(hp)
    qk_norm = "layer" if _has(hp, "blk.0.attn_q_norm.weight") else False
    attention = _gqa(dims, qkv_bias=_has(hp, "blk.0.attn_q.bias"), qk_norm=qk_norm)
    form = {"norm": "layer", "parallel": not _has(hp, "blk.0.ffn_norm.weight"), "out_bias": False}
    return _ln_arch(hp, name, dims, attention, [LayerSpec(None, read_rope(hp, dims["head_dim"]))] * dims["layers"],
                    dense_mlp(hp, [False] * dims["layers"]), partial(families_ln_kin._expand, form))


def describe_nemotron(hp: Hparams, name: str) -> Arch:
    """Nemotron (the module docstring)."""
    from frontends.hf import families_ln_kin

    dims = read_dims(hp)
    bias = _has(hp, "blk.0.attn_q.bias")
    mlp = {"kind": "relu2", "d_ff": hp.count("feed_forward_length"), "bias": _has(hp, "blk.0.ffn_up.bias")}
    form = {"norm": "1p", "parallel": False, "out_bias": _has(hp, "blk.0.attn_output.bias")}
    return _ln_arch(hp, name, dims, _gqa(dims, qkv_bias=bias),
                    [LayerSpec(None, read_rope(hp, dims["head_dim"]))] * dims["layers"], mlp,
                    partial(families_ln_kin._expand, form))


def describe_jais2(hp: Hparams, name: str) -> Arch:
    """Jais-2 (the module docstring)."""
    from frontends.hf import families_2026 as hf_2026

    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"])
    if rope.rotary_dim is not None:
        raise hp.error("rope.dimension_count", f"rotates {rope.rotary_dim} of {dims['head_dim']} dims",
                       hint="Jais-2's rotary embedding spans the head")
    mlp = {"kind": "relu2", "d_ff": hp.count("feed_forward_length"), "bias": _has(hp, "blk.0.ffn_up.bias")}
    return _ln_arch(hp, name, dims, _gqa(dims, **_biases(hp)), [LayerSpec(None, rope)] * dims["layers"], mlp,
                    partial(hf_2026._expand, form={"norm": "layer"}))


def describe_dbrx(hp: Hparams, name: str) -> Arch:
    """DBRX (the module docstring)."""
    from frontends.hf import families_2026b

    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    flags = moe_layers(hp, n)
    if not all(flags):
        raise hp.gguf.error(f"blk.{flags.index(False)}.ffn_gate_inp.weight", "missing: every DBRX layer has experts")
    moe = _top_k_checked(hp, {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
                              "d_ff": hp.count("feed_forward_length"), "norm_topk_prob": True})
    attention = _gqa(dims, clip_qkv=hp.number("attention.clamp_kqv", None))
    return _ln_arch(hp, name, dims, attention, [LayerSpec(None, rope, True)] * n, None, moe=moe,
                    expand=partial(families_2026b._expand, rms=False, parallel=False))


def describe_starcoder(hp: Hparams, name: str) -> Arch:
    """StarCoder-1 / SantaCoder (the module docstring)."""
    from frontends.hf import families_classic

    dims = read_dims(hp)
    if not _has(hp, "position_embd.weight"):
        raise hp.gguf.error("position_embd.weight", "StarCoder's learned position table is missing")
    rows = hp.gguf.tensor("blk.0.attn_qkv.weight").shape[0]
    want = (dims["heads"] + 2 * dims["kv_heads"]) * dims["head_dim"]
    if rows != want:  # the converter writes one kv head whatever the model has
        raise hp.error("attention.head_count_kv", f"{dims['kv_heads']} kv heads make attn_qkv {want} rows; "
                       f"blk.0.attn_qkv.weight has {rows}", hint="StarCoder's converter assumes multi-query "
                                                                 "attention (one kv head)")
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "bias": True, "approximate": "tanh",
           "positions": hp.gguf.tensor("position_embd.weight").shape[0]}
    return _ln_arch(hp, name, dims, _gqa(dims, qkv_bias=True), [LayerSpec(None, None)] * dims["layers"], mlp,
                    partial(families_classic.expand, "sequential"))

# ---- tensors ----------------------------------------------------------------------------------

BIASES = {"attn.bo": "attn_output.bias", "mlp.b_up": "ffn_up.bias", "mlp.b_down": "ffn_down.bias",
          "attn_norm.bias": "attn_norm.bias", "mlp_norm.bias": "ffn_norm.bias"}
QKV = ("attn.wq", "attn.wk", "attn.wv", "attn.bq", "attn.bk", "attn.bv")
TOP = {"norm.bias": "output_norm.bias", "embed_positions": "position_embd.weight"}
NORM_PLUS_ONE = {"attn_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight",
                 "norm": "output_norm.weight"}  # Nemotron's LayerNorm1P weights, stored as 1 + w


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where these archs depart from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if gguf.arch == "nemotron" and (suffix or param) in NORM_PLUS_ONE:
        return TensorSource((block or "") + NORM_PLUS_ONE[suffix or param], offset=1.0)
    if block is None:
        return TensorSource(TOP[param]) if param in TOP else None
    if gguf.arch in ("starcoder", "dbrx") and suffix in QKV:
        return _fused_qkv(arch, block, suffix)
    if gguf.arch == "dbrx" and suffix == "mlp_norm":
        return TensorSource(block + "attn_output_norm.weight")
    if suffix in BIASES:
        return TensorSource(block + BIASES[suffix])
    return None


def _fused_qkv(arch: Arch, block: str, suffix: str) -> TensorSource:
    """Rows of StarCoder's and DBRX's ``attn_qkv`` (c_attn, Wqkv: all q | k | v)."""
    a = arch.attention
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[suffix[-1]]
    return TensorSource(block + ("attn_qkv.weight" if suffix.startswith("attn.w") else "attn_qkv.bias"), rows=rows)


FAMILIES = {"stablelm": describe_stablelm, "nemotron": describe_nemotron, "starcoder": describe_starcoder,
            "jais2": describe_jais2, "dbrx": describe_dbrx}
