"""Each rank's share of models larger than one device, from the graph the ``shard`` pass cuts
(``irc.analysis_shard``), beside what the seeds' arithmetic gives:

    python benchmarks/shard.py

Per model and degree: parameters and weight bytes a rank holds, its KV cache per token
(irc's, and the seeds' rule: GQA splits cleanly up to H_kv ranks, each rank owning whole KV
groups, 2·L·max(H_kv / N, 1)·d_h·bytes; an MLA latent cache is held whole by every rank), how
many ranks hold each cache entry, and the bytes one rank sends per decoded token for its
all-reduces and the logits' all-gather (a ring: 2 (N - 1) / N and (N - 1) / N of the payload;
irc's activations are f32, so the payloads are 4 bytes an element). Structure only: no
weights are read. DeepSeek-V3 runs absorbed (``mla-absorb``: the latent cache serving
engines keep) and with ``ep`` = N (whole experts, E / N a rank).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = [  # (label, spec, pipeline)
    ("Llama-3-70B", "examples/hf/llama3-70b", "shard{tp=8}"),
    ("Llama-3-70B", "examples/hf/llama3-70b", "shard{tp=16}"),
    ("Qwen3-235B-A22B", "examples/hf/qwen3-235b-a22b", "shard{tp=8}"),
    ("Qwen3-235B-A22B", "examples/hf/qwen3-235b-a22b", "shard{tp=8,ep=8}"),
    ("DeepSeek-V3", "examples/hf/deepseek-v3", "mla-absorb,shard{tp=8,ep=8}"),
    ("DeepSeek-V3", "examples/hf/deepseek-v3", "shard{tp=8}"),
]


def seeds_kv(graph, world: int) -> int:
    """The seeds' KV bytes per token per rank: 2·L·max(H_kv / N, 1)·d_h (GQA), or the latent
    L·(d_c + rope) whole on every rank (MLA absorbed), at the cache's bf16."""
    meta = graph.meta
    layers = meta["n_layers"]
    if meta.get("mla") and any(n.op in ("mla_latent_attention", "mla_absorbed_attention") for n in graph.nodes):
        return layers * (meta["mla"]["kv_lora_rank"] + meta["mla"]["qk_rope_head_dim"]) * 2
    if meta.get("mla"):  # as stored: keys and values per head, split with the heads
        heads = meta["n_heads"] // world
        return layers * heads * (meta["mla"]["qk_nope_head_dim"] + meta["mla"]["qk_rope_head_dim"]
                                 + meta["mla"]["v_head_dim"]) * 2
    kv = max(meta["n_kv_heads"] // world, 1)
    return 2 * layers * kv * meta["head_dim"] * 2


def row(label: str, spec: str, pipeline: str) -> str:
    import passes  # noqa: F401  (registers the passes)
    from frontends import load_spec
    from irc.analysis_shard import shard_summary
    from irc.passmanager import PassManager, parse_pipeline
    from irc.weights import seed_absent

    started = time.perf_counter()
    graph = load_spec(spec)
    graph.parts = {}  # the decoder only (DeepSeek-V3's MTP head aside)
    if "mla-absorb" in pipeline:
        seed_absent(graph)  # absorbed weights are made from kv_b's (seeded; only shapes matter here)
    PassManager(parse_pipeline(pipeline)).run(graph)
    s = shard_summary(graph, cache_dtype=None)
    world = s["world"]
    reduce = s["collectives"].get("all_reduce", {"count": 0, "bytes_per_token": 0})
    gather = s["collectives"].get("all_gather", {"bytes_per_token": 0})
    seconds = time.perf_counter() - started
    return (f"| {label} | {pipeline} | {s['params_per_rank'] / 1e9:.2f} B | {s['param_bytes_per_rank'] / 2**30:.1f} | "
            f"{s['kv_cache_bytes_per_token_per_rank']:,} | {seeds_kv(graph, world):,} | {s['kv_replication']} | "
            f"{reduce['count']} | {reduce['bytes_per_token'] / 2**20:.2f} | {gather['bytes_per_token'] / 2**10:.0f} | "
            f"{seconds:.1f} s |")


def main() -> None:
    print("| model | passes | params/rank | weights GiB/rank | KV B/token/rank (irc) | KV (seeds' rule) | ranks "
          "per KV entry | all-reduces/step | all-reduce MiB/token sent | all-gather KiB/token sent | analysis |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        print(row(*case), flush=True)


if __name__ == "__main__":
    main()
