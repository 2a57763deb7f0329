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
    world = spec["tp"] * spec.get("pp", 1)
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
    if spec.get("pp", 1) > 1:  # pipeline stages: each rank holds its own layers
        return {**pipeline_summary(graph, summary), "collectives": collectives,
                "link_bytes_per_token_per_rank": max(c["bytes_per_token"] for c in collectives.values())}
    return {"world": world, "ep": spec.get("ep", 1), "params_per_rank": summary["params_total"], "param_bytes_per_rank": summary["param_bytes"],
            "kv_cache_bytes_per_token_per_rank": summary["kv_cache_bytes_per_token"],
            "state_bytes_per_sequence_per_rank": summary["state_bytes_per_sequence"],
            "kv_replication": max(reps, default=1), "collectives": collectives,
            "link_bytes_per_token_per_rank": sum(c["bytes_per_token"] for c in collectives.values())}


def pipeline_summary(graph: Graph, summary: dict) -> dict:
    """Each stage's parameters, weight bytes and share of the KV cache and state (its layers'
    caches, in proportion to their elements); the largest stage is the per-rank figure."""
    stages = graph.meta[KEY]["stages"]
    pp = graph.meta[KEY]["pp"]
    params = [dict() for _ in range(pp)]
    caches = [0] * pp
    cache_names = {v.name: v for v in past_inputs(graph)}
    for node in graph.nodes:
        stage = stages.get(node.name)
        if stage is None or node.op == "pipe":
            continue
        for value in node.inputs:
            if value is None:
                continue
            if value.name in cache_names and value.producer is None:
                caches[stage] += dims.product([d for d in value.shape if isinstance(d, int)])
            elif hasattr(value, "data"):
                params[stage][value.name] = value
    total = sum(caches) or 1
    rows = [{"stage": i, "params": sum(p.numel for p in ps.values()), "param_bytes": sum(p.nbytes for p in ps.values()),
             "kv_cache_bytes_per_token": summary["kv_cache_bytes_per_token"] * caches[i] // total,
             "state_bytes_per_sequence": summary["state_bytes_per_sequence"] * caches[i] // total}
            for i, ps in enumerate(params)]
    widest = max(rows, key=lambda r: r["param_bytes"])
    return {"world": pp, "pp": pp, "stages": rows, "params_per_rank": widest["params"],
            "param_bytes_per_rank": widest["param_bytes"],
            "kv_cache_bytes_per_token_per_rank": max(r["kv_cache_bytes_per_token"] for r in rows),
            "state_bytes_per_sequence_per_rank": max(r["state_bytes_per_sequence"] for r in rows), "kv_replication": 1}


def shard_lines(shard: dict) -> list[str]:
    """``irc show``'s lines for ``shard_summary``."""
    if shard.get("pp"):
        lines = [f"  {shard['pp']} pipeline stages (shard{{pp={shard['pp']}}}), per stage:"]
        lines += [f"    stage {r['stage']}: {r['params']:,} parameters ({r['param_bytes']:,} bytes), KV cache "
                  f"{r['kv_cache_bytes_per_token']:,} bytes/token" for r in shard["stages"]]
        pipe = shard["collectives"].get("pipe", {"count": 0, "bytes_per_token": 0})
        return lines + [f"    pipe                {pipe['count']} values crossing stages, {pipe['bytes_per_token']:,} "
                        "bytes/token sent in all"]
    ep = f",ep={shard['ep']}" if shard.get("ep", 1) > 1 else ""
    lines = [f"  tensor parallel over {shard['world']} ranks (shard{{tp={shard['world']}{ep}}}), per rank:",
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
