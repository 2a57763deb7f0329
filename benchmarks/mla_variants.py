"""MLA in ONNX Runtime (CPU): decode time of the three forms of DeepSeek's attention on a
DeepSeek-V2-Lite-shaped random model, with each form's bytes and FLOPs per token.

Forms: ``un-absorbed`` (no pass: per-head K and V cached), ``runtime`` (``mla-absorb``, the
default: the checkpoint's weights, W^UK and W^UV applied per head at run time) and
``folded`` (``mla-absorb{fold_weights=true}``: W^UK and W^UV folded into the query and output
weights). Both absorbed forms cache the latent + RoPE key (576 elements per token per layer).

The model: DeepSeek-V2-Lite's attention exactly (d 2048, 16 heads, direct query, d_c 512,
nope 128, rope 64, v 128, YaRN) and its vocabulary (102,400), but only ``--layers`` layers
(default 4; the real model has 27, 16 B parameters, too many for this machine), each with a
dense SwiGLU of width 11,264 in place of the MoE: the width one token reads there (6 routed +
2 shared experts of 1,408). fp32 weights (ORT's CPU provider has no bf16 MatMul).

Each decode step is timed at a given context by feeding a random past cache of P = context - 1
tokens (no prefill is run), one token, batch 1, 2 intra-op threads, the onnx-ort target.
Rounds are interleaved (un-absorbed, runtime, folded, un-absorbed, ...); medians reported.
The host is shared and noisy: compare the ratios within one run.

    python benchmarks/mla_variants.py [--layers 4] [--contexts 1024,8192] [--rounds 5] [--steps 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from common import compile_graph, interleaved, median_seconds, text_table

SPEC = """model:
  name: deepseek-v2-lite-{layers}l
  dtype: f32
  vocab_size: 102400
  d_model: 2048
  n_layers: {layers}
  norm: {{kind: rms, eps: 1.0e-6}}
  attention:
    kind: mla
    n_heads: 16
    q_lora_rank: null
    kv_lora_rank: 512
    qk_nope_head_dim: 128
    qk_rope_head_dim: 64
    v_head_dim: 128
    rope:
      base: 10000
      convention: interleaved
      scaling: {{kind: yarn, factor: 40, original_max_position: 4096, beta_fast: 32, beta_slow: 1,
                mscale: 0.707, mscale_all_dim: 0.707}}
  mlp: {{kind: swiglu, d_ff: 11264}}
  tied_embeddings: false
"""
FORMS = {"un-absorbed": "", "runtime": "mla-absorb", "folded": "mla-absorb{fold_weights=true}"}


def build(form: str, layers: int, directory: str):
    """(graph after the form's pass and the onnx-ort pipeline, model path)."""
    from backends.onnx.targets import DEFAULT_OPSET, TARGETS
    from frontends import load_spec
    from irc.weights import seed_absent

    spec = os.path.join(directory, "spec.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(layers=layers))
    graph = load_spec(spec)
    seed_absent(graph)
    pipeline = ",".join(p for p in (FORMS[form], TARGETS["onnx-ort"].pipeline(DEFAULT_OPSET)) if p)
    path = os.path.join(directory, f"{form}.onnx")
    compile_graph(graph, path, pipeline, target="onnx-ort", genai=False)
    return graph, path


def decode_feeds(graph, context: int, rng) -> dict:
    from irc import dims
    from irc.analysis import cache_inputs

    past = context - 1
    feeds = {"input_ids": rng.integers(0, 102400, (1, 1)), "attention_mask": np.ones((1, context), np.int64),
             "position_ids": np.full((1, 1), past, np.int64)}
    for cache in cache_inputs(graph):
        shape = dims.evaluate_shape(cache.shape, {"B": 1, "P": past})
        feeds[cache.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def time_steps(path: str, feeds: dict, steps: int) -> float:
    """Median seconds of ``steps`` decode steps in a fresh 2-thread session."""
    from backends.onnx.runtime import ort_session

    session = ort_session(path, 2)
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    return median_seconds(lambda: session.run(None, feeds), steps)  # the session goes with the return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    from irc.analysis_mla import count, mla_forms, size

    with tempfile.TemporaryDirectory() as directory:
        built = {}
        for form in FORMS:
            start = time.perf_counter()
            built[form] = build(form, args.layers, directory)
            print(f"built {form} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        trade = mla_forms(built["runtime"][0], contexts=tuple(contexts), devices=())
        numbers = {f["form"]: f for f in trade["forms"]}
        rng = np.random.default_rng(0)
        feeds = {(form, c): decode_feeds(built[form][0], c, rng) for form in FORMS for c in contexts}
        samples = interleaved({(form, c): lambda form=form, c=c: time_steps(built[form][1], feeds[form, c], args.steps)
                               for c in contexts for form in FORMS}, args.rounds)
        sizes = {form: os.path.getsize(path) + sum(os.path.getsize(os.path.join(directory, n))
                                                   for n in os.listdir(directory) if n.startswith(f"{form}.onnx."))
                 for form, (_, path) in built.items()}
    print(f"DeepSeek-V2-Lite-shaped, {args.layers} of 27 layers, dense SwiGLU 11,264 for the MoE, fp32, "
          f"ORT CPU onnx-ort, batch 1, 2 threads; medians of {args.rounds} rounds x {args.steps} steps "
          "(a shared, loaded machine)")
    header = ("form", "params", "ONNX file", "context", "decode ms", "vs runtime", "FLOPs/tok", "KV/tok",
              "bytes read/tok")
    rows = []
    for c in contexts:
        base = statistics.median(samples["runtime", c])
        for form in FORMS:
            f, t = numbers[form], statistics.median(samples[form, c])
            rows.append((form, f"{f['params']:,}", size(sizes[form]), f"{c:,}", f"{t * 1e3:.1f}", f"{t / base:.2f}x",
                         count(f["flops_per_token"][c]), size(f["kv_bytes_per_token"]),
                         size(f["bytes_per_token"][c])))
    text_table(header, rows)


if __name__ == "__main__":
    main()
