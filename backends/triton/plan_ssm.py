"""Planning the recurrent ops (part of ``backends.triton.plan.Planner``): each node is one
launch helper call over generated kernels, the past state an operand and the present state
a new tensor the caller keeps (``past_key_values.{i}.*`` in, ``present.*`` out).

- ``causal_conv1d``, ``gated_rms_norm``: one kernel each (``kernels.recurrent``);
- ``selective_scan`` (Mamba-1): the sequential kernel (its decay is per channel and state
  index: no chunked matmul form);
- ``ssd`` (Mamba-2) and ``gated_delta_rule``: the sequential (step) kernel for decode and
  for nodes without a ``chunk`` attribute; with ``chunk`` set (the ``scan-chunk`` pass), a
  prefill (T > 1) runs the chunked kernels with that chunk size (``kernels.ssd``,
  ``kernels.delta``; the delta rule's per-channel decay keeps the step kernel, see there).
  The chunked kernels are generated only when some node of the graph sets ``chunk``.
"""
from __future__ import annotations

from functools import partial

from irc.graph import Node
from irc.ops.registry import get_op

from backends.triton.kernels import delta, recurrent, ssd

OPS = ("causal_conv1d", "selective_scan", "ssd", "gated_rms_norm", "gated_delta_rule")
STATEFUL = ("causal_conv1d", "selective_scan", "ssd", "gated_delta_rule")  # (y, present) with a past state
KEYWORDS = {"ssd": ("heads", "head_dim", "groups", "state_size", "dt_min", "dt_max"),
            "gated_delta_rule": ("key_heads", "value_heads", "key_dim", "value_dim", "l2_norm", "scale",
                                 "update_rule", "decay"),
            "gated_rms_norm": ("eps", "group_size", "norm_before_gate")}
LAUNCH_HELPERS = ("launch_ssd", "launch_ssd_chunked", "launch_delta", "ssm_new_tokens")

NEW_TOKENS_HELPER = '''def ssm_new_tokens(attention_mask, batch, seq):
    """Bool [B, T]: which new tokens are real (the last T columns of the mask)."""
    if attention_mask is None:
        return torch.ones((batch, seq), dtype=torch.bool, device=DEVICE)
    return attention_mask[:, attention_mask.shape[1] - seq:] != 0'''


def _chunked(planner, op: str) -> bool:
    """Some ``op`` node of the graph asks for the chunked prefill."""
    return any(n.op == op and n.attrs.get("chunk") is not None for n in planner.graph.nodes)


def _dtypes(node: Node, *indices: int):
    """The dtypes of the operands at ``indices`` (the first one's for an omitted operand)."""
    values = [node.inputs[i] if i < len(node.inputs) else None for i in indices]
    first = values[0].dtype
    return [first if v is None else v.dtype for v in values]


def _ssd_launch(planner, node: Node) -> tuple[str, list[str]]:
    x, weight, state = _dtypes(node, 0, 2, 7)
    scan = planner.use_kernel("ssd_scan", partial(ssd.scan_kernel, x=x, weight=weight, state=state), [node])
    names, chunked = [scan], None
    if _chunked(planner, "ssd"):
        chunked = (planner.use_kernel("ssd_chunk_state", partial(ssd.chunk_state_kernel, x=x, weight=weight), [node]),
                   planner.use_kernel("ssd_state_passing", partial(ssd.state_passing_kernel, state=state), [node]),
                   planner.use_kernel("ssd_chunk_scan", partial(ssd.chunk_scan_kernel, x=x, weight=weight), [node]))
        names += list(chunked)
    planner.launchers["launch_ssd"] = ssd.launcher(scan, chunked)
    return "launch_ssd", names


def _delta_launch(planner, node: Node) -> tuple[str, list[str]]:
    x, weight, state = _dtypes(node, 0, 5, 7)
    scan = planner.use_kernel("delta_scan", partial(delta.scan_kernel, x=x, weight=weight, state=state), [node])
    names, chunked = [scan], None
    if _chunked(planner, "gated_delta_rule"):
        chunked = (planner.use_kernel("delta_chunk_solve", partial(delta.chunk_solve_kernel, x=x, weight=weight),
                                      [node]),
                   planner.use_kernel("delta_chunk_scan", partial(delta.chunk_scan_kernel, x=x, weight=weight,
                                                                  state=state), [node]))
        names += list(chunked)
    planner.launchers["launch_delta"] = delta.launcher(scan, chunked)
    return "launch_delta", names


def _kernel_launch(planner, node: Node) -> tuple[str, list[str]]:
    """The single-kernel ops: (launch helper, [kernel])."""
    if node.op == "causal_conv1d":
        x, weight, state = _dtypes(node, 0, 1, 3)
        name = planner.use_kernel("conv", partial(recurrent.conv_kernel, x=x, weight=weight, state=state), [node])
    elif node.op == "selective_scan":
        x, weight, state = _dtypes(node, 0, 2, 7)
        name = planner.use_kernel("scan", partial(recurrent.selective_scan_kernel, x=x, a_log=weight, state=state),
                                  [node])
    else:
        x, z, weight = _dtypes(node, 0, 1, 2)
        name = planner.use_kernel("gated_norm", partial(recurrent.gated_norm_kernel, x=x, z=z, weight=weight), [node])
    return f"launch_{name}", [name]


def plan_recurrent(planner, node: Node) -> None:
    """One step: ``outputs = launch_*(operands, attributes)``; omitted operands pass None,
    a node without a past state keeps only its first output."""
    planners = {"ssd": _ssd_launch, "gated_delta_rule": _delta_launch}
    helper, kernels = planners.get(node.op, _kernel_launch)(planner, node)
    operands = [spec for spec in get_op(node.op).operands if not spec.startswith("*")]
    args = [planner.var(v) for v in node.inputs]
    args += ["None"] * (len(operands) - len(args))
    if node.op == "causal_conv1d":
        args.append(repr(node.attrs["activation"]))
    args += [f"{name}={node.attrs[name]!r}" for name in KEYWORDS.get(node.op, ())]
    if node.op in ("ssd", "gated_delta_rule") and node.attrs.get("chunk") is not None:
        args.append(f"chunk={int(node.attrs['chunk'])}")
    text = f"{helper}({', '.join(args)})"
    if node.op in STATEFUL and len(node.outputs) == 1:
        text += "[0]"
    if node.op in STATEFUL:
        planner.helpers.add("ssm_new_tokens")
    outs = ", ".join(planner.var(v) for v in node.outputs)
    planner.step([node], [f"{outs} = {text}"], kernels=kernels)
