"""RoPE, masks and attention in standard ops.

RoPE: cos and sin [B, T, R/2] are computed in the graph from ``position_ids`` and the
op's inverse frequencies (an initializer, from ``irc.ops.rope.rope_inv_freq``), once per
RoPE configuration and shared by every layer; at opset 23 ``RotaryEmbedding`` takes them
without ``position_ids`` (the 3-D cos/sin form), so no table bounds the context. Before
opset 23 the rotation is written out (slices, multiplies, a concat). Dynamic NTK scaling
depends on the longest position at run time and is refused. LongRoPE's two frequency sets
are both initializers and ``Where(max(position_ids) + 1 > n, long, short)`` picks one per
call (``longrope_selected``), as ``irc.ops.rope`` computes it.

Masks: a bool [B, 1, T, P+T] "query t may see key j" (causal, window and
``attention_mask``; with image ``blocks``, Gemma 3's, causal or the same image; with a
``chunk``, Llama-4's, the query's chunk counted from the row's first real token), built once per
window and shared by the layers; the query at row t
sits at key index P+t, as in ``irc.ops.attention`` (a bidirectional attention's window is
symmetric there too).

Attention: at opset 23, ``Attention`` with q_num_heads/kv_num_heads (grouped, K/V not
repeated), the bool mask, softcap and past_key/past_value; a query row that sees no key
gives zeros, as in the reference. Before opset 23 (and the ``gqa-broadcast`` pass has not
landed, so the emitter does this itself): queries reshaped to [B, K, H/K, T, D] against
keys [B, K, 1, S, D] by broadcasting MatMul, a masked Softmax, and a final Where that
zeroes rows with no visible key.

Sinks (GPT-OSS): the standard ``Attention`` (opsets 23 to 25) has no per-head sink input,
so an attention with ``sinks`` takes the grouped MatMul path at every opset: the sink
logits [H], viewed [1, K, H/K, 1, 1] and expanded to one column per query row, are
concatenated after the masked scores, the Softmax runs over S+1 columns, and the sink
column is sliced off before the weighted sum. ``com.microsoft.GroupQueryAttention`` takes
them as its ``head_sink`` input (measured equal on ORT 1.32's CPU provider); ``head_sink``
gives that input for the onnx-ort lowering.

ALiBi (BLOOM, MPT, Falcon; ``irc.ops.alibi``): the bias slope_h · (j − (P + t)) [H, T, P+T],
f32, is the slopes [H] times a key-minus-query distance built from the shapes once per
(T, P+T) (``alibi_bias``); it is added to the scaled scores on the grouped MatMul path at
every opset (the standard ``Attention`` takes one mask, and a float mask would not zero a
row that sees no key), and ``com.microsoft.GroupQueryAttention`` takes it masked as its
``attention_bias`` (``backends.onnx.ort``).
"""
from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, numpy_helper

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Param, Value
from irc.ops.rope import mrope_tables, rope_inv_freq, rope_switch

from backends.onnx.builder import ONNX_TYPES, Builder
from backends.onnx.fits import attention_operands
from backends.onnx.portable import slice_, softcap

NEG = float(np.finfo(np.float32).min)


# ---- RoPE ------------------------------------------------------------------------------

def check_scaling(op: str, scaling) -> None:
    if scaling and scaling.get("kind") == "dynamic":
        raise BackendError(f"{op}: dynamic NTK RoPE scaling depends on the longest position at run time; "
                           "the ONNX backend does not express it",
                           hint="use a static scaling (linear, yarn, llama3), longrope, or the numpy target")


def rope_tables(b: Builder, position_ids: Value, rotary: int, base: float, scaling, dtype: DType) -> tuple[str, str]:
    """cos and sin [B, T, rotary/2] for ``position_ids`` (attention factor included)."""
    check_scaling("rope", scaling)
    key = ("rope", position_ids.name, rotary, float(base), json.dumps(scaling, sort_keys=True), dtype)

    def make():
        inv_freq, factor = rope_inv_freq(rotary, base, scaling)
        hint = f"rope/{rotary}/{base:g}"
        pos = b.op("Cast", [b.value(position_ids)], f"{hint}/positions", to=TensorProto.FLOAT)
        inverse = b.const(inv_freq, np.float32, f"{hint}/inv_freq")
        switch = rope_switch(rotary, base, scaling)
        if switch is not None:
            long = longrope_selected(b, position_ids, switch[2])
            inverse = b.op("Where", [long, b.const(switch[1], np.float32, f"{hint}/long_inv_freq"), inverse],
                           f"{hint}/inv_freq_selected")
        pos = b.op("Unsqueeze", [pos, b.i64([-1])], f"{hint}/positions3")
        angles = b.op("Mul", [pos, inverse], f"{hint}/angles")
        tables = []
        for fn in ("Cos", "Sin"):
            table = b.op(fn, [angles], f"{hint}/{fn.lower()}")
            if factor != 1.0:
                factor_name = b.const(factor, np.float32, f"{hint}/factor")
                table = b.op("Mul", [table, factor_name], f"{hint}/{fn.lower()}_scaled")
            if dtype != DType.f32:
                table = b.op("Cast", [table], f"{hint}/{fn.lower()}_{dtype}", to=ONNX_TYPES[dtype])
            tables.append(table)
        return tuple(tables)

    return b.cached(key, make)


def mrope_tables_onnx(b: Builder, position_ids: Value, rotary: int, base: float, mrope: dict,
                      dtype: DType) -> tuple[str, str]:
    """cos and sin [B, T, rotary/2] for multi-axis ``position_ids`` [A, B, T]: the angles are
    sum_a position[a] · M[a], M[a, j] = inv_freq_j where pair j reads axis a, else 0 (exact:
    the other axes add zeros)."""
    key = ("mrope", position_ids.name, rotary, float(base), json.dumps(mrope, sort_keys=True), dtype)

    def make():
        axis, inv_freq = mrope_tables(rotary, base, mrope)
        count = len(mrope["sections"])
        table = np.where(np.arange(count)[:, None] == axis[None, :], inv_freq[None, :], 0).astype(np.float32)
        hint = f"mrope/{rotary}/{base:g}/{mrope['layout']}"
        pos = b.op("Cast", [b.value(position_ids)], f"{hint}/positions", to=TensorProto.FLOAT)
        pos = b.op("Unsqueeze", [pos, b.i64([-1])], f"{hint}/positions4")
        spread = b.op("Mul", [pos, b.const(table.reshape(count, 1, 1, -1), np.float32, f"{hint}/axis_freq")],
                      f"{hint}/axis_angles")
        angles = b.op("ReduceSum", [spread, b.i64([0])], f"{hint}/angles", keepdims=0)
        tables = []
        for fn in ("Cos", "Sin"):
            t = b.op(fn, [angles], f"{hint}/{fn.lower()}")
            if dtype != DType.f32:
                t = b.op("Cast", [t], f"{hint}/{fn.lower()}_{dtype}", to=ONNX_TYPES[dtype])
            tables.append(t)
        return tuple(tables)

    return b.cached(key, make)


def longrope_selected(b: Builder, position_ids: Value, original: int) -> str:
    """A bool scalar: max(position_ids) + 1 > ``original`` (LongRoPE's long set applies)."""
    def make():
        longest = b.op("ReduceMax", [b.value(position_ids)], "rope/longest_position", keepdims=0)
        last_short = b.const(original - 1, position_ids.dtype.numpy, f"rope/original_max_{original}")
        return b.op("Greater", [longest, last_short], f"rope/long_{original}")

    return b.cached(("longrope-selected", position_ids.name, original), make)


def rotate(b: Builder, x: str, shape: tuple, cos: str, sin: str, convention: str, rotary: int, out: str) -> str:
    """RoPE written out on x of ``shape`` [..., D] with cos/sin broadcastable to [..., R/2]."""
    head_dim, half = shape[-1], rotary // 2
    part = x if rotary == head_dim else slice_(b, x, 0, rotary, -1, b.fresh(f"{out}/rotary"))
    if convention == "half":
        x1 = slice_(b, part, 0, half, -1, b.fresh(f"{out}/x1"))
        x2 = slice_(b, part, half, rotary, -1, b.fresh(f"{out}/x2"))
    else:
        pairs = b.op("Reshape", [part, b.shape(shape[:-1] + (half, 2))], f"{out}/pairs", allowzero=1)
        x1 = slice_(b, pairs, 0, 1, -1, b.fresh(f"{out}/x1"))
        x2 = slice_(b, pairs, 1, 2, -1, b.fresh(f"{out}/x2"))
        cos = b.op("Unsqueeze", [cos, b.i64([-1])], f"{out}/cos")
        sin = b.op("Unsqueeze", [sin, b.i64([-1])], f"{out}/sin")
    real = b.op("Sub", [b.op("Mul", [x1, cos], f"{out}/x1cos"), b.op("Mul", [x2, sin], f"{out}/x2sin")], f"{out}/real")
    imag = b.op("Add", [b.op("Mul", [x2, cos], f"{out}/x2cos"), b.op("Mul", [x1, sin], f"{out}/x1sin")], f"{out}/imag")
    full = rotary == head_dim
    target = out if full else b.fresh(f"{out}/rotated")
    if convention == "half":
        b.node("Concat", [real, imag], [target], axis=-1)
    else:
        pairs = b.op("Concat", [real, imag], f"{out}/rotated_pairs", axis=-1)
        b.node("Reshape", [pairs, b.shape(shape[:-1] + (rotary,))], [target], allowzero=1)
    if full:
        return out
    rest = slice_(b, x, rotary, head_dim, -1, b.fresh(f"{out}/pass"))
    return b.node("Concat", [target, rest], [out], axis=-1)[0]


def lower_rope(b: Builder, node: Node, outs: list[str]) -> None:
    x, position_ids = node.inputs
    a = node.attrs
    head_dim = a["head_dim"]
    rotary = head_dim if a["rotary_dim"] is None else a["rotary_dim"]
    cos, sin = (mrope_tables_onnx(b, position_ids, rotary, a["base"], a["mrope"], x.dtype) if a.get("mrope")
                else rope_tables(b, position_ids, rotary, a["base"], a["scaling"], x.dtype))
    heads = x.shape[-1] // head_dim
    if b.opset >= 23:
        b.node("RotaryEmbedding", [b.value(x), cos, sin], outs, interleaved=int(a["convention"] == "interleaved"),
               num_heads=heads, rotary_embedding_dim=rotary if rotary != head_dim else None)
        return
    batch, seq = x.shape[:2]
    shape4 = (batch, seq, heads, head_dim)
    x4 = b.op("Reshape", [b.value(x), b.shape(shape4)], f"{outs[0]}/heads", allowzero=1)
    cos4 = b.cached(("unsqueeze", cos, 2), lambda: b.op("Unsqueeze", [cos, b.i64([2])], f"{cos}/heads"))
    sin4 = b.cached(("unsqueeze", sin, 2), lambda: b.op("Unsqueeze", [sin, b.i64([2])], f"{sin}/heads"))
    rotated = rotate(b, x4, shape4, cos4, sin4, a["convention"], rotary, b.fresh(f"{outs[0]}/rotated"))
    b.node("Reshape", [rotated, b.shape(x.shape)], outs, allowzero=1)


def rotate_heads(b: Builder, x4: str, shape4: tuple, cos: str, sin: str, convention: str, out: str) -> str:
    """RoPE on [B, N, T, R] (all of the last axis rotates) with cos/sin [B, T, R/2]."""
    if b.opset >= 23:
        return b.node("RotaryEmbedding", [x4, cos, sin], [out], interleaved=int(convention == "interleaved"))[0]
    cos4 = b.cached(("unsqueeze", cos, 1), lambda: b.op("Unsqueeze", [cos, b.i64([1])], f"{cos}/bhtr"))
    sin4 = b.cached(("unsqueeze", sin, 1), lambda: b.op("Unsqueeze", [sin, b.i64([1])], f"{sin}/bhtr"))
    return rotate(b, x4, shape4, cos4, sin4, convention, shape4[-1], out)


# ---- masks -----------------------------------------------------------------------------

def visibility(b: Builder, mask, seq, total, causal: bool, window, blocks=None, chunk=None) -> str:
    """Bool [B or 1, 1, T, P+T]: may query t see key j; "" when every key is visible."""
    if not causal and window is None and mask is None and blocks is None:
        return ""
    key = ("visible", None if mask is None else mask.name, dims.canonical(seq), dims.canonical(total), causal, window,
           None if blocks is None else blocks.name, chunk)
    return b.cached(key, lambda: _make_visibility(b, mask, seq, total, causal, window, blocks, chunk))


def _same_chunk(b: Builder, mask, seq, total, chunk: int) -> str:
    """Bool: key j in query t's chunk, ⌊(j − pad)/C⌋ = ⌊(P + t − pad)/C⌋ with pad each row's
    leading zeros of attention_mask ([B, 1, T, P+T]; [T, P+T] without a mask)."""
    keys = b.cached(("keys", total), lambda: b.op("Range", [b.i64(0), b.scalar(total), b.i64(1)], "mask/keys"))
    queries = b.cached(("queries", seq, total), lambda: _queries(b, seq, total))
    if mask is not None:
        counted = b.op("CumSum", [b.op("Cast", [b.value(mask)], "mask/chunks/real", to=TensorProto.INT64),
                                  b.i64(1)], "mask/chunks/seen")
        leading = b.op("Cast", [b.op("Equal", [counted, b.i64(0)], "mask/chunks/leading")], "mask/chunks/leading64",
                       to=TensorProto.INT64)
        pad = b.op("ReduceSum", [leading, b.i64([1])], "mask/chunks/pad", keepdims=1)
        pad = b.op("Unsqueeze", [pad, b.i64([1, 2])], "mask/chunks/pad4")  # [B, 1, 1, 1]
        keys, queries = (b.op("Sub", [x, pad], f"mask/chunks/{role}_from_start")
                         for x, role in ((keys, "keys"), (queries, "queries")))
    size = b.i64(chunk)
    return b.op("Equal", [b.op("Div", [keys, size], f"mask/chunk{chunk}/key_chunk"),
                          b.op("Div", [queries, size], f"mask/chunk{chunk}/query_chunk")], f"mask/chunk{chunk}/same")


def _block_ids(b: Builder, blocks: Value, seq, total) -> tuple[str, str]:
    """(queries [B, 1, T, 1], keys [B, 1, 1, P+T]) block ids; the past's keys are -1."""
    def make():
        ids = b.value(blocks)
        past = b.op("Sub", [b.dim(total), b.dim(seq)], "mask/blocks/past")
        none = b.op("ConstantOfShape", [b.op("Concat", [b.dim(blocks.shape[0]), past], "mask/blocks/past_shape",
                                              axis=0)],
                    "mask/blocks/past_ids", value=numpy_helper.from_array(np.array([-1], np.int64)))
        keys = b.op("Unsqueeze", [b.op("Concat", [none, ids], "mask/blocks/keys", axis=1), b.i64([1, 2])],
                    "mask/blocks/keys4")
        return b.op("Unsqueeze", [ids, b.i64([1, 3])], "mask/blocks/queries4"), keys

    return b.cached(("block-ids", blocks.name), make)


def _same_block(b: Builder, blocks: Value, seq, total) -> str:
    """Bool [B, 1, T, P+T]: query t and key j are tokens of one image (blocks equal, >= 0;
    the past's keys, numbered -1, never)."""
    queries, keys = _block_ids(b, blocks, seq, total)
    image = b.op("GreaterOrEqual", [queries, b.i64(0)], "mask/blocks/image_query")
    return b.op("And", [b.op("Equal", [queries, keys], "mask/blocks/equal"), image], "mask/blocks/same")


def _own_block(b: Builder, blocks: Value, seq, total) -> str:
    """Bool [B, 1, T, P+T]: key j is in query t's block (block-diagonal attention)."""
    queries, keys = _block_ids(b, blocks, seq, total)
    return b.op("Equal", [queries, keys], "mask/blocks/own")


def _make_visibility(b: Builder, mask, seq, total, causal: bool, window, blocks=None, chunk=None) -> str:
    hint = "mask" + ("" if window is None else f"/window{window}") + ("" if causal else "/bidirectional") + (
        "" if blocks is None else "/blocks") + ("" if chunk is None else f"/chunk{chunk}")
    visible = None
    if causal or window is not None:
        keys = b.cached(("keys", total), lambda: b.op("Range", [b.i64(0), b.scalar(total), b.i64(1)], "mask/keys"))
        queries = b.cached(("queries", seq, total), lambda: _queries(b, seq, total))
        if causal:
            visible = b.op("LessOrEqual", [keys, queries], f"{hint}/causal")
            if blocks is not None:  # or one image's tokens, both ways
                same = b.cached(("same-block", blocks.name), lambda: _same_block(b, blocks, seq, total))
                visible = b.op("Or", [visible, same], f"{hint}/causal_or_image")
        if window is not None:
            start = b.op("Sub", [queries, b.i64(window)], f"{hint}/window_start")
            inside = b.op("Greater", [keys, start], f"{hint}/window")
            if not causal:  # bidirectional: the window is symmetric, |j - (P+t)| < W
                end = b.op("Add", [queries, b.i64(window)], f"{hint}/window_end")
                inside = b.op("And", [inside, b.op("Less", [keys, end], f"{hint}/window_ahead")],
                              f"{hint}/window_both")
            visible = inside if visible is None else b.op("And", [visible, inside], f"{hint}/causal_window")
    if chunk is not None:  # a causal attention's (the op checks): [B, 1, T, P+T] with a mask
        visible = b.op("And", [visible, _same_chunk(b, mask, seq, total, chunk)], f"{hint}/in_chunk")
    if blocks is not None and not causal:  # bidirectional: only the query's own block
        same = b.cached(("own-block", blocks.name), lambda: _own_block(b, blocks, seq, total))
        visible = same if visible is None else b.op("And", [b.op("Unsqueeze", [visible, b.i64([0, 1])],
                                                                  f"{hint}/window4"), same], f"{hint}/window_block")
    if mask is None:
        return visible if blocks is not None else b.op("Unsqueeze", [visible, b.i64([0, 1])], f"{hint}/visible")
    keep = b.cached(("keep", mask.name), lambda: _keep(b, mask))
    if visible is None:  # padding alone (bidirectional): one row per query, as Attention's mask must have
        return b.op("Expand", [keep, b.shape((1, 1, seq, 1))], f"{hint}/visible")
    return b.op("And", [visible, keep], f"{hint}/visible")


def _queries(b: Builder, seq, total) -> str:
    """[T, 1]: the key index of each query row, P + t."""
    first = b.op("Sub", [b.scalar(total), b.scalar(seq)], "mask/past")
    rows = b.op("Range", [first, b.scalar(total), b.i64(1)], "mask/query_positions")
    return b.op("Unsqueeze", [rows, b.i64([1])], "mask/queries")


def _keep(b: Builder, mask: Value) -> str:
    """[B, 1, 1, P+T] bool from attention_mask (nonzero: a real token)."""
    keep = b.value(mask)
    if mask.dtype != DType.bool:
        keep = b.op("Cast", [keep], "mask/keep", to=TensorProto.BOOL)
    return b.op("Unsqueeze", [keep, b.i64([1, 2])], "mask/keep4")


# ---- attention -------------------------------------------------------------------------

def heads_first(b: Builder, x: str, batch, seq, heads: int, width: int, out: str) -> str:
    """[B, T, N*W] -> [B, N, T, W]."""
    split = b.op("Reshape", [x, b.shape((batch, seq, heads, width))], f"{out}/split", allowzero=1)
    return b.node("Transpose", [split], [out], perm=[0, 2, 1, 3])[0]


def merge_heads(b: Builder, x4: str, batch, seq, heads: int, width: int, out: str) -> str:
    """[B, N, T, W] -> [B, T, N*W]."""
    moved = b.op("Transpose", [x4], f"{out}/tokens_first", perm=[0, 2, 1, 3])
    return b.node("Reshape", [moved, b.shape((batch, seq, heads * width))], [out], allowzero=1)[0]


def grouped_attention(b: Builder, q4: str, key4: str, value4: str, visible: str, *, batch, seq, heads: int,
                      kv_heads: int, head_dim: int, v_head_dim: int, scale: float, cap, out: str,
                      sinks: str = "", bias: str = "") -> str:
    """Softmax(q k^T * scale) v for q [B, H, T, D] over key/value [B, K, S, D]: query head h
    reads kv head h // (H/K) through a [B, K, H/K, T, D] view; masked rows give zeros;
    ``sinks`` (an f32 [H] name, or "") join each head's softmax denominator; ``bias`` (an
    f32 [H, T, S] name, ALiBi's, or "") is added to the scaled scores."""
    group = heads // kv_heads
    q5 = b.op("Reshape", [q4, b.shape((batch, kv_heads, group, seq, head_dim))], f"{out}/q_groups", allowzero=1)
    keys_t = b.op("Transpose", [key4], f"{out}/keys_t", perm=[0, 1, 3, 2])
    keys5 = b.op("Unsqueeze", [keys_t, b.i64([2])], f"{out}/keys5")
    scores = b.op("MatMul", [q5, keys5], f"{out}/qk")
    scores = b.op("Mul", [scores, b.const(scale, np.float32, f"{out}/scale")], f"{out}/scores")
    if cap is not None:
        scores = softcap(b, scores, cap, DType.f32, b.fresh(f"{out}/softcapped"))
    if bias:
        grouped = b.op("Concat", [b.i64([kv_heads, group]), b.op("Shape", [bias], f"{out}/bias_shape", start=1)],
                       f"{out}/bias_groups", axis=0)
        scores = b.op("Add", [scores, b.op("Reshape", [bias, grouped], f"{out}/bias4")], f"{out}/biased")
    visible5 = ""
    if visible:
        visible5 = b.cached(("unsqueeze", visible, 1), lambda: b.op("Unsqueeze", [visible, b.i64([1])],
                                                                     f"{visible}/groups"))
        scores = b.op("Where", [visible5, scores, b.const(NEG, np.float32, "mask/neg")], f"{out}/masked")
    if sinks:
        probs = _softmax_with_sinks(b, scores, sinks, (batch, kv_heads, group, seq), out)
    else:
        probs = b.op("Softmax", [scores], f"{out}/probs_all" if visible else f"{out}/probs", axis=-1)
    if visible:
        probs = b.op("Where", [visible5, probs, b.const(0.0, np.float32, "zero")], f"{out}/probs")
    values5 = b.op("Unsqueeze", [value4, b.i64([2])], f"{out}/values5")
    out5 = b.op("MatMul", [probs, values5], f"{out}/weighted")
    return b.node("Reshape", [out5, b.shape((batch, heads, seq, v_head_dim))], [out], allowzero=1)[0]


def _softmax_with_sinks(b: Builder, scores: str, sinks: str, lead: tuple, out: str) -> str:
    """Softmax of scores [B, K, G, T, S] with one more column per row holding the head's
    sink logit; the sink's own weight is sliced off, so each row sums to less than one."""
    batch, kv_heads, group, seq = lead
    sink5 = b.op("Reshape", [sinks, b.i64([1, kv_heads, group, 1, 1])], f"{out}/sinks5")
    column = b.op("Expand", [sink5, b.shape((batch, kv_heads, group, seq, 1))], f"{out}/sink_column")
    combined = b.op("Concat", [scores, column], f"{out}/scores_and_sink", axis=-1)
    probs = b.op("Softmax", [combined], f"{out}/probs_and_sink", axis=-1)
    total = b.op("Shape", [scores], f"{out}/scores_shape", start=-1)
    return b.op("Slice", [probs, b.i64([0]), total, b.i64([-1])], f"{out}/probs_all")


def head_sink(b: Builder, node: Node) -> str:
    """An attention node's ``sinks`` in its query's float type, for GroupQueryAttention's
    ``head_sink`` input (input 11); "" when it has none."""
    sinks, dtype = attention_operands(node)["sinks"], node.inputs[0].dtype
    if sinks is None:
        return ""
    if isinstance(sinks, Param):
        return b.weight(sinks, dtype=dtype)
    name = b.value(sinks)
    return name if sinks.dtype == dtype else b.op("Cast", [name], f"{name}/{dtype}", to=ONNX_TYPES[dtype])


def attend_heads(b: Builder, q4: str, k4: str, v4: str, past: tuple, presents: list, visible: str, *, batch, seq,
                 heads: int, kv_heads: int, head_dim: int, v_head_dim: int, scale: float, cap, out: str,
                 sinks: str = "", bias: str = "") -> str:
    """Attention on head-major [B, N, T, W] operands with an optional past; writes the
    present caches to ``presents`` (names) when ``past`` is given; ``sinks`` (f32 [H], or
    "") and an ALiBi ``bias`` (f32 [H, T, S], or "") take the grouped MatMul path at every
    opset. Returns [B, H, T, Dv]."""
    if b.opset >= 23 and not sinks and not bias:
        b.node("Attention", [q4, k4, v4, visible, *past], [out, *presents], scale=float(scale),
               softcap=None if cap is None else float(cap), is_causal=0)
        return out
    key4, value4 = k4, v4
    if past:
        key4 = b.node("Concat", [past[0], k4], [presents[0]], axis=2)[0]
        value4 = b.node("Concat", [past[1], v4], [presents[1]], axis=2)[0]
    return grouped_attention(b, q4, key4, value4, visible, batch=batch, seq=seq, heads=heads, kv_heads=kv_heads,
                             head_dim=head_dim, v_head_dim=v_head_dim, scale=scale, cap=cap, out=out, sinks=sinks,
                             bias=bias)


def alibi_bias(b: Builder, slopes, heads: int, seq, total) -> str:
    """ALiBi's f32 [H, T, S]: slopes [H] times the distance j − (P + t), built once per
    slopes operand and (T, S); "" without slopes."""
    if slopes is None:
        return ""

    def make():
        name = b.weight(slopes, dtype=DType.f32) if isinstance(slopes, Param) else b.value(slopes)
        if not isinstance(slopes, Param) and slopes.dtype != DType.f32:
            name = b.op("Cast", [name], f"{name}/f32", to=TensorProto.FLOAT)
        column = b.op("Reshape", [name, b.i64([heads, 1, 1])], f"{name}/heads")
        keys = b.op("Range", [b.i64(0), b.scalar(total), b.i64(1)], "alibi/keys")
        distance = b.op("Cast", [b.op("Sub", [keys, _queries(b, seq, total)], "alibi/distance64")],
                        "alibi/distance", to=TensorProto.FLOAT)
        return b.op("Mul", [column, distance], f"{name}/bias")

    return b.cached(("alibi", slopes.name, dims.canonical(seq), dims.canonical(total)), make)


def lower_attention(b: Builder, node: Node, outs: list[str]) -> None:
    o = attention_operands(node)
    a = node.attrs
    visible = visibility(b, o["mask"], o["seq"], o["total"], a["causal"], a["window"], o["blocks"], a.get("chunk"))
    past = () if o["past_key"] is None else (b.value(o["past_key"]), b.value(o["past_value"]))
    q, k, v = (b.value(o[name]) for name in ("q", "k", "v"))
    sinks = _sinks_f32(b, o["sinks"])
    bias = alibi_bias(b, o["alibi"], o["heads"], o["seq"], o["total"])
    if b.opset >= 23 and not sinks and not bias:
        if o["v"].producer is not None and o["v"].producer.op == "reshape":
            # ORT 1.2x infers Attention's output width wrongly when V's shape is unknown (a
            # Reshape to run-time dims): a Reshape to [0, 0, K·Dv] states it
            v = b.op("Reshape", [v, b.i64([0, 0, o["kv_heads"] * o["v_head_dim"]])], f"{outs[0]}/v_width")
        b.node("Attention", [q, k, v, visible, *past], outs, q_num_heads=o["heads"], kv_num_heads=o["kv_heads"],
               scale=float(o["scale"]), softcap=None if a["softcap"] is None else float(a["softcap"]), is_causal=0)
        return
    shape = dict(batch=o["batch"], seq=o["seq"])
    q4 = heads_first(b, q, heads=o["heads"], width=o["head_dim"], out=b.fresh(f"{outs[0]}/q"), **shape)
    k4 = heads_first(b, k, heads=o["kv_heads"], width=o["head_dim"], out=b.fresh(f"{outs[0]}/k"), **shape)
    v4 = heads_first(b, v, heads=o["kv_heads"], width=o["v_head_dim"], out=b.fresh(f"{outs[0]}/v"), **shape)
    out4 = attend_heads(b, q4, k4, v4, past, outs[1:], visible, heads=o["heads"], kv_heads=o["kv_heads"],
                        head_dim=o["head_dim"], v_head_dim=o["v_head_dim"], scale=o["scale"], cap=a["softcap"],
                        out=b.fresh(f"{outs[0]}/heads"), sinks=sinks, bias=bias, **shape)
    merge_heads(b, out4, heads=o["heads"], width=o["v_head_dim"], out=outs[0], **shape)


def _sinks_f32(b: Builder, sinks) -> str:
    """The sinks operand as an f32 name ("" when absent): the grouped path computes in f32."""
    if sinks is None:
        return ""
    if isinstance(sinks, Param):
        return b.weight(sinks, dtype=DType.f32)
    name = b.value(sinks)
    return name if sinks.dtype == DType.f32 else b.op("Cast", [name], f"{name}/f32", to=TensorProto.FLOAT)
