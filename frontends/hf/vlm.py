"""Vision-language models from Hugging Face folders: a vision model and a text decoder.

=========  =========================================================================================
llava      ``vision_config``: a CLIP or SigLIP vision tower (transformers' default: CLIP ViT-L/14 at
           336 pixels); its hidden state ``vision_feature_layer`` (an index into transformers'
           ``hidden_states``: the embeddings, then each layer's output; -2 by default; a list
           concatenates several along the features), the first token (CLIP's class token)
           dropped when ``vision_feature_select_strategy`` is "default"; the projector
           ``linear_1`` -> ``projector_hidden_act`` -> ``linear_2`` (biases with
           ``multimodal_projector_bias``). ``text_config``: any decoder irc's shared loop builds
           (``model_type`` llama by default), its token embeddings with every ``image_token_id``
           (``image_token_index``) placeholder replaced, in order, by an image feature row
llava_next LLaVA's tower and projector on the base view and each tile of the best-fitting
           ``image_grid_pinpoints`` resolution, the projected tokens packed as transformers'
           ``pack_image_features`` packs them (the base view's, then the tiles' grid unpadded to the
           image's aspect with ``image_newline`` after each row): the rows ``image_rows`` picks, which
           the processor lays out (``irc_cli.images_anyres``); "default" strategy only
gemma3     ``vision_config``: a SigLIP tower's last_hidden_state (post-LayerNorm); the projector
           average-pools the patch grid to ``mm_tokens_per_image`` tokens (a k x k window,
           k = patches per side / tokens per side), normalises them (``mm_soft_emb_norm``,
           Gemma's RMSNorm with 1 + w, the tower's eps) and projects them
           (``mm_input_projection_weight`` [d_vision, d_text], applied as x @ W). ``text_config``:
           a gemma3_text decoder (its embeddings scaled by sqrt(d) before the merge), in which
           one image's tokens see each other both ways (``image_blocks``:
           transformers' ``token_type_ids`` mask, here read from the ids, so the decoder model
           also takes ``input_ids``)
paligemma  ``vision_config``: SigLIP's last_hidden_state (post-LayerNorm) through one linear with a
           bias (``multi_modal_projector.linear``); ``text_config``: gemma (or gemma2); the
           processor writes the image's tokens before <bos> and the prompt, and the whole prompt
           with its image is one bidirectional prefix (``image_blocks`` with ``prefix``: a chunk
           holding an image sees itself whole; transformers 5.25 sets the text model's
           ``use_bidirectional_attention``, the same for a prompt run in one chunk)
idefics3   ``vision_config``: Idefics3's / SmolVLM's SigLIP tower (positions 0..n-1: every tile
smolvlm    the processor gives is full size); its post-LayerNorm states pixel-shuffled by
           ``scale_factor`` (s x s neighbouring patches into one token of s²·d features) and
           projected (``connector.modality_projection.proj``, no bias); ``text_config``: llama
           (SmolLM2's) by default. An image is its tiles and a global view, each a batch row of
           ``pixel_values`` (``irc_cli.images`` splits it as the processor does)
qwen2_vl   Qwen-VL's own tower on the processor's flattened patches and ``image_grid_thw``, a
qwen2_5_vl Qwen2 decoder with multimodal RoPE: ``frontends.hf.vlm_qwen``
qwen3_vl   (and ``qwen3_vl_moe``) the same tower with a learned position grid resampled to each
           image, DeepStack levels added after the text model's first layers, a Qwen3 (MoE) decoder
           with interleaved multimodal RoPE: ``frontends.hf.vlm_qwen``
qwen3_5    (and ``qwen3_5_moe``) that tower without DeepStack before Qwen3.5's gated-DeltaNet hybrid
           (``frontends.hf.families_delta``)
mistral3   Pixtral and Mistral-3's projector on an image of any size, a Mistral decoder:
           ``frontends.hf.vlm_mistral3``
blip-2     BLIP-2's ViT, the Q-Former's ``num_query_tokens`` queries and the language projection,
           an OPT decoder, the image's tokens before the prompt: ``frontends.hf.vlm_blip2``
mllama     Llama-3.2-Vision: a tiled tower whose states a Llama decoder's gated cross-attention
           layers read (no tokens merged): ``frontends.hf.vlm_mllama``
=========  =========================================================================================

``load_vlm`` returns the decoder graph, which takes ``image_features`` f32 [I, d] beside its
usual inputs (``merge_tokens`` right after the embedding lookup; I = 0 on a step without an
image), with the vision model as ``graph.parts["vision"]``: ``pixel_values`` f32 [B, C, S, S]
-> ``image_features`` [B·tokens, d], the projector inside (onnxruntime-genai's layout).
Both read their weights lazily from the checkpoint, under transformers 5's names
(``model.vision_tower.``, ``model.multi_modal_projector.``, ``model.language_model.``,
``lm_head.``) or 4.x's (``vision_tower.``, ``multi_modal_projector.``,
``language_model.model.``, ``language_model.lm_head.``). The tower's tensors that the chosen
layer does not reach (the last layers, the post-LayerNorm, SigLIP's pooling head) are not read.
Refused, with config.json's key and value: a text model the shared decoder loop does not
build, a vision tower other than CLIP's or SigLIP's, a feature layer outside the tower,
strategies other than "default" and "full", projector activations other than GELU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from frontends.dsl import ArgError, Model
from frontends.dsl_vision import Features, build_image_features
from frontends.hf.build import attach_weights, build_graph
from frontends.hf import families_classic, families_delta
from frontends.hf import vlm_blip2 as blip2
from frontends.hf import vlm_mistral3 as mistral3
from frontends.hf import vlm_mllama as mllama
from frontends.hf import vlm_qwen as qwen
from frontends.hf.config import Config, NestedConfig, int_list
from frontends.hf.families import checkpoint_source, describe
from frontends.hf.generation import generation_meta
from frontends.hf.vision import DEFAULTS as TOWER_DEFAULTS
from frontends.hf.vision import GELU, attach_vision_weights, vision_spec
from frontends.hf.weights import Checkpoint, PrefixView, Tensor, View, attach_sources
from irc.graph import Graph
from irc.yamlloc import boolean, non_negative_int, positive_int, string

DEFAULTS = {  # transformers 5.25's LlavaConfig, Gemma3Config, Idefics3Config and SmolVLMConfig
    "llava": {"image_token_index": 32000, "image_seq_length": 576, "projector_hidden_act": "gelu",
              "vision_feature_select_strategy": "default", "vision_feature_layer": -2,
              "multimodal_projector_bias": True, "tie_word_embeddings": False},
    "llava_next": {"image_token_index": 32000, "projector_hidden_act": "gelu", "vision_feature_select_strategy": "default",
                   "vision_feature_layer": -2, "multimodal_projector_bias": True, "tie_word_embeddings": False,
                   "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]},
    "gemma3": {"image_token_index": 262144, "mm_tokens_per_image": 256, "boi_token_index": 255999,
               "eoi_token_index": 256000, "tie_word_embeddings": True},
    "paligemma": {"image_token_index": 256000, "projection_dim": 2048, "tie_word_embeddings": True},
    "idefics3": {"image_token_id": 128257, "scale_factor": 2, "tie_word_embeddings": False},
    "smolvlm": {"image_token_id": 128257, "scale_factor": 2, "tie_word_embeddings": False},
    **{kind: dict(qwen.DEFAULTS[kind]) for kind in qwen.TYPES},
    "mistral3": dict(mistral3.DEFAULTS),
    "blip-2": dict(blip2.DEFAULTS),
    "mllama": dict(mllama.DEFAULTS),
}
FAMILIES = tuple(DEFAULTS)
_SIGLIP_SO400M = {**TOWER_DEFAULTS["siglip_vision_model"], "hidden_size": 1152, "num_hidden_layers": 12,
                  "num_attention_heads": 16, "patch_size": 32, "vision_use_head": False}  # Idefics3/SmolVLM's
# a sub-config is saved as its difference from its class's defaults (llava-hf's text_config
# holds a handful of keys): transformers 5.25's defaults for the shapes, per text model type
_SEVEN_B = {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
TEXT_DEFAULTS = {
    "llama": {**_SEVEN_B, "intermediate_size": 11008, "max_position_embeddings": 2048},
    "mistral": {**_SEVEN_B, "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "sliding_window": 4096},
    "qwen2": {**_SEVEN_B, "vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768},
    "gemma": {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma2": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
               "query_pre_attn_scalar": 256, "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131072, "query_pre_attn_scalar": 256, "sliding_window": 4096},
    **qwen.TEXT_DEFAULTS,
}
STRATEGIES = ("default", "full")
# the text decoders that merge image features: the shared loop's (None), Qwen3.5's hybrid, the classics' (OPT)
IMAGE_EXPANDERS = (None, families_delta.expand, families_classic.expand)
# viewed prefix -> stored prefix, the first that matches wins: how each family's checkpoints
# name the text model (seen as the text family's own names), the tower and the projector,
# transformers 5's in-memory names and 4.x's (what save_pretrained and the hub hold)
_LLAVA_NAMES = ([("model.", "model.language_model."), ("lm_head.", "lm_head."), ("model.", "language_model.model."),
                 ("lm_head.", "language_model.lm_head.")],
                [("", "model.vision_tower."), ("", "vision_tower.")],
                [("projector.", "model.multi_modal_projector."), ("projector.", "multi_modal_projector.")])
_IDEFICS_NAMES = ([("model.", "model.text_model."), ("lm_head.", "lm_head.")], [("vision_model.", "model.vision_model.")],
                  [("projector.", "model.connector.modality_projection.")])


@dataclass
class Family:
    """What a VLM family is made of: its text model's type, the towers it takes (and their
    defaults), how its features are made (``Features``), the key of its
    image token, its checkpoint names (text, tower, projector), and whether one image's
    tokens see each other."""
    text_type: str
    towers: tuple
    tower_defaults: dict
    features: Callable  # (cfg, tower spec) -> frontends.dsl_vision.Features
    image_key: str
    names: tuple
    image_blocks: str = "none"  # dsl_vision.BIDIRECTIONAL
    text_defaults: Optional[dict] = None  # keys its config class sets in the text config
    # a tower of its own form (Qwen-VL's): (cfg, tower config, name, d_text) -> vision graph,
    # and (vision graph, the checkpoint's tower view) -> None attaching its weights
    tower: Optional[Callable] = None
    attach_tower: Optional[Callable] = None
    # (cfg, image token) -> how its processor lays an image out in the prompt (None: LLaVA's)
    layout: Optional[Callable] = None
    # (model_type, text config) -> the text RoPE's multi-axis ``mrope`` (Qwen-VL's), the keys taken out
    mrope: Optional[Callable] = None
    text_checkpoint: Optional[str] = None  # a text layout of its own (Qwen3-VL-MoE's fused experts)
    outer_tie: bool = False  # tied as the outer config says, the text config's flag unread (Qwen3-VL, Qwen3.5)
    # a VLM of another form, which loads itself: (folder, cfg, weights) -> the decoder graph
    # (Llama-3.2-Vision's cross-attention decoder: frontends.hf.vlm_mllama)
    loader: Optional[Callable] = None


def is_vlm(cfg: Config) -> bool:
    model_type = cfg.data.get("model_type")
    return isinstance(model_type, str) and model_type in DEFAULTS


def build_vision_model(cfg: Config, tower: Config, name: str, d_text: int) -> Graph:
    """pixel_values -> the tower -> the family's projector -> image_features."""
    family = FAMILY[cfg.data["model_type"]]
    if family.tower is not None:
        return family.tower(cfg, tower, name, d_text)
    tower_type = tower.get("model_type", string, family.towers[0])
    if tower_type not in family.towers:
        raise tower.unsupported("model_type", tower_type, hint=f"{cfg.data['model_type']} vision towers: "
                                                               f"{', '.join(family.towers)}")
    tower.defaults = {**TOWER_DEFAULTS.get(tower_type, {}), **family.tower_defaults}
    spec = vision_spec(tower, tower_type)
    m = Model(f"{name}-vision", vocab=None, d_model=tower.get("hidden_size", positive_int), dtype=cfg.dtype(),
              encoder=True)
    features = family.features(cfg, spec)
    with m.at(cfg.path):
        try:
            build_image_features(m, spec, features, d_text)
        except ArgError as err:  # feature layers outside the tower, a pooling or shuffle that does not fit
            raise cfg.error(ARGS.get(err.arg, err.arg), err.detail, hint=err.hint) from None
    graph = m.graph
    graph.meta["model_type"] = tower_type
    return graph


def _llava_features(cfg: Config, spec) -> Features:
    """hidden_states[vision_feature_layer] (the class token dropped by "default"), projected."""
    raw = cfg.raw("vision_feature_layer")
    layers = cfg.get("vision_feature_layer", int_list) if isinstance(raw, list) else [
        cfg.get("vision_feature_layer", lambda v: int_list([v])[0])]  # their range: build_image_features
    strategy = cfg.get("vision_feature_select_strategy", string)
    if strategy not in STRATEGIES:
        raise cfg.unsupported("vision_feature_select_strategy", strategy, hint=f"strategies: {', '.join(STRATEGIES)}")
    act = cfg.get("projector_hidden_act", string)
    if act not in GELU or GELU[act] == "quick":
        raise cfg.unsupported("projector_hidden_act", act, hint="irc builds GELU projectors (exact or tanh)")
    return Features(layers=tuple(layers), drop=1 if strategy == "default" else 0, projector="mlp",
                    bias=cfg.get("multimodal_projector_bias", boolean), approximate=GELU[act])


def _anyres_features(cfg: Config, spec) -> Features:
    """LLaVA's features of every tile, packed as LLaVA-NeXT packs them (``Features.packed``)."""
    features = _llava_features(cfg, spec)
    if not features.drop:
        raise cfg.unsupported("vision_feature_select_strategy", cfg.get("vision_feature_select_strategy", string),
                              hint="LLaVA-NeXT's tiles are patch grids: irc builds the \"default\" strategy")
    pinpoints = cfg.raw("image_grid_pinpoints")
    if not isinstance(pinpoints, list) or not pinpoints or any(
            not isinstance(p, list) or len(p) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 or
                                                          v % spec.image_size for v in p) for p in pinpoints):
        raise cfg.error("image_grid_pinpoints", f"expected [height, width] pairs of multiples of the tower's "
                                                f"{spec.image_size} pixels, got {pinpoints!r}")
    features.packed = True
    return features


def _gemma3_features(cfg: Config, spec) -> Features:
    """The post-LayerNorm patch states average-pooled to mm_tokens_per_image, normed, projected."""
    return Features(post_norm=True, pool=cfg.get("mm_tokens_per_image", positive_int), projector="soft_emb")


def _shuffle_features(cfg: Config, spec) -> Features:
    """Idefics3's connector: the post-LayerNorm patch states pixel-shuffled by scale_factor
    (s x s neighbours into one token of s²·d features), then ``modality_projection``."""
    return Features(post_norm=True, shuffle=cfg.get("scale_factor", positive_int), projector="linear", bias=False)


# DSL argument -> the config key behind it
ARGS = {"layers": "vision_feature_layer", "tokens": "mm_tokens_per_image", "scale": "scale_factor"}

def _laid(placeholder: int, kind: str, before=(), after=(), around: str = "", **more) -> dict:
    return {"kind": kind, "placeholder": placeholder, "before": list(before), "after": list(after), "around": around,
            **more}


def _gemma3_layout(cfg: Config, image_token: int) -> dict:
    """Gemma3Processor: "\n\n<start_of_image>" + the soft tokens + "<end_of_image>\n\n" for each
    ``<start_of_image>``."""
    boi, eoi = (cfg.get(key, non_negative_int) for key in ("boi_token_index", "eoi_token_index"))
    return _laid(boi, "gemma3", [boi], [eoi], "\n\n")


def _tiles_layout(cfg: Config, image_token: int) -> dict:
    """SmolVLMProcessor's strings around each tile."""
    return _laid(image_token, "tiles", fake="<fake_token_around_image>", **{"global": "<global-img>"})


def _qwen_layout(cfg: Config, image_token: int) -> dict:
    return qwen.image_prompt(cfg, image_token, (cfg.data.get("vision_config") or {}).get("spatial_merge_size", 2))


FAMILY = {
    "llava": Family("llama", ("clip_vision_model", "siglip_vision_model"),
                    {"model_type": "clip_vision_model", "intermediate_size": 4096, "hidden_size": 1024,
                     "patch_size": 14, "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16},
                    _llava_features, "image_token_index", _LLAVA_NAMES),
    "llava_next": Family("llama", ("clip_vision_model", "siglip_vision_model"),
                         {"model_type": "clip_vision_model", "intermediate_size": 4096, "hidden_size": 1024,
                          "patch_size": 14, "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16},
                         _anyres_features, "image_token_index", _LLAVA_NAMES,  # <image> widened to the packed rows
                         layout=lambda cfg, token: _laid(token, "anyres",
                                                         pinpoints=cfg.get("image_grid_pinpoints", lambda v: v))),
    "gemma3": Family("gemma3_text", ("siglip_vision_model",), {"model_type": "siglip_vision_model"}, _gemma3_features,
                     "image_token_index", _LLAVA_NAMES, image_blocks="image", layout=_gemma3_layout),
    "paligemma": Family("gemma", ("siglip_vision_model",),
                        {"model_type": "siglip_vision_model", "intermediate_size": 4096, "hidden_size": 1152,
                         "patch_size": 14, "image_size": 224, "num_hidden_layers": 27, "num_attention_heads": 16,
                         "vision_use_head": False}, lambda cfg, spec: Features(post_norm=True, projector="linear"),
                        "image_token_index", _LLAVA_NAMES, image_blocks="prefix",  # the images, <bos>, the prompt
                        layout=lambda cfg, token: _laid(token, "prepend"),
                        text_defaults={"hidden_size": 2048, "num_hidden_layers": 18, "intermediate_size": 16384,
                                       "num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 257152}),
    **{kind: Family("llama", (f"{kind}_vision",), _SIGLIP_SO400M, _shuffle_features, "image_token_id",
                    _IDEFICS_NAMES, text_defaults={"rms_norm_eps": 1e-5}, layout=_tiles_layout)
       for kind in ("idefics3", "smolvlm")},
    "mistral3": Family("mistral", ("pixtral",), mistral3.TOWER_DEFAULTS, None, "image_token_index", mistral3.NAMES,
                       text_defaults=mistral3.TEXT_DEFAULTS, tower=mistral3.build_tower,
                       attach_tower=mistral3.attach_tower,
                       layout=lambda cfg, token: mistral3.image_prompt(token, dict(mistral3.BREAKS),
                                                                       cfg.get("spatial_merge_size", positive_int))),
    "blip-2": Family("opt", ("blip_2_vision_model",), {"model_type": "blip_2_vision_model"},
                     lambda cfg, spec: Features(post_norm=True, projector="qformer", qformer=blip2.qformer_spec(cfg)),
                     "image_token_index", blip2.NAMES, layout=lambda cfg, token: _laid(token, "prepend")),
    **{kind: Family(f"{kind}_text", (f"{kind}_vision",), qwen.TOWER_DEFAULTS[kind], None, "image_token_id",
                    (qwen.TEXT_NAMES, qwen.TOWER_NAMES, []), tower=qwen.build_tower, attach_tower=qwen.attach_tower,
                    layout=_qwen_layout, mrope=qwen.text_mrope, text_checkpoint=qwen.CHECKPOINTS.get(kind),
                    outer_tie=kind in qwen.QWEN3)
       for kind in qwen.TYPES},
    "mllama": Family("mllama_text_model", ("mllama_vision_model",), mllama.TOWER_DEFAULTS, None, "image_token_index",
                     ([], [], []), loader=mllama.load),
}


def _text(cfg: Config, name: str):
    model_type = cfg.data["model_type"]
    family = FAMILY[model_type]
    if model_type in qwen.TYPES and model_type not in qwen.QWEN3 and not cfg.has("text_config"):
        # the hub's Qwen2-VLs: the text model's keys at the top
        text = Config({k: v for k, v in cfg.data.items() if k not in ("vision_config", "model_type")}, cfg.path,
                      cfg.text, {})
        text.data["model_type"] = family.text_type
    else:
        text = NestedConfig(cfg, "text_config", {"model_type": family.text_type}, "the text model's settings",
                            hint=f"a {model_type} config holds its text model's settings under text_config")
    inner = text.get("model_type", string)
    if inner != family.text_type and model_type in ("gemma3", *qwen.TYPES):
        raise text.unsupported("model_type", inner, hint=f"{model_type} holds a {family.text_type} model")
    text.data = {**TEXT_DEFAULTS.get(inner, {}), **(family.text_defaults or {}), "model_type": inner, **text.data}
    # a decoder whose RoPE reads three position axes (Qwen-VL's)
    mrope = family.mrope(model_type, text) if family.mrope else None
    arch = describe(text, name)
    if getattr(arch.expand, "func", arch.expand) not in IMAGE_EXPANDERS or arch.encoder is not None:
        raise text.unsupported("model_type", arch.model_type,
                               hint="irc builds a VLM's text model with the decoder most families share, "
                                    "Qwen3.5's hybrid or the classic families' (OPT)")
    for spec in arch.layers if mrope is not None else ():
        if spec.mixer != "attention":
            continue
        sections, rotary = mrope["sections"], (spec.rope.rotary_dim if spec.rope else 0) or arch.attention.head_dim
        if spec.rope is None or spec.rope.scaling or mrope["layout"] == "sections" and sum(sections) * 2 != rotary:
            raise text.error("rope_parameters", f"mrope_section {sections} does not split the heads' {rotary} "
                                                "rotary dims in pairs (or a scaling is set)")
        spec.rope.mrope = dict(mrope)
    key = family.image_key  # image_token_id is an alias of image_token_index where that is the key
    key = "image_token_id" if key == "image_token_index" and cfg.has("image_token_id") and not cfg.has(key) else key
    arch.checkpoint = family.text_checkpoint or arch.checkpoint
    arch.image_token = cfg.get(key, non_negative_int)
    if arch.image_token >= arch.vocab_size:
        raise cfg.error(key, f"{arch.image_token} is outside the text model's vocabulary ({arch.vocab_size})")
    outer = cfg.get("tie_word_embeddings", boolean)
    arch.tied = outer if family.outer_tie else arch.tied or outer  # LlavaConfig.__post_init__: either ties
    if not any(key in text.data for key in ("dtype", "torch_dtype")):  # the model's dtype, where the text's is unsaid
        arch.dtype = cfg.dtype()
    arch.image_blocks = family.image_blocks
    return arch, text


PROJECTOR = {"gemma3": {"projector.norm": "projector.mm_soft_emb_norm.weight",
                        "projector.proj": "projector.mm_input_projection_weight"},
             "paligemma": {"projector.proj": "projector.linear.weight", "projector.proj.bias": "projector.linear.bias"},
             "blip-2": blip2.projector_source}


def _attach_projector(graph: Graph, view: Checkpoint, model_type: str, checkpoint: Checkpoint) -> None:
    """The projector's params from ``view`` (its prefix), LLaVA-NeXT's ``image_newline`` from
    beside it in ``checkpoint`` (transformers 5's name, then 4.x's)."""
    names = PROJECTOR.get(model_type, {})

    def source(name: str, shape: tuple) -> Tensor:
        if callable(names):  # a projector of its own names (BLIP-2's Q-Former)
            return names(name, shape)
        stored = names.get(name) or (name if name.endswith(".bias") else name + ".weight")
        # Gemma 3 stores its projection [d_vision, d_text], applied as x @ W
        return View(stored, transpose=True) if stored.endswith("_projection_weight") else Tensor(stored)

    attach_sources([p for p in graph.params.values() if p.name.startswith("projector.")], view, source,
                   spare=lambda name: True)
    if "image_newline" in graph.params:
        stored = next((n for n in ("model.image_newline", "image_newline") if n in checkpoint.files), "image_newline")
        attach_sources([graph.params["image_newline"]], checkpoint, lambda name, shape: Tensor(stored),
                       spare=lambda name: True)


def _image_prompt(cfg: Config, image_token: int) -> dict:
    """How the checkpoint's processor lays an image out in the prompt (the family's ``layout``):
    the id the user writes (``placeholder``) becomes ``around`` (text), ``before``, the image's
    tokens, ``after``, ``around`` again; LlavaProcessor's by default: ``<image>`` widened."""
    layout = FAMILY[cfg.data["model_type"]].layout
    return layout(cfg, image_token) if layout else _laid(image_token, "repeat")


def _unread(name: str, layers: int) -> bool:
    """A tower tensor the chosen hidden state does not reach."""
    parts = name.split(".")
    if "layers" in parts:
        return int(parts[parts.index("layers") + 1]) >= layers
    return any(p in ("post_layernorm", "head") for p in parts)


def load_vlm(folder: str, cfg: Config, weights: bool) -> Graph:
    """The decoder of ``folder``'s VLM, its vision model as ``graph.parts["vision"]``."""
    loader = FAMILY[cfg.data["model_type"]].loader
    if loader is not None:
        return loader(folder, cfg, weights)
    cfg.defaults = DEFAULTS[cfg.data["model_type"]]
    name = os.path.basename(os.path.normpath(os.path.abspath(folder))) or "model"
    arch, text = _text(cfg, name)
    names = FAMILY[cfg.data["model_type"]].names
    tower = NestedConfig(cfg, "vision_config", {}, "the vision tower's settings")
    vision = build_vision_model(cfg, tower, name, arch.d_model)
    arch.deepstack = vision.meta["vision"].get("deepstack", 0)  # Qwen3-VL's levels the decoder adds
    checkpoint = Checkpoint.find(folder) if weights else None
    if checkpoint is not None:
        if cfg.has("quantization_config"):
            raise cfg.error("quantization_config", "quantized checkpoints are not supported")
        arch.dtype = str(PrefixView(checkpoint, names[0]).dtype(checkpoint_source(arch, "embed").names()[0]))
    graph = build_graph(arch, text)
    graph.meta.update(generation_meta(folder, cfg.data))
    graph.meta["model_type"] = cfg.data["model_type"]
    graph.meta["image_prompt"] = _image_prompt(cfg, arch.image_token)
    if checkpoint is not None:
        attach_weights(graph, arch, PrefixView(checkpoint, names[0]))
        family = FAMILY[cfg.data["model_type"]]
        if family.attach_tower is not None:
            family.attach_tower(vision, PrefixView(checkpoint, names[1]))
            graph.parts["vision"] = vision
            return graph
        _attach_projector(vision, PrefixView(checkpoint, names[2]), cfg.data["model_type"], checkpoint)
        layers = vision.meta["n_layers"]
        attach_vision_weights(vision, PrefixView(checkpoint, names[1]), spare=lambda n: _unread(n, layers))
    graph.parts["vision"] = vision  # what Model.vision_model sets in the DSL
    return graph


__all__ = ["DEFAULTS", "FAMILIES", "build_vision_model", "is_vlm", "load_vlm"]
