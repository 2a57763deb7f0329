"""Qwen2-VL and Qwen2.5-VL from Hugging Face folders: their vision tower (``frontends.dsl_qwen_vision``)
and what their text model adds to a Qwen2 decoder (multimodal RoPE).

==========  ========================================================================================
qwen2_vl    ``vision_config`` (``qwen2_vl_vision``): ``embed_dim`` wide, ``depth`` layers of
            ``num_heads``, LayerNorms (eps 1e-6), quick_gelu MLPs ``embed_dim`` x ``mlp_ratio``; every
            layer attends over its frame; merger to ``hidden_size`` (the text model's width)
qwen2_5_vl  ``vision_config`` (``qwen2_5_vl_vision``): ``hidden_size`` wide, RMSNorms, SwiGLU MLPs
            with biases (``intermediate_size``, ``hidden_act`` silu), window attention over
            ``window_size`` pixels except in ``fullatt_block_indexes``; merger (RMSNorm) to
            ``out_hidden_size``
==========  ========================================================================================

Both: patches of ``patch_size`` x ``temporal_patch_size`` frames, ``spatial_merge_size`` merging,
2-D RoPE with ``vision_config.rope_parameters.rope_theta`` (10,000). The text model is a Qwen2
decoder (``text_config``, or, as the hub's checkpoints hold it, the top-level keys) whose RoPE
reads three position axes (``mrope_section`` in ``rope_parameters`` / ``rope_scaling``, of
``rope_type`` "mrope" or "default"): its ``position_ids`` are i64 [3, B, T] (``irc.mrope``).
Weights: the tower under ``model.visual.`` (transformers 5) or ``visual.`` (the hub's), the text
model under ``model.language_model.`` or ``model.``. The processor writes
``<|vision_start|>`` + one ``<|image_pad|>`` per visual token + ``<|vision_end|>``.
"""
from __future__ import annotations

from frontends.dsl import ArgError, Model
from frontends.dsl_qwen_vision import QwenVisionSpec, build_qwen_vision
from frontends.hf.config import Config, int_list
from frontends.hf.weights import Checkpoint, Tensor, View, attach_sources
from irc.graph import Graph
from irc.yamlloc import positive_int, string

TYPES = ("qwen2_vl", "qwen2_5_vl")
_TEXT = {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
         "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 32768,
         "rms_norm_eps": 1e-5, "rope_theta": 1e6, "model_type": "qwen2"}
TEXT_DEFAULTS = {"qwen2_vl_text": _TEXT, "qwen2_5_vl_text": _TEXT}  # transformers 5.25's, for saved differences
_COMMON = {"in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "depth": 32,
           "num_heads": 16}
TOWER_DEFAULTS = {
    "qwen2_vl": {**_COMMON, "model_type": "qwen2_vl_vision", "embed_dim": 1280, "hidden_size": 3584,
                 "hidden_act": "quick_gelu", "mlp_ratio": 4},
    "qwen2_5_vl": {**_COMMON, "model_type": "qwen2_5_vl_vision", "hidden_size": 3584, "out_hidden_size": 3584,
                   "intermediate_size": 3420, "hidden_act": "silu", "window_size": 112,
                   "fullatt_block_indexes": [7, 15, 23, 31]},
}
DEFAULTS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653, "tie_word_embeddings": False}
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
    if act != ("quick_gelu" if qwen2 else "silu"):
        raise tower.unsupported("hidden_act", act, hint=f"irc builds {model_type}'s "
                                                        f"{'quick_gelu' if qwen2 else 'silu'} vision MLP")
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(tower.raw(key), list):
            raise tower.unsupported(key, tower.raw(key), hint="irc reads one size")
    depth = tower.get("depth", positive_int)
    window, full = None, ()
    if not qwen2:
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
    return QwenVisionSpec(depth=depth, width=width, heads=tower.get("num_heads", positive_int), d_ff=d_ff, out=out,
                          patch=tower.get("patch_size", positive_int),
                          temporal=tower.get("temporal_patch_size", positive_int),
                          channels=tower.get("in_channels", positive_int),
                          merge=tower.get("spatial_merge_size", positive_int), norm="layer" if qwen2 else "rms",
                          mlp="quick_gelu" if qwen2 else "swiglu", window=window, full_layers=full, theta=theta)


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


def _source(param: str, shape: tuple, swiglu: bool) -> Tensor:
    """The checkpoint tensor (under the tower's prefix) behind the tower's param."""
    if param == "patch_embed":
        from frontends.hf.vision import Reshaped
        return Reshaped("patch_embed.proj.weight", shape)  # the Conv3d [d, C, T, p, p], flattened
    if param in _TOP:
        return Tensor(_TOP[param])
    index, name = param[len("layers."):].split(".", 1)
    block = f"blocks.{index}."
    if name[:-1] in ("attn.w", "attn.b") and name[-1] in "qkv":  # rows of the fused qkv projection
        width = shape[0]
        part = "qkv".index(name[-1])
        return View(block + ("attn.qkv.weight" if name[5] == "w" else "attn.qkv.bias"),
                    rows=range(part * width, (part + 1) * width))
    return Tensor(block + ({**_LAYER, **_SWIGLU} if swiglu else _LAYER)[name])


def attach_tower(vision: Graph, view: Checkpoint) -> None:
    """Every tower param from its tensor (shapes checked); a tower tensor left over is an error."""
    swiglu = "layers.0.mlp.w_gate" in vision.params  # Qwen2.5-VL's MLP; Qwen2-VL's is fc1, fc2
    attach_sources(vision.params.values(), view, lambda name, shape: _source(name, shape, swiglu),
                   what="the vision tower")


def pop_mrope(text: Config) -> list:
    """The text model's ``mrope_section`` (taken out of its RoPE settings, whose type
    "mrope" reads as "default", so the Qwen2 decoder reads the rest)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = text.data.get(key)
        if isinstance(params, dict) and "mrope_section" in params:
            params = dict(params)
            sections = params.pop("mrope_section")
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
