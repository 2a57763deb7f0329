"""Vision encoders from Hugging Face folders: ViT, DINOv2 (with registers), CLIP's and SigLIP's
vision towers, built through the DSL's vision form (``frontends.dsl_vision``).

=======================  ===================================================================
vit                      patches (Conv2d with bias) + CLS + learned positions; pre-LN layers
                         (``layernorm_before`` / ``layernorm_after``), MHA with q/k/v biases
                         (``qkv_bias``), GELU MLP; final ``layernorm``; pooler: dense +
                         ``pooler_act`` (tanh) on the CLS state, when the checkpoint has it
dinov2                   ViT's embeddings; LayerScale after attention and MLP
                         (``layer_scale1/2.lambda1``), MLP width hidden_size x ``mlp_ratio``;
                         pooler_output: the normed CLS state. Built for the image side the
                         folder's preprocessor_config.json makes (crop_size: 224 for the
                         hub's checkpoints, trained at 518), the position grid resized
                         bicubically as transformers' ``interpolate_pos_encoding`` does
dinov2_with_registers    DINOv2 plus ``num_register_tokens`` learned tokens after the CLS one
clip_vision_model        patches (no bias) + class embedding + positions, ``pre_layrnorm``,
                         layers with quick_gelu MLPs; last_hidden_state unnormed,
                         pooler_output = ``post_layernorm`` of the CLS state
blip_2_vision_model      BLIP-2's ViT: patches (bias) + class embedding + positions, the fused
                         ``qkv`` with ``q_bias`` and ``v_bias`` (the key's bias zero), GELU MLPs;
                         last_hidden_state = ``post_layernorm``(x); pooler_output: the class
                         state through ``post_layernorm`` again (transformers applies it twice)
siglip_vision_model      patches (bias) + positions, no class token; gelu tanh MLPs;
                         last_hidden_state = ``post_layernorm``(x); pooler_output: the
                         attention-pooling head (``vision_use_head``), else none
siglip2_vision_model     SigLIP 2's NaFlex tower (``frontends.hf.siglip2``): the processor's
                         flattened patches of any aspect ratio (``pixel_values`` [B, L, p·p·C],
                         ``pixel_attention_mask``, ``spatial_shapes``), the learned position grid
                         resized to each image; SigLIP's layers, padding masked, and head
clip, siglip, siglip2    a dual encoder's config (``vision_config`` and ``text_config``): its
                         image tower as above (``vision_config``, errors naming
                         ``vision_config.<key>``); CLIP adds ``image_embeds``, the pooled state
                         through ``visual_projection`` (``get_image_features``); SigLIP's image
                         embedding is its pooler_output. The text tower is ``graph.parts["text"]``
                         (``frontends.hf.dual_text``)
=======================  ===================================================================

The graph (SigLIP 2's aside) takes ``pixel_values`` f32 [B, C, image_size, image_size] (the
checkpoint's size: the position embeddings are used as trained, as transformers does without
``interpolate_pos_encoding``) and returns ``last_hidden_state`` [B, tokens, d] and
``pooler_output`` [B, d] (what the family's base model returns). Keys a config.json leaves out
take transformers 5.25's defaults (``DEFAULTS``). A checkpoint may hold the tower alone
(``XModel.save_pretrained``) or under ``vision_model.`` / ``vit.`` / ``dinov2.`` (CLIP and
SigLIP, or classification checkpoints); a classifier's head and DINOv2's ``mask_token`` are
not read. Refused, each with the key and the value: activations other than GELU (exact or
tanh) and quick_gelu, DINOv2's SwiGLU FFN (``use_swiglu_ffn``), ViT without q/k/v biases,
non-square images.
"""
from __future__ import annotations

import math
import os

import numpy as np

from frontends.dsl_vision import VisionSpec, build_vit
from frontends.hf import siglip2
from frontends.hf.siglip2 import GELU
from frontends.hf.config import Config, NestedConfig
from frontends.hf.weights import Checkpoint, Source, Tensor, View, Zeros, attach_sources
from irc.errors import SpecError
from irc.graph import Graph, Param
from irc.yamlloc import boolean, positive_int, positive_number

_VIT = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_act": "gelu",
        "image_size": 224, "num_channels": 3, "qkv_bias": True}
DEFAULTS = {
    "vit": {**_VIT, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "patch_size": 16, "pooler_act": "tanh",
            "pooler_output_size": None},
    "dinov2": {**_VIT, "mlp_ratio": 4, "layer_norm_eps": 1e-6, "patch_size": 14, "use_swiglu_ffn": False},
    "dinov2_with_registers": {**_VIT, "mlp_ratio": 4, "layer_norm_eps": 1e-6, "patch_size": 16,
                              "use_swiglu_ffn": False, "num_register_tokens": 4},
    "clip_vision_model": {**_VIT, "intermediate_size": 3072, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                          "patch_size": 32},
    "siglip_vision_model": {**_VIT, "intermediate_size": 3072, "hidden_act": "gelu_pytorch_tanh",
                            "layer_norm_eps": 1e-6, "patch_size": 16, "vision_use_head": True},
    "blip_2_vision_model": {**_VIT, "hidden_size": 1408, "intermediate_size": 6144, "num_hidden_layers": 39,
                            "num_attention_heads": 16, "patch_size": 14, "layer_norm_eps": 1e-6},
    "siglip2_vision_model": siglip2.DEFAULTS,
    "clip": {"projection_dim": 512}, "siglip": {}, "siglip2": {},  # dual encoders: their towers' are above
}
# dual encoder -> its image tower
TOWERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "siglip2": "siglip2_vision_model"}
FAMILIES = tuple(DEFAULTS)
PREFIXES = ("", "vision_model.", "vit.", "dinov2.")
# irc's param name (a layer's after "layers.{i}.") -> the checkpoint's, per layout
_VIT_LAYER = {"attn.wq": "attention.attention.query.weight", "attn.bq": "attention.attention.query.bias",
              "attn.wk": "attention.attention.key.weight", "attn.bk": "attention.attention.key.bias",
              "attn.wv": "attention.attention.value.weight", "attn.bv": "attention.attention.value.bias",
              "attn.wo": "attention.output.dense.weight", "attn.bo": "attention.output.dense.bias"}
_CLIP_LAYER = {**{f"attn.w{x}": f"self_attn.{x}_proj.weight" for x in "qkv"},
               **{f"attn.b{x}": f"self_attn.{x}_proj.bias" for x in "qkv"},
               "attn.wo": "self_attn.out_proj.weight", "attn.bo": "self_attn.out_proj.bias",
               "attn_norm": "layer_norm1.weight", "attn_norm.bias": "layer_norm1.bias",
               "mlp_norm": "layer_norm2.weight", "mlp_norm.bias": "layer_norm2.bias",
               "mlp.w_up": "mlp.fc1.weight", "mlp.b_up": "mlp.fc1.bias",
               "mlp.w_down": "mlp.fc2.weight", "mlp.b_down": "mlp.fc2.bias"}
LAYOUTS = {
    "vit": ("encoder.layer.", {**_VIT_LAYER, "attn_norm": "layernorm_before.weight",
                               "attn_norm.bias": "layernorm_before.bias", "mlp_norm": "layernorm_after.weight",
                               "mlp_norm.bias": "layernorm_after.bias", "mlp.w_up": "intermediate.dense.weight",
                               "mlp.b_up": "intermediate.dense.bias", "mlp.w_down": "output.dense.weight",
                               "mlp.b_down": "output.dense.bias"},
            {"patch_embed": "embeddings.patch_embeddings.projection.weight",
             "patch_embed.bias": "embeddings.patch_embeddings.projection.bias", "cls_token": "embeddings.cls_token",
             "position_embeddings": "embeddings.position_embeddings", "norm": "layernorm.weight",
             "norm.bias": "layernorm.bias", "pooler.dense": "pooler.dense.weight",
             "pooler.dense.bias": "pooler.dense.bias"}),
    "dinov2": ("encoder.layer.", {**_VIT_LAYER, "attn_norm": "norm1.weight", "attn_norm.bias": "norm1.bias",
                                  "mlp_norm": "norm2.weight", "mlp_norm.bias": "norm2.bias",
                                  "mlp.w_up": "mlp.fc1.weight", "mlp.b_up": "mlp.fc1.bias",
                                  "mlp.w_down": "mlp.fc2.weight", "mlp.b_down": "mlp.fc2.bias",
                                  "layer_scale1": "layer_scale1.lambda1", "layer_scale2": "layer_scale2.lambda1"},
               {"patch_embed": "embeddings.patch_embeddings.projection.weight",
                "patch_embed.bias": "embeddings.patch_embeddings.projection.bias", "cls_token": "embeddings.cls_token",
                "registers": "embeddings.register_tokens", "position_embeddings": "embeddings.position_embeddings",
                "norm": "layernorm.weight", "norm.bias": "layernorm.bias"}),
    "clip": ("encoder.layers.", _CLIP_LAYER,
             {"patch_embed": "embeddings.patch_embedding.weight", "cls_token": "embeddings.class_embedding",
              "position_embeddings": "embeddings.position_embedding.weight", "pre_norm": "pre_layrnorm.weight",
              "pre_norm.bias": "pre_layrnorm.bias", "post_norm": "post_layernorm.weight",
              "post_norm.bias": "post_layernorm.bias"}),
    "blip": ("encoder.layers.", {**_CLIP_LAYER, "attn.wo": "self_attn.projection.weight",
                                 "attn.bo": "self_attn.projection.bias"},
             {"patch_embed": "embeddings.patch_embedding.weight", "patch_embed.bias": "embeddings.patch_embedding.bias",
              "cls_token": "embeddings.class_embedding", "position_embeddings": "embeddings.position_embedding",
              "norm": "post_layernorm.weight", "norm.bias": "post_layernorm.bias",
              "post_norm": "post_layernorm.weight", "post_norm.bias": "post_layernorm.bias"}),
    "siglip": ("encoder.layers.", _CLIP_LAYER,
               {"patch_embed": "embeddings.patch_embedding.weight",
                "patch_embed.bias": "embeddings.patch_embedding.bias",
                "position_embeddings": "embeddings.position_embedding.weight", "norm": "post_layernorm.weight",
                "norm.bias": "post_layernorm.bias"}),
}
LAYOUT = {"vit": "vit", "dinov2": "dinov2", "dinov2_with_registers": "dinov2", "clip_vision_model": "clip",
          "siglip_vision_model": "siglip", "clip": "clip", "siglip": "siglip",
          "siglip2_vision_model": "siglip", "siglip2": "siglip",
          "idefics3_vision": "siglip", "smolvlm_vision": "siglip",  # these and BLIP-2's: VLM towers (frontends.hf.vlm)
          "blip_2_vision_model": "blip"}
SIGLIP_LIKE = ("siglip_vision_model", "idefics3_vision", "smolvlm_vision")
ROOT_NAMES = {"visual_projection": "visual_projection.weight"}  # a dual encoder's, beside its towers
RESHAPED = ("cls_token", "registers", "position_embeddings")  # stored [1, n, d] or [d]: read as [n, d]
SPARE = ("embeddings.mask_token",)  # DINOv2's pretraining mask: no base model's inference reads it
BLIP_QKV = tuple(f"attn.{kind}{part}" for kind in "wb" for part in "qkv")  # from its fused qkv (_blip_qkv)
PACKED = {"q": 0, "k": 1, "v": 2}  # rows of torch.nn.MultiheadAttention's in_proj (SigLIP's head)


def is_vision(cfg: Config) -> bool:
    model_type = cfg.data.get("model_type")
    return isinstance(model_type, str) and model_type in DEFAULTS


def checkpoint_name(model_type: str, param: str) -> str:
    """The checkpoint key (without a tower prefix) of irc's param ``param``."""
    layer_prefix, layer_names, top_names = LAYOUTS[LAYOUT[model_type]]
    if param.startswith("layers."):
        index, name = param[len("layers."):].split(".", 1)
        return f"{layer_prefix}{index}.{layer_names[name]}"
    if param.startswith("head."):  # SigLIP's pooling head keeps its names
        return "head.layernorm.weight" if param == "head.layernorm" else param
    return top_names[param]


class Reshaped(Tensor):
    """A whole tensor read in another shape of as many elements (a class token stored
    [1, 1, d] or [d], positions [1, N, d] or [N, d]: the params are [n, d])."""

    def __init__(self, name: str, shape: tuple):
        super().__init__(name)
        self.wanted = list(shape)

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = checkpoint.info(self.name)[1]
        return self.wanted if math.prod(stored) == math.prod(self.wanted) else stored

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return checkpoint.read(self.name).reshape(self.wanted)[start:stop]

    def __repr__(self) -> str:
        return f"{self.name}[as {self.wanted}]"


def bicubic_matrix(old: int, new: int, antialias: bool = False) -> np.ndarray:
    """[new, old]: torch's bicubic resize along one axis (``F.interpolate(..., size=new,
    mode="bicubic", align_corners=False)``: source x = (i + 0.5)·old/new - 0.5, Keys' cubic with
    a = -0.75 on the four nearest samples, indices clamped to the edge); with ``antialias``,
    torch's antialiased form (PIL's: a = -0.5 over a support widened by the downscale, the
    weights normalised)."""
    if antialias:
        return _antialiased(old, new)
    a, out = -0.75, np.zeros((new, old))
    for i in range(new):
        x = (i + 0.5) * old / new - 0.5
        base = math.floor(x)
        t = x - base
        weights = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                   ((a + 2) * t - (a + 3)) * t * t + 1,
                   ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                   ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
        for k, weight in enumerate(weights):
            out[i, min(max(base - 1 + k, 0), old - 1)] += weight
    return out


def _antialiased(old: int, new: int) -> np.ndarray:
    def cubic(x: float, a: float = -0.5) -> float:
        x = abs(x)
        return ((a + 2) * x - (a + 3)) * x * x + 1 if x < 1 else (((x - 5) * x + 8) * x - 4) * a if x < 2 else 0.0

    scale = old / new
    support, invscale = 2 * max(scale, 1.0), 1 / scale if scale >= 1 else 1.0
    out = np.zeros((new, old))
    for i in range(new):
        center = scale * (i + 0.5)
        low, high = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), old)
        weights = np.array([cubic((j - center + 0.5) * invscale) for j in range(low, high)])
        out[i, low:high] = weights / weights.sum() if weights.sum() else weights
    return out


class Positions(Reshaped):
    """A ViT's position table [1 + g², d] (class row, then a g x g grid), read for a model of
    another grid n x n as DINOv2 does for every image size (``interpolate_pos_encoding``: the
    grid bicubic-resized in float32, the class row kept; DINOv2 with registers antialiased)."""

    def __init__(self, name: str, shape: tuple, antialias: bool = False):
        super().__init__(name, shape)
        self.antialias = antialias

    def _grids(self, checkpoint: Checkpoint) -> tuple:
        stored = math.prod(checkpoint.info(self.name)[1]) // self.wanted[-1]
        old, new = math.isqrt(stored - 1), math.isqrt(self.wanted[0] - 1)
        return (old, new) if old * old == stored - 1 and new * new == self.wanted[0] - 1 else (None, None)

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        old, new = self._grids(checkpoint)
        return self.wanted if old is not None else super().shape(checkpoint)

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        old, new = self._grids(checkpoint)
        table = checkpoint.read(self.name).reshape(-1, self.wanted[-1])
        if old == new:
            return table[start:stop]
        resize = bicubic_matrix(old, new, self.antialias)
        grid = table[1:].astype(np.float32).reshape(old, old, -1)
        resized = np.einsum("ij,jkd,lk->ild", resize, grid, resize).reshape(new * new, -1)
        return np.concatenate([table[:1], resized.astype(table.dtype)])[start:stop]


def processor_size(folder: str):
    """The square side ``preprocessor_config.json`` beside a checkpoint makes its images (its
    crop, or a fixed resize), or None."""
    import json

    path = os.path.join(folder, "preprocessor_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return None
    size = settings.get("crop_size") if settings.get("do_center_crop", True) else settings.get("size")
    if isinstance(size, dict) and size.get("height") == size.get("width") and isinstance(size.get("height"), int):
        return size["height"]
    return None


def checkpoint_source(model_type: str, param: Param, prefix: str, files=()) -> Source:
    """Where ``param`` is in the checkpoint: one tensor, or for SigLIP's head q, k or v (and
    their biases) the rows of torch's packed in-projection, q|k|v."""
    name = param.name
    if name in ROOT_NAMES:
        return Tensor(ROOT_NAMES[name])
    if LAYOUT[model_type] == "blip" and name.startswith("layers.") and name.split(".", 2)[2] in BLIP_QKV:
        return _blip_qkv(name, param.shape, prefix, files)
    packed = PACKED.get(name.rsplit(".", 1)[-1][1:]) if name.startswith("head.attention.") else None
    if packed is None:
        stored = prefix + checkpoint_name(model_type, name)
        if name == "position_embeddings" and TOWERS.get(model_type, model_type) not in siglip2.NAFLEX:
            return Positions(stored, param.shape, antialias=model_type == "dinov2_with_registers")
        return Reshaped(stored, param.shape) if name in RESHAPED else Tensor(stored)
    d = param.shape[0]
    stored = "in_proj_weight" if name.rsplit(".", 1)[-1][0] == "w" else "in_proj_bias"
    return View(f"{prefix}head.attention.{stored}", rows=range(packed * d, (packed + 1) * d))


def _blip_qkv(name: str, shape: tuple, prefix: str, files) -> Source:
    """BLIP-2's q, k or v: rows of the fused ``self_attn.qkv``; their biases rows of its bias as
    transformers 5 saves it, or the hub's ``q_bias`` and ``v_bias`` with the key's zero (what
    transformers makes of them: q_bias | 0 | v_bias)."""
    index, kind, part = name.split(".")[1], name[-2], name[-1]
    layer = f"{prefix}encoder.layers.{index}.self_attn."
    rows = range("qkv".index(part) * shape[0], ("qkv".index(part) + 1) * shape[0])
    if kind == "w" or f"{layer}qkv.bias" in files:
        return View(f"{layer}qkv.{'weight' if kind == 'w' else 'bias'}", rows=rows)
    return Zeros(shape) if part == "k" else Tensor(f"{layer}{part}_bias")


def _activation(cfg: Config) -> str:
    act = cfg.raw("hidden_act")
    if not isinstance(act, str) or act not in GELU:
        raise cfg.unsupported("hidden_act", act, hint=f"activations: {', '.join(GELU)}")
    return GELU[act]


def vision_spec(cfg: Config, model_type: str, pooler: bool = True) -> VisionSpec:
    """The ``VisionSpec`` of a ``model_type`` tower config.json describes (``pooler``: ViT's
    dense pooler, which a classification checkpoint lacks)."""
    d = cfg.get("hidden_size", positive_int)
    heads = cfg.get("num_attention_heads", positive_int)
    if d % heads:
        raise cfg.error("num_attention_heads", f"{heads} heads do not divide hidden_size {d}")
    if isinstance(cfg.raw("image_size"), list):
        raise cfg.unsupported("image_size", cfg.raw("image_size"), hint="irc compiles square images")
    size = cfg.get("image_size", positive_int)
    patch = cfg.get("patch_size", positive_int)
    if patch > size:
        raise cfg.error("patch_size", f"{patch} is larger than image_size {size}")
    dino = model_type.startswith("dinov2")
    if dino:
        cfg.check("use_swiglu_ffn", lambda v: not v, hint="irc builds DINOv2's GELU MLP")
        d_ff = int(d * cfg.get("mlp_ratio", positive_number))
    else:
        d_ff = cfg.get("intermediate_size", positive_int)
    if model_type in ("vit", "dinov2", "dinov2_with_registers"):
        cfg.check("qkv_bias", lambda v: v is True, hint="irc builds ViT and DINOv2 with q/k/v biases")
    spec = VisionSpec(image_size=size, patch=patch, layers=cfg.get("num_hidden_layers", positive_int), heads=heads,
                      d_ff=d_ff, eps=cfg.get("layer_norm_eps", positive_number), activation=_activation(cfg),
                      channels=cfg.get("num_channels", positive_int), layer_scale=dino,
                      registers=cfg.get("num_register_tokens", positive_int) if model_type.endswith("registers") else 0)
    if model_type == "clip_vision_model":
        spec.patch_bias, spec.pre_norm, spec.final_norm, spec.pooler = False, True, False, "class_token_norm"
    elif model_type in SIGLIP_LIKE:
        spec.class_token = False
        spec.pooler = "attention" if cfg.get("vision_use_head", boolean) else "none"
    elif model_type == "blip_2_vision_model":  # the pooled class state goes through post_layernorm twice
        spec.pooler = "class_token_norm"
    elif model_type == "vit":
        spec.pooler = "none"
        if pooler:
            cfg.check("pooler_act", lambda v: v == "tanh", hint="irc builds ViT's tanh pooler")
            spec.pooler, spec.pooler_width = "dense_tanh", cfg.get("pooler_output_size", positive_int, d)
    return spec


def build_vision(cfg: Config, name: str, pooler: bool = True, size=None) -> Graph:
    """The vision encoder config.json describes, through ``build_vit`` (a dual encoder's image
    tower, with CLIP's projection); ``size``: DINOv2's images of another side than
    ``image_size`` (its positions resized as transformers resizes them: ``Positions``)."""
    from frontends.dsl import Model

    model_type = cfg.data["model_type"]
    tower = cfg
    if model_type in TOWERS:
        tower = NestedConfig(cfg, "vision_config", DEFAULTS[TOWERS[model_type]], "the image tower's settings",
                             hint=f"irc compiles the image tower of a {model_type} checkpoint")
    m = Model(name, vocab=None, d_model=tower.get("hidden_size", positive_int), dtype=cfg.dtype(), encoder=True)
    if TOWERS.get(model_type, model_type) in siglip2.NAFLEX:  # SigLIP 2: images of any aspect ratio
        from frontends.dsl_naflex import build_naflex
        build_naflex(m, siglip2.naflex_spec(tower))
        m.graph.meta["model_type"] = model_type
        return m.graph
    spec = vision_spec(tower, TOWERS.get(model_type, model_type), pooler)
    if size is not None and model_type.startswith("dinov2"):
        if size < spec.patch:
            raise SpecError(f"preprocessor_config.json makes {size}-pixel images, smaller than a {spec.patch}-pixel "
                            "patch", location=cfg.path)
        spec.image_size = size
    pooled = build_vit(m, spec)
    if model_type == "clip":
        m.image_embeds(m.dense(pooled, cfg.get("projection_dim", positive_int), name="visual_projection"))
    graph = m.graph
    graph.meta["model_type"] = model_type
    return graph


def _prefix(checkpoint: Checkpoint, model_type: str) -> str:
    probe = checkpoint_name(model_type, "patch_embed")
    for prefix in PREFIXES:
        if prefix + probe in checkpoint.files:
            return prefix
    raise SpecError(f"no tensor {probe} (under any of {', '.join(repr(p) for p in PREFIXES if p)} or none) in "
                    "the checkpoint", location=checkpoint.folder, hint=f"is this a {model_type} checkpoint?")


def attach_vision_weights(graph: Graph, checkpoint: Checkpoint, spare=lambda name: False) -> None:
    """Point every param not yet attached at its checkpoint tensor (shapes and dtypes
    checked); tensors of the tower left over are an error, a classifier's, the other tower's
    and those ``spare(name)`` accepts (a VLM's unread layers) are not."""
    model_type = graph.meta["model_type"]
    prefix = _prefix(checkpoint, model_type)
    tower = {n for n in checkpoint.files if n.startswith(prefix) and n[len(prefix):].split(".")[0] in
             ("embeddings", "encoder", "layernorm", "pre_layrnorm", "post_layernorm", "head")}
    attach_sources([p for p in graph.params.values() if p.data is None], checkpoint,
                   lambda name, shape: checkpoint_source(model_type, graph.params[name], prefix, checkpoint.files),
                   spare=lambda n: n not in tower or n[len(prefix):] in SPARE or spare(n))


def load_vision(folder: str, cfg: Config, weights: bool) -> Graph:
    """The vision encoder of ``folder`` (``frontends.hf.load_hf`` dispatches here)."""
    cfg.defaults = DEFAULTS[cfg.data["model_type"]]
    name = os.path.basename(os.path.normpath(os.path.abspath(folder))) or "model"
    checkpoint = Checkpoint.find(folder) if weights else None
    pooler = True
    if checkpoint is not None and cfg.data["model_type"] == "vit":
        prefix = _prefix(checkpoint, "vit")
        pooler = prefix + checkpoint_name("vit", "pooler.dense") in checkpoint.files
    # DINOv2 runs at its processor's image size, resizing its positions as transformers always does
    size = processor_size(folder) if cfg.data["model_type"].startswith("dinov2") else None
    graph = build_vision(cfg, name, pooler, size)
    if cfg.data["model_type"] in TOWERS:  # a dual encoder: its text tower beside (frontends.hf.dual_text)
        from frontends.hf.dual_text import build_text_tower
        graph.parts["text"] = build_text_tower(cfg, name)
    if checkpoint is not None:
        attach_vision_weights(graph, checkpoint)
        if "text" in graph.parts:
            from frontends.hf.dual_text import attach_text_weights
            attach_text_weights(graph.parts["text"], checkpoint, cfg.data["model_type"], graph.parts["text"].meta)
    return graph


__all__ = ["DEFAULTS", "FAMILIES", "attach_vision_weights", "build_vision", "is_vision", "load_vision",
           "vision_spec"]

