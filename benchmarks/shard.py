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

Then, for the record (not a goal: a CPU is not where tensor parallelism pays), the wall time of
a decode step on this CPU of a small Llama (d 512, 8 layers, 8 / 2 heads, ffn 1408, vocab
32000, random weights) as one ONNX model in onnxruntime (tp 1) and as two rank models
(``shard{tp=2}``, ``--target onnx-ort``) in two processes whose all-reduces go through
torch.distributed's gloo (``tests/backends/onnx_world.py``: each rank's model cut at its
collectives, the pieces run by onnxruntime), one intra-op thread a process; medians of
``STEPS`` greedy steps after a 64-token prompt (``--no-gloo`` skips it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
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


SMALL = """
model:
  name: small-llama
  vocab_size: 32000
  d_model: 512
  n_layers: 8
  norm: {kind: rms, eps: 1.0e-5}
  attention: {kind: gqa, n_heads: 8, n_kv_heads: 2, head_dim: 64, rope: {base: 10000, convention: half}}
  mlp: {kind: swiglu, d_ff: 1408}
"""
STEPS, PROMPT = 32, 64


def gloo_rows() -> list:
    """(label, median ms a step, steps) at tp 1 and tp 2 (module docstring)."""
    os.environ.update(ORT_THREADS="1", WORLD_STEPS=str(STEPS))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "backends"))
    import numpy as np
    import onnx_world
    import passes  # noqa: F401
    from backends.onnx.emit import emit_model
    from backends.onnx.shard import emit_sharded
    from frontends.yaml_spec import loads
    from irc.interpreter import random_feeds
    from irc.passmanager import PassManager, parse_pipeline

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        graph = loads(SMALL)
        feeds = random_feeds(graph, batch=1, tokens=PROMPT, seed=0)
        feeds = {k: v for k, v in feeds.items() if not k.startswith("past_key_values.")}
        feeds.update({v.name: np.zeros((1, 2, 0, 64), np.float32) for v in graph.inputs
                      if v.name.startswith("past_key_values.")})
        whole = emit_model(graph, os.path.join(tmp, "whole", "model.onnx"), target="onnx-ort", genai=False)
        for threads in (1, 2):
            os.environ["ORT_THREADS"] = str(threads)
            runner = onnx_world.Runner(whole.path)
            _, tokens = onnx_world.greedy(runner, feeds, steps=STEPS)
            rows.append((f"tp 1 (one process, {threads} thread{'s' * (threads > 1)})",
                         statistics.median(runner.times) * 1e3, tokens))
        os.environ["ORT_THREADS"] = "1"
        PassManager(parse_pipeline("shard{tp=2}")).run(graph)
        emit_sharded(graph, os.path.join(tmp, "tp2", "model.onnx"), target="onnx-ort")
        results = onnx_world.run_world(os.path.join(tmp, "gloo.store"), [os.path.join(tmp, "tp2")], [feeds], 2)[0]
        step = [max(a, b) for a, b in zip(results[0]["times"], results[1]["times"])]
        rows.append(("tp 2 (two processes, 1 thread each, gloo)", statistics.median(step) * 1e3,
                     results[0]["tokens"].tolist()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gloo", action="store_true", help="skip the CPU decode-step timing")
    args = parser.parse_args()
    print("| model | passes | params/rank | weights GiB/rank | KV B/token/rank (irc) | KV (seeds' rule) | ranks "
          "per KV entry | all-reduces/step | all-reduce MiB/token sent | all-gather KiB/token sent | analysis |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        print(row(*case), flush=True)
    if args.no_gloo:
        return
    rows = gloo_rows()
    print(f"\nSmall Llama (d 512, 8 layers), decode step after a {PROMPT}-token prompt, median of {STEPS} steps, "
          "this CPU:\n\n| world | ms / step | tokens/s | same tokens as tp 1 |\n|---|---|---|---|")
    for label, ms, tokens in rows:
        print(f"| {label} | {ms:.2f} | {1e3 / ms:.0f} | {tokens == rows[0][2]} |")


if __name__ == "__main__":
    main()
