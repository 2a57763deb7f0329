"""What a sharded graph (``passes/shard.py``) costs each rank: ``irc show SPEC --tp N``.

The graph is one rank's program, so ``irc.analysis.analyze`` of it gives a rank's parameters,
weight bytes, KV cache and state per token as they are. Beside them: how many times the KV
cache is held across the world (KV heads replicated where there are fewer than ranks), and
the bytes each collective sends per token from one rank (a ring: an all-reduce of n bytes
sends 2 (N - 1) / N x n, an all-gather of an n-byte result (N - 1) / N x n;
``irc.ops.collective.link_bytes``), the same per token at prefill and at decode since every
collective reads a [B, T, ...] activation (the head's all-gather runs at the last position
only where the folder keeps the last logits).
"""
from __future__ import annotations

from irc import dims
from irc.analysis import analyze, past_inputs
from irc.graph import Graph
from irc.ops.collective import COLLECTIVES, link_bytes
from irc.world import KEY


def per_token_elements(shape: tuple) -> int:
    """Elements of one token's row of a [B, T, ...] activation."""
    return dims.product(shape[2:]) if len(shape) > 2 else 1


def shard_summary(graph: Graph, context: int = 4096, cache_dtype=None) -> dict:
    """Per-rank figures of a graph the shard pass has cut (module docstring)."""
    spec = graph.meta[KEY]
    world = spec["tp"]
    summary = analyze(graph, context=context, cache_dtype=cache_dtype)
    collectives: dict = {}
    for node in graph.nodes:
        if node.op in COLLECTIVES:
            out = node.outputs[0]
            nbytes = per_token_elements(out.shape) * out.dtype.nbytes(1)
            entry = collectives.setdefault(node.op, {"count": 0, "bytes_per_token": 0, "payload_bytes_per_token": 0})
            entry["count"] += 1
            entry["payload_bytes_per_token"] += nbytes
            entry["bytes_per_token"] += link_bytes(node.op, nbytes, world)
    cuts = spec.get("inputs", {})  # a cache no rank cuts (an MLA latent, a state) is held by every rank
    reps = [cuts[v.name].get("rep", 1) if v.name in cuts else world for v in past_inputs(graph)]
    return {"world": world, "params_per_rank": summary["params_total"], "param_bytes_per_rank": summary["param_bytes"],
            "kv_cache_bytes_per_token_per_rank": summary["kv_cache_bytes_per_token"],
            "state_bytes_per_sequence_per_rank": summary["state_bytes_per_sequence"],
            "kv_replication": max(reps, default=1), "collectives": collectives,
            "link_bytes_per_token_per_rank": sum(c["bytes_per_token"] for c in collectives.values())}


def shard_lines(shard: dict) -> list[str]:
    """``irc show``'s lines for ``shard_summary``."""
    lines = [f"  tensor parallel over {shard['world']} ranks (shard{{tp={shard['world']}}}), per rank:",
             f"    parameters          {shard['params_per_rank']:,} ({shard['param_bytes_per_rank']:,} bytes)",
             f"    KV cache/token      {shard['kv_cache_bytes_per_token_per_rank']:,} bytes"
             + (f" (each held by {shard['kv_replication']} ranks)" if shard["kv_replication"] > 1 else "")]
    if shard["state_bytes_per_sequence_per_rank"]:
        lines.append(f"    state/sequence      {shard['state_bytes_per_sequence_per_rank']:,} bytes")
    for op, c in sorted(shard["collectives"].items()):
        lines.append(f"    {op:<19} {c['count']} per step, {c['payload_bytes_per_token']:,} bytes/token of results, "
                     f"{c['bytes_per_token']:,} bytes/token sent (ring)")
    return lines


__all__ = ["shard_lines", "shard_summary"]
