"""Planning the matmul family (part of ``backends.triton.plan.Planner``).

- ``linear`` / ``dequant_linear``: one matmul kernel, the bias and the single-use
  elementwise chain after it (per-column operands only) in the epilogue;
- ``mul(act(P(x, Wg)), P(x, Wu))`` for P linear or dequant_linear: one dual matmul, the
  GLU in the epilogue (the decomposed SwiGLU of shared experts and lowered MLPs);
- ``swiglu`` / ``geglu``: the dual matmul into the hidden buffer, then the down matmul;
  ``gelu_mlp``: up (bias, gelu epilogue), then down (bias).

Weights read through a folded ``dequantize`` (or a ``dequant_linear``'s codes) are decoded
inside the K loop (``backends.triton.kernels.dequant``).
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from irc.dtypes import DType
from irc.graph import Node
from irc.ops.registry import pad_inputs
from irc.rewrite.epilogue import epilogue_chain, glu_match
from irc.text import shape_text

from backends.triton.kernels import dequant, elementwise, matmul, torch_type

LINEAR_OPS = ("linear", "dequant_linear")
# what a matmul epilogue reads besides the accumulator: per-column vectors (a bias, a scale).
# A residual add is left to the row kernel after it, which also computes the norm it feeds.
EPILOGUE_OPERANDS = ("vector",)


def _make_gemm(spec_args, name):
    return matmul.gemm_kernel(matmul.GemmSpec(name, **spec_args))


class GemmPlanning:
    """Mixin: needs the Planner's var/alloc/step/use_kernel/claim/helpers."""

    def gemm(self, base: str, spec_args: dict, nodes: list[Node]) -> str:
        return self.use_kernel(base, partial(_make_gemm, spec_args), nodes)

    def matmul_kernel(self, nodes, a_dtype: DType, weight: dict, out_dtype: DType, bias: Optional[DType] = None,
                      chain=()) -> str:
        """A dense matmul kernel: out = chain(a @ w.T [+ bias]) rounded as the nodes are.

        ``weight`` holds the GemmSpec weight fields (``dequant.weight``); ``chain`` holds
        (op, attrs, result dtype, input dtype, operand roles) for each epilogue op, a role
        being "y" (the running value) or a vector operand's dtype. The launcher takes the
        bias and then the vector operands, in order."""
        inputs, value = [], "acc"
        if bias is not None:
            inputs.append(matmul.EpilogueInput("e0", "vector", bias))
            value = "(acc + e0)"
        lines = [f"y = {elementwise.round_to(value, out_dtype if not chain else chain[0][3])}"]
        for op, attrs, result, _, roles in chain:
            names = []
            for role in roles:
                if role == "y":
                    names.append("y")
                else:
                    names.append(f"e{len(inputs)}")
                    inputs.append(matmul.EpilogueInput(names[-1], "vector", role))
            lines.append(f"y = {elementwise.expression(op, attrs, names, result)}")
        lines = ["out = acc"] if lines == ["y = acc"] else lines + ["out = y"]
        if any(elementwise.uses_tanh(line) for line in lines):
            self.helpers.add("tanh_f32")
        ops = (["bias"] if bias is not None else []) + [op for op, *_ in chain]
        kind = "int8/int4" if weight.get("weight_load") else str(weight["w_dtype"])
        summary = f"Matmul {a_dtype} x {kind}" + "".join(f", then {op}" for op in ops) + "."
        base = dequant.base_name(weight, "_".join(["matmul"] + ops))
        return self.gemm(base, dict(summary=summary, a_dtype=a_dtype, out_dtype=out_dtype, epilogue=lines,
                                    inputs=inputs, **weight), nodes)

    def _claim_epilogues(self) -> None:
        """Each linear's epilogue chain (``irc.rewrite.epilogue``) joins its matmul kernel."""
        for node in self.graph.nodes:
            if node.op not in LINEAR_OPS or node.name in self.claimed:
                continue
            chain = [step.node for step in epilogue_chain(self.graph, node.outputs[0], EPILOGUE_OPERANDS, self.free)]
            if chain:
                self.claim([node] + chain, partial(self._linear, node, chain))

    def linear_weight(self, node: Node) -> tuple[dict, list, Optional[object]]:
        """(weight fields, weight operands, bias) of a linear or dequant_linear node."""
        if node.op == "dequant_linear":
            fields, operands = dequant.linear_weight(node)
            return fields, operands, pad_inputs(node.inputs, 5)[4]
        fields, operands = dequant.weight(self, node.inputs[1])
        return fields, operands, pad_inputs(node.inputs, 3)[2]

    def _linear(self, node: Node, chain: list[Node]) -> None:
        x = node.inputs[0]
        fields, operands, bias = self.linear_weight(node)
        result = chain[-1].outputs[0] if chain else node.outputs[0]
        extra = [self.var(bias)] if bias is not None else []
        steps, prev = [], node.outputs[0]
        for member in chain:
            roles = []
            for v in member.inputs:
                roles.append("y" if v is prev else v.dtype)
                if v is not prev:
                    extra.append(self.var(v))
            steps.append((member.op, member.attrs, member.outputs[0].dtype, prev.dtype, roles))
            prev = member.outputs[0]
        nodes = [node] + chain
        bias_dtype = bias.dtype if bias is not None else None
        name = self.matmul_kernel(nodes, x.dtype, fields, result.dtype, bias_dtype, steps)
        main, trailing = dequant.launch_args(self, [operands])
        call = f"launch_{name}({', '.join([self.var(x)] + main + [self.var(result)] + extra + trailing)})"
        self.step(nodes, [self.alloc(result), call], kernels=[name])

    def glu_kernel(self, base, x_dtype, weight: dict, out_dtype, act_op, act_attrs, gate_bias=False, up_bias=False,
                   nodes=(), mapping=None) -> str:
        """The dual matmul kernel: out = act(a @ w.T [+ b]) * (a @ w2.T [+ b2])."""
        inputs = []
        gate, up = "acc", "acc2"
        if gate_bias:
            inputs.append(matmul.EpilogueInput("e0", "vector", x_dtype))
            gate = "(acc + e0)"
        if up_bias:
            inputs.append(matmul.EpilogueInput(f"e{len(inputs)}", "vector", x_dtype))
            up = f"(acc2 + e{len(inputs) - 1})"
        lines = [f"gate = {elementwise.round_to(gate, out_dtype)}",
                 f"up = {elementwise.round_to(up, out_dtype)}",
                 f"act = {elementwise.expression(act_op, act_attrs, ['gate'], out_dtype)}",
                 f"out = {elementwise.round_to('act * up', out_dtype)}"]
        if any(elementwise.uses_tanh(line) for line in lines):
            self.helpers.add("tanh_f32")
        spec = dict(summary=f"Gated matmul: {act_op}(a @ w.T) * (a @ w2.T), both in one K loop.",
                    a_dtype=x_dtype, out_dtype=out_dtype, dual=True, epilogue=lines, inputs=inputs, **weight)
        if mapping is not None:
            spec["mapping"] = mapping
        return self.gemm(dequant.base_name(weight, base), spec, list(nodes))

    def _claim_glu(self) -> None:
        """mul(act(P(x, Wg)), P(x, Wu)) -> one dual matmul with a GLU epilogue."""
        for node in self.graph.nodes:
            if node.op != "mul" or node.name in self.claimed:
                continue
            match = glu_match(self.graph, node, LINEAR_OPS, self.free)
            if match and self.linear_weight(match[0])[0] == self.linear_weight(match[2])[0]:
                gate, act, up = match
                self.claim([gate, act, up, node], partial(self._glu, gate, act, up, node))

    def _glu(self, gate: Node, act: Node, up: Node, mul: Node) -> None:
        x = gate.inputs[0]
        fields, gate_ops, gate_bias = self.linear_weight(gate)
        _, up_ops, up_bias = self.linear_weight(up)
        nodes = [gate, act, up, mul]
        name = self.glu_kernel(f"matmul_{act.op}_glu", x.dtype, fields, mul.outputs[0].dtype, act.op,
                               act.attrs, gate_bias is not None, up_bias is not None, nodes)
        main, trailing = dequant.launch_args(self, [gate_ops, up_ops])
        extra = [self.var(b) for b in (gate_bias, up_bias) if b is not None]
        args = [self.var(x)] + main + [self.var(mul.outputs[0])] + extra + trailing
        self.step(nodes, [self.alloc(mul.outputs[0]), f"launch_{name}({', '.join(args)})"], kernels=[name])

    def _mlp(self, node: Node) -> None:
        """swiglu/geglu: the dual matmul into the hidden buffer, then the down projection;
        gelu_mlp: up with bias + gelu epilogue, then down with bias."""
        x, out = node.inputs[0], node.outputs[0]
        hidden_shape = x.shape[:-1] + (node.inputs[1].shape[0],)
        hidden = f"{self.var(out)}_hidden"
        lines = [f"{hidden} = torch.empty({shape_text(hidden_shape)}, device=DEVICE, dtype={torch_type(x.dtype)})"]
        if node.op == "gelu_mlp":
            _, w_up, w_down, b_up, b_down = pad_inputs(node.inputs, 5)
            (up_fields, up_ops), (down_fields, down_ops) = dequant.weight(self, w_up), dequant.weight(self, w_down)
            gelu = ("gelu", {"approximate": node.attrs["approximate"]}, x.dtype, x.dtype, ["y"])
            up = self.matmul_kernel([node], x.dtype, up_fields, x.dtype, b_up and b_up.dtype, [gelu])
            down = self.matmul_kernel([node], x.dtype, down_fields, x.dtype, b_down and b_down.dtype)
            for name, source, ops, target, bias in ((up, self.var(x), up_ops, hidden, b_up),
                                                    (down, hidden, down_ops, self.var(out), b_down)):
                main, trailing = dequant.launch_args(self, [ops])
                biases = [self.var(bias)] if bias is not None else []
                if name == down:
                    lines.append(self.alloc(out))
                lines.append(f"launch_{name}({', '.join([source] + main + [target] + biases + trailing)})")
            self.step([node], lines, kernels=[up, down])
            return
        _, w_gate, w_up, w_down = node.inputs
        (gate_fields, gate_ops), (up_fields, up_ops) = dequant.weight(self, w_gate), dequant.weight(self, w_up)
        down_fields, down_ops = dequant.weight(self, w_down)
        act, attrs = ("silu", {}) if node.op == "swiglu" else ("gelu", {"approximate": node.attrs["approximate"]})
        if gate_fields != up_fields:
            raise_mixed(node)
        glu = self.glu_kernel(f"matmul_{act}_glu", x.dtype, gate_fields, x.dtype, act, attrs, nodes=[node])
        down = self.matmul_kernel([node], x.dtype, down_fields, x.dtype)
        main, trailing = dequant.launch_args(self, [gate_ops, up_ops])
        down_main, down_trailing = dequant.launch_args(self, [down_ops])
        lines += [f"launch_{glu}({', '.join([self.var(x)] + main + [hidden] + trailing)})",
                  self.alloc(out),
                  f"launch_{down}({', '.join([hidden] + down_main + [self.var(out)] + down_trailing)})"]
        self.step([node], lines, kernels=[glu, down])


def raise_mixed(node: Node) -> None:
    from irc.errors import BackendError

    raise BackendError("gate and up weights are stored differently (float and quantized, or two quantizations)",
                       location=f"node %{node.name}", hint="quantize both or neither")
