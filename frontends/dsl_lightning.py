"""The DSL's MiniMax lightning-attention mixer (part of ``frontends.dsl.Layer``), over
``irc.ops.delta.gated_delta_rule`` with ``update_rule="gated"`` and a constant per-head
decay. (Being built: issue 26.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frontends.dsl import Model


class LightningLayer:
    """Mixin: needs the layer's ``model``, ``prefix``, ``index`` and ``frontends.dsl_ssm``'s
    helpers."""

    model: Model
    prefix: str
    index: int
