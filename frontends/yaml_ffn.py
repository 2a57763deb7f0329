"""The YAML architecture form's feed-forward blocks (part of ``frontends.yaml_spec``, whose
docstring documents the keys): ``model.mlp`` and ``model.moe`` read into the arguments of
``Layer.swiglu`` / ``geglu`` / ``gelu_mlp`` / ``relu2_mlp`` and ``Layer.moe``, and which layers
have which block."""
from __future__ import annotations

from typing import Optional

from frontends import yaml_ssm
from frontends.dsl import Model
from frontends.yaml_attention import blame
from irc.ops.moe import MOE_ACTIVATIONS
from irc.yamlloc import Fields, boolean, choice, non_negative_int, number, optional, positive_int, positive_number

MLP_KEYS = ("kind", "d_ff", "approximate", "bias")
MOE_KEYS = ("experts", "top_k", "d_ff", "shared_experts", "shared_d_ff", "router", "router_bias",
            "norm_topk_prob", "routed_scale", "group_limited", "dense_layers", "layers", "shared_expert_gate",
            "activation", "swiglu_alpha", "swiglu_limit", "router_logit_bias", "expert_bias", "jitter_eps")
GROUP_KEYS = ("groups", "top_groups", "score")


class FeedForwardReader:
    """Mixin of ``yaml_spec._Expander``: needs its ``f``, ``n_layers``, ``kinds``,
    ``feed_forward`` and ``_missing``."""

    def _read_mlp(self, mlp: Optional[Fields]) -> None:
        self.mlp_f = mlp
        needs = next((i for i, ffn in enumerate(self.ffn) if ffn == "mlp"), None)
        if mlp is None:
            if needs is None:
                return
            if self.moe_f is not None and self.moe_f.has("dense_layers"):
                raise self.moe_f.error("dense_layers", "dense layers need model.mlp")
            if self.moe_f is not None and self.moe_f.has("layers"):
                raise self.moe_f.error("layers", f"layer {needs} is not MoE: the other layers need model.mlp")
            raise self._missing("mlp", needs, "has an MLP block")
        if not any(self.ffn):
            raise self.f.error("mlp", "no layer has a feed-forward block",
                               hint="model.layers.feed_forward is false and the pattern has no mlp layer")
        self.mlp_kind = mlp.get("kind", choice("swiglu", "geglu", "gelu", "relu2"))
        self.d_ff = mlp.get("d_ff", positive_int)
        default = {"geglu": "tanh"}.get(self.mlp_kind, "none")
        if self.mlp_kind in ("swiglu", "relu2") and mlp.has("approximate"):
            raise mlp.error("approximate", "applies to geglu and gelu only")
        self.approximate = mlp.get("approximate", choice("tanh", "none"), default)
        if self.mlp_kind not in ("gelu", "relu2") and mlp.has("bias"):
            raise mlp.error("bias", "applies to kinds gelu and relu2 only")
        self.mlp_bias = mlp.get("bias", boolean, False)

    def _read_moe(self, moe: Optional[Fields]) -> None:
        """The MoE settings, and ``self.ffn``: each layer's feed-forward block (mlp, moe, None)."""
        self.moe_f = moe
        moe_layers = yaml_ssm.moe_layers(moe, self.n_layers, self.feed_forward) if moe is not None else set()
        self.ffn = [k if k in yaml_ssm.FEED_FORWARD else ("moe" if i in moe_layers else "mlp") if self.feed_forward else None
                    for i, k in enumerate(self.kinds)]
        layer = next((i for i, ffn in enumerate(self.ffn) if ffn == "moe"), None)
        if moe is None:
            if layer is not None:
                raise self._missing("moe", layer, "is moe")
            return
        if not any(self.ffn):
            raise self.f.error("moe", "no layer has a feed-forward block",
                               hint="model.layers.feed_forward is false and the pattern has no moe layer")
        self.moe = {
            "experts": moe.get("experts", positive_int), "top_k": moe.get("top_k", positive_int),
            "d_ff": moe.get("d_ff", positive_int),
            "shared_experts": moe.get("shared_experts", non_negative_int, 0),
            "shared_d_ff": moe.get("shared_d_ff", optional(positive_int), None),
            "scoring": moe.get("router", choice("softmax", "sigmoid", "sparsemixer"), "softmax"),
            "router_bias": moe.get("router_bias", boolean, False),
            "norm_topk_prob": moe.get("norm_topk_prob", boolean, None),  # the DSL's default per router
            "routed_scale": moe.get("routed_scale", positive_number, 1.0),
            "shared_expert_gate": moe.get("shared_expert_gate", boolean, False),
            "activation": moe.get("activation", choice(*MOE_ACTIVATIONS), "silu"),
            "router_logit_bias": moe.get("router_logit_bias", boolean, False),
            "expert_bias": moe.get("expert_bias", boolean, False),
        }
        for key in ("swiglu_alpha", "swiglu_limit"):
            if moe.has(key) and self.moe["activation"] != "swiglu_oai":
                raise moe.error(key, "applies to activation swiglu_oai only")
            if moe.has(key):
                self.moe[key] = moe.get(key, positive_number)
        if moe.has("jitter_eps"):
            if self.moe["scoring"] != "sparsemixer":
                raise moe.error("jitter_eps", "applies to router sparsemixer only")
            self.moe["jitter_eps"] = moe.get("jitter_eps", number)
        self.group_f = moe.sub("group_limited", GROUP_KEYS)
        if self.group_f is not None:
            g = self.group_f
            self.moe.update(groups=g.get("groups", positive_int), top_groups=g.get("top_groups", positive_int),
                            group_score=g.get("score", choice("max", "top2_sum"), "max"))

    def _feed_forward(self, m: Model, layer, h, ffn: str):
        if ffn == "moe":
            table = {"scoring": (self.moe_f, "router")}
            if self.group_f is not None:
                table.update({"groups": (self.group_f, "groups"), "top_groups": (self.group_f, "top_groups")})
            with m.at(self.moe_f.origin()), blame(self.moe_f, table):
                return layer.moe(h, **self.moe)
        with m.at(self.mlp_f.origin()), blame(self.mlp_f):
            if self.mlp_kind == "swiglu":
                return layer.swiglu(h, d_ff=self.d_ff)
            if self.mlp_kind == "geglu":
                return layer.geglu(h, d_ff=self.d_ff, approximate=self.approximate)
            if self.mlp_kind == "relu2":
                return layer.relu2_mlp(h, d_ff=self.d_ff, bias=self.mlp_bias)
            return layer.gelu_mlp(h, d_ff=self.d_ff, bias=self.mlp_bias, approximate=self.approximate)
