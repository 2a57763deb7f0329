"""The GGUF frontend: llama.cpp / ollama model files -> Graph, weights kept as stored.

    graph = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")            # blocks kept where exact
    graph = load_gguf("model-00001-of-00003.gguf", weights="float")  # every weight float32
    files = tokenizer_files("model.gguf")  # {"tokenizer.json": ..., "tokenizer_config.json": ...}

``load_spec`` (and so ``irc show/compile/run/tile``) takes a ``.gguf`` path, split sets
included. Stages, one module each: ``reader`` opens the file(s) with the ``gguf``
package's reader (metadata, tensor directory; data memory-mapped); ``families`` (with
``arch``, ``ssm`` for mamba, mamba2, jamba, and ``hybrid`` for granitehybrid, nemotron_h,
falcon-h1, ``linear`` for lfm2, lfm2moe, qwen3next, qwen35, qwen35moe, ``classic`` for the
LayerNorm decoders and GPT-OSS, ``kimi`` for kimi-linear, ``gemma3n``, ``gemma4`` and ``phimoe``,
``families_2026`` for exaone4, exaone-moe, glm4moe, ernie4_5(-moe), hunyuan, dots1, seed_oss,
arcee, minimax-m2, exaone, llama4, afmoe, minicpm3, with ``families_2026b`` for stablelm,
nemotron, starcoder, jais2 and dbrx) maps the architecture's keys onto the ``Arch``
the Hugging Face frontend builds, and ``frontends.hf.build.expand`` makes the same graph from it; ``layout`` and
``tensors`` name each param's tensor and undo the converter's changes; ``quantized``
attaches lazy data, keeping the block formats ``blocks`` can express as ``dequant_linear`` /
``dequant_embedding`` / ``dequantize`` codes (MatMulNBits' layout) in ``forms``' forms, one
tensor at a time;
``tokenizer`` writes the tokenizer the file carries as ``tokenizer.json``; ``mtp`` builds the
multi-token-prediction head a file's nextn block holds as ``graph.parts["mtp"]`` (GLM-4.5's), as
``frontends.hf.mtp`` does from a checkpoint.

``weights``: ``"blocks"`` (default) keeps the block formats ``blocks`` expresses quantized,
every block's values as the file has them (``forms``: 4-bit types as 4-bit codes; Q5_0, Q5_1,
Q5_K, Q6_K and Q8_0 as 8-bit codes under the file's scales; MatMulNBits at accuracy level 4,
int8 activations) and dequantizes the rest to float32; ``"blocks4"`` re-expresses Q5_0 / Q6_K /
Q5_1 / Q5_K as 4-bit codes (lossy, noted: the default before 2026-12-07); ``"exact"`` keeps
the file's codes and asks for float activations (accuracy level 0: exact products, slow 8-bit
kernels); ``"int4"`` re-expresses Q8_0 as 4-bit codes too (every projection 4-bit: irc's int4
size, lossy, noted);
``"float"`` dequantizes everything (the numbers transformers' GGUF
loader computes); ``None`` builds the structure alone (params absent). The graph is
float32 and named after the file; ``meta`` carries the tokenizer's special token ids
(``bos_token_id``, ``eos_token_id``, ``pad_token_id``) for genai_config.json, and
``meta["gguf"]`` the architecture and the notes on which tensors were kept or converted.
"""
from __future__ import annotations

import os
import re

from frontends.dsl_args import ArgError
from frontends.gguf import mtp, ssm
from frontends.gguf.families import describe
from frontends.gguf.quantized import attach_weights
from frontends.gguf.reader import SPLIT, GGUFFile
from frontends.hf.build import expand
from frontends.hf.mtp import PART
from irc.errors import SpecError
from irc.graph import Graph

__all__ = ["load_gguf", "is_gguf", "tokenizer_files", "GGUFFile"]

WEIGHTS = ("blocks", "blocks4", "exact", "int4", "float", None)
# DSL argument -> the GGUF key (after the architecture prefix) a refusal should name
GGUF_KEYS = {"n": "block_count", "vocab": "vocab_size", "d_model": "embedding_length", "heads": "attention.head_count",
             "kv_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
             "d_ff": "feed_forward_length", "experts": "expert_count", "top_k": "expert_used_count",
             "groups": "expert_group_count", "top_groups": "expert_group_used_count",
             "window": "attention.sliding_window", "rope.rotary_dim": "rope.dimension_count",
             "shared_d_ff": "expert_shared_feed_forward_length", "kv_lora_rank": "attention.kv_lora_rank",
             "q_lora_rank": "attention.q_lora_rank", "qk_rope_head_dim": "rope.dimension_count",
             "qk_nope_head_dim": "attention.key_length_mla", "v_head_dim": "attention.value_length_mla",
             "routed_scale": "expert_weights_scale", **ssm.KEYS,
             "key_heads": "ssm.group_count", "value_heads": "ssm.time_step_rank", "key_dim": "ssm.state_size"}
TOKEN_IDS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
             "pad_token_id": "tokenizer.ggml.padding_token_id"}


def is_gguf(path) -> bool:
    return str(path).lower().endswith(".gguf")


def graph_name(path: str) -> str:
    """The file's name without ``.gguf`` (and without a split suffix), in IR name characters."""
    base = os.path.basename(path)
    match = SPLIT.match(base)
    stem = match.group("stem") if match else base[:-len(".gguf")] if is_gguf(base) else base
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", stem) or "model"


def load_gguf(path, weights="blocks") -> Graph:
    """The graph of a GGUF file (module docstring)."""
    if weights not in WEIGHTS:
        raise SpecError(f"weights={weights!r} is not one of {', '.join(map(repr, WEIGHTS))}", location=str(path))
    return build(GGUFFile.open(path), weights)


def build(gguf: GGUFFile, weights="blocks") -> Graph:
    """``load_gguf`` for a file already opened."""
    arch = describe(gguf, graph_name(gguf.path))
    mtp.read_head(gguf, arch)  # the file's multi-token-prediction block: frontends.gguf.mtp
    attach = None if weights is None or not gguf.tensors else {"weights": weights}
    try:
        graph = expand(arch, gguf.path)
        if arch.mtp is not None:
            graph.parts[PART] = mtp.build_head(gguf, arch, attach)
    except ArgError as err:
        key = gguf.arch_key(GGUF_KEYS[err.arg]) if err.arg in GGUF_KEYS else err.arg
        raise SpecError(f"{key}: {err.detail}", location=gguf.path, hint=err.hint) from None
    for meta_key, key in TOKEN_IDS.items():
        if gguf.has(key):
            graph.meta[meta_key] = gguf.get(key, int)
    if gguf.has(gguf.arch_key("context_length")):  # the longest sequence trained for (genai's context_length cap)
        graph.meta["max_positions"] = gguf.get(gguf.arch_key("context_length"), int)
    # a file without tensors (a vocabulary-only GGUF) gives the structure alone, like weights=None
    notes = [] if attach is None else attach_weights(graph, arch, gguf, **attach)
    graph.meta["gguf"] = {"architecture": gguf.arch, "notes": notes}
    return graph


def tokenizer_files(path) -> tuple[dict, str]:
    """({"tokenizer.json": text, "tokenizer_config.json": text}, "") for the tokenizer a
    GGUF file carries, or ({}, why not): it cannot be converted faithfully
    (``frontends.gguf.tokenizer``), or the ``tokenizers`` package (the ``gguf`` extra) is
    not installed."""
    try:
        from frontends.gguf.tokenizer import tokenizer_files as files
    except ImportError:
        return {}, "tokenizer.json not written: it needs the tokenizers package (pip install 'irc[text]')"
    return files(GGUFFile.open(path))
