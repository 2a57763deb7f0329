"""``gqa-broadcast``: grouped-query attention as primitives, K/V broadcast over query groups."""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc.dtypes import DType
from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass

F32 = DType.f32
# a hidden score before the softmax: exp(MASKED - peak) is exactly 0 in float32
MASKED = float(np.finfo(np.float32).min)


def lower_attention(e: Emitter, node: Node):
    """Grouped attention's primitives; None for MHA (kv_heads == heads), which is left alone;
    a note for attention with sinks (GPT-OSS), image blocks, ALiBi slopes or chunks (Llama-4),
    which the ONNX emitter lowers itself."""
    if node.attrs["kv_heads"] >= node.attrs["heads"]:
        return None
    if len(node.inputs) > 6 and node.inputs[6] is not None:
        return "attention sinks: left to the emitter (backends.onnx.attention lowers them)"
    if len(node.inputs) > 7 and node.inputs[7] is not None:
        return "image blocks: left to the emitter (backends.onnx.attention lowers them)"
    if len(node.inputs) > 8 and node.inputs[8] is not None:
        return "ALiBi slopes: left to the emitter (backends.onnx.attention lowers them)"
    if node.attrs.get("chunk") is not None:
        return "chunked attention: left to the emitter (backends.onnx.attention lowers it)"
    return GroupedAttention(e, bool(e.options["materialize"])).outputs()


@register_pass
class GqaBroadcast(LoweringPass):
    """Lower grouped ``attention`` (kv_heads < heads) to matmuls with K/V broadcast over query groups.

    For backends without grouped attention; MQA (kv_heads 1) included. Default form:
    queries become [B, K, G, T, D] (G = heads / kv_heads query heads per KV head) and
    keys/values [B, K, 1, S, D] (S = P + T), so ``matmul``'s broadcasting lets each KV head
    serve its group and no repeated K/V is ever materialised. With ``materialize=true`` K/V
    are repeated explicitly (``expand`` + ``reshape`` to [B, H, S, D], query head h reading
    KV head h // G) for targets that want MHA-shaped tensors.

    The op's full semantics are kept: present = concat(past, new) along S (the outputs keep
    their names ``present.{i}.key/value``), scores times ``scale`` (head_dim ** -0.5 by
    default), Gemma-2 ``softcap``, and visibility built from positions: query row t sits at
    cache index P + t (``range_like`` over T plus ``dim_size`` of the past), key j is
    visible iff j <= P + t (causal), j > P + t - window (and j < P + t + window without
    causal: a bidirectional window is symmetric), and attention_mask[b, j] != 0.
    Hidden scores become float32's lowest value, so the softmax gives them exactly 0; with
    an attention_mask a query row may see no key at all (left padding), and such rows are
    zeroed after the softmax, as the op's reference does. MHA (kv_heads == heads) is left
    alone. Guarantees: the reference result up to float32 rounding; outputs keep their names.
    """

    name = "gqa-broadcast"
    options = {"materialize": False}
    lowerings = {"attention": lower_attention}


class GroupedAttention:
    """The primitives of one attention node, emitted through ``e`` (named ``<output>.<role>``)."""

    def __init__(self, e: Emitter, materialize: bool):
        self.e, self.node, self.materialize = e, e.node, materialize
        a = self.node.attrs
        self.heads, self.kv_heads, self.head_dim = a["heads"], a["kv_heads"], a["head_dim"]
        self.v_head_dim = a["v_head_dim"] or a["head_dim"]
        self.group = self.heads // self.kv_heads
        self.batch, self.seq = self.node.inputs[0].shape[:2]

    def outputs(self) -> list[Value]:
        e = self.e
        q, k, v, mask, past_key, past_value = list(e.operands.values())[:6]
        query = self.queries(e.cast(q, F32, "q_f32"))
        key = self.split(e.cast(k, F32, "k_f32"), self.kv_heads, self.head_dim, "key")
        value = self.split(e.cast(v, F32, "v_f32"), self.kv_heads, self.v_head_dim, "value")
        presents = []
        if past_key is not None:
            key = e("concat", [e.cast(past_key, F32, "past_key_f32"), key], "present_key", {"axis": 2})
            value = e("concat", [e.cast(past_value, F32, "past_value_f32"), value], "present_value", {"axis": 2})
            presents = [e.cast(key, past_key.dtype, "present_key_cast"),
                        e.cast(value, past_value.dtype, "present_value_cast")]
        scores = self.scores(query, key)
        weights = self.softmax(scores, q, key, mask, past_key)
        out = self.weighted_sum(weights, value)
        return [e.cast(out, e.out.dtype, "cast")] + presents

    # ---- layouts -------------------------------------------------------------------------
    def split(self, x: Value, heads: int, width: int, role: str) -> Value:
        """[B, T, N*D] -> [B, N, T, D]."""
        split = self.e("reshape", [x], f"{role}_heads", {"shape": [self.batch, self.seq, heads, width]})
        layout = "BHTD" if heads == self.heads else "BKTD"
        return self.e("transpose", [split], f"{role}_{layout}", {"perm": [0, 2, 1, 3]})

    def queries(self, q: Value) -> Value:
        """[B, T, H*D] -> [B, K, G, T, D] (grouped), or [B, H, T, D] (materialised)."""
        if self.materialize:
            return self.split(q, self.heads, self.head_dim, "query")
        shape = [self.batch, self.seq, self.kv_heads, self.group, self.head_dim]
        split = self.e("reshape", [q], "query_heads", {"shape": shape})
        return self.e("transpose", [split], "query_BKGTD", {"perm": [0, 2, 3, 1, 4]})

    def per_group(self, x: Value, role: str) -> Value:
        """K/V [B, K, S, D] as [B, K, 1, S, D] (grouped), or repeated to [B, H, S, D]."""
        b, kv, s, d = x.shape
        single = self.e("reshape", [x], f"{role}_BK1SD", {"shape": [b, kv, 1, s, d]})
        if not self.materialize:
            return single
        repeated = self.e("expand", [single], f"{role}_BKGSD", {"shape": [b, kv, self.group, s, d]})
        return self.e("reshape", [repeated], f"{role}_BHSD", {"shape": [b, self.heads, s, d]})

    # ---- the math ------------------------------------------------------------------------
    def scores(self, query: Value, key: Value) -> Value:
        """Scaled (and soft-capped) q . k: [B, K, G, T, S], or [B, H, T, S] materialised."""
        if self.materialize:
            key_t = self.e("transpose", [self.per_group(key, "key")], "key_BHDS", {"perm": [0, 1, 3, 2]})
        else:
            key_t = self.e("transpose", [self.per_group(key, "key")], "key_BK1DS", {"perm": [0, 1, 2, 4, 3]})
        scores = self.e("matmul", [query, key_t], "scores")
        attrs = self.node.attrs
        scale = self.head_dim ** -0.5 if attrs["scale"] is None else attrs["scale"]
        scores = self.e("mul", [scores, self.e.constant(float(scale), F32, "scale")], "scores_scaled")
        if attrs["softcap"] is not None:
            scores = self.e("softcap", [scores], "scores_capped", {"cap": float(attrs["softcap"])})
        return scores

    def softmax(self, scores: Value, q: Value, key: Value, mask, past_key) -> Value:
        visible = self.visible(q, key, mask, past_key, scores.rank)
        if visible is None:
            return self.e("softmax", [scores], "weights", {"axis": -1})
        hidden = self.e.constant(MASKED, F32, "hidden")
        masked = self.e("where", [visible, scores, hidden], "scores_masked")
        weights = self.e("softmax", [masked], "weights", {"axis": -1})
        if mask is None:  # every row sees at least its own key: nothing to zero
            return weights
        zero = self.e.constant(0.0, F32, "zero")
        return self.e("where", [visible, weights, zero], "weights_visible")

    def visible(self, q: Value, key: Value, mask, past_key, rank: int):
        """Bool [T, S] (causal, window) and [B, 1.., S] (padding) combined, or None."""
        attrs, i64 = self.node.attrs, DType.i64
        visible = None
        if attrs["causal"] or attrs["window"] is not None:
            query_index = self.e("range_like", [q], "query_index", {"axis": 1})
            if past_key is not None:
                past = self.e("dim_size", [past_key], "past_length", {"axis": 2})
                query_index = self.e("add", [query_index, past], "query_position")
            query_index = self.e("reshape", [query_index], "query_position_T1", {"shape": [self.seq, 1]})
            key_index = self.e("range_like", [key], "key_position", {"axis": 2})
            if attrs["causal"]:
                visible = self.e("less_equal", [key_index, query_index], "causal")
            if attrs["window"] is not None:
                window = self.e.constant(int(attrs["window"]), i64, "window")
                oldest = self.e("sub", [query_index, window], "window_start")
                inside = self.e("less", [oldest, key_index], "in_window")
                if not attrs["causal"]:  # bidirectional: the window is symmetric, |j - (P + t)| < window
                    newest = self.e("add", [query_index, window], "window_end")
                    ahead = self.e("less", [key_index, newest], "in_window_ahead")
                    inside = self.e("logical_and", [inside, ahead], "in_window_both")
                visible = inside if visible is None else self.e("logical_and", [visible, inside], "causal_window")
        if mask is not None:
            real = self.e("cast", [mask], "key_is_real", {"to": "bool"})
            shape = [self.batch] + [1] * (rank - 2) + [mask.shape[1]]
            real = self.e("reshape", [real], "key_is_real_B1S", {"shape": shape})
            visible = real if visible is None else self.e("logical_and", [visible, real], "visible")
        return visible

    def weighted_sum(self, weights: Value, value: Value) -> Value:
        """weights @ V, back to [B, T, H*Dv]."""
        out = self.e("matmul", [weights, self.per_group(value, "value")], "context")
        if self.materialize:  # [B, H, T, Dv]
            out = self.e("transpose", [out], "context_BTHD", {"perm": [0, 2, 1, 3]})
        else:  # [B, K, G, T, Dv]
            out = self.e("transpose", [out], "context_BTKGD", {"perm": [0, 3, 1, 2, 4]})
        return self.e("reshape", [out], "merged", {"shape": [self.batch, self.seq, self.heads * self.v_head_dim]})
