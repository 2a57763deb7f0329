"""What an NPU plan covers: the matmul-like work of every node, at one phase's sizes.

``extract(graph, bindings)`` walks the graph and returns one ``Work`` per GEMM or
attention core, named ``<node>`` for a single-GEMM node (``layers.0.q``) and
``<node>:<role>`` inside model-level ops (``layers.0.mlp_out:gate_up``):

- ``linear`` (bias as a fused row operand), ``matmul`` (batch dims as instances, B
  stored [K,N]);
- ``patch_embed`` (a ViT's patch projection): the GEMM [B·patches, C·p·p] x [C·p·p, d], the
  weight [d, C, p, p] read as [N, K], the bias a row operand; A is counted as the patches'
  rows (an im2col'd image: each patch row C·p·p contiguous), as ``lower-patch-embed`` writes it;
- ``swiglu``/``geglu``: ``gate_up``, one GEMM over both weights whose epilogue writes
  act(gate) * up, then ``down``; ``gelu_mlp``: ``up`` (bias and GELU fused) and ``down``;
- ``attention``: one flash-style core per KV head, its query heads grouped as rows
  (M = heads/kv_heads * T) over S = P + T keys (P capped by a sliding window as
  ``irc.analysis`` does); causal or not (an image encoder's), every block of the M x S
  square is planned and counted (a causal core does not skip its masked blocks); the k/v
  projections write the new rows straight into the cache;
  with sinks (GPT-OSS) the group's heads/kv_heads sink logits join its softmax (H floats per
  layer, ``AttentionShape.sinks``; the executor starts each row's online softmax from them);
  with ALiBi (BLOOM, MPT) the group's slopes, read the same way (``AttentionShape.alibi``),
  bias each score by slope times key minus query index, computed on chip;
- ``mla_attention``: ``q_a``/``q_b`` (or ``wq``), ``kv_a``, ``kv_b``, the per-head core
  (Dk = nope + rope, Dv = v) and ``wo``; ``mla_absorbed_attention``: ``q_a``,
  ``q_b_absorbed`` (or ``wq_absorbed``), ``kv_a``, one core of H*T rows over the latent
  cache (Dk = d_c + rope, Dv = d_c) and ``wo_absorbed``; ``mla_latent_attention``: ``q_a``,
  ``q_b`` (or ``wq``), ``kv_a``, ``w_uk`` (H small GEMMs [T, nope] x [nope, d_c], one per head),
  the same core, ``w_uv`` (H small GEMMs [T, d_c] x [d_c, v]) and ``wo``;
- ``ssd``, ``gated_delta_rule``, ``causal_conv1d``: one scan per sequence over head (or
  channel) tiles and token chunks, the state resident (``passes.npu_tile.recurrent``,
  ``irc.npu.scan``);
- ``moe``: ``router``, ``shared.gate_up``/``shared.down`` and the routed experts (GPT-OSS:
  the router's logit bias and each expert's down bias as row operands, the gate and up
  biases as ``bias`` rows before the GLU, the clamped GLU's alpha and limit in its step).
  Routed rows are the *expected* load under balanced routing: the T*top_k token slots spread over
  min(E, T*top_k) experts as evenly as possible (so for decode, top_k experts of one row
  each; for a 512-token prefill over DeepSeek-V2's 160 experts, 32 experts of 20 rows and
  128 of 19). Real routing is uneven; the worst case for one expert is T rows, which
  costs the same weight traffic per active expert but more activation traffic.

Elementwise consumers are fused into the producing GEMM's epilogue as
``irc.rewrite.epilogue.epilogue_chain`` decides (the matcher the Triton planner calls too):
single-use, not a graph output, shape-preserving elementwise ops, a binary op's other
operand being a residual of the output's shape (read tile by tile) or a row vector of N (a
bias). The Triton matmul epilogue reads row vectors only (its residual add runs in the
row kernel of the norm after it): the targets differ in that argument alone. A decomposed
GLU (``mul(silu(linear), linear)``) is planned as two GEMMs, the gate's epilogue reading
the up projection as a tile (Triton runs it as one dual GEMM). ``rope`` is not fused: it
pairs columns D/2 apart, so a tile would have to hold whole heads. The non-GEMM steps
inside model-level ops (the norms and RoPE inside MLA, the router's softmax and top-k, the
MoE combine) are not planned and not counted.
"""
from __future__ import annotations

import math
from typing import Optional

from irc import dims
from irc.analysis import layer_of
from irc.errors import BackendError
from irc.graph import Graph, Node, Param, Value
from irc.ops import get_op
from irc.ops.registry import pad_inputs
from irc.npu.cost import AttentionShape, GemmShape
from irc.rewrite.epilogue import epilogue_chain
from passes.npu_tile import recurrent
from passes.npu_tile.work import Work

# what a tile loop's epilogue reads besides the accumulator: residual tiles and row vectors
EPILOGUE_OPERANDS = ("tile", "vector")
GATHERS = ("embedding", "gather")


def extract(graph: Graph, bindings: dict) -> tuple[list[Work], set]:
    """The planned work at ``bindings`` (B, T, P), and the names of the nodes it covers
    (planned or fused)."""
    works: list[Work] = []
    covered: set = set()
    for node in graph.nodes:
        if node.name in covered:
            continue
        rule = RULES.get(node.op)
        if rule is None:
            continue  # unplanned (unplanned_bytes counts it)
        try:
            found = rule(graph, node, _Sizes(bindings))
        except KeyError as err:
            raise BackendError(f"cannot size {node.op} at {bindings}: {err}", location=f"node %{node.name}") from None
        layer = _layer(node)
        for work in found:
            work.layer = layer
            covered.update(work.fused)
        covered.add(node.name)
        works.extend(found)
    return works, covered


class _Sizes:
    def __init__(self, bindings: dict):
        self.bindings = bindings

    def shape(self, value: Value) -> tuple:
        return dims.evaluate_shape(value.shape, self.bindings)

    def rows(self, value: Value) -> int:
        return math.prod(self.shape(value)[:-1])


def _layer(node: Node) -> Optional[int]:
    found = layer_of(node.name)
    if found is None:
        found = next((layer_of(v.name) for v in node.inputs if isinstance(v, Param) and layer_of(v.name) is not None),
                     None)
    return found


# ---- fusion ------------------------------------------------------------------------------

def fuse_epilogue(graph: Graph, value: Value) -> tuple[list, list, int, int]:
    """``value``'s epilogue chain (``irc.rewrite.epilogue``, residual tiles and row vectors
    as operands) as plan steps: (steps, fused node names, tile operands, row operands)."""
    steps, names, tiles, rows = [], [], 0, 0
    for found in epilogue_chain(graph, value, EPILOGUE_OPERANDS):
        node = found.node
        if found.operand is None:
            step = {"op": node.op, **{k: node.attrs[k] for k in ("approximate", "cap") if k in node.attrs}}
        else:
            step = {"op": node.op, "operand": "tile" if found.operand == "tile" else "row", "swap": found.swap}
            tiles += found.operand == "tile"
            rows += found.operand == "vector"
        steps.append({**step, "node": node.name})
        names.append(node.name)
    return steps, names, tiles, rows


def _gemm(graph, node, role, M, K, N, *, weights=1, layout="nk", steps=(), rows=0, fuse=None, count=1,
          suffix=True) -> Work:
    """A GEMM work item; ``fuse``: the value whose elementwise consumers join the epilogue."""
    steps, names, tile_ops = list(steps), [], 0
    if fuse is not None:
        more, names, tile_ops, more_rows = fuse_epilogue(graph, fuse)
        steps += more
        rows += more_rows
    shape = GemmShape(M, K, N, weights, layout, tile_ops, rows)
    return Work(f"{node.name}:{role}" if suffix else node.name, node.name, node.op, role, shape, count,
                fused=names, epilogue=steps)


# ---- rules: node -> work -----------------------------------------------------------------

def _linear(graph, node, sizes):
    x, weight, bias = pad_inputs(node.inputs, 3)
    N, K = weight.shape
    steps = [{"op": "add", "operand": "row", "swap": False, "node": node.name}] if bias is not None else []
    return [_gemm(graph, node, "linear", sizes.rows(x), K, N, steps=steps, rows=int(bias is not None),
                  fuse=node.outputs[0], suffix=False)]


def _patch_embed(graph, node, sizes):
    _, weight, bias = pad_inputs(node.inputs, 3)
    N, K = weight.shape[0], math.prod(weight.shape[1:])
    steps = [{"op": "add", "operand": "row", "swap": False, "node": node.name}] if bias is not None else []
    return [_gemm(graph, node, "patch_embed", sizes.rows(node.outputs[0]), K, N, steps=steps,
                  rows=int(bias is not None), fuse=node.outputs[0], suffix=False)]


def _matmul(graph, node, sizes):
    a, b = node.inputs
    out = sizes.shape(node.outputs[0])
    return [_gemm(graph, node, "matmul", out[-2], sizes.shape(a)[-1], out[-1], layout="kn",
                  fuse=node.outputs[0], count=math.prod(out[:-2]), suffix=False)]


def _gated_mlp(graph, node, sizes):
    x, gate, up, down = node.inputs
    f, d = gate.shape
    activation = "silu" if node.op == "swiglu" else ("gelu_tanh" if node.attrs["approximate"] == "tanh" else "gelu")
    M = sizes.rows(x)
    return [_gemm(graph, node, "gate_up", M, d, f, weights=2, steps=[{"op": "glu", "activation": activation}]),
            _gemm(graph, node, "down", M, f, d, fuse=node.outputs[0])]


def _gelu_mlp(graph, node, sizes):
    x, up, down, b_up, b_down = pad_inputs(node.inputs, 5)
    f, d = up.shape
    M = sizes.rows(x)
    bias = {"op": "add", "operand": "row", "swap": False}
    up_steps = ([bias] if b_up is not None else []) + [{"op": "gelu", "approximate": node.attrs["approximate"]}]
    return [_gemm(graph, node, "up", M, d, f, steps=up_steps, rows=int(b_up is not None)),
            _gemm(graph, node, "down", M, f, d, steps=[bias] if b_down is not None else [],
                  rows=int(b_down is not None), fuse=node.outputs[0])]


def _keys(node, sizes, tokens) -> tuple[int, int]:
    """(visible past, keys) at these sizes: P capped by a sliding window as irc.analysis does,
    or by a chunk (Llama-4's: a query sees at most C keys, those of its chunk)."""
    past = sizes.bindings.get("P", 0) if len(node.inputs) > 4 and node.inputs[4] is not None else 0
    for span in (node.attrs.get("window"), node.attrs.get("chunk")):
        if span is not None:
            past = max(0, min(past, span - tokens))
    return past, past + tokens


def _core(node, sizes, role, batch, tokens, group, count, key_dim, value_dim, scale, sinks=False,
          alibi=False) -> Work:
    past, keys = _keys(node, sizes, tokens)
    shape = AttentionShape(group * tokens, keys, key_dim, value_dim, group if sinks else 0, group if alibi else 0)
    return Work(f"{node.name}:{role}", node.name, node.op, role, shape, batch * count,
                attention={"group": group, "tokens": tokens, "past": past,
                           "causal": bool(node.attrs.get("causal", True)), "scale": scale,
                           "softcap": node.attrs.get("softcap"), "window": node.attrs.get("window"),
                           **({"chunk": node.attrs["chunk"]} if node.attrs.get("chunk") else {})})


def _attention(graph, node, sizes):
    a = node.attrs
    batch, tokens = sizes.shape(node.inputs[0])[:2]
    v_dim = a["v_head_dim"] or a["head_dim"]
    scale = a["scale"] if a["scale"] is not None else a["head_dim"] ** -0.5
    sinks = len(node.inputs) > 6 and node.inputs[6] is not None
    alibi = len(node.inputs) > 8 and node.inputs[8] is not None
    return [_core(node, sizes, "attention", batch, tokens, a["heads"] // a["kv_heads"], a["kv_heads"], a["head_dim"],
                  v_dim, scale, sinks, alibi)]


def _mla(graph, node, sizes):
    from irc.ops.attention import mla_softmax_scale

    a = node.attrs
    absorbed = node.op != "mla_attention"
    folded = node.op == "mla_absorbed_attention"
    named = dict(zip(get_op(node.op).operand_names(len(node.inputs)), node.inputs))
    wq, wo = named.get("wq", named.get("wq_absorbed")), named.get("wo", named.get("wo_absorbed"))
    batch, tokens, d = sizes.shape(named["x"])
    M, H = batch * tokens, a["heads"]
    rank, rope, nope, v = a["kv_lora_rank"], a["qk_rope_head_dim"], a["qk_nope_head_dim"], a["v_head_dim"]
    q_width = H * ((rank if folded else nope) + rope)
    q_suffix = "_absorbed" if folded else ""
    if wq is not None:
        works = [_gemm(graph, node, "wq" + q_suffix, M, d, q_width)]
    else:
        q_rank = a["q_lora_rank"]
        works = [_gemm(graph, node, "q_a", M, d, q_rank), _gemm(graph, node, "q_b" + q_suffix, M, q_rank,
                                                                        q_width)]
    works.append(_gemm(graph, node, "kv_a", M, d, rank + rope))
    scale = mla_softmax_scale(nope, rope, a["rope"], a["scale"])
    if absorbed:
        if not folded:  # per head: q_nope [M, nope] x W^UK_h [nope, d_c], stored [K, N]
            works.append(_gemm(graph, node, "w_uk", M, nope, rank, layout="kn", count=H))
        works.append(_core(node, sizes, "attention", batch, tokens, H, 1, rank + rope, rank, scale))
        if not folded:  # per head: o_h [M, d_c] x W^UV_h^T, W^UV_h stored [v, d_c] = [N, K]
            works.append(_gemm(graph, node, "w_uv", M, rank, v, count=H))
    else:
        works.append(_gemm(graph, node, "kv_b", M, rank, H * (nope + v)))
        works.append(_core(node, sizes, "attention", batch, tokens, 1, H, nope + rope, v, scale))
    works.append(_gemm(graph, node, "wo" + q_suffix, M, wo.shape[1], wo.shape[0], fuse=node.outputs[0]))
    return works


def _moe(graph, node, sizes):
    x, router, w_gate, w_up = node.inputs[:4]
    shared = node.inputs[7] if len(node.inputs) > 7 else None  # shared_up (an ungated expert has no gate)
    logit_bias, b_gate, b_up, b_down = pad_inputs(node.inputs, 14)[10:14]
    a = node.attrs
    M = sizes.rows(x)
    experts, f, d = w_up.shape
    gated = 1 + (w_gate is not None)  # weights of the first GEMM: gate | up, or up alone (relu2)
    glu = [{"op": "glu", "activation": a["activation"]}]
    if a["activation"] == "swiglu_oai":
        glu[0].update(alpha=a["swiglu_alpha"], limit=a["swiglu_limit"])
    row = {"operand": "row", "swap": False}
    bias = [{"op": "add", **row}] if logit_bias is not None else []
    works = [_gemm(graph, node, "router", M, d, router.shape[0], steps=bias, rows=len(bias))]  # + identity experts
    if shared is not None:
        fs = shared.shape[0]
        works += [_gemm(graph, node, "shared.gate_up", M, d, fs, weights=gated, steps=glu),
                  _gemm(graph, node, "shared.down", M, fs, d)]
    # GPT-OSS's expert biases: gate's and up's rows before the GLU, down's after the GEMM
    biases = [{"op": "bias", "weight": w, **row} for w, b in enumerate((b_gate, b_up)) if b is not None]
    down = [{"op": "add", **row}] if b_down is not None else []
    slots = M * a["top_k"]
    active = min(experts, slots)
    base, extra = divmod(slots, active)
    for rows, count in ((base + 1, extra), (base, active - extra)):
        if count and rows:
            works += [_gemm(graph, node, f"experts.gate_up[{rows} rows]", rows, d, f, weights=gated, steps=biases + glu,
                            rows=len(biases), count=count),
                      _gemm(graph, node, f"experts.down[{rows} rows]", rows, f, d, steps=down, rows=len(down),
                            count=count)]
    return works


RULES = {"linear": _linear, "patch_embed": _patch_embed, "matmul": _matmul, "swiglu": _gated_mlp,
         "geglu": _gated_mlp, "gelu_mlp": _gelu_mlp,
         "attention": _attention, "mla_attention": _mla, "mla_absorbed_attention": _mla,
         "mla_latent_attention": _mla, "moe": _moe, **recurrent.RULES}


# ---- what is left ------------------------------------------------------------------------

def unplanned_bytes(node: Node, bindings: dict, op_bytes: int) -> int:
    """DRAM bytes of a node the plan does not tile: every operand read and result written
    once, floats at the NPU's operand width, integers at their own (a gather reads only
    the rows it returns)."""
    total = 0
    out_elements = math.prod(dims.evaluate_shape(node.outputs[0].shape, bindings)) if node.outputs else 0
    for value in list(node.inputs) + list(node.outputs):
        if value is None:
            continue
        elements = math.prod(dims.evaluate_shape(value.shape, bindings))
        if isinstance(value, Param) and node.op in GATHERS:
            elements = out_elements
        width = op_bytes if value.dtype.is_float else max(1, value.dtype.bits // 8)
        total += elements * width
    return total
