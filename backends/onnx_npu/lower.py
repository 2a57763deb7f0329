"""The onnx-npu op table: static-shape lowerings over the ONNX backend's pieces.

Every dim is a number: an ``NpuBuilder`` evaluates irc's symbols (B = 1, T = the graph's
tokens per call, P = the fixed cache length N) where the ONNX backend would read them from
input shapes, so no ``Shape``, ``Range`` or dynamic ``Reshape`` reaches the NPU compiler.
The ops that differ from the portable flavour:

- ``embedding``: ``Gather`` with int32 ids (the HTP computes indices in 32 bits; the QNN
  provider also accepts int64 inputs and narrows them itself, but int32 keeps the contract
  what the device sees);
- ``rope``: cos/sin [1, T, R/2] gathered by int32 ``position_ids`` from tables [N, R/2]
  computed here (``irc.ops.rope``, attention factor included) and stored once beside the
  weights, then the rotation written out (slices, multiplies, a concat). LongRoPE: tables
  [2N, R/2], the short set's rows then the long set's, gathered by an int32 ``rope_rows``
  input [1, T] the host fills (positions, plus N once the sequence it runs is longer than
  n). The host decides because it knows the whole length: a chunked prefill's chunk sees
  only its own positions, but transformers rotates every token of a prompt longer than n
  with the long set; ``sinusoidal_positions`` (XGLM) gathers rows of a [N, d] table the same way;
- ``attention``: the new keys and values [1, K, T, D] are graph outputs (``present.*``) for
  the host to place; they are concatenated after the fixed cache [1, K, N, D] and the
  queries attend over N + T keys with an additive mask input [1, 1, T, N + T] (one per
  sliding window), grouped heads as 4-D matmuls over [1, K, G*T, D] queries: every tensor
  is rank 4 or less; GPT-OSS's sinks are one more score column per query row, a constant
  [1, K, G*T, 1] computed from ``attn.sinks`` [H] when the weights are written, concatenated
  before the Softmax and sliced off after it (static shapes; the sink is a plain logit
  beside fp16 scores, so fp16 stays safe as the mask's -10000 does); ALiBi's slopes times key
  minus query position, the slots' positions 0..N-1 and the new keys' ``position_ids``, one
  [1, K, G*T, N + T] bias added before the mask (``alibi_scores``);
- ``linear``: ``MatMul`` against the transposed weight; a weight also read another way (a
  tied embedding) is read once, by ``Gemm(transB=1)`` over static 2-D reshapes.

What the HTP compiler accepts was found by compiling (``backends.onnx_npu.qnn``): the
table holds only ops whose ONNX form compiled with every node on the HTP for soc_model 60
and 69. An op outside it is refused with the pass that would lower it (``NEEDS``); recurrent
layers are lowered in ``backends.onnx_npu.recurrent`` (a per-head decay: chunk form) and
``backends.onnx_npu.recurrent_steps`` (Mamba-1's selective scan, Kimi's per-channel decay, RWKV-4
and the RG-LRU: the call's tokens unrolled); a recurrent op without a lowering is refused by
``check_lowerable``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Param
from irc.ops.registry import get_op, pad_inputs
from irc.ops.rope import mrope_angles, rope_cos_sin, rope_inv_freq, rope_switch

from backends.onnx import activations, portable
from backends.onnx.attention import attention_operands, check_scaling, heads_first, merge_heads, rotate
from backends.onnx.builder import ONNX_TYPES, Builder, transposed
from backends.onnx.moe import lower_moe

MASK_VALUE = -10000.0   # the additive mask's "hidden": exp underflows to 0 in f16 and f32
OPSET = 21


@dataclass
class NpuBuilder(Builder):
    """A Builder whose dims are numbers: ``bindings`` gives every symbol's value."""

    bindings: dict = field(default_factory=dict)
    masks: dict = field(default_factory=dict)       # (window, chunk) (None: none) -> mask input name
    rope_rows: dict = field(default_factory=dict)   # LongRoPE's n -> the rows input name
    positions: str = ""                              # position_ids claimed for a graph without one (ALiBi)
    quant: Any = None                                # a qdq.QuantPlan for w8a16 / w4a16

    def size(self, d) -> int:
        return dims.evaluate(dims.canonical(d), self.bindings)

    def dim(self, d) -> str:
        return self.i64([self.size(d)])

    def scalar(self, d) -> str:
        return self.i64(self.size(d))

    def shape(self, shape) -> str:
        return self.i64([self.size(d) for d in shape])

    def mask(self, window, chunk=None) -> str:
        """The additive mask input for layers of this sliding window and chunk (None: none)."""
        if (window, chunk) not in self.masks:
            name = "attention_bias" + ("" if window is None else f".window{window}") + (
                "" if chunk is None else f".chunk{chunk}")
            self.masks[window, chunk] = self.claim(name)
        return self.masks[window, chunk]

    def position_ids(self) -> str:
        """The int32 [1, T] ``position_ids`` input: the graph's, or one claimed here (an ALiBi
        decoder reads no positions, but its bias needs the new keys')."""
        value = next((v for v in self.graph.inputs if v.name == "position_ids"), None)
        if value is not None:
            return self.value(value)
        if not self.positions:
            self.positions = self.claim("position_ids")
        return self.positions

    def rows(self, original: int) -> str:
        """The host-filled table-rows input of a LongRoPE with pretraining length ``original``."""
        if original not in self.rope_rows:
            if self.rope_rows:
                raise BackendError("onnx-npu takes one LongRoPE length per model; this graph has "
                                   f"{next(iter(self.rope_rows))} and {original}")
            self.rope_rows[original] = self.claim("rope_rows")
        return self.rope_rows[original]


def lower_embedding(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    ids, table = node.inputs
    rows = b.value(table) if table.dtype.is_float else b.weight(table, dtype=DType.f32)
    scale = node.attrs["scale"]
    gathered = b.node("Gather", [rows, b.value(ids)], [outs[0] if scale is None else b.fresh(f"{outs[0]}/rows")],
                      axis=0)[0]
    if scale is not None:
        b.node("Mul", [gathered, b.const(scale, node.outputs[0].dtype.numpy, f"{outs[0]}/scale")], outs)


def rope_table(rotary: int, base: float, scaling_items: tuple, positions: int, which: int, dtype_name: str,
               stacked: bool = False):
    """cos (which 0) or sin (1) [positions, rotary/2] in ``dtype_name`` (``stacked``, for a
    LongRoPE: the short set's rows, then the long set's)."""
    scaling = dict(scaling_items) if scaling_items else None
    inv_freq, factor = rope_inv_freq(rotary, base, scaling)
    sets = list(rope_switch(rotary, base, scaling)[:2]) if stacked else [inv_freq]
    tables = [rope_cos_sin(np.arange(positions)[None, :], freqs, factor)[which][0] for freqs in sets]
    return np.concatenate(tables).astype(DType.parse(dtype_name).numpy)


def gathered_rope(b: NpuBuilder, position_ids, rotary: int, base: float, scaling, dtype: DType) -> tuple[str, str]:
    """cos and sin [1, T, R/2] gathered from tables of ``context`` rows (LongRoPE: 2 x
    ``context`` rows, gathered by ``rope_rows``)."""
    check_scaling("rope", scaling)
    items = tuple(sorted((scaling or {}).items()))
    key = ("npu-rope", rotary, float(base), repr(items), dtype)
    switch = rope_switch(rotary, base, scaling)
    if switch is not None and b.context <= switch[2]:
        switch = None  # every position the cache holds is below n: the long set never applies

    def make():
        names = []
        rows = b.value(position_ids) if switch is None else b.rows(switch[2])
        count = b.context * (1 if switch is None else 2)
        for which, role in enumerate(("cos", "sin")):
            load = functools.partial(rope_table, rotary, float(base), items, b.context, which, dtype.name,
                                     switch is not None)
            table = b.derived(f"rope/{rotary}/{base:g}/{role}", dtype, (count, rotary // 2), (), load)
            names.append(b.op("Gather", [table, rows], f"rope/{rotary}/{base:g}/{role}_rows", axis=0))
        return tuple(names)

    return b.cached(key, make)


def sinusoidal_table(dim: int, offset: int, padding_idx, positions: int, frequencies: str = "fairseq") -> np.ndarray:
    """The sinusoidal rows of positions 0..positions-1 (``irc.ops.positions``), f32 [positions, dim]."""
    from irc.ops.positions import sinusoidal_rows

    return sinusoidal_rows(np.arange(positions) + offset, dim, padding_idx, frequencies)


def lower_sinusoidal(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """XGLM's positions: rows of a table of ``context`` positions computed when the weights are
    written, gathered by the int32 ``position_ids`` (as RoPE's cos/sin are; no Sin or Cos)."""
    a = node.attrs
    load = functools.partial(sinusoidal_table, a["dim"], a["offset"], a["padding_idx"], b.context, a["frequencies"])
    table = b.derived(f"sinusoidal/{a['dim']}/{a['offset']}/{a['padding_idx']}/{a['frequencies']}", DType.f32,
                      (b.context, a["dim"]), (), load)
    b.node("Gather", [table, b.value(node.inputs[0])], outs, axis=0)


def lower_rope(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    x, position_ids = node.inputs
    a = node.attrs
    head_dim = a["head_dim"]
    rotary = head_dim if a["rotary_dim"] is None else a["rotary_dim"]
    if a.get("mrope"):  # a tower's 2-D positions, fixed with its image (the pipeline's fix-image-grid)
        cos, sin = fixed_mrope(b, position_ids, rotary, a["base"], a["mrope"], x.dtype, _where(node))
    else:
        cos, sin = gathered_rope(b, position_ids, rotary, a["base"], a["scaling"], x.dtype)
    tokens = b.size(x.shape[1])
    shape4 = (1, tokens, x.shape[-1] // head_dim, head_dim)
    x4 = b.op("Reshape", [b.value(x), b.shape(shape4)], f"{outs[0]}/heads")
    cos4 = b.cached(("unsqueeze", cos), lambda: b.op("Unsqueeze", [cos, b.i64([2])], f"{cos}/heads"))
    sin4 = b.cached(("unsqueeze", sin), lambda: b.op("Unsqueeze", [sin, b.i64([2])], f"{sin}/heads"))
    rotated = rotate(b, x4, shape4, cos4, sin4, a["convention"], rotary, b.fresh(f"{outs[0]}/rotated"))
    b.node("Reshape", [rotated, b.shape((1, tokens, x.shape[-1]))], outs)


def mrope_table(rotary: int, base: float, sections: tuple, layout: str, which: int, dtype_name: str, positions):
    """cos (which 0) or sin (1) [1, T, rotary/2] of fixed multi-axis positions [A, 1, T]."""
    angles = mrope_angles(positions, rotary, base, {"sections": list(sections), "layout": layout})
    return (np.cos(angles) if which == 0 else np.sin(angles)).astype(DType.parse(dtype_name).numpy)


def fixed_mrope(b: NpuBuilder, positions, rotary: int, base: float, mrope: dict, dtype: DType,
                where: str) -> tuple[str, str]:
    """cos and sin [1, T, R/2] of multi-axis positions known at compile time (a param)."""
    fixed = compile_time(positions)
    if fixed is None:
        raise BackendError("onnx-npu reads multi-axis RoPE positions fixed at compile time (an image tower at its "
                           "reference image: fix-image-grid); these are computed at run time (mrope)", location=where,
                           hint="compile it with --target onnx or onnx-ort")
    names = []
    for which, role in enumerate(("cos", "sin")):
        load = functools.partial(mrope_table, rotary, float(base), tuple(mrope["sections"]), mrope["layout"], which,
                                 dtype.name)
        names.append(b.derived(f"{positions.name}/{rotary}/{base:g}/{role}", dtype,
                               (1, positions.shape[-1], rotary // 2), (positions,), load) if fixed is positions
                     else b.const(load(fixed), dtype.numpy, f"{positions.name}/{role}"))
    return names[0], names[1]


def compile_time(value):
    """``value`` itself when it is a param, the array of a ``constant`` node's result, or None
    (a value computed at run time)."""
    if isinstance(value, Param):
        return value
    if value.producer is not None and value.producer.op == "constant":
        return np.asarray(value.producer.attrs["value"])
    return None


def block_mask(group: int, dtype_name: str, blocks) -> np.ndarray:
    """[1, 1, G*T, T]: 0 where query t and key j share a block, the dtype's lowest value elsewhere
    (row g*T + t is query t's, for each of a kv head's G query heads)."""
    ids = np.asarray(blocks).reshape(-1)
    dtype = DType.parse(dtype_name).numpy
    mask = np.where(ids[:, None] == ids[None, :], 0, np.finfo(dtype).min).astype(dtype)
    return np.tile(mask, (group, 1))[None, None]


def grouped_mask(b: NpuBuilder, window, group: int, tokens: int, chunk=None) -> str:
    """The additive mask [1, 1, G*T, N+T]: row g*T + t is the mask of query t."""
    mask = b.mask(window, chunk)
    if group == 1:
        return mask
    return b.cached(("mask-groups", window, chunk, group), lambda: b.op("Tile", [mask, b.i64([1, 1, group, 1])],
                                                                        f"{mask}/groups{group}"))


def lower_attention(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    o = attention_operands(node)
    a = node.attrs
    bidirectional = o["past_key"] is None and not a["causal"] and o["mask"] is None and a["window"] is None
    if o["blocks"] is not None and not (bidirectional and compile_time(o["blocks"]) is not None):
        raise BackendError("onnx-npu attention has no mask for image tokens that see each other (Gemma 3's image "
                           "blocks) or for blocks computed at run time", location=_where(node),
                           hint="compile the VLM with --target onnx or onnx-ort")
    if bidirectional and o["alibi"] is None:
        return lower_bidirectional(b, o, a["softcap"], outs)
    if o["past_key"] is None or not a["causal"]:
        raise BackendError("onnx-npu attention needs a causal attention with a KV cache (the decoder form) or "
                           "one that sees every token with no mask and no cache (an image encoder's)",
                           location=_where(node), hint="compile a decoder spec (its attention reads "
                                                       "past_key_values.*) or an image encoder")
    tokens, heads, kv_heads = b.size(o["seq"]), o["heads"], o["kv_heads"]
    group, width, v_width = heads // kv_heads, o["head_dim"], o["v_head_dim"]
    shape = dict(batch=1, seq=tokens)
    name = outs[0]
    q4 = heads_first(b, b.value(o["q"]), heads=heads, width=width, out=b.fresh(f"{name}/q"), **shape)
    k4 = heads_first(b, b.value(o["k"]), heads=kv_heads, width=width, out=outs[1], **shape)
    v4 = heads_first(b, b.value(o["v"]), heads=kv_heads, width=v_width, out=outs[2], **shape)
    keys = b.op("Concat", [b.value(o["past_key"]), k4], f"{name}/keys", axis=2)
    values = b.op("Concat", [b.value(o["past_value"]), v4], f"{name}/values", axis=2)
    sinks = "" if o["sinks"] is None else sink_column(b, o["sinks"], kv_heads, group, tokens, o["q"].dtype)
    bias = "" if o["alibi"] is None else alibi_scores(b, o["alibi"], kv_heads, group, tokens, o["q"].dtype,
                                                       _where(node))
    attended = attend(b, q4, keys, values, grouped_mask(b, a["window"], group, tokens, a.get("chunk")),
                      kv_heads=kv_heads,
                      group=group, tokens=tokens, width=width, v_width=v_width, scale=o["scale"], cap=a["softcap"],
                      dtype=o["q"].dtype, out=b.fresh(f"{name}/heads"), sinks=sinks, bias=bias)
    merge_heads(b, attended, heads=heads, width=v_width, out=name, **shape)


def lower_bidirectional(b: NpuBuilder, o: dict, cap, outs: list[str]) -> None:
    """An image encoder's attention: every query sees every one of the T tokens, no cache, no
    mask (a ViT's); the same grouped 4-D matmuls as the decoder form, without the Add."""
    tokens, heads, kv_heads = b.size(o["seq"]), o["heads"], o["kv_heads"]
    width, v_width, name = o["head_dim"], o["v_head_dim"], outs[0]
    shape = dict(batch=1, seq=tokens)
    q4, k4, v4 = (heads_first(b, b.value(o[role]), heads=count, width=w, out=b.fresh(f"{name}/{role}"), **shape)
                  for role, count, w in (("q", heads, width), ("k", kv_heads, width), ("v", kv_heads, v_width)))
    sinks = "" if o["sinks"] is None else sink_column(b, o["sinks"], kv_heads, heads // kv_heads, tokens,
                                                      o["q"].dtype)
    mask = ""
    if o["blocks"] is not None:  # block-diagonal over the fixed image's frames or windows
        group, dtype, fixed = heads // kv_heads, o["q"].dtype, compile_time(o["blocks"])
        load = functools.partial(block_mask, group, dtype.name)
        mask = (b.derived(f"{o['blocks'].name}/mask{group}", dtype, (1, 1, group * tokens, tokens), (fixed,), load)
                if isinstance(fixed, Param) else b.const(load(fixed), dtype.numpy, f"{o['blocks'].name}/mask"))
    attended = attend(b, q4, k4, v4, mask, kv_heads=kv_heads, group=heads // kv_heads, tokens=tokens, width=width,
                      v_width=v_width, scale=o["scale"], cap=cap, dtype=o["q"].dtype, out=b.fresh(f"{name}/heads"),
                      sinks=sinks)
    merge_heads(b, attended, heads=heads, width=v_width, out=name, **shape)


def sink_rows(kv_heads: int, group: int, tokens: int, dtype_name: str, sinks) -> np.ndarray:
    """[1, K, G*T, 1]: row g*T + t of kv head k holds the sink of query head k*G + g."""
    column = np.repeat(np.asarray(sinks, np.float32).reshape(kv_heads, group), tokens, axis=1)
    return column.reshape(1, kv_heads, group * tokens, 1).astype(DType.parse(dtype_name).numpy)


def sink_column(b: NpuBuilder, sinks, kv_heads: int, group: int, tokens: int, dtype: DType) -> str:
    """The sink logits as one constant score column per grouped query row, in ``dtype``."""
    if not isinstance(sinks, Param):
        raise BackendError(f"onnx-npu takes attention sinks as a weight param, not the computed value %{sinks.name}",
                           hint="compile with the sinks as the checkpoint's attn.sinks")
    load = functools.partial(sink_rows, kv_heads, group, tokens, dtype.name)
    return b.derived(f"{sinks.name}/rows{group}x{tokens}", dtype, (1, kv_heads, group * tokens, 1), (sinks,), load)


def alibi_scores(b: NpuBuilder, slopes, kv_heads: int, group: int, tokens: int, dtype: DType, where: str) -> str:
    """ALiBi's bias [1, K, G*T, N+T] in ``dtype``: row g*T + t of kv head k is query head
    k*G + g's slope times (key position − position_ids[t]), the cache slot j holding position
    j (the host's layout) and new key t position_ids[t]; made once per slopes operand."""
    fixed = compile_time(slopes)
    if fixed is None:
        raise BackendError("onnx-npu takes ALiBi slopes known when compiling (a constant or a weight), not a value "
                           "computed at run time", location=where)
    context = b.context

    def make():
        load = functools.partial(sink_rows, kv_heads, group, tokens, DType.f32.name)
        name = f"{slopes.name}/alibi{group}x{tokens}"
        column = (b.derived(name, DType.f32, (1, kv_heads, group * tokens, 1), (fixed,), load)
                  if isinstance(fixed, Param) else b.const(load(fixed), np.float32, name))
        queries = b.cached("alibi-queries", lambda: b.op("Cast", [b.position_ids()], "alibi/queries",
                                                         to=TensorProto.FLOAT))
        keys = b.op("Concat", [b.const(np.arange(context, dtype=np.float32)[None], np.float32, "alibi/slots"),
                               queries], "alibi/keys", axis=1)
        distance = b.op("Sub", [b.op("Reshape", [keys, b.i64([1, 1, 1, context + tokens])], "alibi/keys4"),
                                b.op("Reshape", [queries, b.i64([1, 1, tokens, 1])], "alibi/queries4")],
                        "alibi/distance")
        if group > 1:
            distance = b.op("Tile", [distance, b.i64([1, 1, group, 1])], f"alibi/distance{group}")
        bias = b.op("Mul", [column, distance], f"{name}/bias")
        return bias if dtype == DType.f32 else b.op("Cast", [bias], f"{bias}/{dtype}", to=ONNX_TYPES[dtype])

    return b.cached(("alibi", slopes.name, group), make)


def attend(b: NpuBuilder, q4: str, keys: str, values: str, mask: str, *, kv_heads: int, group: int, tokens: int,
           width: int, v_width: int, scale: float, cap, dtype: DType, out: str, sinks: str = "",
           bias: str = "") -> str:
    """softmax(q k^T * scale + mask) v for q [1, H, T, D] over keys/values [1, K, S, D]:
    the G query heads of a kv head are one [G*T, D] block; ``mask`` "" is no mask (every
    key visible); ``sinks`` (a [1, K, G*T, 1] column, or "") join each row's softmax and take
    no weight; ``bias`` (ALiBi's [1, K, G*T, S], or "") is added before the mask. Returns
    [1, H, T, Dv]."""
    q_groups = b.op("Reshape", [q4, b.i64([1, kv_heads, group * tokens, width])], f"{out}/q_groups")
    keys_t = b.op("Transpose", [keys], f"{out}/keys_t", perm=[0, 1, 3, 2])
    scores = b.op("MatMul", [q_groups, keys_t], f"{out}/qk")
    scores = b.op("Mul", [scores, b.const(scale, dtype.numpy, f"{out}/scale")], f"{out}/scores")
    if cap is not None:
        scores = portable.softcap(b, scores, cap, dtype, b.fresh(f"{out}/softcapped"))
    if bias:
        scores = b.op("Add", [scores, bias], f"{out}/biased")
    masked = b.op("Add", [scores, mask], f"{out}/masked") if mask else scores
    if sinks:
        with_sink = b.op("Concat", [masked, sinks], f"{out}/masked_and_sink", axis=-1)
        probs_all = b.op("Softmax", [with_sink], f"{out}/probs_and_sink", axis=-1)
        probs = b.op("Slice", [probs_all, b.i64([0]), b.i64([-1]), b.i64([-1])], f"{out}/probs")
    else:
        probs = b.op("Softmax", [masked], f"{out}/probs", axis=-1)
    weighted = b.op("MatMul", [probs, values], f"{out}/weighted")
    return b.node("Reshape", [weighted, b.i64([1, kv_heads * group, tokens, v_width])], [out])[0]


def lower_linear(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    x, weight, bias = pad_inputs(node.inputs, 3)
    if not isinstance(weight, Param):
        raise BackendError("onnx-npu takes linear layers over float weight params",
                           hint="quantize with --precision w8a16/w4a16, not the quantize pass")
    product = outs[0] if bias is None else b.fresh(f"{outs[0]}/matmul")
    if b.quant is not None and b.quant.covers(x, node.outputs[0]):
        from backends.onnx_npu.qdq import quantized_linear

        quantized_linear(b, b.quant, x, weight, node.outputs[0], product)
    elif b.cached(("matrix-only", weight.name), lambda: portable.only_matrix_uses(weight)):
        matrix = b.derived(f"{weight.name}.T", weight.dtype, tuple(reversed(weight.shape)), (weight,), transposed,
                           "columns")
        b.node("MatMul", [b.value(x), b.converted(matrix, weight.dtype, x.dtype)], [product])
    else:  # also read as rows (a tied embedding): one copy, Gemm(transB) over static 2-D reshapes
        lead = [b.size(d) for d in x.shape[:-1]]
        rows = b.op("Reshape", [b.value(x), b.i64([int(np.prod(lead)), weight.shape[1]])], f"{outs[0]}/rows")
        flat = b.op("Gemm", [rows, b.weight(weight, dtype=x.dtype)], f"{outs[0]}/gemm", transB=1)
        b.node("Reshape", [flat, b.i64(lead + [weight.shape[0]])], [product])
    if bias is not None:
        b.node("Add", [product, b.weight(bias, dtype=x.dtype)], outs)


def lower_cast(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """A cast to the type a value already has is an Identity the compiler drops."""
    (x,) = node.inputs
    target = DType.parse(node.attrs["to"])
    if target == x.dtype:
        b.node("Identity", [b.value(x)], outs)
    else:
        b.node("Cast", [b.value(x)], outs, to=ONNX_TYPES[target])


# What the HTP compiler accepted (module docstring; ``log``: Ling's safe KDA gate, compiled for soc
# 60 and 69 in tests/backends/test_onnx_npu_qnn.py); ``backends.onnx_npu.emit.TABLE`` adds
# MoE (the ONNX backend's dense form, TopK routing included, compiles) and MLA; an op
# outside the table is refused with the pass named in NEEDS.
ACCEPTED = ("add", "sub", "mul", "div", "exp", "tanh", "sqrt", "sigmoid", "neg", "rsqrt", "silu", "gelu",
            "constant", "reduce_mean", "reduce_sum", "reduce_max", "softmax", "matmul", "reshape", "transpose",
            "slice", "concat", "gather", "expand", "maximum", "less_equal", "log")


def lower_constant(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """An integer constant in int32, the type of every integer value here (``to_onnx_type``:
    Gemma-3n's per-layer id arithmetic meets the int32 ``input_ids``)."""
    dtype = DType.parse(node.attrs["dtype"])
    value = np.asarray(node.attrs["value"], dtype=np.int32 if dtype in (DType.i64, DType.i32) else dtype.numpy)
    b.node("Identity", [b.const(value, value.dtype, f"{outs[0]}/value")], outs)


LOWERINGS = {**{op: portable.LOWERINGS[op] for op in ACCEPTED}, "slice": portable.lower_plain_slice,
             "cast": lower_cast, "embedding": lower_embedding,
             **activations.LOWERINGS,  # softplus, xielu (irc.ops.activations): standard ops, static
             "rope": lower_rope, "sinusoidal_positions": lower_sinusoidal, "attention": lower_attention,
             "linear": lower_linear, "moe": lower_moe,
             "constant": lower_constant}
NEEDS = {
    "rms_norm": "lower-norms", "layer_norm": "lower-norms", "swiglu": "lower-mlp", "geglu": "lower-mlp",
    "gelu_mlp": "lower-mlp", "softcap": "lower-softcap", "patch_embed": "lower-patch-embed",
    **{op: f"a static-cache lowering of {op} (not written yet); compile without mla-absorb: un-absorbed "
           "mla_attention has one" for op in ("mla_absorbed_attention", "mla_latent_attention")},
    "dequant_linear": "none yet: quantize with --precision w8a16/w4a16 (QDQ), not the quantize pass",
    "dequantize": "none yet: quantize with --precision w8a16/w4a16 (QDQ), not the quantize pass",
}


def refuse(node: Node, table) -> BackendError:
    need = NEEDS.get(node.op, "a pass that lowers it to " + ", ".join(sorted(table)))
    return BackendError(f"op {node.op!r} has no NPU lowering for target onnx-npu", location=_where(node),
                        hint=f"needed: {need}")


def recurrent(op: str) -> bool:
    """An op that carries a state from step to step (a ``past_state`` operand: the
    state-space ops of ``irc.ops.ssm``, the gated delta rule)."""
    return any(spec.strip("*?") == "past_state" for spec in get_op(op).operands)


def check_lowerable(graph, table) -> None:
    """Raise for the first node outside ``table``; a recurrent one (an op with a past state)
    is named as such, with the targets that carry it."""
    for node in graph.nodes:
        if node.op in table:
            continue
        if recurrent(node.op):
            raise BackendError(f"op {node.op!r} is a recurrent layer that onnx-npu has no lowering for (it lowers "
                               "the state-space ops, the delta rule, RWKV-4, the RG-LRU and the mLSTM)",
                               location=_where(node),
                               hint="compile this model with --target onnx or --target onnx-ort, which carry "
                                    "each layer's state as past_key_values.{i}.* -> present.{i}.*")
        raise refuse(node, table)


def _where(node: Node) -> str:
    return f"node %{node.name}" + (f", from {node.origin}" if node.origin else "")


def to_onnx_type(dtype: DType) -> int:
    return TensorProto.INT32 if dtype in (DType.i64, DType.i32) else ONNX_TYPES[dtype]
