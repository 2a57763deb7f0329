"""``moe-sort``: the ``moe`` op as routing, a sort of token slots by expert, grouped GEMMs
over contiguous segments and a weighted scatter back to token order."""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from irc import dims
from irc.analysis import layer_of
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph, Node, Param, Value
from irc.ops.moe_sorted import expert_capacity, tile_padding
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass

F32 = DType.f32
ROUTING = ("experts", "top_k", "scoring", "norm_topk_prob", "routed_scale", "n_group", "topk_group", "group_score",
           "jitter_eps")
ACTIVATION_OPS = {"silu": ("silu", {}), "gelu": ("gelu", {"approximate": "none"}),
                  "gelu_tanh": ("gelu", {"approximate": "tanh"})}
# the report runs the reference interpreter; past this many weight elements it only says so
REPORT_MAX_PARAM_ELEMENTS = 1 << 26


def lower_moe(e: Emitter, node: Node):
    """The sorted form replacing ``node``'s output, or why ``node`` is left: a capacity with
    expert down biases (a dropped pair would still add its bias)."""
    if node.attrs.get("expert_shards", 1) > 1:
        return "experts spread over ranks (shard's ep): the sorted form has no offset for a rank's experts"
    if e.options["capacity_factor"] is not None and e.operands["b_down"] is not None:
        return "capacity_factor with expert down biases (b_down): dropped pairs would keep their bias"
    if e.options["capacity_factor"] is not None and node.attrs["identity_experts"]:
        return "capacity_factor with identity experts: their pairs would take expert capacity"
    return SortedMoe(e, e.options["capacity_factor"]).output()


@register_pass
class MoeSort(LoweringPass):
    """Lower ``moe`` to sorted dispatch: route, sort token slots by expert, grouped GEMMs, scatter back.

    For x [B, T, d] with N = B*T tokens, k = top_k and M = N*k token-slot pairs:
    ``moe_route`` gives expert_ids and gating weights [N, k] (the op's routing: softmax or
    sigmoid, selection bias, group-limited top-k, or sparsemixer's two rounds;
    renormalisation, routed scale);
    ``moe_dispatch`` stably sorts the M pairs by expert into token_index/slot_index [M] and
    indptr [E+1]; the token rows are gathered, ``grouped_gemm`` runs gate and up over each
    expert's contiguous segment, the activation and product follow, ``grouped_gemm`` runs
    down; each row is scaled by its gating weight and ``scatter_add`` sums the rows into
    token order on top of the shared expert (Qwen's sigmoid ``shared_expert_gate`` included)
    or zeros. Everything runs in float32 and is cast back to x's dtype, as the op does.
    GPT-OSS's additions lower to primitives: ``moe_route`` adds the router logit bias; each
    sorted row's expert (expert_ids gathered by slot_index) gathers its gate and up bias rows,
    added after their ``grouped_gemm``; ``swiglu_oai`` is written out (``clamped_glu``); the
    down biases join the scatter's base in token order (``token_biases``). With a capacity,
    a node with down biases is left as it is, with a note (a dropped pair would keep its bias).
    Identity experts (LongCat's, ``identity_experts``): ``moe_route`` routes over all of them,
    their pairs go to expert 0 with weight 0 (``identity_split``) and each token's summed
    identity weight times the token joins the scatter's base; with a capacity the node is left.

    Options: ``capacity_factor`` (default none) caps each expert at
    ceil(capacity_factor * N * k / E) rows, dropping pairs in GShard priority order (every
    token's first choice before any second choice, tokens in order); the pass is then no
    longer exact and ``report`` counts the dropped pairs. ``tile`` (default 16) is the GEMM
    row tile the report's padding figure assumes.

    FLOPs per token are unchanged (grouped GEMMs count active work only) and so are the
    active parameters (``grouped_gemm`` touches top_k / E of each expert weight).
    Intermediate values are named ``<output>.<role>``; the output keeps its name.
    Guarantees without a capacity: the reference result up to float32 rounding.
    """

    name = "moe-sort"
    options = {"capacity_factor": None, "tile": 16}
    lowerings = {"moe": lower_moe}

    def __init__(self, **options):
        super().__init__(**options)
        factor, tile = self.config["capacity_factor"], self.config["tile"]
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0):
            raise PassError(f"pass moe-sort: capacity_factor must be a positive number, got {factor!r}",
                            hint="moe-sort{capacity_factor=1.25}, or leave it out to keep every token")
        if isinstance(tile, bool) or not isinstance(tile, int) or tile <= 0:
            raise PassError(f"pass moe-sort: tile must be a positive integer, got {tile!r}", hint="moe-sort{tile=64}")
        self.exact = factor is None  # dropping tokens changes the result; the check reports it

    def report(self, graph: Graph, feeds: Optional[Mapping[str, np.ndarray]] = None, seed: int = 0) -> dict:
        """Tokens per expert, load imbalance, dropped pairs and tile padding for each sorted MoE.

        Tokens per expert depend on the data, so the graph runs through the reference
        interpreter on ``feeds`` (default: the numeric check's seeded inputs, B=2, T=3, P=2)
        with seeded weights, and each ``moe_dispatch``'s routing is read off. Per layer:
        ``tokens_per_expert`` (pairs routed to each expert), ``imbalance`` (max / mean of
        those), ``kept_per_expert`` and ``dropped`` (after the capacity), and ``padding``
        (sum over experts of ceil(kept / tile) * tile - kept). JSON-able.
        """
        sites = [n for n in graph.nodes if n.op == "moe_dispatch"]
        summary = {"tile": self.config["tile"], "capacity_factor": self.config["capacity_factor"], "layers": []}
        if not sites:
            return summary
        size = sum(p.numel for p in graph.params.values())
        if size > REPORT_MAX_PARAM_ELEMENTS:
            summary["skipped"] = (f"{size} weight elements exceed {REPORT_MAX_PARAM_ELEMENTS}; tokens per expert "
                                  "need a reference run (use the tiny twin)")
            return summary
        routed, kept = _run_dispatch(graph, feeds, seed)
        for node, ids, indptr in zip(sites, routed, kept):
            summary["layers"].append(self._layer(node, ids, indptr))
        for key in ("pairs", "dropped", "padding"):
            summary[key] = sum(layer[key] for layer in summary["layers"])
        return summary

    def _layer(self, node: Node, expert_ids: np.ndarray, indptr: np.ndarray) -> dict:
        experts = node.attrs["experts"]
        tokens, top_k = expert_ids.shape
        routed = np.bincount(expert_ids.reshape(-1), minlength=experts)
        kept = np.diff(indptr)
        router = node.inputs[0].producer.inputs[1]
        factor = node.attrs["capacity_factor"]
        mean = routed.sum() / experts
        return {"layer": layer_of(router.name), "router": router.name, "experts": experts, "top_k": top_k,
                "tokens": int(tokens), "pairs": int(routed.sum()), "tokens_per_expert": routed.tolist(),
                "imbalance": round(float(routed.max() / mean), 4) if mean else 0.0,
                "capacity": None if factor is None else expert_capacity(tokens, top_k, experts, factor),
                "kept_per_expert": kept.tolist(), "dropped": int(routed.sum() - kept.sum()),
                "padding": tile_padding(kept, self.config["tile"])}


def _run_dispatch(graph: Graph, feeds, seed: int) -> tuple[list, list]:
    """Each ``moe_dispatch``'s expert_ids and indptr through the reference interpreter."""
    from irc.check import check_feeds, run_reference

    probe = graph.clone()
    sites = [n for n in probe.nodes if n.op == "moe_dispatch"]
    probe.outputs = [v for n in sites for v in (n.inputs[0], n.outputs[2])]
    arrays = run_reference(probe, check_feeds(graph, seed) if feeds is None else feeds, seed)
    return arrays[0::2], arrays[1::2]


class SortedMoe:
    """The sorted form of one ``moe`` node, emitted through ``e`` (named ``<output>.<role>``)."""

    def __init__(self, e: Emitter, capacity_factor):
        self.e, self.node, self.capacity_factor = e, e.node, capacity_factor

    def output(self) -> Value:
        e = self.e
        x, router, w_gate, w_up, w_down, bias, s_gate, s_up, s_down, s_expert_gate = list(e.operands.values())[:10]
        attrs = self.node.attrs
        experts, top_k = attrs["experts"], attrs["top_k"]
        d = x.shape[-1]
        tokens_shape = [dims.product(x.shape[:-1]), d]
        tokens = e.cast(e("reshape", [x], "tokens", {"shape": tokens_shape}), F32, "tokens_f32")
        logit_bias, b_gate, b_up, b_down = list(e.operands.values())[10:14]
        route = [tokens, router, bias] + ([logit_bias] if logit_bias is not None else [])
        identity = attrs["identity_experts"]
        expert_ids, weights = e.emit("moe_route", route,
                                     [e.name("expert_ids"), e.name("routing_weights")],
                                     {**{key: attrs[key] for key in ROUTING}, "experts": experts + identity})
        identity_weight = None
        if identity:  # LongCat's zero-computation experts: out of the dispatch, weight·x on the base
            expert_ids, weights, identity_weight = self.identity_split(expert_ids, weights)
        token_index, slot_index, indptr = e.emit(
            "moe_dispatch", [expert_ids], [e.name(role) for role in ("token_index", "slot_index", "indptr")],
            {"experts": experts, "capacity_factor": self.capacity_factor})
        rows = e("gather", [tokens, token_index], "rows", {"axis": 0})
        if attrs["weight_inputs"]:  # Llama-4: each pair's expert sees its token times the weight
            rows = e("mul", [rows, self.row_weights(weights, slot_index, rows.shape[0])], "weighted_rows")
        gemm = {"experts": experts, "top_k": top_k}
        row_expert = None
        if b_gate is not None or b_up is not None:  # each sorted row's expert [M]
            flat_ids = e("reshape", [expert_ids], "expert_ids_flat", {"shape": [dims.product(expert_ids.shape)]})
            row_expert = e("gather", [flat_ids, slot_index], "row_expert", {"axis": 0})
        gate = None if w_gate is None else self.biased(e("grouped_gemm", [rows, w_gate, indptr], "gate", gemm), b_gate,
                                                       row_expert, "gate")
        up = self.biased(e("grouped_gemm", [rows, w_up, indptr], "up", gemm), b_up, row_expert, "up")
        hidden = self.glu(gate, up, "act", "hidden")
        down = e("grouped_gemm", [hidden, w_down, indptr], "down", gemm)
        weighted = down if attrs["weight_inputs"] else e(
            "mul", [down, self.row_weights(weights, slot_index, down.shape[0])], "weighted")
        if b_down is None:
            base = self.shared(tokens, s_gate, s_up, s_down, s_expert_gate, tokens_shape)
        elif s_up is None:
            base = self.token_biases(b_down, expert_ids, weights)
        else:
            base = e("add", [self.shared(tokens, s_gate, s_up, s_down, s_expert_gate, tokens_shape),
                             self.token_biases(b_down, expert_ids, weights)], "shared_and_down_biases")
        if identity_weight is not None:
            base = e("add", [base, e("mul", [tokens, identity_weight], "identity")], "with_identity")
        combined = e("scatter_add", [base, token_index, weighted], "combined")
        out = e("reshape", [combined], "out_BTD", {"shape": list(x.shape)})
        return e.cast(out, e.out.dtype, "cast")

    def identity_split(self, expert_ids: Value, weights: Value) -> tuple:
        """Pairs routed to identity experts (ids >= experts) moved to expert 0 with weight 0,
        and each token's identity weight [N, 1] (the sum of theirs)."""
        e = self.e
        real = e("less", [expert_ids, e.constant(self.node.attrs["experts"], DType.i64, "mlp_experts")], "real_pairs")
        zero = e.constant(0.0, F32, "zero_weight")
        total = e("reduce_sum", [e("where", [real, zero, weights], "identity_pairs")], "identity_weight",
                  {"axes": [-1], "keepdims": True})
        ids = e("where", [real, expert_ids, e.constant(0, DType.i64, "expert_zero")], "mlp_expert_ids")
        return ids, e("where", [real, weights, zero], "mlp_weights"), total

    def row_weights(self, weights: Value, slot_index: Value, pairs) -> Value:
        """[M, 1]: each sorted (token, expert) pair's gating weight."""
        e = self.e
        flat = e("reshape", [weights], "routing_weights_flat", {"shape": [pairs]})
        row_weights = e("gather", [flat, slot_index], "row_weights", {"axis": 0})
        return e("reshape", [row_weights], "row_weights_M1", {"shape": [pairs, 1]})

    def activate(self, x: Value, role: str) -> Value:
        op, attrs = ACTIVATION_OPS[self.node.attrs["activation"]]
        return self.e(op, [x], role, attrs)

    def glu(self, gate: Value, up: Value, role: str, out: str) -> Value:
        """act(gate) * up, GPT-OSS's clamped form (``clamped_glu``) for ``swiglu_oai``, or relu(up)²
        for ungated experts (``relu2``: gate None)."""
        if self.node.attrs["activation"] == "relu2":
            positive = self.e("maximum", [up, self.e.constant(0.0, F32, f"{role}_zero")], f"{role}_relu")
            return self.e("mul", [positive, positive], out)
        if self.node.attrs["activation"] == "swiglu_oai":
            return clamped_glu(self.e, gate, up, self.node.attrs["swiglu_alpha"], self.node.attrs["swiglu_limit"],
                               role, out)
        return self.e("mul", [self.activate(gate, role), up], out)

    def biased(self, rows: Value, bias: Optional[Param], row_expert: Optional[Value], role: str) -> Value:
        """``rows`` [M, n] plus each row's expert's bias row (``bias`` [E, n] gathered by
        ``row_expert``), in float32; ``rows`` itself without a bias."""
        if bias is None:
            return rows
        e = self.e
        picked = e.cast(e("gather", [bias, row_expert], f"{role}_bias_rows", {"axis": 0}), F32, f"{role}_bias_f32")
        return e("add", [rows, picked], f"{role}_biased")

    def token_biases(self, b_down: Param, expert_ids: Value, weights: Value) -> Value:
        """sum over k of weights[:, k] * b_down[expert_ids[:, k]] [N, d]: the down biases in
        token order, the scatter's base (so the weighted scatter stays one GEMM epilogue)."""
        e, tokens, base = self.e, expert_ids.shape[0], None
        for k in range(self.node.attrs["top_k"]):
            ids = e("reshape", [e("slice", [expert_ids], f"ids_{k}", {"axis": 1, "start": k, "end": k + 1})],
                    f"ids_{k}_N", {"shape": [tokens]})
            rows = e.cast(e("gather", [b_down, ids], f"down_bias_{k}", {"axis": 0}), F32, f"down_bias_{k}_f32")
            weight = e("slice", [weights], f"weight_{k}", {"axis": 1, "start": k, "end": k + 1})
            term = e("mul", [rows, weight], f"down_bias_{k}_weighted")
            base = term if base is None else e("add", [base, term], f"down_bias_{k}_sum")
        return base

    def shared(self, tokens: Value, s_gate: Optional[Param], s_up, s_down, s_expert_gate, shape) -> Value:
        """The shared expert over every token (sigmoid-gated when asked), or zeros [N, d]."""
        e = self.e
        if s_up is None:
            return e("expand", [e.constant(0.0, F32, "zero")], "zeros", {"shape": shape})
        gate = None if s_gate is None else e("linear", [tokens, s_gate], "shared_gate")
        if self.node.attrs["activation"] in ("swiglu_oai", "relu2"):
            hidden = self.glu(gate, e("linear", [tokens, s_up], "shared_up"), "shared_act", "shared_hidden")
        else:  # the activation before the up projection (the golden dump's order)
            hidden = e("mul", [self.activate(gate, "shared_act"), e("linear", [tokens, s_up], "shared_up")],
                       "shared_hidden")
        out = e("linear", [hidden, s_down], "shared")
        if s_expert_gate is None:
            return out
        score = e("sigmoid", [e("linear", [tokens, s_expert_gate], "shared_score")], "shared_sigmoid")
        return e("mul", [out, score], "shared_gated")


def clamped_glu(e: Emitter, gate: Value, up: Value, alpha: float, limit: float, role: str, out: str) -> Value:
    """GPT-OSS's ``swiglu_oai`` in primitives (``irc.ops.moe.glu``): with g = min(gate, limit)
    = -max(-gate, -limit) and u = clip(up, -limit, limit) = max(-max(-up, -limit), -limit),
    (u + 1) * g * sigmoid(alpha * g)."""
    bound = e.constant(-float(limit), F32, f"{role}_minus_limit")
    g = e("neg", [e("maximum", [e("neg", [gate], f"{role}_gate_neg"), bound], f"{role}_gate_neg_max")],
          f"{role}_gate_clamped")
    low = e("neg", [e("maximum", [e("neg", [up], f"{role}_up_neg"), bound], f"{role}_up_neg_max")], f"{role}_up_min")
    u = e("maximum", [low, bound], f"{role}_up_clamped")
    scaled = e("mul", [g, e.constant(float(alpha), F32, f"{role}_alpha")], f"{role}_gate_scaled")
    act = e("mul", [g, e("sigmoid", [scaled], f"{role}_sigmoid")], f"{role}_glu")
    return e("mul", [e("add", [u, e.constant(1.0, F32, f"{role}_one")], f"{role}_up_plus_one"), act], out)
