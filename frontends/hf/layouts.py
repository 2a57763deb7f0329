"""How a family's checkpoint names its tensors: Llama's names (``TOP_NAMES``, ``LAYER_NAMES``
under ``LAYER_PREFIX``), the entries a layout may hold instead (a name, per-expert tensors
``Experts``, rows of a fused tensor ``Split``, or a callable), and ``layout_source``, the
tensor(s) behind one irc param in one layout. The family tables build their layouts from
these. ``LAYOUTS`` holds every family's layout, filled by the registry (``frontends.hf.families``)
as it merges the family tables, the way the passes fill ``irc.passmanager.PASSES``, so that
a layout's ``_resolve`` can ask ``checkpoint_source`` without importing the registry."""
from __future__ import annotations

import re
from typing import Callable

from frontends.hf import families_ssm
from frontends.hf.config import Arch
from frontends.hf.weights import Rows, Source, Stack, Tensor
from irc.errors import SpecError


class Experts:
    """Per-expert tensors (``{e}`` in the template) stacked into one [E, ...] param."""

    def __init__(self, template: str):
        self.template = template


class Split:
    """Rows [start, stop) of a fused projection; ``bounds(arch)`` gives them."""

    def __init__(self, key: str, bounds: Callable[[Arch], tuple[int, int]]):
        self.key, self.bounds = key, bounds


TOP_NAMES = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LAYER_NAMES = {  # irc name under layers.{i}. -> checkpoint name under model.layers.{i}.
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    **{f"attn.w{x}": f"self_attn.{x}_proj.weight" for x in "qkvo"},
    **{f"attn.b{x}": f"self_attn.{x}_proj.bias" for x in "qkvo"},
    "attn.q_norm": "self_attn.q_norm.weight",
    "attn.k_norm": "self_attn.k_norm.weight",
    "attn.q_a": "self_attn.q_a_proj.weight",
    "attn.q_a_norm": "self_attn.q_a_layernorm.weight",
    "attn.q_b": "self_attn.q_b_proj.weight",
    "attn.kv_a": "self_attn.kv_a_proj_with_mqa.weight",
    "attn.kv_a_norm": "self_attn.kv_a_layernorm.weight",
    "attn.kv_b": "self_attn.kv_b_proj.weight",
    **{f"mlp.w_{x}": f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")},
    "moe.router": "mlp.gate.weight",
    "moe.router_bias": "mlp.gate.e_score_correction_bias",
    **{f"moe.w_{x}": Experts(f"mlp.experts.{{e}}.{x}_proj.weight") for x in ("gate", "up", "down")},
    **{f"moe.shared_{x}": f"mlp.shared_experts.{x}_proj.weight" for x in ("gate", "up", "down")},
}
# a layout's "_prefix" (the layers' names, default model.layers.) and "_top" (embed, norm
# and lm_head, default TOP_NAMES) say where a family departs from Llama's names
LAYER_PREFIX = "model.layers."
LAYOUTS: dict[str, dict] = {}  # Arch.checkpoint -> its layout (filled by frontends.hf.families)
LAYER_PARAM = re.compile(r"layers\.(\d+)\.(.+)")


def layout_source(layout: dict, arch: Arch, param: str) -> Source:
    """The checkpoint tensor(s) holding irc param ``param`` in ``layout`` (a family's departures
    from ``LAYER_NAMES``; ``frontends.hf.families.checkpoint_source`` picks the arch's)."""
    fused = families_ssm.fused_source(arch, param)  # stacked or halved tensors a name cannot say
    if fused is not None:
        return fused
    top = layout.get("_top", TOP_NAMES)
    if param in top:
        return Tensor(top[param])
    match = LAYER_PARAM.fullmatch(param)
    entry = None
    if match and not match.group(2).startswith("_"):
        suffix = match.group(2)
        entry = layout.get(suffix, LAYER_NAMES.get(suffix))
    if entry is None:
        raise SpecError(f"no checkpoint name is known for @{param} in the {arch.model_type} layout")
    prefix = f"{layout.get('_prefix', LAYER_PREFIX)}{int(match.group(1)) + layout.get('_layer_offset', 0)}."
    if callable(entry):  # a view a name cannot say: entry(arch, prefix) -> Source
        return entry(arch, prefix)
    if isinstance(entry, Experts):
        return Stack([Tensor(prefix + entry.template.format(e=e)) for e in range(arch.moe["experts"])])
    if isinstance(entry, Split):
        start, stop = entry.bounds(arch)
        return Rows(prefix + entry.key, start, stop)
    return Tensor(prefix + entry)


def checkpoint_source(arch: Arch, param: str) -> Source:
    """The checkpoint tensor(s) holding irc param ``param`` (see ``frontends.hf.families``'
    docstring): ``layout_source`` in the arch's layout."""
    return layout_source(LAYOUTS[arch.checkpoint], arch, param)
