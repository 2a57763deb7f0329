"""``moe`` in ONNX: routing and experts in standard ops, or ONNX Runtime's ``MoE`` op.

Standard ops (``lower_moe``), the routing of ``irc.ops.moe.route`` step by step: softmax or
sigmoid scores, the selection bias, expert groups (max or top-2 sum per group, the best
``topk_group`` groups kept through a OneHot mask), ``TopK`` (lower index first on ties, as
the reference), the unbiased scores of the chosen experts, renormalised and scaled; or
sparsemixer's two rounds (``sparsemixer``: ArgMax, the ratio (max - s) / Max(|s|, max) against
2 * jitter_eps through Greater, a Where to -inf, Softmax, GatherElements; round 2 after the
first choice is masked out by an Equal against Range(E)), in f32 as the reference. The
experts then run densely: one MatMul over all experts' gate and up rows ([d, E*f], stored
that way), the activation, each expert's hidden units times its gating weight (0 for an
expert not chosen), one MatMul with all down projections ([E*f, d]). That is E/top_k times
the FLOPs of sparse dispatch but only standard ops and no data-dependent shapes; the ORT
op below is the sparse path.

Identity experts (LongCat-Flash's zero experts: ``identity_experts`` Z): the routing runs over
E + Z, the gating's last Z columns are summed per token and add that weight times x.

Biases (GPT-OSS): the router's logit bias is added to the router logits; the gate and up
biases [E, f] are added flat ([E*f], the column order of the packed weights) after their
MatMuls; the down biases [E, d] arrive as gating [N, E] @ b_down, each expert's bias times
its gating weight. ``swiglu_oai`` is written out: Min(gate, limit), Clip(up, -limit,
limit), gate * Sigmoid(alpha * gate) * (up + 1).

ORT (``lower_moe_ort``): ``com.microsoft.MoE`` where it matches the op: softmax routing
without selection bias or groups (not sparsemixer: ORT 1.32's CPU MoE accepts
``use_sparse_mixer`` and routes plain softmax top-2 all the same), routed scale 1, SwiGLU
or GPT-OSS's clamped SwiGLU experts (``activation_alpha``, ``activation_beta`` 1 and
``swiglu_limit``: ORT 1.32 computes exactly that form), with their biases (fc1's
interleaved like its weight, fc2's as they are);
a router logit bias is added to the logits it is given. On CPU SwiGLU needs
``swiglu_fusion=1`` (gate and up rows interleaved in one [E, 2f, d] weight, built at write
time) and no separate fc3. The shared expert (and its sigmoid gate) stays in standard
ops. Anything else falls back to ``lower_moe`` (``moe_fits_ort`` says why).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Param
from irc.ops.registry import by_name

from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.portable import activation, gated_mlp, linear

MOE_OPERANDS = ("x", "router", "w_gate", "w_up", "w_down", "router_bias", "shared_gate", "shared_up", "shared_down",
                "shared_expert_gate", "router_logit_bias", "b_gate", "b_up", "b_down")
ACTIVATION_OF = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh"}
BIASES = ("router_logit_bias", "b_gate", "b_up", "b_down")


def experts_in_major(w):
    """[E, f, d] gate or up weights -> [d, E*f]: x @ it gives every expert's hidden units."""
    w = np.asarray(w)
    return w.transpose(2, 0, 1).reshape(w.shape[2], -1)


def experts_out_major(w):
    """[E, d, f] down weights -> [E*f, d]."""
    w = np.asarray(w)
    return w.transpose(0, 2, 1).reshape(-1, w.shape[1])


def interleave_gate_up(gate, up):
    """[E, f, d] gate and up -> [E, 2f, d] with rows gate_0, up_0, gate_1, up_1, ..."""
    gate, up = np.asarray(gate), np.asarray(up)
    fused = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]), dtype=gate.dtype)
    fused[:, 0::2], fused[:, 1::2] = gate, up
    return fused


def interleave_biases(gate, up):
    """[E, f] gate and up biases -> [E, 2f]: gate_0, up_0, gate_1, up_1, ... (fc1's rows)."""
    gate, up = np.asarray(gate), np.asarray(up)
    fused = np.empty((gate.shape[0], 2 * gate.shape[1]), dtype=gate.dtype)
    fused[:, 0::2], fused[:, 1::2] = gate, up
    return fused


def flat_bias(b: Builder, bias, dtype: DType, shape: tuple) -> str:
    """A bias param (or value) reshaped to ``shape`` in type ``dtype``."""
    name = b.weight(bias, dtype=dtype) if isinstance(bias, Param) else b.value(bias)
    if not isinstance(bias, Param) and bias.dtype != dtype:
        name = b.op("Cast", [name], f"{name}/{dtype}", to=ONNX_TYPES[dtype])
    return b.op("Reshape", [name, b.i64(list(shape))], f"{name}/{'x'.join(map(str, shape))}")


def glu(b: Builder, gate: str, up: str, attrs: dict, dtype: DType, out: str) -> str:
    """The hidden units: act(gate) * up, GPT-OSS's clamped form (``swiglu_oai``), or relu(up)²
    for ungated experts (``relu2``: gate unused)."""
    if attrs["activation"] == "relu2":
        positive = b.op("Relu", [up], f"{out}/relu")
        return b.op("Mul", [positive, positive], f"{out}/hidden")
    if attrs["activation"] != "swiglu_oai":
        return b.op("Mul", [activation(b, ACTIVATION_OF[attrs["activation"]], gate, b.fresh(f"{out}/act")), up],
                    f"{out}/hidden")
    np_type = dtype.numpy
    limit, alpha = float(attrs["swiglu_limit"]), float(attrs["swiglu_alpha"])
    gate = b.op("Min", [gate, b.const(limit, np_type, f"{out}/limit")], f"{out}/gate_clamped")
    up = b.op("Clip", [up, b.const(-limit, np_type, f"{out}/minus_limit"), b.const(limit, np_type, f"{out}/limit_")],
              f"{out}/up_clamped")
    sig = b.op("Sigmoid", [b.op("Mul", [gate, b.const(alpha, np_type, f"{out}/alpha")], f"{out}/gate_scaled")],
               f"{out}/gate_sigmoid")
    up1 = b.op("Add", [up, b.const(1.0, np_type, f"{out}/one")], f"{out}/up_plus_one")
    return b.op("Mul", [b.op("Mul", [gate, sig], f"{out}/glu"), up1], f"{out}/hidden")


def _operands(node: Node) -> dict:
    return by_name(MOE_OPERANDS, node.inputs)


def route(b: Builder, logits: str, bias, attrs: dict, out: str, dtype: DType = DType.f32) -> tuple[str, str]:
    """(expert ids [N, k] i64, gating weights [N, k] f32) from router logits [N, E] of type
    ``dtype``; the routing is computed in f32 (logits of another type are cast first), as
    the reference routes."""
    top_k = attrs["top_k"]
    if dtype != DType.f32:
        logits = b.op("Cast", [logits], f"{out}/router_logits_f32", to=TensorProto.FLOAT)
    if attrs["scoring"] == "sparsemixer":
        ids, weights = sparsemixer(b, logits, attrs, out)
    else:
        ids, weights = _top_k(b, logits, bias, attrs, out)
    if attrs["norm_topk_prob"]:
        total = b.op("ReduceSum", [weights, b.i64([-1])], f"{out}/weights_sum", keepdims=1)
        total = b.op("Add", [total, b.const(1e-20, np.float32, f"{out}/tiny")], f"{out}/weights_sum_eps")
        weights = b.op("Div", [weights, total], f"{out}/weights_normed")
    if attrs["routed_scale"] != 1.0:
        weights = b.op("Mul", [weights, b.const(attrs["routed_scale"], np.float32, f"{out}/routed_scale")],
                       f"{out}/weights_scaled")
    return ids, weights


def _top_k(b: Builder, logits: str, bias, attrs: dict, out: str) -> tuple[str, str]:
    """Softmax or sigmoid scores, the selection bias (on the logits: sigmoid_logits), groups, TopK:
    (ids, unbiased scores)."""
    if attrs["scoring"] == "softmax":
        scores = b.op("Softmax", [logits], f"{out}/scores", axis=-1)
    else:
        scores = b.op("Sigmoid", [logits], f"{out}/scores")
    choice = logits if attrs["scoring"] == "sigmoid_logits" else scores  # Kolibri-1 selects on the logits
    choice = choice if bias is None else b.op("Add", [choice, b.weight(bias, dtype=DType.f32)], f"{out}/choice")
    if attrs["n_group"] is not None:
        choice = _limit_groups(b, choice, attrs, out)
    ids = b.fresh(f"{out}/expert_ids")
    b.node("TopK", [choice, b.i64([attrs["top_k"]])], [b.fresh(f"{out}/top_scores"), ids], axis=-1, largest=1,
           sorted=1)
    return ids, b.op("GatherElements", [scores, ids], f"{out}/weights", axis=-1)


def sparsemixer(b: Builder, logits: str, attrs: dict, out: str) -> tuple[str, str]:
    """Phi-3.5-MoE's two rounds over f32 logits [N, E] (``irc.ops.moe.sparsemixer``):
    (ids [N, 2] i64, weights [N, 2] f32)."""
    threshold = b.const(np.float32(2.0 * attrs["jitter_eps"]), np.float32, f"{out}/sparsemixer_threshold")
    minus_inf = b.const(-np.inf, np.float32, "moe/minus_inf")
    magnitude = b.op("Abs", [logits], f"{out}/logits_abs")
    scores, ids, weights = logits, [], []
    for r in (1, 2):
        best = b.op("ArgMax", [scores], f"{out}/round{r}_id", axis=-1, keepdims=1)
        top = b.op("ReduceMax", [scores, b.i64([-1])], f"{out}/round{r}_max", keepdims=1)
        ratio = b.op("Div", [b.op("Sub", [top, logits], f"{out}/round{r}_gap"),
                             b.op("Max", [magnitude, top], f"{out}/round{r}_factor")], f"{out}/round{r}_ratio")
        far = b.op("Greater", [ratio, threshold], f"{out}/round{r}_far")
        kept = b.op("Where", [far, minus_inf, scores], f"{out}/round{r}_kept")
        probs = b.op("Softmax", [kept], f"{out}/round{r}_probs", axis=-1)
        weights.append(b.op("GatherElements", [probs, best], f"{out}/round{r}_weight", axis=-1))
        ids.append(best)
        if r == 1:
            experts = b.i64(np.arange(attrs["experts"]), f"{out}/expert_range")
            first = b.op("Equal", [experts, best], f"{out}/round1_chosen")
            scores = b.op("Where", [first, minus_inf, logits], f"{out}/round2_scores")
    return (b.op("Concat", ids, f"{out}/expert_ids", axis=-1),
            b.op("Concat", weights, f"{out}/weights", axis=-1))


def _limit_groups(b: Builder, choice: str, attrs: dict, out: str) -> str:
    """Keep only the experts of the ``topk_group`` best groups (others -> -inf)."""
    experts, groups, keep_groups = attrs["experts"], attrs["n_group"], attrs["topk_group"]
    per_group = experts // groups
    grouped = b.op("Reshape", [choice, b.i64([-1, groups, per_group])], f"{out}/grouped")
    if attrs["group_score"] == "max":
        group_scores = b.op("ReduceMax", [grouped, b.i64([-1])], f"{out}/group_scores", keepdims=0)
    else:
        top2 = b.fresh(f"{out}/group_top2")
        b.node("TopK", [grouped, b.i64([2])], [top2, b.fresh(f"{out}/group_top2_ids")], axis=-1, largest=1, sorted=1)
        group_scores = b.op("ReduceSum", [top2, b.i64([-1])], f"{out}/group_scores", keepdims=0)
    best = b.fresh(f"{out}/best_groups")
    b.node("TopK", [group_scores, b.i64([keep_groups])], [b.fresh(f"{out}/best_group_scores"), best], axis=-1,
           largest=1, sorted=1)
    onehot = b.op("OneHot", [best, b.i64(groups), b.const([0.0, 1.0], np.float32, "onehot/values")],
                  f"{out}/best_onehot", axis=-1)
    keep = b.op("ReduceMax", [onehot, b.i64([1])], f"{out}/keep_groups", keepdims=0)
    keep = b.op("Unsqueeze", [keep, b.i64([-1])], f"{out}/keep_groups3")
    keep = b.op("Expand", [keep, b.i64([1, 1, per_group])], f"{out}/keep_experts3")
    keep = b.op("Reshape", [keep, b.i64([-1, experts])], f"{out}/keep_experts")
    keep = b.op("Cast", [keep], f"{out}/keep", to=TensorProto.BOOL)
    return b.op("Where", [keep, choice, b.const(-np.inf, np.float32, "moe/minus_inf")], f"{out}/choice_in_groups")


def _shared(b: Builder, ops: dict, x2: str, routed: str, attrs: dict, out: str) -> str:
    """routed + the shared expert (times sigmoid(x @ shared_expert_gate.T) when gated)."""
    if ops["shared_up"] is None:
        return routed
    x_value = ops["x"]
    dtype, name = x_value.dtype, b.fresh(f"{out}/shared")
    if attrs["activation"] in ("swiglu_oai", "relu2"):
        gate = None if ops["shared_gate"] is None else linear(b, x2, dtype, ops["shared_gate"], None,
                                                               b.fresh(f"{name}/gate"))
        up = linear(b, x2, dtype, ops["shared_up"], None, b.fresh(f"{name}/up"))
        shared = linear(b, glu(b, gate, up, attrs, dtype, name), dtype, ops["shared_down"], None, name)
    else:
        shared = gated_mlp(b, x2, dtype, ops["shared_gate"], ops["shared_up"], ops["shared_down"],
                           ACTIVATION_OF[attrs["activation"]], name)
    if ops["shared_expert_gate"] is not None:
        gate = linear(b, x2, x_value.dtype, ops["shared_expert_gate"], None, b.fresh(f"{out}/shared_gate_logit"))
        shared = b.op("Mul", [shared, b.op("Sigmoid", [gate], f"{out}/shared_gate")], f"{out}/shared_gated")
    return b.op("Add", [routed, shared], f"{out}/with_shared")


def lower_moe(b: Builder, node: Node, outs: list[str], rank: Optional[int] = None) -> None:
    """Standard ops (module docstring); ``rank``: a sharded graph's rank, whose experts are
    r x n .. (r + 1) x n of ``experts`` (``expert_shards``: routing over all of them, the
    rank's gating columns kept, ``rank_gating``)."""
    ops, a = _operands(node), node.attrs
    x_value, out = ops["x"], outs[0]
    d, experts, f = x_value.shape[-1], a["experts"], ops["w_up"].shape[1]
    x2 = b.op("Reshape", [b.value(x_value), b.i64([-1, d])], f"{out}/tokens")
    logits = linear(b, x2, x_value.dtype, ops["router"], ops["router_logit_bias"], b.fresh(f"{out}/router_logits"))
    ids, weights = route(b, logits, ops["router_bias"], a, out, x_value.dtype)
    onehot = b.op("OneHot", [ids, b.i64(experts + a["identity_experts"]),
                             b.const([0.0, 1.0], np.float32, "onehot/values")], f"{out}/chosen", axis=-1)
    gating = b.op("Mul", [onehot, b.op("Unsqueeze", [weights, b.i64([-1])], f"{out}/weights3")], f"{out}/gating3")
    gating = b.op("ReduceSum", [gating, b.i64([1])], f"{out}/gating", keepdims=0)
    identity = None
    if a["identity_experts"]:  # LongCat's zero-computation experts: weight·x, their weights summed per token
        ends = (b.i64([experts]), b.i64([experts + a["identity_experts"]]), b.i64([-1]))
        identity = b.op("ReduceSum", [b.op("Slice", [gating, *ends], f"{out}/identity_gating"), b.i64([-1])],
                        f"{out}/identity_weight", keepdims=1)
        gating = b.op("Slice", [gating, b.i64([0]), b.i64([experts]), b.i64([-1])], f"{out}/expert_gating")
    if a.get("expert_shards", 1) > 1:
        gating, experts = rank_gating(b, gating, a, rank, out)
    if x_value.dtype != DType.f32:
        gating = b.op("Cast", [gating], f"{out}/gating_{x_value.dtype}", to=ONNX_TYPES[x_value.dtype])
        identity = identity and b.op("Cast", [identity], f"{out}/identity_{x_value.dtype}",
                                     to=ONNX_TYPES[x_value.dtype])

    def packed(param, load, shape, role):
        if isinstance(param, Param):
            return b.converted(b.derived(f"{param.name}.{role}", param.dtype, shape, (param,), load), param.dtype,
                               x_value.dtype)
        perm = [2, 0, 1] if role == "experts_in" else [0, 2, 1]  # a dequantized weight, in the graph
        moved = b.op("Transpose", [b.value(param)], f"{param.name}.{role}_3d", perm=perm)
        return b.op("Reshape", [moved, b.i64(list(shape))], f"{param.name}.{role}")

    up_all = packed(ops["w_up"], experts_in_major, (d, experts * f), "experts_in")
    down_all = packed(ops["w_down"], experts_out_major, (experts * f, d), "experts_out")
    gate = None if ops["w_gate"] is None else b.op(
        "MatMul", [x2, packed(ops["w_gate"], experts_in_major, (d, experts * f), "experts_in")], f"{out}/gate")
    up = b.op("MatMul", [x2, up_all], f"{out}/up")
    if a["weight_inputs"]:  # Llama-4: expert(w·x), and w·x's projections are w times x's
        gate, up = (t and _per_expert(b, t, gating, experts, f, f"{out}/{role}_weighted") for t, role in (
            (gate, "gate"), (up, "up")))
    if ops["b_gate"] is not None:
        gate = b.op("Add", [gate, flat_bias(b, ops["b_gate"], x_value.dtype, (experts * f,))], f"{out}/gate_biased")
        up = b.op("Add", [up, flat_bias(b, ops["b_up"], x_value.dtype, (experts * f,))], f"{out}/up_biased")
    hidden = glu(b, gate, up, a, x_value.dtype, out)
    if not a["weight_inputs"]:
        hidden = _per_expert(b, hidden, gating, experts, f, f"{out}/weighted")
    routed = b.op("MatMul", [hidden, down_all], f"{out}/routed")
    if ops["b_down"] is not None:
        down_bias = b.op("MatMul", [gating, flat_bias(b, ops["b_down"], x_value.dtype, (experts, d))],
                         f"{out}/down_bias")
        routed = b.op("Add", [routed, down_bias], f"{out}/routed_biased")
    if identity is not None:
        routed = b.op("Add", [routed, b.op("Mul", [x2, identity], f"{out}/identity")], f"{out}/with_identity")
    total = _shared(b, ops, x2, routed, a, out)
    b.node("Reshape", [total, b.shape(x_value.shape)], outs, allowzero=1)


def rank_gating(b: Builder, gating: str, attrs: dict, rank: Optional[int], out: str) -> tuple[str, int]:
    """The gating columns [N, n] of rank ``rank``'s experts (r x n .. (r + 1) x n), and n: the
    other ranks' experts add nothing here (their all-reduce brings them)."""
    shards = attrs["expert_shards"]
    if rank is None:
        raise BackendError(f"moe with its experts over {shards} ranks (expert_shards) is one rank's program",
                           hint="a sharded graph is written one model per rank (backends.onnx.shard)")
    n = attrs["experts"] // shards
    return b.op("Slice", [gating, b.i64([rank * n]), b.i64([(rank + 1) * n]), b.i64([-1])],
                f"{out}/rank_gating"), n


def _per_expert(b: Builder, hidden: str, gating: str, experts: int, f: int, out: str) -> str:
    """[N, E*f] hidden units times each token's gating weight for their expert ([N, E])."""
    hidden3 = b.op("Reshape", [hidden, b.i64([-1, experts, f])], f"{out}/3d")
    scaled = b.op("Mul", [hidden3, b.op("Unsqueeze", [gating, b.i64([-1])], f"{out}/gating3d")], f"{out}/scaled3d")
    return b.op("Reshape", [scaled, b.i64([-1, experts * f])], out)


def moe_fits_ort(node: Node):
    """Why ORT's MoE op cannot compute this node (None when it can)."""
    a, ops = node.attrs, _operands(node)
    if a.get("expert_shards", 1) > 1:
        return "one rank's share of the experts (expert_shards: routing over all of them)"
    if a["weight_inputs"]:
        return "gating weights on the experts' inputs (Llama-4's)"
    if a["identity_experts"]:
        return "identity (zero-computation) experts"
    if a["scoring"] == "sparsemixer":
        return "sparsemixer routing (ORT 1.32's CPU MoE ignores use_sparse_mixer: it routes softmax top-2)"
    if a["scoring"] != "softmax":
        return f"{a['scoring']} router scores (MoE applies softmax)"
    if ops["router_bias"] is not None:
        return "a router selection bias"
    if a["n_group"] is not None:
        return "group-limited routing"
    if a["routed_scale"] != 1.0:
        return "a routed scale"
    if a["activation"] not in ("silu", "swiglu_oai"):
        return f"{a['activation']} experts (CPU MoE runs SwiGLU)"
    if not all(isinstance(ops[name], Param) for name in ("w_gate", "w_up", "w_down", *BIASES) if ops[name] is not None):
        return "quantized experts (dequantized in the graph)"
    if ops["x"].dtype.text not in ("f32", "f16"):
        return f"{ops['x'].dtype} activations"
    return None


def lower_moe_ort(b: Builder, node: Node, outs: list[str]) -> None:
    if moe_fits_ort(node) is not None:
        lower_moe(b, node, outs)
        return
    ops, a = _operands(node), node.attrs
    x_value, out = ops["x"], outs[0]
    d, experts, f = x_value.shape[-1], a["experts"], ops["w_gate"].shape[1]
    x2 = b.op("Reshape", [b.value(x_value), b.i64([-1, d])], f"{out}/tokens")
    logits = linear(b, x2, x_value.dtype, ops["router"], ops["router_logit_bias"], b.fresh(f"{out}/router_logits"))
    gate, up = ops["w_gate"], ops["w_up"]
    fc1 = b.derived(f"{gate.name}.interleaved_up", gate.dtype, (experts, 2 * f, d), (gate, up), interleave_gate_up,
                    "rows")
    fc1 = b.converted(fc1, gate.dtype, x_value.dtype)
    fc1_bias = fc2_bias = ""
    if ops["b_gate"] is not None:
        bg, bu = ops["b_gate"], ops["b_up"]
        fc1_bias = b.converted(b.derived(f"{bg.name}.interleaved_up", bg.dtype, (experts, 2 * f), (bg, bu),
                                         interleave_biases, "rows"), bg.dtype, x_value.dtype)
    if ops["b_down"] is not None:
        fc2_bias = b.weight(ops["b_down"], dtype=x_value.dtype)
    fc2 = b.weight(ops["w_down"], dtype=x_value.dtype)
    oai = a["activation"] == "swiglu_oai"
    routed = b.op("MoE", [x2, logits, fc1, fc1_bias, fc2, fc2_bias], f"{out}/routed", domain=MS_DOMAIN,
                  k=a["top_k"], normalize_routing_weights=int(a["norm_topk_prob"]), activation_type="swiglu",
                  swiglu_fusion=1, activation_alpha=float(a["swiglu_alpha"]) if oai else 1.0,
                  activation_beta=1.0 if oai else 0.0, swiglu_limit=float(a["swiglu_limit"]) if oai else None)
    total = _shared(b, ops, x2, routed, a, out)
    b.node("Reshape", [total, b.shape(x_value.shape)], outs, allowzero=1)
