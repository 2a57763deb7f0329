"""The DSL's mixture of experts (part of ``frontends.dsl.Layer``): argument checks, the
``moe`` op over the layer's expert weights, and the model's ``moe`` meta entry."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import GROUP_SCORES, MOE_SCORING, one_of, positive, positive_float
from irc.ops.moe import MOE_ACTIVATIONS, UNGATED

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


class MoeLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` (``layers.{i}.``) and ``index``."""

    model: Model
    prefix: str
    index: int

    def moe(self, x: Tensor, experts: int, top_k: int, d_ff: int, shared_experts: int = 0,
            shared_d_ff: Optional[int] = None, scoring: str = "softmax", router_bias: bool = False,
            norm_topk_prob: Optional[bool] = None, routed_scale: float = 1.0, groups: Optional[int] = None,
            top_groups: Optional[int] = None, group_score: str = "max", shared_expert_gate: bool = False,
            activation: str = "silu", router_logit_bias: bool = False, expert_bias: bool = False,
            swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0, jitter_eps: float = 0.01,
            weight_inputs: bool = False) -> Tensor:
        """Mixture of SwiGLU experts (fused ``moe.w_gate/w_up`` [E, d_ff, d], ``moe.w_down``
        [E, d, d_ff]) routed by ``moe.router`` [E, d]: softmax or sigmoid scores, top_k
        (group-limited when ``groups``/``top_groups`` are set), optional selection bias
        ``moe.router_bias`` (DeepSeek-V3), ``routed_scale`` on the routed sum, and shared
        experts of width ``shared_d_ff`` (default shared_experts * d_ff), optionally gated
        by ``moe.shared_expert_gate`` [1, d] (Qwen-MoE). GPT-OSS's additions:
        ``router_logit_bias`` (the router Linear's bias ``moe.router_logit_bias`` [E], added
        to the logits), ``expert_bias`` (``moe.b_gate``/``moe.b_up`` [E, d_ff] and
        ``moe.b_down`` [E, d]) and ``activation="swiglu_oai"`` (the clamped SwiGLU with
        ``swiglu_alpha`` and ``swiglu_limit``; ``irc.ops.moe``). ``scoring="sparsemixer"``
        (Phi-3.5-MoE): two argmax rounds, each weight a softmax over the logits within
        2 * ``jitter_eps`` (relative) of that round's maximum; top_k 2, no router_bias, no
        groups. ``norm_topk_prob`` renormalises the top-k weights: default true, false for
        sparsemixer. ``weight_inputs`` (Llama-4): each chosen expert takes its token times its
        weight, and its output is added unweighted."""
        m, p = self.model, self.prefix
        where = m.origin()
        d = m._features(x)
        for arg, value in (("experts", experts), ("top_k", top_k), ("d_ff", d_ff)):
            positive(arg, value, where)
        if isinstance(shared_experts, bool) or not isinstance(shared_experts, int) or shared_experts < 0:
            raise m.error("shared_experts", f"expected a non-negative integer, got {shared_experts!r}")
        if top_k > experts:
            raise m.error("top_k", f"top_k {top_k} exceeds {experts} experts")
        one_of("scoring", scoring, MOE_SCORING, where)
        if scoring == "sparsemixer":
            self._check_sparsemixer(top_k, router_bias, groups, jitter_eps)
        norm_topk_prob = scoring != "sparsemixer" if norm_topk_prob is None else norm_topk_prob
        one_of("group_score", group_score, GROUP_SCORES, where)
        one_of("activation", activation, MOE_ACTIVATIONS, where)
        swiglu_alpha = positive_float("swiglu_alpha", swiglu_alpha, where)
        swiglu_limit = positive_float("swiglu_limit", swiglu_limit, where)
        routed_scale = positive_float("routed_scale", routed_scale, where)
        self._check_groups(experts, top_k, groups, top_groups, where)
        if shared_d_ff is not None:
            positive("shared_d_ff", shared_d_ff, where)
            if not shared_experts:
                raise m.error("shared_d_ff", "set shared_experts too")
        shared = shared_d_ff or shared_experts * d_ff
        if shared_expert_gate and not shared:
            raise m.error("shared_expert_gate", "a shared expert gate needs shared experts")
        router, gated = m.param(f"{p}moe.router", (experts, d)), activation not in UNGATED  # relu2: no gate (Nemotron-H)
        w_gate = m.param(f"{p}moe.w_gate", (experts, d_ff, d)) if gated else None
        w_up = m.param(f"{p}moe.w_up", (experts, d_ff, d))
        w_down = m.param(f"{p}moe.w_down", (experts, d, d_ff))
        bias = m.param(f"{p}moe.router_bias", (experts,)) if router_bias else None
        s_gate = s_up = s_down = s_sigmoid = None
        if shared:
            s_gate = m.param(f"{p}moe.shared_gate", (shared, d)) if gated else None
            s_up = m.param(f"{p}moe.shared_up", (shared, d))
            s_down = m.param(f"{p}moe.shared_down", (d, shared))
        if shared_expert_gate:
            s_sigmoid = m.param(f"{p}moe.shared_expert_gate", (1, d))
        logit_bias = m.param(f"{p}moe.router_logit_bias", (experts,)) if router_logit_bias else None
        b_gate = b_up = b_down = None
        if expert_bias:
            b_gate, b_up = (m.param(f"{p}moe.b_{x_}", (experts, d_ff)) for x_ in ("gate", "up"))
            b_down = m.param(f"{p}moe.b_down", (experts, d))
        attrs = {"experts": experts, "top_k": top_k, "scoring": scoring, "norm_topk_prob": bool(norm_topk_prob),
                 "routed_scale": routed_scale, "n_group": groups, "topk_group": top_groups,
                 "group_score": group_score, "activation": activation}
        if activation == "swiglu_oai":
            attrs.update(swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit)
        attrs.update({"jitter_eps": float(jitter_eps)} if scoring == "sparsemixer" else {},
                     **({"weight_inputs": True} if weight_inputs else {}))
        out = m.emit("moe", [x, router, w_gate, w_up, w_down, bias, s_gate, s_up, s_down, s_sigmoid, logit_bias,
                             b_gate, b_up, b_down], attrs, f"{p}moe_out")[0]
        if m.meta["moe"] is None:
            self._first_meta(attrs, d_ff=d_ff, shared_experts=shared_experts, shared_d_ff=shared or None,
                             router_bias=bool(router_bias), shared_expert_gate=bool(shared_expert_gate),
                             router_logit_bias=bool(router_logit_bias), expert_bias=bool(expert_bias))
        m.meta["moe"]["layers"].append(self.index)
        return out

    def _first_meta(self, attrs: dict, **settings) -> None:
        """The model's ``moe`` meta entry, from its first MoE layer: sizes and routing; GPT-OSS's
        additions and sparsemixer's ``jitter_eps`` only where used."""
        names = {"n_group": "groups", "topk_group": "top_groups"}
        meta = {"experts": attrs["experts"], "top_k": attrs["top_k"], "d_ff": settings["d_ff"],
                "shared_experts": settings["shared_experts"], "shared_d_ff": settings["shared_d_ff"],
                "scoring": attrs["scoring"], "router_bias": settings["router_bias"],
                **{names.get(k, k): attrs[k] for k in ("norm_topk_prob", "routed_scale", "n_group", "topk_group",
                                                       "group_score")},
                "shared_expert_gate": settings["shared_expert_gate"], "layers": []}
        if settings["router_logit_bias"] or settings["expert_bias"] or attrs["activation"] == "swiglu_oai":
            meta.update(router_logit_bias=settings["router_logit_bias"], expert_bias=settings["expert_bias"],
                        activation=attrs["activation"])
        if "jitter_eps" in attrs:
            meta["jitter_eps"] = attrs["jitter_eps"]
        self.model.meta["moe"] = meta

    def _check_sparsemixer(self, top_k: int, router_bias: bool, groups, jitter_eps) -> None:
        """sparsemixer routes exactly two experts, on the logits alone."""
        m = self.model
        if top_k != 2:
            raise m.error("top_k", f"sparsemixer routes exactly 2 experts, got top_k {top_k}")
        if router_bias:
            raise m.error("router_bias", "sparsemixer has no selection bias")
        if groups is not None:
            raise m.error("groups", "sparsemixer has no expert groups")
        if isinstance(jitter_eps, bool) or not isinstance(jitter_eps, (int, float)) or not (
                jitter_eps >= 0 and math.isfinite(jitter_eps)):
            raise m.error("jitter_eps", f"expected a non-negative number, got {jitter_eps!r}")

    def _check_groups(self, experts: int, top_k: int, groups, top_groups, where) -> None:
        """Group-limited routing's arguments: both or neither, and they fit the experts."""
        m = self.model
        if (groups is None) != (top_groups is None):
            raise m.error("groups" if groups is None else "top_groups", "groups and top_groups go together")
        if groups is None:
            return
        positive("groups", groups, where)
        positive("top_groups", top_groups, where)
        if experts % groups:
            raise m.error("groups", f"{experts} experts do not split into {groups} groups")
        if top_groups > groups:
            raise m.error("top_groups", f"top_groups {top_groups} exceeds {groups} groups")
        if top_k > top_groups * (experts // groups):
            raise m.error("top_k", f"top_k {top_k} exceeds the {top_groups * (experts // groups)} experts "
                                   f"in {top_groups} groups")
