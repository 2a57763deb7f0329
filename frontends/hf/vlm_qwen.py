"""Qwen2-VL, Qwen2.5-VL and Qwen3.5 from Hugging Face folders: their vision tower
(``frontends.dsl_qwen_vision``) and what their text model adds to its decoder (multimodal RoPE).

==========  ========================================================================================
qwen2_vl    ``vision_config`` (``qwen2_vl_vision``): ``embed_dim`` wide, ``depth`` layers of
            ``num_heads``, LayerNorms (eps 1e-6), quick_gelu MLPs ``embed_dim`` x ``mlp_ratio``; every
            layer attends over its frame; merger to ``hidden_size`` (the text model's width)
qwen2_5_vl  ``vision_config`` (``qwen2_5_vl_vision``): ``hidden_size`` wide, RMSNorms, SwiGLU MLPs
            with biases (``intermediate_size``, ``hidden_act`` silu), window attention over
            ``window_size`` pixels except in ``fullatt_block_indexes``; merger (RMSNorm) to
            ``out_hidden_size``
qwen3_5     ``vision_config`` (``qwen3_5_vision`` / ``qwen3_5_moe_vision``): ``hidden_size`` wide, patches
qwen3_5_moe with a bias, ``num_position_embeddings`` learned positions (an S x S grid) resampled
            bilinearly to each image, LayerNorms, GELU (tanh) MLPs with biases
            (``intermediate_size``), every layer over its frame; merger (LayerNorm) to
            ``out_hidden_size``. The text model (``text_config``) is Qwen3.5's hybrid
            (``frontends.hf.families_delta``), its RoPE interleaved over three axes
            (``mrope_section``, [11, 11, 10] by default, as ``Qwen3_5TextRotaryEmbedding`` always
            interleaves)
qwen3_vl    Qwen3.5's tower plus DeepStack: the states after each ``deepstack_visual_indexes`` layer
            ([8, 16, 24] by default) through a merger of their own, added to the text model's
            hidden states at the image tokens after its first layers (``Arch.deepstack``; the
            features are [I, (1 + levels)·d]); the text model a Qwen3 decoder (q/k norms) with
            interleaved RoPE over three axes ([24, 20, 20] by default)
==========  ========================================================================================

Both: patches of ``patch_size`` x ``temporal_patch_size`` frames, ``spatial_merge_size`` merging,
2-D RoPE with ``vision_config.rope_parameters.rope_theta`` (10,000). The Qwen2-VLs' text model is
a Qwen2 decoder (``text_config``, or, as the hub's checkpoints hold it, the top-level keys)
whose RoPE reads three position axes in sections (``mrope_section`` in ``rope_parameters`` /
``rope_scaling``, of ``rope_type`` "mrope" or "default"); every text model's ``position_ids`` are
i64 [3, B, T] (``irc.mrope``).
Weights: the tower under ``model.visual.`` (transformers 5) or ``visual.`` (the hub's), the text
model under ``model.language_model.`` or ``model.``. The processor writes
``<|vision_start|>`` + one ``<|image_pad|>`` per visual token + ``<|vision_end|>``.
"""
from __future__ import annotations

import math

from frontends.dsl import ArgError, Model
from frontends.dsl_qwen_vision import QwenVisionSpec, build_qwen_vision
from frontends.hf.config import Config, int_list
from frontends.hf.weights import Checkpoint, Tensor, View, attach_sources
from irc.graph import Graph
from irc.yamlloc import positive_int, string

DEEPSTACK = ("qwen3_vl", "qwen3_vl_moe")
QWEN3 = (*DEEPSTACK, "qwen3_5", "qwen3_5_moe")  # towers with a learned position grid, interleaved text RoPE
TYPES = ("qwen2_vl", "qwen2_5_vl", *QWEN3)
SECTIONS = {**{kind: [24, 20, 20] for kind in DEEPSTACK}, "qwen3_5": [11, 11, 10], "qwen3_5_moe": [11, 11, 10]}
QWEN3_TEXT = {"qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}  # irc's decoder for the text model
CHECKPOINTS = {"qwen3_vl_moe": "qwen3_vl_moe"}  # text layouts of their own: the experts fused
_TEXT = {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
         "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 32768,
         "rms_norm_eps": 1e-5, "rope_theta": 1e6, "model_type": "qwen2"}
TEXT_DEFAULTS = {"qwen2_vl_text": _TEXT, "qwen2_5_vl_text": _TEXT,  # transformers 5.25's, for saved differences
                 "qwen3_vl_text": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                                   "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128,
                                   "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 5e5,
                                   "attention_bias": False, "model_type": "qwen3"},
                 "qwen3_vl_moe_text": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                                       "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                                       "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 5e5,
                                       "attention_bias": False, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                                       "num_experts_per_tok": 4, "num_local_experts": 60, "mlp_only_layers": [],
                                       "norm_topk_prob": True, "tie_word_embeddings": True,
                                       "model_type": "qwen3_moe"}}
_COMMON = {"in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "depth": 32,
           "num_heads": 16}
TOWER_DEFAULTS = {
    "qwen2_vl": {**_COMMON, "model_type": "qwen2_vl_vision", "embed_dim": 1280, "hidden_size": 3584,
                 "hidden_act": "quick_gelu", "mlp_ratio": 4},
    "qwen2_5_vl": {**_COMMON, "model_type": "qwen2_5_vl_vision", "hidden_size": 3584, "out_hidden_size": 3584,
                   "intermediate_size": 3420, "hidden_act": "silu", "window_size": 112,
                   "fullatt_block_indexes": [7, 15, 23, 31]},
    **{kind: {**_COMMON, "model_type": f"{kind}_vision", "depth": 27, "hidden_size": 1152, "patch_size": 16,
              "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304, "out_hidden_size": 3584,
              "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]} for kind in QWEN3},
}
ACTS = {"qwen2_vl": "quick_gelu", "qwen2_5_vl": "silu", **{kind: "gelu_pytorch_tanh" for kind in QWEN3}}
MLP = {"quick_gelu": "quick_gelu", "silu": "swiglu", "gelu_pytorch_tanh": "gelu"}
_QWEN2_IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
              "vision_end_token_id": 151653, "tie_word_embeddings": False}
DEFAULTS = {"qwen2_vl": _QWEN2_IDS, "qwen2_5_vl": _QWEN2_IDS, **{kind: _QWEN2_IDS for kind in DEEPSTACK},
            **{kind: {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
                      "vision_end_token_id": 248054, "tie_word_embeddings": False} for kind in ("qwen3_5", "qwen3_5_moe")}}
TEXT_NAMES = [("model.", "model.language_model."), ("lm_head.", "lm_head."), (None, "model.visual."),
              ("model.", "model.")]
TOWER_NAMES = [("", "model.visual."), ("", "visual.")]
_LAYER = {"attn_norm": "norm1.weight", "attn_norm.bias": "norm1.bias", "mlp_norm": "norm2.weight",
          "mlp_norm.bias": "norm2.bias", "attn.wo": "attn.proj.weight", "attn.bo": "attn.proj.bias",
          "mlp.w_up": "mlp.fc1.weight", "mlp.b_up": "mlp.fc1.bias", "mlp.w_down": "mlp.fc2.weight",
          "mlp.b_down": "mlp.fc2.bias"}
_SWIGLU = {f"mlp.{k}_{w}": f"mlp.{w}_proj.{'weight' if k == 'w' else 'bias'}" for k in "wb"
           for w in ("gate", "up", "down")}
_TOP = {"merger.norm": "merger.ln_q.weight", "merger.norm.bias": "merger.ln_q.bias",
        "merger.fc1": "merger.mlp.0.weight", "merger.fc1.bias": "merger.mlp.0.bias",
        "merger.fc2": "merger.mlp.2.weight", "merger.fc2.bias": "merger.mlp.2.bias"}
# Qwen3.5's names where they differ
_QWEN3_NAMES = {"mlp.w_up": "mlp.linear_fc1.weight", "mlp.b_up": "mlp.linear_fc1.bias",
                "mlp.w_down": "mlp.linear_fc2.weight", "mlp.b_down": "mlp.linear_fc2.bias",
                "merger.norm": "merger.norm.weight", "merger.norm.bias": "merger.norm.bias",
                "merger.fc1": "merger.linear_fc1.weight", "merger.fc1.bias": "merger.linear_fc1.bias",
                "merger.fc2": "merger.linear_fc2.weight", "merger.fc2.bias": "merger.linear_fc2.bias",
                "pos_embed": "pos_embed.weight", "patch_embed.bias": "patch_embed.proj.bias"}


def tower_spec(cfg: Config, tower: Config, d_text: int) -> QwenVisionSpec:
    """The ``QwenVisionSpec`` of ``vision_config`` (its keys checked, its output ``d_text`` wide)."""
    model_type = cfg.data["model_type"]
    tower.defaults = TOWER_DEFAULTS[model_type]
    qwen2 = model_type == "qwen2_vl"
    width = tower.get("embed_dim" if qwen2 else "hidden_size", positive_int)
    out = tower.get("hidden_size" if qwen2 else "out_hidden_size", positive_int)
    if out != d_text:
        raise tower.error("hidden_size" if qwen2 else "out_hidden_size",
                          f"the merger's {out} features do not match the text model's width {d_text}")
    act = tower.get("hidden_act", string)
    if act != ACTS[model_type]:
        raise tower.unsupported("hidden_act", act, hint=f"irc builds {model_type}'s {ACTS[model_type]} vision MLP")
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(tower.raw(key), list):
            raise tower.unsupported(key, tower.raw(key), hint="irc reads one size")
    depth = tower.get("depth", positive_int)
    window, full = None, ()
    if model_type == "qwen2_5_vl":
        pixels = tower.get("window_size", positive_int)
        unit = tower.get("patch_size", positive_int) * tower.get("spatial_merge_size", positive_int)
        if pixels % unit:
            raise tower.error("window_size", f"{pixels} pixels are not whole {unit}-pixel merged blocks")
        window = pixels // unit
        full = tuple(tower.get("fullatt_block_indexes", int_list))
        if any(not 0 <= i < depth for i in full):
            raise tower.error("fullatt_block_indexes", f"{list(full)} are not all layers of the {depth}-layer tower")
    theta = 10000.0
    rope = tower.data.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        theta = float(rope["rope_theta"])
    d_ff = width * tower.get("mlp_ratio", positive_int) if qwen2 else tower.get("intermediate_size", positive_int)
    qwen3 = model_type in QWEN3
    positions = tower.get("num_position_embeddings", positive_int) if qwen3 else 0
    # Qwen3.5's towers have no DeepStack (its configs may list an empty one; transformers reads none)
    deepstack = tuple(tower.get("deepstack_visual_indexes", int_list)) if model_type in DEEPSTACK else ()
    if len(set(deepstack)) != len(deepstack) or any(not 0 <= i < depth for i in deepstack):
        raise tower.error("deepstack_visual_indexes", f"{list(deepstack)} are not distinct layers of the "
                                                      f"{depth}-layer tower")
    if positions and math.isqrt(positions) ** 2 != positions:
        raise tower.error("num_position_embeddings", f"{positions} learned positions are not a square grid")
    return QwenVisionSpec(depth=depth, width=width, heads=tower.get("num_heads", positive_int), d_ff=d_ff, out=out,
                          patch=tower.get("patch_size", positive_int),
                          temporal=tower.get("temporal_patch_size", positive_int),
                          channels=tower.get("in_channels", positive_int),
                          merge=tower.get("spatial_merge_size", positive_int),
                          norm="rms" if model_type == "qwen2_5_vl" else "layer", mlp=MLP[act], window=window,
                          full_layers=full, theta=theta, patch_bias=qwen3, positions=positions, deepstack=deepstack)


def build_tower(cfg: Config, tower: Config, name: str, d_text: int) -> Graph:
    """pixel_values [P, C·T·p·p] + image_grid_thw -> the tower -> the merger -> image_features."""
    spec = tower_spec(cfg, tower, d_text)
    m = Model(f"{name}-vision", vocab=None, d_model=spec.width, dtype=cfg.dtype(), encoder=True)
    with m.at(cfg.path):
        try:
            build_qwen_vision(m, spec)
        except ArgError as err:
            raise tower.error(err.arg, err.detail, hint=err.hint) from None
    graph = m.graph
    graph.meta["model_type"] = tower.get("model_type", string)
    return graph


def _source(param: str, shape: tuple, swiglu: bool, qwen3: bool) -> Tensor:
    """The checkpoint tensor (under the tower's prefix) behind the tower's param."""
    if param == "patch_embed":
        from frontends.hf.vision import Reshaped
        return Reshaped("patch_embed.proj.weight", shape)  # the Conv3d [d, C, T, p, p], flattened
    if qwen3 and param in _QWEN3_NAMES:
        return Tensor(_QWEN3_NAMES[param])
    if param.startswith("deepstack."):  # deepstack.{j}.norm / fc1 / fc2 (+ .bias)
        _, level, name = param.split(".", 2)
        stored = _QWEN3_NAMES[f"merger.{name}"][len("merger."):]
        return Tensor(f"deepstack_merger_list.{level}.{stored}")
    if param in _TOP:
        return Tensor(_TOP[param])
    index, name = param[len("layers."):].split(".", 1)
    block = f"blocks.{index}."
    if name[:-1] in ("attn.w", "attn.b") and name[-1] in "qkv":  # rows of the fused qkv projection
        width = shape[0]
        part = "qkv".index(name[-1])
        return View(block + ("attn.qkv.weight" if name[5] == "w" else "attn.qkv.bias"),
                    rows=range(part * width, (part + 1) * width))
    if qwen3 and name in _QWEN3_NAMES:
        return Tensor(block + _QWEN3_NAMES[name])
    return Tensor(block + ({**_LAYER, **_SWIGLU} if swiglu else _LAYER)[name])


def attach_tower(vision: Graph, view: Checkpoint) -> None:
    """Every tower param from its tensor (shapes checked); a tower tensor left over is an error."""
    swiglu = "layers.0.mlp.w_gate" in vision.params  # Qwen2.5-VL's MLP; Qwen2-VL's is fc1, fc2
    qwen3 = "pos_embed" in vision.params  # Qwen3.5's names
    attach_sources(vision.params.values(), view, lambda name, shape: _source(name, shape, swiglu, qwen3),
                   what="the vision tower")


def text_mrope(model_type: str, text: Config) -> dict:
    """The text model's multimodal RoPE (``rope``'s ``mrope``), its settings taken out of the
    text config: Qwen2-VL's sections, read by a Qwen2 decoder, or Qwen3-VL's and Qwen3.5's
    interleaved ones (a Qwen3 decoder and Qwen3.5's hybrid, which set the two keys aside)."""
    if model_type not in QWEN3:
        sections = pop_mrope(text)
        text.data["model_type"] = "qwen2"
        return {"sections": sections, "layout": "sections"}
    params = next((text.data[k] for k in ("rope_parameters", "rope_scaling") if isinstance(text.data.get(k), dict)),
                  {})
    sections = params.get("mrope_section", SECTIONS[model_type])  # the text RoPE class's default
    if model_type in DEEPSTACK:  # a Qwen3 decoder (the hybrid sets the two keys aside itself)
        pop_mrope(text)
        text.data["model_type"] = QWEN3_TEXT[model_type]
        if "num_local_experts" in text.data:  # Qwen3VLMoeTextConfig saves num_experts under this name
            text.data["num_experts"] = text.data.pop("num_local_experts")
    try:
        return {"sections": int_list(sections), "layout": "interleaved"}
    except Exception:
        raise text.error("rope_parameters.mrope_section", f"expected a list of integers, got {sections!r}") from None


def pop_mrope(text: Config) -> list:
    """The text model's ``mrope_section`` (taken out of its RoPE settings, whose type
    "mrope" reads as "default", so the Qwen2 decoder reads the rest)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = text.data.get(key)
        if isinstance(params, dict) and "mrope_section" in params:
            params = dict(params)
            sections = params.pop("mrope_section")
            params.pop("mrope_interleaved", None)  # Qwen3-VL's: the layout is the family's
            if params.get("rope_type", params.get("type")) == "mrope":
                params.pop("type", None)
                params["rope_type"] = "default"
            text.data = {**text.data, key: params}
            try:
                return int_list(sections)
            except Exception:
                raise text.error(f"{key}.mrope_section", f"expected a list of integers, got {sections!r}") from None
    return [16, 24, 24]  # Qwen2_5_VLTextConfig's default


def image_prompt(cfg: Config, image_token: int, merge: int) -> dict:
    """How Qwen2VLProcessor lays an image out: the user's ``<|image_pad|>`` widened to the
    image's tokens, which the prompt holds between <|vision_start|> and <|vision_end|>."""
    return {"kind": "qwen", "placeholder": image_token, "before": [], "after": [], "around": "", "merge": merge,
            "vision_start": cfg.get("vision_start_token_id", positive_int),
            "vision_end": cfg.get("vision_end_token_id", positive_int)}
