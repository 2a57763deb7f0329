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
ROUTING = ("experts", "top_k", "scoring", "norm_topk_prob", "routed_scale", "n_group", "topk_group", "group_score")
ACTIVATION_OPS = {"silu": ("silu", {}), "gelu": ("gelu", {"approximate": "none"}),
                  "gelu_tanh": ("gelu", {"approximate": "tanh"})}
# the report runs the reference interpreter; past this many weight elements it only says so
REPORT_MAX_PARAM_ELEMENTS = 1 << 26


def refusal(node: Node) -> Optional[str]:
    """Why the sorted form cannot express ``node`` (None when it can): GPT-OSS's router logit
    bias (``moe_route`` reads none, and backends lowering ``moe_route`` would drop it), its
    expert biases (``grouped_gemm`` has none) and its clamped ``swiglu_oai`` GLU (no clamp
    primitive). Such a node stays a ``moe`` op, which the ONNX targets lower whole."""
    operands = dict(zip(("router_logit_bias", "b_gate", "b_up", "b_down"), node.inputs[10:14]))
    present = [name for name, value in operands.items() if value is not None]
    if present:
        return f"{', '.join(present)}: the sorted form has no biases (moe_route, grouped_gemm)"
    if node.attrs["activation"] == "swiglu_oai":
        return "swiglu_oai experts: the sorted form has no clamped GLU"
    return None


def lower_moe(e: Emitter, node: Node):
    """The sorted form replacing ``node``'s output, or the reason it is left (``refusal``)."""
    return refusal(node) or SortedMoe(e, e.options["capacity_factor"]).output()


@register_pass
class MoeSort(LoweringPass):
    """Lower ``moe`` to sorted dispatch: route, sort token slots by expert, grouped GEMMs, scatter back.

    For x [B, T, d] with N = B*T tokens, k = top_k and M = N*k token-slot pairs:
    ``moe_route`` gives expert_ids and gating weights [N, k] (the op's routing: softmax or
    sigmoid, selection bias, group-limited top-k, renormalisation, routed scale);
    ``moe_dispatch`` stably sorts the M pairs by expert into token_index/slot_index [M] and
    indptr [E+1]; the token rows are gathered, ``grouped_gemm`` runs gate and up over each
    expert's contiguous segment, the activation and product follow, ``grouped_gemm`` runs
    down; each row is scaled by its gating weight and ``scatter_add`` sums the rows into
    token order on top of the shared expert (Qwen's sigmoid ``shared_expert_gate`` included)
    or zeros. Everything runs in float32 and is cast back to x's dtype, as the op does.
    GPT-OSS's MoE (router logit bias, expert biases, ``swiglu_oai``) is left as it is, with a
    note saying which (``refusal``).

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
        expert_ids, weights = e.emit("moe_route", [tokens, router, bias],
                                     [e.name("expert_ids"), e.name("routing_weights")],
                                     {key: attrs[key] for key in ROUTING})
        token_index, slot_index, indptr = e.emit(
            "moe_dispatch", [expert_ids], [e.name(role) for role in ("token_index", "slot_index", "indptr")],
            {"experts": experts, "capacity_factor": self.capacity_factor})
        rows = e("gather", [tokens, token_index], "rows", {"axis": 0})
        gemm = {"experts": experts, "top_k": top_k}
        gate = e("grouped_gemm", [rows, w_gate, indptr], "gate", gemm)
        up = e("grouped_gemm", [rows, w_up, indptr], "up", gemm)
        hidden = e("mul", [self.activate(gate, "act"), up], "hidden")
        down = e("grouped_gemm", [hidden, w_down, indptr], "down", gemm)
        pairs = down.shape[0]
        flat = e("reshape", [weights], "routing_weights_flat", {"shape": [pairs]})
        row_weights = e("gather", [flat, slot_index], "row_weights", {"axis": 0})
        row_weights = e("reshape", [row_weights], "row_weights_M1", {"shape": [pairs, 1]})
        weighted = e("mul", [down, row_weights], "weighted")
        base = self.shared(tokens, s_gate, s_up, s_down, s_expert_gate, tokens_shape)
        combined = e("scatter_add", [base, token_index, weighted], "combined")
        out = e("reshape", [combined], "out_BTD", {"shape": list(x.shape)})
        return e.cast(out, e.out.dtype, "cast")

    def activate(self, x: Value, role: str) -> Value:
        op, attrs = ACTIVATION_OPS[self.node.attrs["activation"]]
        return self.e(op, [x], role, attrs)

    def shared(self, tokens: Value, s_gate: Optional[Param], s_up, s_down, s_expert_gate, shape) -> Value:
        """The shared expert over every token (sigmoid-gated when asked), or zeros [N, d]."""
        e = self.e
        if s_gate is None:
            return e("expand", [e.constant(0.0, F32, "zero")], "zeros", {"shape": shape})
        gate = e("linear", [tokens, s_gate], "shared_gate")
        hidden = e("mul", [self.activate(gate, "shared_act"), e("linear", [tokens, s_up], "shared_up")],
                   "shared_hidden")
        out = e("linear", [hidden, s_down], "shared")
        if s_expert_gate is None:
            return out
        score = e("sigmoid", [e("linear", [tokens, s_expert_gate], "shared_score")], "shared_sigmoid")
        return e("mul", [out, score], "shared_gated")
