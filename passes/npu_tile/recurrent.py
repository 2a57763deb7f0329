"""What an NPU plan covers of a recurrent layer: one scan per sequence (``irc.npu.scan``).

- ``ssd``: units are the heads (state [N, P] each); a group of H/G heads shares B and C;
  per token a head reads x (P) and dt (1) and writes y (P); parameters A_log, D, dt_bias;
- ``gated_delta_rule``: units are the value heads (state [d_k, d_v]); the H_v/H_k value
  heads of a key head share q and k; per token a head reads v (d_v), a and b (one each,
  when present) and writes o (d_v); parameters A_log, dt_bias; a per-key-channel decay
  (``decay="channel"``) reads d_k decay inputs per token;
- ``causal_conv1d``: units are the channels (state: the last K-1 inputs); per token a
  channel reads x and writes y; parameters the K weights and the bias.

The MACs per token and unit are the sequential form's (``irc.ops.ssm.scan_cost`` and the
delta rule's cost count the same products): 2·N·P for ssd, 2·d_k·d_v (the gated rule) or
3·d_k·d_v (the delta rule) and K for the convolution.
"""
from __future__ import annotations

from irc.ops.delta import OPERANDS as DELTA_OPERANDS
from irc.ops.registry import by_name
from irc.ops.ssm import CONV_OPERANDS, SSD_OPERANDS
from irc.npu.scan import ScanShape
from passes.npu_tile.work import Work


def _present(ops: dict, names) -> tuple:
    return tuple(1 for name in names if ops.get(name) is not None)


def ssd_shape(node, tokens: int) -> ScanShape:
    o, a = by_name(SSD_OPERANDS, node.inputs), node.attrs
    N, P, H = a["state_size"], a["head_dim"], a["heads"]
    return ScanShape(tokens, H, H // a["groups"], (P, 1), (N, N), P, N * P, _present(o, ("A_log", "D", "dt_bias")),
                     2 * N * P)


def delta_shape(node, tokens: int) -> ScanShape:
    o, a = by_name(DELTA_OPERANDS, node.inputs), node.attrs
    dk, dv, H = a["key_dim"], a["value_dim"], a["value_heads"]
    decay = dk if a["decay"] == "channel" else 1
    inputs = (dv,) + ((decay,) if o["a"] is not None else ()) + ((1,) if o["b"] is not None else ())
    params = (1,) + ((decay,) if o["dt_bias"] is not None else ())
    return ScanShape(tokens, H, H // a["key_heads"], inputs, (dk, dk), dv, dk * dv, params,
                     (3 if a["update_rule"] == "gated_delta" else 2) * dk * dv)


def conv_shape(node, tokens: int) -> ScanShape:
    o = by_name(CONV_OPERANDS, node.inputs)
    channels, kernel = o["weight"].shape[0], o["weight"].shape[2]
    params = (kernel,) + ((1,) if o["bias"] is not None else ())
    return ScanShape(tokens, channels, 1, (1,), (), 1, kernel - 1, params, kernel, chunked=False)


SHAPES = {"ssd": ssd_shape, "gated_delta_rule": delta_shape, "causal_conv1d": conv_shape}


def scan_rule(graph, node, sizes):
    """One scan per sequence of the batch (a ``Work`` of ``passes.npu_tile.work``)."""
    batch, tokens = sizes.shape(node.inputs[0])[:2]
    shape = SHAPES[node.op](node, tokens)
    attrs = {k: v for k, v in node.attrs.items() if k != "chunk"}
    operands = [name.strip("?") for name, v in zip(_operands(node.op), node.inputs)
                if v is not None and name.strip("?") != "attention_mask"]
    return [Work(f"{node.name}:scan", node.name, node.op, "scan", shape, batch,
                 scan={"op": node.op, "attrs": attrs, "operands": operands})]


def _operands(op: str) -> tuple:
    return {"ssd": SSD_OPERANDS, "gated_delta_rule": DELTA_OPERANDS, "causal_conv1d": CONV_OPERANDS}[op]


RULES = {op: scan_rule for op in SHAPES}
