"""State-space and hybrid models on ONNX Runtime's CPU provider, against attention of the same
width and depth, in one run. Prints tables; asserts nothing.

Models (DSL, seeded weights, f32, ``--target onnx-ort``; the shapes are those of the families,
the sizes chosen to run here):

- ``mamba2-130m``: Mamba-2, d_model 768, 24 layers, 24 heads x 64, state 128, 1 group, tied
  head, vocab 50,280 (the published Mamba-2-130M's shape);
- ``granite-h-small-ish``: Granite-4.0-H's layer pattern at that width: 24 layers, attention
  (12 heads, 4 kv, head_dim 64) on every 6th layer, Mamba-2 elsewhere, a SwiGLU MLP (d_ff
  2,048) after every mixer;
- ``llama-same``: every layer attention (12/4 heads) + the same SwiGLU MLP.

Measured, batch 1, 2 intra-op threads, plain onnxruntime sessions (the graph irc writes for
onnxruntime-genai, fed directly), medians over interleaved rounds:

- prefill ms at 128 / 1,024 / 4,096 tokens (empty caches, zero states);
- decode ms per token at contexts 128 -> 8,192 (a cache of that many past tokens, random, and
  random states: what one step costs at that point of a generation);
- memory per sequence (KV cache + states, from ``irc show``'s accounting) at those contexts;
- for Mamba-2, irc's ``LinearAttention`` lowering of ``ssd`` (ORT's com.microsoft kernel, the
  onnx-ort default) against its standard-op lowering (a ``Scan`` over tokens, the portable
  target's);

mobius-onnx 0.1.0 and onnxruntime-genai's builder build none of these families (their
refusals, twin by twin, are in ``benchmarks/ssm_families.py``), so they have no row here.

    python benchmarks/ssm.py [--rounds 3] [--quick]

The expected shape: the state-space layers' decode time and state memory are flat in context,
attention's grow with it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

import numpy as np

from common import interleaved, markdown_table, median_seconds
from backends.onnx import ssm as onnx_ssm  # noqa: E402
from backends.onnx.emit import emit_model  # noqa: E402
from backends.onnx.runtime import ort_session  # noqa: E402
from frontends.dsl import Model, Rope  # noqa: E402
from irc import dims  # noqa: E402
from irc.analysis import analyze, memory_against_context  # noqa: E402
from irc.text import format_bytes  # noqa: E402

THREADS = 2
PREFILL = (128, 1024, 4096)
CONTEXTS = (128, 1024, 4096, 8192)
VOCAB, D, LAYERS = 50280, 768, 24


def mamba2_130m() -> Model:
    m = Model("mamba2-130m", vocab=VOCAB, d_model=D)
    x = m.embed(m.input_ids())
    for layer in m.layers(LAYERS):
        x = x + layer.mamba2(layer.rms_norm(x, "ssm_norm"), heads=24, head_dim=64, state_size=128, groups=1,
                             norm_group_size=1536)
    m.logits(m.rms_norm(x, "norm"), tied=True)
    return m


def hybrid(attention_every: int, name: str) -> Model:
    m = Model(name, vocab=VOCAB, d_model=D)
    x = m.embed(m.input_ids())
    for layer in m.layers(LAYERS):
        if (layer.index + 1) % attention_every == 0:
            x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=12, kv_heads=4, head_dim=64,
                                    rope=Rope(base=1e4))
        else:
            x = x + layer.mamba2(layer.rms_norm(x, "ssm_norm"), heads=24, head_dim=64, state_size=128, groups=1,
                                 norm_group_size=1536)
        x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=2048)
    m.logits(m.rms_norm(x, "norm"), tied=True)
    return m


MODELS = {"mamba2-130m": mamba2_130m, "granite-h-small-ish": lambda: hybrid(6, "granite-h-small-ish"),
          "llama-same": lambda: hybrid(1, "llama-same")}


def compile_model(graph, folder: str, lowerings=None) -> str:
    path = os.path.join(folder, "model.onnx")
    emit_model(graph, path, target="onnx-ort", genai=False, lowerings=lowerings, context=max(CONTEXTS + PREFILL))
    return path


def feeds_for(session, graph, tokens: int, past: int, rng) -> dict:
    """Inputs of one step: ``tokens`` new ids after ``past`` cached ones (random caches and
    states; zero states when ``past`` is 0)."""
    feeds = {"input_ids": rng.integers(0, VOCAB, (1, tokens), dtype=np.int64),
             "attention_mask": np.ones((1, past + tokens), np.int64),
             "position_ids": np.arange(past, past + tokens, dtype=np.int64)[None, :]}
    for value in graph.inputs:
        if value.name.startswith("past_key_values."):
            shape = dims.evaluate_shape(value.shape, {"B": 1, "P": past})
            feeds[value.name] = (rng.standard_normal(shape).astype(np.float32) * 0.1 if past
                                 else np.zeros(shape, np.float32))
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def timed(session, feeds, repeats: int) -> float:
    """Median ms of ``repeats`` runs after one warm-up."""
    return median_seconds(lambda: session.run(None, feeds), repeats) * 1e3


def one_round(graph, path: str, prefill, contexts, rng) -> dict:
    """{("prefill", T) | ("decode", S): ms} in a fresh session of ``path``."""
    session = ort_session(path, THREADS)
    out = {("prefill", t): timed(session, feeds_for(session, graph, t, 0, rng), 1 if t >= 4096 else 2)
           for t in prefill}
    out.update({("decode", s): timed(session, feeds_for(session, graph, 1, s - 1, rng), 5) for s in contexts})
    return out


def measure(models: dict, rounds: int, prefill, contexts) -> dict:
    """name -> {("prefill", T) | ("decode", S): [ms per round]}, rounds interleaved."""
    rng = np.random.default_rng(0)
    runs = interleaved({name: lambda graph=graph, path=path: one_round(graph, path, prefill, contexts, rng)
                        for name, (graph, path) in models.items()}, rounds, progress="  ")
    return {name: {key: [cells[key] for cells in done] for key in done[0]} for name, done in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="prefill 128/1024, contexts 128/1024, one round")
    args = parser.parse_args()
    prefill, contexts, rounds = (PREFILL[:2], CONTEXTS[:2], 1) if args.quick else (PREFILL, CONTEXTS, args.rounds)
    tmp = tempfile.mkdtemp(prefix="irc-ssm-")
    try:
        built, summaries = {}, {}
        for name, make in MODELS.items():
            graph = make().graph
            summaries[name] = (analyze(graph), memory_against_context(graph, CONTEXTS))
            os.makedirs(os.path.join(tmp, name))
            built[name] = (graph, compile_model(graph, os.path.join(tmp, name)))
        mamba = built["mamba2-130m"][0]
        os.makedirs(os.path.join(tmp, "scan"))
        built["mamba2-130m (Scan ssd)"] = (mamba, compile_model(mamba, os.path.join(tmp, "scan"),
                                                                {"ssd": onnx_ssm.lower_ssd}))
        results = measure(built, rounds, prefill, contexts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nonnx-ort, batch 1, {THREADS} threads, median of {rounds} interleaved round(s)\n")
    table = []
    for name, rows in results.items():
        params = summaries.get(name.split(" ")[0], (None,))[0]
        table.append((name, f"{params['params_total'] / 1e6:.0f} M",
                      *(f"{statistics.median(rows[('prefill', t)]):.1f} ms" for t in prefill),
                      *(f"{statistics.median(rows[('decode', s)]):.2f} ms" for s in contexts)))
    markdown_table(("model", "params", *(f"prefill {t}" for t in prefill), *(f"decode @{s}" for s in contexts)), table)
    print("\nmemory per sequence (KV cache at f32 + states), irc's accounting\n")
    markdown_table(("model", *(f"@{s}" for s in CONTEXTS), "of which state"),
                   [(name, *(format_bytes(r["total_bytes"]) for r in memory),
                     format_bytes(summary["state_bytes_per_sequence"]))
                    for name, (summary, memory) in summaries.items()])
    scan, fused = results["mamba2-130m (Scan ssd)"], results["mamba2-130m"]
    print("\nMamba-2 ssd lowering on onnx-ort: com.microsoft LinearAttention vs standard-op Scan\n")
    pairs = {key: (statistics.median(fused[key]), statistics.median(scan[key]))
             for key in [("prefill", t) for t in prefill] + [("decode", s) for s in contexts]}
    markdown_table(("phase", "LinearAttention", "Scan", "Scan / LinearAttention"),
                   [(f"{key[0]} {key[1]}", f"{a:.2f} ms", f"{b:.2f} ms", f"{b / a:.2f}x")
                    for key, (a, b) in pairs.items()])


if __name__ == "__main__":
    main()
