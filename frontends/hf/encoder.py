"""The encoder form of a Hugging Face folder: an embedding model instead of a decoder.

A folder compiles to an encoder (``Arch.encoder``; ``frontends.dsl_encoder`` builds it: no
KV cache, no logits; inputs ``input_ids`` and ``attention_mask`` [B, T]) when

- its config.json sets ``use_bidirectional_attention: true`` (EmbeddingGemma, on
  ``gemma3_text``): attention is bidirectional. transformers 5.24 turns the config's
  ``sliding_window`` W into W // 2 + 1 and lets a sliding layer's query see the keys with
  |i - j| < W // 2 + 1 (``Gemma3TextConfig.__post_init__`` and
  ``_bidirectional_window_overlay``), which is the ``attention`` op's symmetric window
  (``symmetric_window``); or
- it holds sentence-transformers' ``modules.json`` (a causal decoder pooled at its last
  token, Qwen3-Embedding's form, keeps causal attention).

Outputs: ``last_hidden_state`` [B, T, d] after the final norm (what transformers' base model,
``AutoModel``, returns), and with ``modules.json`` the ``sentence_embedding`` its modules
compute after the Transformer: ``Pooling`` (``1_Pooling/config.json``: the legacy
``pooling_mode_*`` switches or ``pooling_mode``), any ``Dense`` layers
(``2_Dense/config.json``: in_features, out_features, bias, activation_function identity or
tanh; weights ``linear.weight`` / ``linear.bias`` in the module's ``model.safetensors``,
params ``dense.{k}``), then ``Normalize``. Anything else in those files (another module
type, ``include_prompt: false``, a residual Dense, widths that do not chain) is a
``SpecError`` naming the file and the key.

A base model's checkpoint names its tensors without ``model.`` (``embed_tokens.weight``,
``layers.0...``, ``norm.weight``: what ``AutoModel.save_pretrained`` writes, and how
EmbeddingGemma ships); ``base_model_view`` shows them under the family layout's names.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from frontends.hf.config import Arch, Config, CONFIG
from frontends.hf.weights import Checkpoint, CheckpointData, Tensor
from irc.errors import SpecError
from irc.graph import Graph
from irc.inputs import parse_json, read_text
from irc.yamlloc import positive_int

MODULES = "modules.json"
PREFIX = "model."
LEGACY_MODES = {  # sentence-transformers' legacy switches, in its concatenation order
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": None, "torch.nn.modules.activation.Tanh": "tanh"}
EMBEDDING = "sentence_embedding"
# copied beside a compiled model: the prompts to prepend (config_sentence_transformers.json) and
# the longest input (sentence_bert_config.json); modules.json is not, the graph pools itself
SENTENCE_FILES = ("config_sentence_transformers.json", "sentence_bert_config.json")


@dataclass
class DenseLayer:
    """One sentence-transformers Dense module: param ``name`` [out, in] (+ ``name.bias``)."""
    name: str
    folder: str
    in_features: int
    out_features: int
    bias: bool
    activation: Optional[str]


@dataclass
class Encoder:
    """How an ``Arch`` is built as an encoder: ``causal`` attention or not, and the
    sentence-transformers modules after the Transformer (``steps``: ("pool", modes),
    ("dense", DenseLayer), ("normalize", None), in order), empty without modules.json."""
    causal: bool
    steps: list = field(default_factory=list)


def symmetric_window(window: Optional[int]) -> Optional[int]:
    """The ``attention`` op's symmetric window for a bidirectional layer whose config.json
    gives ``sliding_window`` ``window`` (transformers: W // 2 + 1, exclusive)."""
    return None if window is None else window // 2 + 1


def bidirectional(cfg: Config) -> Optional[Encoder]:
    """An ``Encoder`` with bidirectional attention when config.json sets
    ``use_bidirectional_attention``, else None."""
    value = cfg.raw("use_bidirectional_attention")
    if value not in (None, True, False):
        raise cfg.error("use_bidirectional_attention", f"expected true or false, got {value!r}")
    return Encoder(causal=False) if value else None


# ---- modules.json --------------------------------------------------------------------------

def read_modules(folder: str, arch: Arch) -> None:
    """Read the folder's ``modules.json`` (when there is one) into ``arch.encoder``; a
    folder without one keeps its form."""
    path = os.path.join(folder, MODULES)
    if not os.path.isfile(path):
        return
    text = read_text(path, SpecError)
    modules = parse_json(text, path, SpecError)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise SpecError("expected a list of modules (objects with type and path)", location=path)
    if arch.expand is not None or arch.attention is None or arch.attention.kind != "gqa" or arch.ssm is not None:
        raise SpecError(f"a {arch.model_type} model has no encoder form in irc", location=path,
                        hint="the encoder form takes decoders of attention layers and feed-forward blocks")
    encoder = arch.encoder or Encoder(causal=True)
    width = arch.d_model
    for index, module in enumerate(modules):
        kind, where = _kind(module, index, text, path)
        if (index == 0) != (kind == "Transformer") or (kind == "Transformer" and module.get("path", "") != ""):
            raise SpecError(f"module {index} is {module.get('type')!r} at {module.get('path')!r}; irc reads a "
                            "Transformer at the folder itself first, then Pooling, Dense and Normalize",
                            location=where)
        if kind == "Transformer":
            continue
        sub = os.path.join(folder, _sub_path(module, where))
        if kind == "Pooling":
            if encoder.steps:
                raise SpecError("Pooling must come once, right after the Transformer", location=where)
            modes = _pooling(Config.read(sub), width)
            encoder.steps.append(("pool", modes))
            width *= len(modes)
        elif not encoder.steps:
            raise SpecError(f"{kind} before Pooling: irc pools the token embeddings first", location=where)
        elif kind == "Dense":
            dense = _dense(Config.read(sub) if os.path.isfile(os.path.join(sub, CONFIG)) else None, sub, width,
                           sum(step[0] == "dense" for step in encoder.steps))
            encoder.steps.append(("dense", dense))
            width = dense.out_features
        else:
            _normalize(sub)
            encoder.steps.append(("normalize", None))
    arch.encoder = encoder


def _kind(module: dict, index: int, text: str, path: str) -> tuple[str, str]:
    """(the module's class name, the location of its entry)."""
    spots = [m.start() for m in re.finditer(r'"type"\s*:', text)]
    where = f"{path}:{text.count(chr(10), 0, spots[index]) + 1}" if index < len(spots) else path
    kind = module.get("type")
    name = kind.rsplit(".", 1)[-1] if isinstance(kind, str) else None
    if name not in ("Transformer", "Pooling", "Dense", "Normalize"):
        raise SpecError(f"type: {kind!r} is not supported", location=where,
                        hint="irc compiles Transformer, Pooling, Dense and Normalize modules")
    return name, where


def _sub_path(module: dict, where: str) -> str:
    sub = module.get("path")
    if not isinstance(sub, str) or not sub or os.path.isabs(sub) or ".." in sub.split("/"):
        raise SpecError(f"path: {sub!r} is not a folder of this model", location=where)
    return sub


def _pooling(cfg: Config, width: int) -> tuple:
    """The pooling modes of a Pooling module's config.json, in sentence-transformers' order."""
    for key in ("embedding_dimension", "word_embedding_dimension"):
        if cfg.has(key) and cfg.raw(key) != width:
            raise cfg.error(key, f"{cfg.raw(key)!r} does not match the model's hidden_size {width}")
    if cfg.raw("include_prompt", True) is not True:
        raise cfg.unsupported("include_prompt", cfg.raw("include_prompt"),
                              hint="excluding the prompt needs its length at encode time; the model has no "
                                   "such input")
    unknown = sorted(k for k in cfg.data if k.startswith("pooling_mode_") and k not in LEGACY_MODES)
    if unknown:
        raise cfg.unsupported(unknown[0], cfg.raw(unknown[0]), hint=f"pooling switches: {', '.join(LEGACY_MODES)}")
    if "pooling_mode" in cfg.data:
        value = cfg.raw("pooling_mode")
        modes = (value,) if isinstance(value, str) else value
        key = "pooling_mode"
    else:
        for legacy in LEGACY_MODES:
            if not isinstance(cfg.raw(legacy, False), bool):
                raise cfg.error(legacy, f"expected true or false, got {cfg.raw(legacy)!r}")
        modes = tuple(mode for legacy, mode in LEGACY_MODES.items() if cfg.raw(legacy, False)) or ("mean",)
        key = next((k for k in LEGACY_MODES if cfg.raw(k, False)), "pooling_mode_mean_tokens")
    if not isinstance(modes, (list, tuple)) or not modes or any(m not in LEGACY_MODES.values() for m in modes):
        raise cfg.unsupported(key, cfg.raw(key), hint=f"pooling modes: {', '.join(LEGACY_MODES.values())}")
    return tuple(modes)


def _dense(cfg: Optional[Config], folder: str, width: int, index: int) -> DenseLayer:
    if cfg is None:
        raise SpecError(f"no {CONFIG} in this Dense module's folder", location=folder)
    for key in ("module_input_name", "module_output_name"):
        cfg.check(key, lambda v: v in (None, EMBEDDING), hint="irc's Dense reads and writes the sentence embedding")
    cfg.check("use_residual", lambda v: not v, hint="irc's Dense has no residual branch")
    in_features = cfg.get("in_features", positive_int)
    if in_features != width:
        raise cfg.error("in_features", f"{in_features} does not match the {width} features before it")
    activation = cfg.raw("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise cfg.unsupported("activation_function", activation, hint=f"activations: {', '.join(ACTIVATIONS)}")
    bias = cfg.raw("bias", True)
    if not isinstance(bias, bool):
        raise cfg.error("bias", f"expected true or false, got {bias!r}")
    return DenseLayer(f"dense.{index}", folder, in_features, cfg.get("out_features", positive_int), bias,
                      ACTIVATIONS[activation])


def _normalize(folder: str) -> None:
    if os.path.isfile(os.path.join(folder, CONFIG)):
        cfg = Config.read(folder)
        for key in ("module_input_name", "module_output_name"):
            cfg.check(key, lambda v: v in (None, EMBEDDING), hint="irc normalises the sentence embedding")


# ---- the graph and its weights ---------------------------------------------------------------

def build_outputs(m, encoder: Encoder, x) -> None:
    """The encoder's outputs through the DSL: ``last_hidden_state`` = x, then the
    sentence-transformers steps and ``sentence_embedding`` when there are any."""
    h = m.last_hidden_state(x)
    if not encoder.steps:
        return
    e = h
    for step, detail in encoder.steps:
        if step == "pool":
            e = m.pool(e, detail)
        elif step == "dense":
            e = m.dense(e, detail.out_features, bias=detail.bias, activation=detail.activation, name=detail.name)
        else:
            e = m.l2_normalize(e)
    m.sentence_embedding(e)


def attach_modules(graph: Graph, encoder: Encoder) -> None:
    """Point the Dense params at their modules' ``model.safetensors`` (shapes checked)."""
    for step, dense in encoder.steps:
        if step != "dense":
            continue
        checkpoint = Checkpoint.find(dense.folder)
        if checkpoint is None:
            raise SpecError("no model.safetensors in this Dense module's folder", location=dense.folder,
                            hint="irc reads safetensors weights (sentence-transformers' default), not "
                                 "pytorch_model.bin")
        wanted = {"linear.weight": graph.params[dense.name]}
        if dense.bias:
            wanted["linear.bias"] = graph.params[f"{dense.name}.bias"]
        extra = sorted(set(checkpoint.files) - set(wanted))
        if extra:
            raise SpecError(f"tensor {extra[0]} has no place in a Dense of config.json's settings",
                            location=checkpoint.file(extra[0]))
        for name, param in wanted.items():
            shape = checkpoint.info(name)[1]
            if tuple(shape) != param.shape:
                raise SpecError(f"tensor {name} has shape {shape}; config.json describes {list(param.shape)}",
                                location=checkpoint.file(name))
            checkpoint.dtype(name)
            param.data = CheckpointData(checkpoint, Tensor(name), param.dtype)


class BaseModelCheckpoint(Checkpoint):
    """A base model's tensors (``embed_tokens.weight``, ``layers.0...``) under the
    ``model.``-prefixed names of the family layouts."""

    def __init__(self, checkpoint: Checkpoint):
        super().__init__(checkpoint.folder, {PREFIX + name: path for name, path in checkpoint.files.items()})
        self._headers = checkpoint._headers

    def entry(self, name: str) -> dict:
        path = self.file(name)
        stored = name[len(PREFIX):]
        entry = self.header(path).get(stored)
        if entry is None:
            raise SpecError(f"tensor {stored} is not in {os.path.basename(path)}", location=path)
        return entry


def base_model_view(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` as the layouts name it: a base model's (no name under ``model.``, an
    ``embed_tokens.weight``) seen through ``BaseModelCheckpoint``, any other as it is."""
    names = checkpoint.files
    if "embed_tokens.weight" in names and not any(name.startswith(PREFIX) for name in names):
        return BaseModelCheckpoint(checkpoint)
    return checkpoint
