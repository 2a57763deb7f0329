"""SigLIP 2 (NaFlex) from Hugging Face folders: ``siglip2_vision_model`` and the ``siglip2`` dual
encoder's image tower, built through the DSL's NaFlex form (``frontends.dsl_naflex``).

Their config.json is SigLIP's without ``image_size``: ``num_patches`` (256 by default) learned
positions form an S x S grid (S = sqrt(num_patches)) that transformers resizes to every image,
and ``patch_size`` p sizes the flattened patches the processor gives ([L, p·p·C]). The layers,
the final ``post_layernorm`` and the pooling head (``vision_use_head``) are SigLIP's, their
tensors under the same names (``frontends.hf.vision``'s "siglip" layout; the patch projection is
an ``nn.Linear`` [d, p·p·C] here). Keys a config.json leaves out take transformers 5.25's
``Siglip2VisionConfig`` defaults (``DEFAULTS``). Refused, each a SpecError naming config.json,
the key and the value: a non-square position grid (``num_patches``), a ``patch_size`` that is not
one number, activations other than GELU (exact or tanh) and quick_gelu, heads that do not divide
``hidden_size``. The ``siglip2`` text tower is SigLIP's (transformers' ``Siglip2TextModel`` is
``SiglipTextModel``; ``frontends.hf.dual_text``).
"""
from __future__ import annotations

import math

from frontends.dsl_vision import VisionSpec
from frontends.hf.config import Config
from irc.yamlloc import boolean, positive_int, positive_number

DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
            "num_channels": 3, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
            "vision_use_head": True, "num_patches": 256}
# config.json hidden_act -> the DSL's GELU form, for every vision tower (frontends.hf.vision too)
GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "quick_gelu": "quick"}
NAFLEX = ("siglip2_vision_model",)  # the towers frontends.dsl_naflex builds


def naflex_spec(cfg: Config) -> VisionSpec:
    """The ``VisionSpec`` of the NaFlex tower config.json describes: ``image_size`` the position
    grid's own image (S·p pixels), no class token, SigLIP's pooler or none."""
    d = cfg.get("hidden_size", positive_int)
    heads = cfg.get("num_attention_heads", positive_int)
    if d % heads:
        raise cfg.error("num_attention_heads", f"{heads} heads do not divide hidden_size {d}")
    if not isinstance(cfg.raw("patch_size"), int) or isinstance(cfg.raw("patch_size"), bool):
        raise cfg.unsupported("patch_size", cfg.raw("patch_size"), hint="irc compiles square patches: one number")
    patch = cfg.get("patch_size", positive_int)
    positions = cfg.get("num_patches", positive_int)
    side = math.isqrt(positions)
    if side * side != positions:
        raise cfg.error("num_patches", f"{positions} learned positions are not a square grid",
                        hint="transformers reads them as a sqrt(num_patches)-square grid")
    act = cfg.raw("hidden_act")
    if not isinstance(act, str) or act not in GELU:
        raise cfg.unsupported("hidden_act", act, hint=f"activations: {', '.join(GELU)}")
    return VisionSpec(image_size=side * patch, patch=patch, layers=cfg.get("num_hidden_layers", positive_int),
                      heads=heads, d_ff=cfg.get("intermediate_size", positive_int),
                      eps=cfg.get("layer_norm_eps", positive_number), activation=GELU[act],
                      channels=cfg.get("num_channels", positive_int), class_token=False,
                      pooler="attention" if cfg.get("vision_use_head", boolean) else "none")
