"""MoE grouped GEMMs over the sorted segments ``moe-sort`` produces.

``moe-sort`` leaves (N tokens, M = N * top_k sorted token-slot rows, E experts):
``moe_route`` -> ``moe_dispatch`` (token_index, slot_index [M], indptr [E+1]) -> ``gather``
of token rows -> ``grouped_gemm`` gate and up -> activation, ``mul`` -> ``grouped_gemm``
down -> ``mul`` by each row's gating weight -> ``scatter_add`` into the shared expert's
output (or zeros). Three generated kernels cover the GEMM part:

- ``moe_glu_gemm``: gate and up of every expert in one K loop, the GLU in the epilogue,
  the token-row ``gather`` fused into the A load (rows read through token_index);
- ``moe_down_gemm``: the down projection, each row scaled by its gating weight in the
  epilogue and added atomically into its token's output row (the weighted
  ``scatter_add`` fused into the store; the shared expert's output is the accumulator);
- ``grouped_gemm``: a lone segment GEMM (zeros outside every segment), for anything else.

A program owns one row tile of one expert's segment [indptr[e], indptr[e+1]) and returns
at once when the segment is shorter; the grid covers E x ceil(M / BLOCK_M) row tiles, so
no host sync reads the segment sizes. Routing, dispatch and the small gathers of gating
weights stay torch ops (``backends.triton.fallback``).
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from irc.graph import Node, Value
from irc.rewrite.epilogue import glu_match

from backends.triton.kernels import dequant, matmul
from backends.triton.plan_gemm import raise_mixed

FRESH_PRODUCERS = ("linear", "dequant_linear", "mul", "add", "matmul", "swiglu", "geglu", "gelu_mlp")


def claim(planner) -> None:
    """Claim the sorted-MoE patterns: grouped GLU (+ row gather) and down + weight + scatter."""
    planner.special["grouped_gemm"] = plan_grouped_gemm
    for node in planner.graph.nodes:
        if node.name in planner.claimed:
            continue
        if node.op == "mul":
            match = glu_match(planner.graph, node, ("grouped_gemm",), planner.free)
            if match:
                gate, act, up = match
                gather = _row_gather(planner, gate.inputs[0], {gate.name, up.name})
                members = [gate, act, up, node] + ([gather] if gather is not None else [])
                planner.claim(members, partial(_emit_glu, planner, gate, act, up, node, gather))
        elif node.op == "scatter_add":
            match = _down_match(planner, node)
            if match:
                down, weigh, zeros = match
                planner.claim([down, weigh, node] + zeros, partial(_emit_down, planner, down, weigh, node, zeros))


def _row_gather(planner, rows: Value, readers: set) -> Optional[Node]:
    """The ``gather(tokens, token_index)`` producing ``rows`` when only ``readers`` read it."""
    gather = rows.producer
    if gather is None or gather.op != "gather" or gather.attrs["axis"] != 0 or rows in planner.graph.outputs:
        return None
    if gather.name in planner.claimed or any(user.name not in readers for user in rows.uses):
        return None
    return gather if gather.inputs[0].rank == 2 and gather.inputs[1].rank == 1 else None


def _down_match(planner, scatter: Node):
    """(down grouped_gemm, weighting mul, [constant, expand] when the base is zeros) for
    scatter_add(base, index, mul(grouped_gemm(...), row_weights [M, 1]))."""
    base, _, weighted = scatter.inputs
    weigh = weighted.producer
    if weigh is None or weigh.op != "mul" or not planner.single_use(weighted) or weigh.name in planner.claimed:
        return None
    for down_value, scale in (weigh.inputs, weigh.inputs[::-1]):
        down = down_value.producer
        if down is not None and down.op == "grouped_gemm" and planner.single_use(down_value) \
                and down.name not in planner.claimed and scale.shape == (down_value.shape[0], 1):
            break
    else:
        return None
    if base.dtype != weighted.dtype or weighted.shape != down_value.shape:
        return None
    return down, weigh, _zeros_base(planner, base) or []


def _zeros_base(planner, base: Value) -> Optional[list]:
    """[constant, expand] when base = expand(constant 0) read only here."""
    expand = base.producer
    if expand is None or expand.op != "expand" or not planner.single_use(base):
        return None
    constant = expand.inputs[0].producer
    if constant is None or constant.op != "constant" or constant.attrs["value"] not in (0, 0.0):
        return None
    if not planner.single_use(expand.inputs[0]):
        return None
    return [constant, expand]


def _fresh(planner, base: Value) -> bool:
    """Whether ``base`` is a buffer a kernel just wrote and nothing else reads (add into it)."""
    return planner.single_use(base) and base not in planner.graph.outputs and base.producer.op in FRESH_PRODUCERS


def _emit_glu(planner, gate: Node, act: Node, up: Node, mul: Node, gather: Optional[Node]) -> None:
    rows = gate.inputs[0]
    a, row_index = (gather.inputs[0], gather.inputs[1]) if gather is not None else (rows, None)
    mapping = matmul.Mapping("grouped", row_index=row_index is not None)
    nodes = [n for n in (gather, gate, act, up, mul) if n is not None]
    (fields, gate_ops), (up_fields, up_ops) = (dequant.weight(planner, n.inputs[1], grouped=True) for n in (gate, up))
    if fields != up_fields:
        raise_mixed(mul)
    name = planner.glu_kernel("moe_glu_gemm", a.dtype, fields, mul.outputs[0].dtype, act.op, act.attrs, nodes=nodes,
                              mapping=mapping)
    out = mul.outputs[0]
    main, trailing = dequant.launch_args(planner, [gate_ops, up_ops])
    args = [planner.var(a)] + main + [planner.var(out), planner.var(gate.inputs[2])]
    args += ([planner.var(row_index)] if row_index is not None else []) + trailing
    lines = [planner.alloc(out).replace("torch.empty(", "torch.zeros("), f"launch_{name}({', '.join(args)})"]
    planner.step(nodes, lines, kernels=[name])


def _emit_down(planner, down: Node, weigh: Node, scatter: Node, zeros: list) -> None:
    hidden, weight, indptr = down.inputs
    scale = weigh.inputs[1] if weigh.inputs[0] is down.outputs[0] else weigh.inputs[0]
    base, index, _ = scatter.inputs
    out = scatter.outputs[0]
    inputs = [matmul.EpilogueInput("e0", "rowscalar", scale.dtype)]
    epilogue = ["out = acc * e0"]
    fields, operands = dequant.weight(planner, weight, grouped=True)
    spec = dict(summary="MoE down projection: segment GEMMs, rows weighted and scattered back to their tokens.",
                details=["Each row is scaled by its gating weight and added atomically into its token's row."],
                a_dtype=hidden.dtype, out_dtype=out.dtype, epilogue=epilogue, inputs=inputs,
                mapping=matmul.Mapping("grouped", scatter=True), **fields)
    nodes = [down, weigh, scatter] + zeros
    name = planner.gemm(dequant.base_name(fields, "moe_down_gemm"), spec, nodes)
    main, trailing = dequant.launch_args(planner, [operands])
    lines = []
    if zeros:
        lines.append(planner.alloc(out).replace("torch.empty(", "torch.zeros("))
    elif _fresh(planner, base):
        planner.alias(out, planner.var(base))
        lines.append(f"# {planner.var(out)}: the rows are added in place into {planner.var(base)}")
    else:
        lines.append(f"{planner.var(out)} = {planner.var(base)}.clone()")
    args = [planner.var(hidden)] + main + [planner.var(out), planner.var(indptr), planner.var(index),
                                           planner.var(scale)] + trailing
    lines.append(f"launch_{name}({', '.join(args)})")
    planner.step(nodes, lines, kernels=[name])


def plan_grouped_gemm(planner, node: Node) -> None:
    """A lone grouped_gemm: rows[indptr[e]:indptr[e+1]] @ w[e].T, zeros elsewhere."""
    rows, weight, indptr = node.inputs
    out = node.outputs[0]
    fields, operands = dequant.weight(planner, weight, grouped=True)
    spec = dict(summary="Grouped GEMM: each expert's weight over its segment of sorted rows.", a_dtype=rows.dtype,
                out_dtype=out.dtype, mapping=matmul.Mapping("grouped"), **fields)
    name = planner.gemm(dequant.base_name(fields, "grouped_gemm"), spec, [node])
    main, trailing = dequant.launch_args(planner, [operands])
    args = [planner.var(rows)] + main + [planner.var(out), planner.var(indptr)] + trailing
    lines = [planner.alloc(out).replace("torch.empty(", "torch.zeros("), f"launch_{name}({', '.join(args)})"]
    planner.step([node], lines, kernels=[name])
