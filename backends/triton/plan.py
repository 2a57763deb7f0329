"""The launch plan: which kernel implements which graph nodes, in what order.

``Planner(graph).run()`` walks the graph once and produces ``Step``s: the launcher lines
for one kernel launch (or a torch op), with the IR lines of the nodes they implement.
Fusion decisions, each a pattern over the graph that keeps every value read elsewhere:

- row groups: contiguous runs of row-wise ops over one row length (elementwise ops,
  RMSNorm/LayerNorm, an embedding gather at the head) become one row kernel: residual
  add + RMSNorm, Gemma's post-norm + add + pre-norm, embedding + first norm;
- matmul epilogues: a ``linear``'s bias and the single-use elementwise chain after it
  whose other operands are per-column vectors (Gemma's final soft-cap);
- gated MLPs: ``swiglu``/``geglu`` and ``mul(act(linear(x)), linear(x))`` run both
  projections in one K loop with the GLU in the epilogue (``grouped_gemm`` too: MoE);
- RoPE on q rotates the projection buffer in place; RoPE on k writes the rotated rows
  straight into the present KV cache; V rows are copied in by ``store_heads``.

Model-level ops are planned here (attention), by their kernel module (``mla``, ``moe``,
``dequant``) or by ``backends.triton.plan_ssm`` (the recurrent ops); the rest fall back to
torch (``backends.triton.fallback``) or are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph, Node, Param, Value
from irc.printer import format_node
from irc.text import identifier, shape_text

from backends.triton import collective, fallback, plan_ssm
from backends.triton.kernels import Kernel, dequant, elementwise, mla, moe, norm, torch_type
from backends.triton.plan_attention import AttentionPlanning
from backends.triton.plan_gemm import LINEAR_OPS, GemmPlanning

REFUSED_HINTS = {
    "mla_attention": "run mla-absorb first (the triton target's default pipeline does): --passes dce,cse,mla-absorb",
    "moe": "run moe-sort first (the triton target's default pipeline does): --passes dce,cse,moe-sort",
    "patch_embed": "run lower-patch-embed first (the triton target's default pipeline does): "
                   "--passes dce,cse,lower-patch-embed",
}


@dataclass
class Step:
    nodes: list                      # graph nodes implemented
    lines: list                      # launcher lines (no indent)
    kernels: list = field(default_factory=list)
    torch_ops: list = field(default_factory=list)  # ops run as torch


class Planner(GemmPlanning, AttentionPlanning):
    def __init__(self, graph: Graph):
        self.graph = graph
        self.kernels: dict[str, Kernel] = {}
        self.steps: list[Step] = []
        self.prologue: list[str] = []          # lines before the first step (present caches)
        self.helpers: set[str] = set()          # fallback helpers the module must define
        self.launchers: dict[str, str] = {}     # launch helpers shared by several kernels (attention)
        self.weights: dict[str, np.ndarray] = {}  # derived tensors stored beside the params
        self.names: dict[str, str] = {}
        self.taken: set[str] = {"W", "inputs", "kv_storage", "torch", "triton", "tl", "np", "math", "os", "dist",
                                *fallback.HELPERS, *plan_ssm.LAUNCH_HELPERS,
                                *collective.HELPERS}  # no variable shadows a helper
        self.claimed: dict[int, str] = {}       # node.name -> why it is planned elsewhere
        self.cache_of: dict[str, str] = {}      # value name -> present cache var it was written into
        self.rope_tables: dict[tuple, tuple] = {}
        self.late_caches: dict[str, str] = {}   # present name -> its allocation line, at the attention
        self.uses = {v.name: len(v.uses) + sum(o is v for o in graph.outputs) for v in graph.values()}
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}  # a node is named after its first output

    # ---- names and buffers ---------------------------------------------------------------
    def var(self, value: Optional[Value]) -> str:
        if value is None:
            return "None"
        if isinstance(value, Param):
            return f"W[{value.name!r}]"
        if value.name not in self.names:
            base, n = identifier(value.name), 0
            name = base
            while name in self.taken:
                n += 1
                name = f"{base}_{n}"
            self.taken.add(name)
            self.names[value.name] = name
        return self.names[value.name]

    def alias(self, value: Value, other: str) -> None:
        """``value`` lives in the buffer of the variable ``other`` (an in-place kernel)."""
        self.names[value.name] = other

    def alloc(self, value: Value) -> str:
        return f"{self.var(value)} = torch.empty({shape_text(value.shape)}, device=DEVICE, " \
               f"dtype={torch_type(value.dtype)})"

    def free(self, node: Node) -> bool:
        """``node`` is not yet planned as part of a fused kernel."""
        return node.name not in self.claimed

    def single_use(self, value: Value) -> bool:
        return self.uses[value.name] == 1 and not isinstance(value, Param) and value.producer is not None

    def use_kernel(self, base: str, make, nodes: list[Node]) -> str:
        """Register the kernel ``make(name)`` builds (one copy per distinct text); returns its name."""
        n = 0
        while True:
            name = base if n == 0 else f"{base}_{n}"
            kernel = make(name)
            known = self.kernels.get(name)
            if known is None:
                self.kernels[name] = kernel
                known = kernel
            if known.key() == kernel.key():
                known.nodes += [node.name for node in nodes if node.name not in known.nodes]
                return name
            n += 1

    def step(self, nodes: list[Node], lines: list[str], kernels=(), torch_ops=()) -> None:
        self.steps.append(Step(list(nodes), list(lines), list(kernels), list(torch_ops)))

    # ---- the walk ------------------------------------------------------------------------
    def run(self) -> "Planner":
        self.special = {"mla_absorbed_attention": mla.plan_mla, "mla_latent_attention": mla.plan_mla,
                        **{op: plan_ssm.plan_recurrent for op in plan_ssm.OPS},
                        **{op: collective.plan_collective for op in collective.OPS}}
        collective.check(self.graph)
        for node in self.graph.nodes:
            if node.op in REFUSED_HINTS:
                raise BackendError(f"the triton target does not take {node.op!r}", location=f"node %{node.name}",
                                   hint=REFUSED_HINTS[node.op])
        self._present_caches()
        dequant.claim(self)
        moe.claim(self)
        self._claim_glu()
        self._claim_epilogues()
        groups = self._row_groups()
        for node in self.graph.nodes:
            if node.name in self.claimed:
                anchor = self.claimed[node.name]
                if callable(anchor):
                    anchor()
                continue
            if node.name in groups:
                members = groups[node.name]
                if members is not None:
                    self._row_group(members)
                continue
            self._node(node)
        return self

    def _node(self, node: Node) -> None:
        op = node.op
        if op in self.special:
            self.special[op](self, node)
        elif op in LINEAR_OPS:
            self._linear(node, [])
        elif op in ("swiglu", "geglu", "gelu_mlp"):
            self._mlp(node)
        elif op == "rope":
            self._rope(node)
        elif op == "attention":
            self._attention(node)
        else:
            self._fallback(node)

    def _fallback(self, node: Node) -> None:
        args = [self.var(v) for v in node.inputs]
        try:
            text, helpers = fallback.fallback_line(node.op, node.attrs, args, node.outputs)
        except KeyError:
            raise BackendError(f"the triton target has no kernel or torch fallback for op {node.op!r}",
                               location=f"node %{node.name}",
                               hint="lower it with a pass first, or use --target numpy") from None
        self.helpers |= helpers
        outs = ", ".join(self.var(v) for v in node.outputs)
        self.step([node], [f"{outs} = {text}"], torch_ops=[node.op])

    # ---- KV caches -----------------------------------------------------------------------
    def _present_caches(self) -> None:
        """Each attention's present cache whose past is a graph input is allocated up front
        (the past copied in, or a view of a Session's storage), so RoPE and stores can write
        new rows into it; a past computed in the graph (a dequantized int8 cache) gets its
        present buffer at the attention."""
        inputs = set(v.name for v in self.graph.inputs)
        for node in self.graph.nodes:
            if node.op not in ("attention", "mla_absorbed_attention", "mla_latent_attention") or len(node.outputs) < 3:
                continue
            past = node.inputs[4:6] if node.op == "attention" else node.inputs[3:5]
            new_tokens = node.inputs[0].shape[1]
            for past_value, present in zip(past, node.outputs[1:3]):
                line = (f"{self.var(present)} = present_cache({self.var(past_value)}, {new_tokens}, kv_storage, "
                        f"{past_value.name!r})")
                if past_value.name in inputs:
                    self.prologue.append(line)
                else:
                    self.late_caches[present.name] = line

    # ---- fusion claims -------------------------------------------------------------------
    def claim(self, members: list[Node], emit) -> None:
        """Plan ``members`` as one unit emitted (by ``emit()``) at the last of them."""
        last = max(members, key=lambda n: self.index[n.name])
        for node in members:
            self.claimed[node.name] = emit if node is last else "fused"

    # ---- row groups ----------------------------------------------------------------------
    def _row_groups(self) -> dict:
        """node name -> members (at the group's last node), or None (a member planned there)."""
        groups, run = {}, []

        def close():
            if run:
                for member in run[:-1]:
                    groups[member.name] = None
                groups[run[-1].name] = list(run)
                run.clear()

        for node in self.graph.nodes:
            ok = node.name not in self.claimed and node.op not in self.special and self._row_member(node, run)
            if not ok:
                close()
                if node.name not in self.claimed and node.op not in self.special and self._row_member(node, []):
                    run.append(node)
            else:
                run.append(node)
        close()
        return groups

    def _row_member(self, node: Node, run: list) -> bool:
        if not (elementwise.supports(node.op, node.attrs) or node.op in norm.NORMS or node.op == "embedding"):
            return False
        if len(node.outputs) != 1 or not node.outputs[0].dtype.is_float or node.outputs[0].rank < 1:
            return False
        shape = node.outputs[0].shape
        if run and shape != run[0].outputs[0].shape:
            return False
        inside = {v.name for member in run for v in member.outputs}
        if node.op == "embedding":
            return node.inputs[0].shape == shape[:-1]
        return all(v is None or v.name in inside or _operand_kind(v, shape) for v in node.inputs)

    def _row_group(self, members: list[Node]) -> None:
        shape = members[0].outputs[0].shape
        rows, width = dims.product(shape[:-1]), shape[-1]
        inputs, args, regs, steps, loaded = [], [], {}, [], {}

        def operand(value: Value, kind: str) -> str:
            key = (value.name, kind)
            if key not in loaded:
                var = f"x{len(inputs)}"
                inputs.append(elementwise.RowInput(var, kind, value.dtype))
                args.append(_row_view(self.var(value), kind, width))
                loaded[key] = var
            return loaded[key]

        for node in members:
            out = f"v{len(regs)}"
            result = node.outputs[0].dtype
            if node.op == "embedding":
                ids, table = node.inputs
                var = f"x{len(inputs)}"
                inputs.append(elementwise.RowInput(var, "gather", table.dtype, ids.dtype))
                args.extend([f"{self.var(ids)}.reshape(-1, 1)", self.var(table)])
                scale = node.attrs["scale"]
                text = var if scale is None else f"{var} * {float(scale)!r}"
                steps.append(f"{out} = {elementwise.round_to(text, result) if result != DType.f32 else text}")
            else:
                names = [None if v is None else regs.get(v.name) or operand(v, _operand_kind(v, shape))
                         for v in node.inputs]
                if node.op in norm.NORMS:
                    steps += norm.norm_lines(node.op, node.attrs, out, names, result)
                else:
                    steps.append(f"{out} = {elementwise.expression(node.op, node.attrs, names, result)}")
            regs[node.outputs[0].name] = out
        member_ids = {n.name for n in members}
        outputs, allocs = [], []
        for node in members:
            value = node.outputs[0]
            if value in self.graph.outputs or any(user.name not in member_ids for user in value.uses):
                outputs.append(elementwise.RowOutput(regs[value.name], value.dtype))
                allocs.append(self.alloc(value))
                args.append(f"{self.var(value)}.reshape(-1, 1, {width})")
        if not outputs:
            return
        name = self.row_kernel([n.op for n in members], inputs, steps, outputs, members)
        call = f"launch_{name}({rows}, 1, {width}, {', '.join(args)})"
        self.step(members, allocs + [call], kernels=[name])

    def row_kernel(self, ops: list[str], inputs, steps: list[str], outputs, nodes) -> str:
        """Register a row kernel running ``steps`` (named after ``ops``); returns its name."""
        if any(elementwise.uses_tanh(line) for line in steps):
            self.helpers.add("tanh_f32")
        summary = f"Fused row kernel: {', '.join(ops)}."
        return self.use_kernel("_".join(ops)[:48].rstrip("_"),
                               partial(_make_row_kernel, summary, inputs, list(steps), outputs), nodes)

    # ---- matmuls -------------------------------------------------------------------------
def _make_row_kernel(summary, inputs, steps, outputs, name):
    return elementwise.row_kernel(name, summary, inputs, steps, outputs)


def _is_vector(value: Optional[Value], width) -> bool:
    return value is not None and value.rank == 1 and dims.canonical(value.shape[0]) == dims.canonical(width)


def _operand_kind(value: Value, shape: tuple) -> Optional[str]:
    if value.shape == shape:
        return "rows"
    if _is_vector(value, shape[-1]):
        return "vector"
    if value.rank == 0:
        return "scalar"
    if value.shape == shape[:-1] + (1,):
        return "rowscalar"
    return None


def _row_view(var: str, kind: str, width) -> str:
    """A row kernel's operand as it indexes it: dense rows. A view whose rows are not dense
    (expand's stride-0 rows, a transpose) is copied first; ``contiguous`` passes a dense
    tensor as it is (``reshape`` alone would keep such a view, and the kernel would read
    past its storage)."""
    if kind == "scalar":
        return var
    if kind == "vector":
        return f"{var}.contiguous()"
    if kind == "rowscalar":
        return f"{var}.contiguous().reshape(-1, 1, 1)"
    return f"{var}.contiguous().reshape(-1, 1, {width})"


def ir_lines(nodes: list[Node]) -> list[str]:
    return [format_node(node) for node in nodes]
