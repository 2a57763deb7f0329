"""The Hugging Face frontend: a model folder (config.json + *.safetensors) -> Graph.

    graph = load_hf("models/Llama-3.1-8B")              # weights lazy, read on first use
    graph = load_hf("examples/hf/llama3-8b", weights=False)  # structure only: params absent

``load_spec`` (and so ``irc show/compile/run``) takes such a folder wherever it takes a
spec file. A folder with only config.json compiles with params absent (analysis, passes,
seeded weights for ``--check``).

Stages, one module each: ``config`` reads config.json into a normalised ``Arch``
(``families`` knows each model_type), ``build`` expands it through the DSL exactly as the
YAML architecture form does and points params at the checkpoint, ``weights`` indexes the
safetensors files and reads one tensor at a time. The graph is named after the folder.
Families and their options are listed in ``frontends.hf.families``; anything else is a
``SpecError`` naming config.json, the key and the value.
"""
from __future__ import annotations

import os
from typing import Optional

from frontends.hf.build import attach_weights, build_graph
from frontends.hf.config import CONFIG, Arch, Config
from frontends.hf.encoder import SENTENCE_FILES, attach_modules, base_model_view, read_modules
from frontends.hf.families import checkpoint_source, describe
from frontends.hf.generation import GENERATION_CONFIG, generation_meta
from frontends.hf.mtp import PART, build_head, has_head, read_head
from frontends.hf.vision import is_vision, load_vision
from frontends.hf.vlm import is_vlm, load_vlm
from frontends.hf.weights import Checkpoint
from irc.dtypes import DType
from irc.errors import SpecError
from irc.graph import Graph

__all__ = ["load_hf", "read_arch", "is_hf_folder", "companion_files"]

# what a runtime reads beside the model (onnxruntime-genai: tokenizer.json and
# tokenizer_config.json; the rest for other tokenizer loaders and chat templates; irc run:
# tokenizer.json, the chat template and generation_config.json's eos)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", GENERATION_CONFIG,
                   "preprocessor_config.json")  # an image encoder's processor (irc run --image)


def is_hf_folder(path) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG))


def companion_files(folder) -> dict:
    """The folder's tokenizer files and generation_config.json that exist, by name -> path
    (copied beside the model so onnxruntime-genai and ``irc run`` run the output folder as
    it is), and sentence-transformers' settings an embedding model's user reads (its
    prompts: ``frontends.hf.encoder.SENTENCE_FILES``)."""
    paths = {name: os.path.join(str(folder), name) for name in TOKENIZER_FILES + SENTENCE_FILES}
    return {name: path for name, path in paths.items() if os.path.isfile(path)}


def read_arch(folder, cfg: Optional[Config] = None) -> tuple[Arch, Config]:
    """The normalised architecture of a folder's config.json (an encoder's, ``Arch.encoder``,
    with bidirectional attention or sentence-transformers' modules.json:
    ``frontends.hf.encoder``); ``cfg`` when the caller has read it already."""
    folder = str(folder)
    cfg = cfg or Config.read(folder)
    name = os.path.basename(os.path.normpath(os.path.abspath(folder))) or "model"
    arch = describe(cfg, name)
    read_modules(folder, arch)  # sentence-transformers' modules.json: the encoder form
    read_head(cfg, arch)  # a multi-token-prediction head config.json declares: frontends.hf.mtp
    return arch, cfg


def load_hf(folder, weights: bool = True) -> Graph:
    """The graph of a Hugging Face model folder; with ``weights``, params read lazily from
    its safetensors files (absent when the folder has none)."""
    folder = str(folder)
    if not is_hf_folder(folder):
        raise SpecError(f"no {CONFIG} in this folder", location=folder)
    cfg = Config.read(folder)
    if is_vision(cfg):  # an image encoder: frontends.hf.vision
        return load_vision(folder, cfg, weights)
    if is_vlm(cfg):  # a vision-language model: frontends.hf.vlm
        return load_vlm(folder, cfg, weights)
    arch, cfg = read_arch(folder, cfg)
    checkpoint = Checkpoint.find(folder) if weights else None
    if checkpoint is not None and arch.encoder is not None:
        checkpoint = base_model_view(checkpoint)
    if checkpoint is not None:
        if arch.quantized:
            raise cfg.error("quantization_config", "quantized checkpoints are not supported",
                            hint="use unquantized weights, or compile the structure alone (weights=False)")
        embed = checkpoint_source(arch, "embed").names()[0]
        arch.dtype = str(checkpoint.dtype(embed) if embed in checkpoint.files else DType.parse(arch.dtype))
        if arch.mtp is not None and not has_head(arch, checkpoint):
            arch.mtp = None  # declared, not saved (transformers' save_pretrained drops it)
    graph = build_graph(arch, cfg)
    if arch.mtp is not None:
        graph.parts[PART] = build_head(arch, cfg, checkpoint)
    graph.meta.update(generation_meta(folder, cfg.data))  # token ids, positions, search defaults
    if checkpoint is not None:
        if arch.encoder is not None:
            attach_modules(graph, arch.encoder)
        attach_weights(graph, arch, checkpoint)
    return graph
