"""Mixture of experts: the ``moe`` op, its router and two reference implementations.

Routing (``route``), all in float32:

1. scores = softmax or sigmoid of the router logits x @ router.T (+ router_logit_bias, the
   router Linear's own bias: GPT-OSS);
2. selection scores = scores + router_bias (DeepSeek-V3's correction bias: selection only);
   ``scoring="sigmoid_logits"`` (Kolibri-1): sigmoid scores, but the selection is the *logits*
   + router_bias (top-k on them; the weights are still the chosen experts' sigmoid scores);
3. with groups (n_group, topk_group) the experts split into n_group equal groups; a group's
   score is its max selection score ("max", DeepSeek-V2 group_limited_greedy) or the sum of
   its top two ("top2_sum", DeepSeek-V3 noaux_tc); only the best topk_group groups stay;
4. the top_k experts by selection score, ties to the lower expert index, best first;
5. gating weights are the *unbiased* scores of the chosen experts, divided by their sum
   (+1e-20, as HF) when norm_topk_prob, times routed_scale.

``scoring="sparsemixer"`` (Phi-3.5-MoE's sparsemixer at inference) replaces steps 1-4 with two
rounds over the logits s (+ router_logit_bias), exactly 2 experts, no selection bias, no groups:
round 1 picks e1 = argmax s (ties to the lower index) with max m; logits with
(m - s) / max(|s|, m) > 2 * ``jitter_eps`` are masked to -inf and the weight is the softmax
of what is left, at e1. Round 2 masks e1 out of s, picks e2 = argmax, and repeats with that
maximum m2 (the ratio still over the unmasked |s|). Both in float32, as transformers computes
them (a 0/0 ratio compares false: kept); step 5 then applies (the Phi family sets
norm_topk_prob false).

Experts are gated MLPs (or, with ``activation="relu2"``, ungated: down(relu(up(x))²), no
w_gate and no shared_gate: Nemotron-H's): down(act(gate(x)) * up(x)) with weights [E, f, d], [E, f, d],
[E, d, f] (HF layout per expert), optional biases b_gate, b_up [E, f] and b_down [E, d]
(each expert's own row added after its projection). ``activation`` is the gate function
(silu: SwiGLU, gelu, gelu_tanh) or ``swiglu_oai``, GPT-OSS's clamped GLU: gate clamped
above at ``swiglu_limit``, up clamped to [-limit, limit], glu = gate * sigmoid(
``swiglu_alpha`` * gate), hidden = (up + 1) * glu. An optional shared expert (same
activation, no biases) is added to the routed sum; Qwen2-MoE scales it by
sigmoid(x @ shared_expert_gate.T).
With ``weight_inputs`` (Llama-4) a chosen expert's *input* is scaled by the gating weight and
its output added as it is: expert(w·x) in place of w·expert(x).
``identity_experts`` Z (LongCat-Flash's zero-computation experts): the router (and its biases)
has E + Z rows, routing runs over all E + Z, and a chosen expert e >= E returns its input:
it adds weight·x (E = ``experts``, the MLP experts' count).
Mixtral: softmax, top_k, norm_topk_prob=True. DeepSeek-V3: sigmoid, router_bias, groups
with "top2_sum", routed_scale. Qwen2-MoE: softmax, shared expert with its gate. GPT-OSS:
softmax with router_logit_bias and norm_topk_prob=True (a softmax over the top-k logits),
expert biases, swiglu_oai (alpha 1.702, limit 7). Phi-3.5-MoE: sparsemixer (jitter_eps =
router_jitter_noise, 0.01), norm_topk_prob=False, SwiGLU experts.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from irc import dims
from irc.ops.nn import f32
from irc.ops.primitives import gelu, silu
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, by_name, expect, pad_inputs, register, same_dims

SCORINGS = ("softmax", "sigmoid", "sparsemixer", "sigmoid_logits")
GROUP_SCORES = ("max", "top2_sum")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # gate functions (the NPU executor's epilogues too)
UNGATED = ("relu2",)  # experts with no gate projection: relu(up)² (Nemotron-H's)
MOE_ACTIVATIONS = ACTIVATIONS + ("swiglu_oai",) + UNGATED  # what the moe op's ``activation`` takes
EXPERT_OPERANDS = ("w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")
OPERANDS = ("x", "router", "w_gate?", "w_up", "w_down", "router_bias?", "shared_gate?", "shared_up?", "shared_down?",
            "shared_expert_gate?", "router_logit_bias?", "b_gate?", "b_up?", "b_down?")


def activate(x, activation: str) -> np.ndarray:
    if activation == "silu":
        return silu(x)
    if activation == "gelu":
        return gelu(x)
    if activation == "gelu_tanh":
        return gelu(x, "tanh")
    raise ValueError(f"unknown moe activation {activation!r}")


def glu(gate, up, activation: str = "silu", alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """The hidden units from gate and up projections [..., f], float32: act(gate) * up, GPT-OSS's
    clamped form for ``swiglu_oai`` (the module docstring), or relu(up)² for the ungated
    ``relu2`` (gate None)."""
    if activation == "relu2":
        return np.square(np.maximum(f32(up), np.float32(0.0)))
    gate, up = f32(gate), f32(up)
    if activation != "swiglu_oai":
        return activate(gate, activation) * up
    gate = np.minimum(gate, np.float32(limit))
    up = np.clip(up, np.float32(-limit), np.float32(limit))
    return ((up + np.float32(1.0)) * gate / (np.float32(1.0) + np.exp(-np.float32(alpha) * gate))).astype(np.float32)


def _top_indices(values, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis, best first, ties to the lower index."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def _softmax(logits) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def sparsemixer(logits, jitter_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Phi-3.5-MoE's two-round routing of logits [N, E] (the module docstring):
    (expert_ids [N, 2] i64, weights [N, 2] f32), the round-1 choice first."""
    logits = f32(logits)
    threshold = np.float32(2.0 * jitter_eps)
    rows, columns = np.arange(len(logits)), np.arange(logits.shape[-1])
    scores, ids, weights = logits, [], []
    for _ in range(2):
        best = np.argmax(scores, axis=-1)  # the first of equal maxima, as torch.max
        top = scores[rows, best][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            far = (top - logits) / np.maximum(np.abs(logits), top) > threshold
        weights.append(_softmax(np.where(far, -np.inf, scores))[rows, best])
        ids.append(best)
        scores = np.where(columns == best[:, None], -np.inf, scores)  # round 2: without the first choice
    return np.stack(ids, axis=-1).astype(np.int64), np.stack(weights, axis=-1).astype(np.float32)


def route(x, router, router_bias=None, *, top_k: int, scoring: str = "softmax", norm_topk_prob: bool = True,
          routed_scale: float = 1.0, n_group: Optional[int] = None, topk_group: Optional[int] = None,
          group_score: str = "max", jitter_eps: float = 0.01, logit_bias=None) -> tuple[np.ndarray, np.ndarray]:
    """Choose experts for each token of x [..., d]: (expert_ids [N, k] i64, weights [N, k] f32),
    N the number of tokens, experts best first (see the module docstring; ``logit_bias`` is
    the router's own bias, added to the logits; ``jitter_eps`` is read by sparsemixer only)."""
    router = f32(router)
    tokens = f32(x).reshape(-1, router.shape[1])
    logits = tokens @ router.T
    if logit_bias is not None:
        logits = logits + f32(logit_bias)
    if scoring == "sparsemixer":
        if top_k != 2 or router_bias is not None or n_group is not None:
            raise ValueError("sparsemixer routes 2 experts, without selection bias or groups")
        expert_ids, weights = sparsemixer(logits, jitter_eps)
        return _finish(expert_ids, weights, norm_topk_prob, routed_scale)
    if scoring == "softmax":
        scores = _softmax(logits)
    elif scoring in ("sigmoid", "sigmoid_logits"):
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        raise ValueError(f"unknown moe scoring {scoring!r}")
    scores = scores.astype(np.float32)
    choice = f32(logits) if scoring == "sigmoid_logits" else scores  # Kolibri-1 selects on the logits
    choice = choice if router_bias is None else choice + f32(router_bias)
    if n_group is not None:
        experts = scores.shape[-1]
        grouped = choice.reshape(len(choice), n_group, experts // n_group)
        if group_score == "max":
            per_group = grouped.max(axis=-1)
        elif group_score == "top2_sum":
            per_group = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)
        else:
            raise ValueError(f"unknown moe group_score {group_score!r}")
        keep = np.zeros(per_group.shape, dtype=bool)
        np.put_along_axis(keep, _top_indices(per_group, topk_group), True, axis=-1)
        choice = np.where(np.repeat(keep, experts // n_group, axis=-1), choice, -np.inf)
    expert_ids = _top_indices(choice, top_k)
    return _finish(expert_ids, np.take_along_axis(scores, expert_ids, axis=-1), norm_topk_prob, routed_scale)


def _finish(expert_ids, weights, norm_topk_prob: bool, routed_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Step 5: renormalised when asked, times routed_scale."""
    if norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + np.float32(1e-20))
    weights = weights * np.float32(routed_scale)
    return expert_ids.astype(np.int64), weights.astype(np.float32)


ROUTING_ATTRS = ("top_k", "scoring", "norm_topk_prob", "routed_scale", "n_group", "topk_group", "group_score",
                 "jitter_eps")


def routing_attrs(attrs: dict) -> dict:
    """The keyword arguments of ``route`` taken from the op's attributes."""
    return {key: attrs[key] for key in ROUTING_ATTRS}


def _plus(y, bias) -> np.ndarray:
    return y if bias is None else y + f32(bias)


def expert_mlp(x, w_gate, w_up, w_down, activation: str = "silu", b_gate=None, b_up=None, b_down=None,
               alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """down(glu(x @ gate.T + b_gate, x @ up.T + b_up)) + b_down for one expert (or the
    shared one), float32; ``glu`` per ``activation`` (biases optional)."""
    x = f32(x)
    gate = None if w_gate is None else _plus(x @ f32(w_gate).T, b_gate)
    hidden = glu(gate, _plus(x @ f32(w_up).T, b_up), activation, alpha, limit)
    return _plus(hidden @ f32(w_down).T, b_down)


def shared_expert(x, shared_gate=None, shared_up=None, shared_down=None, shared_expert_gate=None,
                  activation: str = "silu", alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """The shared expert's contribution for tokens x [N, d] (zeros when absent)."""
    x = f32(x)
    if shared_up is None:
        return np.zeros_like(x)
    out = expert_mlp(x, shared_gate, shared_up, shared_down, activation, alpha=alpha, limit=limit)
    if shared_expert_gate is not None:
        out = out / (1.0 + np.exp(-(x @ f32(shared_expert_gate).T)))
    return out


def _row(bias, expert: int):
    return None if bias is None else bias[expert]


def moe_dense(x, router, w_gate, w_up, w_down, router_bias=None, shared_gate=None, shared_up=None,
              shared_down=None, shared_expert_gate=None, router_logit_bias=None, b_gate=None, b_up=None, b_down=None,
              *, activation: str = "silu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
              weight_inputs: bool = False, **routing) -> np.ndarray:
    """Every expert over every token, each output scaled by that token's gating weight for
    the expert (0 if not chosen; with ``weight_inputs``, each chosen expert's input is
    scaled instead). Float32, shape of x."""
    tokens = f32(x).reshape(-1, x.shape[-1])
    expert_ids, weights = route(tokens, router, router_bias, logit_bias=router_logit_bias, **routing)
    dense = np.zeros((len(tokens), np.shape(router)[0]), dtype=np.float32)  # E + identity experts
    np.put_along_axis(dense, expert_ids, weights, axis=-1)
    chosen = np.zeros(dense.shape, dtype=bool)
    np.put_along_axis(chosen, expert_ids, True, axis=-1)
    glu_args = dict(alpha=swiglu_alpha, limit=swiglu_limit)
    out = shared_expert(tokens, shared_gate, shared_up, shared_down, shared_expert_gate, activation, **glu_args)
    for e in range(len(w_up)):
        weight = dense[:, e:e + 1]
        y = expert_mlp(tokens * weight if weight_inputs else tokens, _row(w_gate, e), w_up[e], w_down[e], activation,
                       _row(b_gate, e), _row(b_up, e), _row(b_down, e), **glu_args)
        out = out + (np.where(chosen[:, e:e + 1], y, 0.0) if weight_inputs else weight * y)
    out = out + tokens * dense[:, len(w_up):].sum(axis=-1, keepdims=True)  # identity experts: weight·x
    return out.reshape(x.shape).astype(np.float32)


def moe_per_token(x, router, w_gate, w_up, w_down, router_bias=None, shared_gate=None, shared_up=None,
                  shared_down=None, shared_expert_gate=None, router_logit_bias=None, b_gate=None, b_up=None,
                  b_down=None, *, activation: str = "silu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
                  weight_inputs: bool = False, **routing) -> np.ndarray:
    """Token by token, only the chosen experts: the definition ``moe_dense`` must equal."""
    tokens = f32(x).reshape(-1, x.shape[-1])
    expert_ids, weights = route(tokens, router, router_bias, logit_bias=router_logit_bias, **routing)
    glu_args = dict(alpha=swiglu_alpha, limit=swiglu_limit)
    out = shared_expert(tokens, shared_gate, shared_up, shared_down, shared_expert_gate, activation, **glu_args)
    for n, token in enumerate(tokens):
        for e, weight in zip(expert_ids[n], weights[n]):
            if e >= len(w_up):  # an identity expert
                out[n] += weight * token
                continue
            y = expert_mlp(token[None] * weight if weight_inputs else token[None], _row(w_gate, e), w_up[e], w_down[e],
                           activation, _row(b_gate, e), _row(b_up, e), _row(b_down, e), **glu_args)[0]
            out[n] += y if weight_inputs else weight * y
    return out.reshape(x.shape).astype(np.float32)


# ---- the op ----------------------------------------------------------------------------

def _shape_is(value, want) -> bool:
    return len(value.shape) == len(want) and all(same_dims(a, b) for a, b in zip(value.shape, want))


def _check(name, value, want):
    expect(_shape_is(value, want),
           f"moe: {name} {dims.format_shape(value.shape)} should be {dims.format_shape(want)}")


def check_routing_attrs(attrs) -> None:
    experts, top_k, identity = attrs["experts"], attrs["top_k"], attrs.get("identity_experts", 0)
    expect(isinstance(experts, int) and experts > 0, f"moe: experts must be a positive int, got {experts!r}")
    expect(isinstance(identity, int) and not isinstance(identity, bool) and identity >= 0,
           f"moe: identity_experts must be a non-negative int, got {identity!r}")
    experts += identity  # routing chooses among the MLP and the identity experts
    expect(isinstance(top_k, int) and 0 < top_k <= experts, f"moe: top_k must be in 1..{experts}, got {top_k!r}")
    expect(attrs["scoring"] in SCORINGS, f"moe: scoring must be one of {', '.join(SCORINGS)}")
    expect(attrs["group_score"] in GROUP_SCORES, f"moe: group_score must be one of {', '.join(GROUP_SCORES)}")
    expect(attrs["activation"] in MOE_ACTIVATIONS, f"moe: activation must be one of {', '.join(MOE_ACTIVATIONS)}")
    eps = attrs["jitter_eps"]
    expect(isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0,
           f"moe: jitter_eps must be a non-negative number, got {eps!r}")
    n_group, topk_group = attrs["n_group"], attrs["topk_group"]
    if attrs["scoring"] == "sparsemixer":
        expect(top_k == 2, f"moe: sparsemixer routes exactly 2 experts, got top_k {top_k}")
        expect(n_group is None, "moe: sparsemixer has no expert groups (n_group)")
    expect((n_group is None) == (topk_group is None), "moe: n_group and topk_group must be set together")
    if n_group is not None:
        expect(isinstance(n_group, int) and n_group > 0 and experts % n_group == 0,
               f"moe: n_group ({n_group}) must divide experts ({experts})")
        expect(isinstance(topk_group, int) and 0 < topk_group <= n_group,
               f"moe: topk_group must be in 1..{n_group}, got {topk_group!r}")
        expect(top_k <= topk_group * (experts // n_group),
               f"moe: top_k ({top_k}) exceeds the experts in {topk_group} kept groups")


def _check_oai(attrs) -> None:
    for name in ("swiglu_alpha", "swiglu_limit"):
        value = attrs[name]
        expect(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
               f"moe: {name} must be a positive number, got {value!r}")


def _check_expert_biases(ops: dict, experts: int, f, d, routed: int) -> None:
    """router_logit_bias [E + identity experts], b_gate/b_up [E, f] (together) and b_down [E, d], each optional."""
    if ops["router_logit_bias"] is not None:
        _check("router_logit_bias", ops["router_logit_bias"], (routed,))
    expect((ops["b_gate"] is None) == (ops["b_up"] is None), "moe: b_gate and b_up must be given together")
    for name, want in (("b_gate", (experts, f)), ("b_up", (experts, f)), ("b_down", (experts, d))):
        if ops[name] is not None:
            _check(name, ops[name], want)


def _moe_infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    x, router, w_gate, w_up, w_down, bias, s_gate, s_up, s_down, s_expert_gate = pad_inputs(inputs, 10)
    check_routing_attrs(attrs)
    _check_oai(attrs)
    expect(isinstance(attrs["weight_inputs"], bool), "moe: weight_inputs must be true or false")
    expect(not attrs["weight_inputs"] or all(ops[name] is None for name in ("b_gate", "b_up", "b_down")),
           "moe: weight_inputs (Llama-4's) takes experts without biases")
    routed_total, shards = attrs["experts"], attrs["expert_shards"]
    expect(isinstance(shards, int) and shards >= 1 and routed_total % shards == 0,
           f"moe: expert_shards ({shards!r}) must divide experts ({routed_total})")
    experts = routed_total // shards  # the experts this rank holds (passes/shard.py's ep)
    expect(x.dtype.is_float and len(x.shape) == 3, f"moe: x must be float [B,T,d], got {dims.format_shape(x.shape)}")
    d = x.shape[-1]
    routed = routed_total + attrs["identity_experts"]
    _check("router", router, (routed, d))
    ungated = attrs["activation"] in UNGATED
    expect((w_gate is None) == ungated, f"moe: {attrs['activation']} experts take "
                                        f"{'no w_gate' if ungated else 'a w_gate'}")
    expect(len(w_up.shape) == 3, f"moe: w_up must be [E,f,d], got {dims.format_shape(w_up.shape)}")
    f = w_up.shape[1]
    if w_gate is not None:
        _check("w_gate", w_gate, (experts, f, d))
    _check("w_up", w_up, (experts, f, d))
    _check("w_down", w_down, (experts, d, f))
    if bias is not None:
        expect(attrs["scoring"] != "sparsemixer", "moe: sparsemixer routing takes no router_bias (selection bias)")
        _check("router_bias", bias, (routed,))
    shared = (s_up, s_down) if ungated else (s_gate, s_up, s_down)
    expect(all(s is None for s in shared) or all(s is not None for s in shared),
           "moe: the shared expert's projections must be given together" + (" (no shared_gate)" if ungated else ""))
    expect(not ungated or s_gate is None, f"moe: {attrs['activation']} experts take no shared_gate")
    if s_up is not None:
        expect(len(s_up.shape) == 2, f"moe: shared_up must be [fs,d], got {dims.format_shape(s_up.shape)}")
        fs = s_up.shape[0]
        for name, value, want in (("shared_gate", s_gate, (fs, d)), ("shared_up", s_up, (fs, d)),
                                  ("shared_down", s_down, (d, fs))):
            if value is not None:
                _check(name, value, want)
    if s_expert_gate is not None:
        expect(s_up is not None, "moe: shared_expert_gate needs a shared expert")
        _check("shared_expert_gate", s_expert_gate, (1, d))
    _check_expert_biases(ops, experts, f, d, routed)
    return [TensorType(x.dtype, x.shape)]


def _moe_reference(inputs, attrs):
    """Routed gated-MLP experts (top-k of softmax or sigmoid scores, optional selection and
    logit biases, groups, renormalisation and scale, or sparsemixer's two rounds; optional
    expert biases; SwiGLU, GELU or GPT-OSS's clamped SwiGLU) plus an optional, optionally
    gated, shared expert."""
    x = inputs[0]
    operands = pad_inputs(inputs, 14)
    if attrs["expert_shards"] > 1:  # this rank's experts among zeros: its part of the sum (irc.world)
        operands = _placed(operands, attrs)
    return [moe_dense(*operands, activation=attrs["activation"], swiglu_alpha=attrs["swiglu_alpha"],
                      swiglu_limit=attrs["swiglu_limit"], weight_inputs=attrs["weight_inputs"],
                      **routing_attrs(attrs)).astype(x.dtype)]


def _placed(operands: list, attrs: dict) -> list:
    """The expert operands of rank r (experts r x n .. (r + 1) x n of ``experts``) placed among
    zero experts, which add nothing: the rank's partial sum of the routed experts."""
    from irc.ops.collective import current

    rank, _ = current()
    placed = list(operands)
    for index, name in enumerate(OPERANDS):
        if name.rstrip("?") in EXPERT_OPERANDS and placed[index] is not None:
            local = np.asarray(placed[index])
            full = np.zeros((attrs["experts"],) + local.shape[1:], local.dtype)
            full[rank * len(local):(rank + 1) * len(local)] = local
            placed[index] = full
    return placed


def _moe_active_fraction(attrs: dict, operand: str) -> float:
    """One token touches top_k of the experts' weights; everything else in full."""
    return attrs["top_k"] / attrs["experts"] if operand in EXPERT_OPERANDS else 1.0


def routing_other_flops(attrs: dict) -> int:
    """Elementwise routing work per token: ~5 per expert for scores and top-k; sparsemixer's
    two rounds (ratio, mask, softmax, the first choice masked out) ~16."""
    return (16 if attrs.get("scoring") == "sparsemixer" else 5) * attrs["experts"]


def _moe_cost(inputs, outputs, attrs):
    """2 FLOPs per weight a token uses: the router, top_k experts and the shared expert."""
    x, router, w_gate, w_up, w_down = inputs[:5]
    tokens = x.numel // x.shape[-1]
    shards = attrs.get("expert_shards", 1)  # a rank holding 1/shards of the experts runs top_k/shards of them a token
    per_expert = sum(w.numel for w in (w_gate, w_up, w_down) if w is not None) * shards // attrs["experts"]
    shared = sum(t.numel for t in inputs[6:10] if t is not None)
    flops = 2 * tokens * (router.numel + attrs["top_k"] * per_expert // shards + shared)
    hidden = attrs["top_k"] * w_up.shape[1] + (inputs[7].shape[0] if len(inputs) > 7 and inputs[7] is not None else 0)
    per_unit = 8 if attrs["activation"] == "swiglu_oai" else 4  # clamps, the +1 and the sigmoid's gain
    biases = sum(t.numel // attrs["experts"] for t in inputs[11:14] if t is not None)  # one row per chosen expert
    other = tokens * (routing_other_flops(attrs) + per_unit * hidden + attrs["top_k"] * biases)
    return Cost(flops=flops, other_flops=other, bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=outputs[0].nbytes)


register(OpDef("moe", OPERANDS,
               {"experts": REQUIRED, "top_k": REQUIRED, "scoring": "softmax", "norm_topk_prob": True,
                "routed_scale": 1.0, "n_group": None, "topk_group": None, "group_score": "max",
                "activation": "silu", "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "jitter_eps": 0.01,
                "weight_inputs": False, "identity_experts": 0, "expert_shards": 1},
               _moe_infer, _moe_reference, _moe_cost, level="model", active_fraction=_moe_active_fraction))
