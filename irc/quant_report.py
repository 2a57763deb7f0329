"""How much a ``quantize`` run costs in accuracy: per-tensor SQNR and end-to-end logits.

``quantization_report(float_graph, quant_graph, prompts)`` returns a JSON-able dict and
``format_report`` renders it as text:

- per quantized tensor (each ``dequant_linear`` / ``dequantize`` weight, by its float
  name): the signal-to-quantization-noise ratio 10·log10(Σw² / Σ(w - ŵ)²) in dB, the
  largest absolute error, and the largest error in quantization steps (at most 0.5 for
  RTN: every element within half a step of its float value);
- end to end: both graphs run through the reference interpreter on the same token
  prompts (``default_prompts``: seeded), each prompt as a prefill of its first half then
  one token at a time through each graph's own KV cache (so an int8 cache is exercised);
  the logits at every position are compared: relative error (max |Δ| / max |float|, the
  ``--check`` measure, and the RMS ratio ‖Δ‖/‖float‖) and top-1 agreement (the fraction
  of positions where both graphs pick the same next token);
- for a recurrent model (a graph with conv or recurrent states), the error against
  position: ``position_curve`` runs both graphs chunk by chunk through their own states
  over up to 4,096 positions and reports the logits error and top-1 agreement per bucket
  ending at 128, 1,024 and 4,096 (``position_marks``), since a recurrence's error compounds
  along the sequence where attention's does not;
- param bytes before and after, and logical parameter counts (``logical_param_count``:
  a quantized weight counts its N·K float elements; scales and zero points count none).

Both graphs need weight data: seed the float graph (``irc.weights.seed_absent``) before
quantizing a copy of it, so the quantized params' lazy data can read their float sources.

``gaussian_rtn_sqnr_db`` is the theoretical SQNR of symmetric max-abs RTN on Gaussian
weights, the figure the measured one is held against (see its docstring).
"""
from __future__ import annotations

import math
import re
from typing import Optional, Sequence

import numpy as np

from irc import dims
from irc.analysis import EMPTY
from irc.graph import Graph, Param
from irc.evaluate import DEFAULT_WINDOW, perplexity_and_agreement
from irc.ops.quant import dequantize_blocks, quantize_blocks
from irc.check import relative_error
from irc.weights import materialize, read_rows

QUANT_OPS = {"dequant_linear": 1, "dequantize": 0, "dequant_embedding": 1}  # op -> index of its qweight operand


# ---- per tensor ------------------------------------------------------------------------------

def sqnr_db(reference, approximation) -> float:
    """10·log10(Σ reference² / Σ (reference - approximation)²); inf when they are equal."""
    ref = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum((ref - np.asarray(approximation, dtype=np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def weight_error(weight, qweight, scales, zero_points, *, bits: int, block_size: int) -> dict:
    """SQNR (dB), max absolute error and max error in steps (|w - ŵ| / scale) of one
    quantized weight [..., N, K] against its float values."""
    w = np.asarray(weight, dtype=np.float32)
    k = w.shape[-1]
    approx = dequantize_blocks(qweight, scales, zero_points, bits=bits, block_size=block_size, k=k)
    error = np.abs(approx.astype(np.float64) - w)
    step = np.repeat(np.asarray(scales, dtype=np.float64), block_size, axis=-1)[..., :k]
    steps = np.divide(error, step, out=np.zeros_like(error), where=step > 0)
    return {"sqnr_db": sqnr_db(w, approx), "max_abs_error": float(error.max()), "max_error_steps": float(steps.max()),
            "max_abs_weight": float(np.abs(w).max())}


def quantized_weights(graph: Graph) -> list[tuple[str, list, dict]]:
    """(float name, [qweight, scales, zero_points or None] params, attrs) of each quantized
    weight read in ``graph``, once each, in graph order."""
    seen, found = set(), []
    for node in graph.nodes:
        if node.op not in QUANT_OPS:
            continue
        start = QUANT_OPS[node.op]
        parts = (list(node.inputs) + [None] * 3)[start:start + 3]
        qweight = parts[0]
        if not isinstance(qweight, Param) or qweight.name in seen:
            continue
        seen.add(qweight.name)
        name = qweight.name[:-len(".qweight")] if qweight.name.endswith(".qweight") else qweight.name
        found.append((name, parts, node.attrs))
    return found


_ROWS = re.compile(r"^(.*)\.rows_(\d+)_(\d+)$")


def float_weight(float_graph: Graph, name: str) -> Optional[np.ndarray]:
    """The float values of quantized weight ``name``: its param in ``float_graph``, or for a
    row piece ``<param>.rows_<start>_<stop>`` (``quantize`` cuts a recurrence's Δ rows out of
    a projection) those rows of the param; None without data."""
    source = float_graph.params.get(name)
    if source is not None:
        return None if source.data is None else materialize(source)
    match = _ROWS.match(name)
    source = float_graph.params.get(match.group(1)) if match else None
    if source is None or source.data is None:
        return None
    return read_rows(source, int(match.group(2)), int(match.group(3)))


def tensor_report(float_graph: Graph, quant_graph: Graph, baseline: bool = False) -> list[dict]:
    """One row per quantized weight with data (module docstring); with ``baseline``, also
    ``sqnr_rtn_db``: the SQNR max-abs RTN (``quantize_blocks``) gets with the same bits,
    block and symmetry, the figure a searched method is held against. One weight at a time."""
    rows = []
    for name, (qweight, scales, zero_points), attrs in quantized_weights(quant_graph):
        weight = float_weight(float_graph, name)
        if weight is None:
            continue
        arrays = [None if p is None else materialize(p) for p in (qweight, scales, zero_points)]
        bits, block = attrs["bits"], attrs["block_size"]
        row = {"name": name, "shape": list(weight.shape), "bits": bits, "block_size": block,
               "symmetric": zero_points is None, "float_bytes": weight.nbytes,
               "quantized_bytes": sum(p.nbytes for p in (qweight, scales, zero_points) if p is not None)}
        row.update(weight_error(weight, *arrays, bits=bits, block_size=block))
        if baseline:
            rtn = quantize_blocks(weight, bits=bits, block_size=block, symmetric=zero_points is None,
                                  scale_dtype=np.asarray(arrays[1]).dtype.name)
            row["sqnr_rtn_db"] = weight_error(weight, *rtn, bits=bits, block_size=block)["sqnr_db"]
        rows.append(row)
    return rows


def pass_report(float_graph: Graph, quant_graph: Graph, method: str, tokens: Optional[Sequence[int]] = None,
                window: int = DEFAULT_WINDOW, kept: Sequence[dict] = (), positions: int = 0) -> dict:
    """What one ``quantize`` run reports in the dump stats: per tensor, SQNR of ``method``
    and of RTN; a summary (bytes before and after, mean and min SQNR both ways); ``kept``,
    the params it kept float on purpose and why (a recurrence's Δ path and own parameters);
    with ``tokens``, ``eval``: perplexity of both graphs over the text and top-1 agreement
    (``irc.evaluate.perplexity_and_agreement``, streamed); for a graph with a recurrent
    state and ``positions`` > 0, ``positions``: the error against position
    (``position_curve``) over the first ``positions`` of ``tokens`` (seeded ids without)."""
    tensors = tensor_report(float_graph, quant_graph, baseline=method != "rtn")
    report = {"method": method, "tensors": tensors, "summary": _summary(float_graph, quant_graph, tensors),
              "kept": [dict(k) for k in kept]}
    if tokens is not None:
        result = perplexity_and_agreement(float_graph, quant_graph, tokens, window)
        report["eval"] = {"tokens": result["tokens"], "window": result["window"], "positions": result["positions"],
                          "perplexity_float": result["perplexity"]["reference"],
                          "perplexity_quantized": result["perplexity"]["candidate"],
                          "top1_agreement": result["top1_agreement"]}
    if positions and has_recurrent_state(float_graph):
        absent = [p.name for g in (float_graph, quant_graph) for p in g.params.values() if p.data is None]
        if absent:
            report["positions"] = {"skipped": f"@{absent[0]} has no weights (a shape-only compile)"}
        else:
            ids = list(tokens[:positions]) if tokens is not None else \
                default_prompts(int(float_graph.meta.get("vocab_size", 2)), 1, positions)[0]
            report["positions"] = position_curve(float_graph, quant_graph, ids)
    return report


def format_pass_report(report: dict) -> str:
    """``pass_report`` in a few lines (what ``irc compile`` prints)."""
    summary = report["summary"]
    mb = 1e6
    lines = [f"quantize ({report['method']}): {summary['tensors']} tensors; params "
             f"{summary['param_bytes_float'] / mb:.1f} MB -> {summary['param_bytes_quantized'] / mb:.1f} MB"]
    if summary["mean_sqnr_db"] is not None:
        line = f"  SQNR mean {summary['mean_sqnr_db']:.2f} dB, min {summary['min_sqnr_db']:.2f} dB"
        if summary["mean_sqnr_rtn_db"] is not None:
            line += f" (rtn: mean {summary['mean_sqnr_rtn_db']:.2f} dB, min {summary['min_sqnr_rtn_db']:.2f} dB)"
        lines.append(line)
    result = report.get("eval")
    if result:
        lines.append(f"  eval text, {result['tokens']} tokens: perplexity {result['perplexity_float']:.3f} (float) -> "
                     f"{result['perplexity_quantized']:.3f} (quantized); top-1 agreement "
                     f"{result['top1_agreement']:.1%}")
    curve = report.get("positions") or {}
    if curve.get("skipped"):
        lines.append(f"  error against position: skipped ({curve['skipped']})")
    for row in curve.get("rows", []):
        lines.append(f"  positions {row['start']}-{row['stop']}: logits rms relative error "
                     f"{row['rms_relative_error']:.4g}, max {row['max_relative_error']:.4g}; top-1 agreement "
                     f"{row['top1_agreement']:.1%}")
    if report.get("kept"):
        kinds = sorted({re.sub(r"(^|\.)layers\.\d+\.", r"\1layers.*.", k["name"]) for k in report["kept"]})
        lines.append(f"  kept float on purpose ({len(report['kept'])} params): {', '.join(kinds)}")
    return "\n".join(lines) + "\n"


def _summary(float_graph: Graph, quant_graph: Graph, tensors: list) -> dict:
    def mean(key):
        values = [t[key] for t in tensors if key in t and math.isfinite(t[key])]
        return float(np.mean(values)) if values else None

    def least(key):
        values = [t[key] for t in tensors if key in t]
        return min(values) if values else None

    return {"tensors": len(tensors), "param_bytes_float": sum(p.nbytes for p in float_graph.params.values()),
            "param_bytes_quantized": sum(p.nbytes for p in quant_graph.params.values()),
            "mean_sqnr_db": mean("sqnr_db"), "min_sqnr_db": least("sqnr_db"),
            "mean_sqnr_rtn_db": mean("sqnr_rtn_db"), "min_sqnr_rtn_db": least("sqnr_rtn_db")}


def logical_param_count(graph: Graph) -> int:
    """Parameters as float elements: a quantized weight counts N·K (its qweight's logical
    size: the ``K`` attribute times the other dims of its scales), its scales and zero
    points count nothing; every other param its element count."""
    quantized = {}
    for _, parts, attrs in quantized_weights(graph):
        for part in parts:
            if part is not None:
                quantized[part.name] = 0
        quantized[parts[0].name] = dims.product(parts[1].shape[:-1]) * attrs["K"]
    return sum(quantized.get(p.name, p.numel) for p in graph.params.values())


# ---- end to end ------------------------------------------------------------------------------

def default_prompts(vocab: int, count: int = 4, length: int = 12, seed: int = 0) -> list[list[int]]:
    """``count`` seeded prompts of ``length`` token ids below ``vocab``."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, length)] for _ in range(count)]


def prompt_logits(graph: Graph, prompts: Sequence[Sequence[int]], seed: int = 0) -> list[np.ndarray]:
    """Logits [len(prompt), V] per prompt: a prefill of the first half, then one token at a
    time, each step fed the graph's own present caches (batch 1; the whole prompt at once
    when the graph has no caches)."""
    from irc.interpreter import Interpreter, past_inputs, present_name

    interpreter = Interpreter(graph.clone(), seed)
    names = {v.name for v in graph.inputs}
    caches = past_inputs(graph)
    results = []
    for prompt in prompts:
        split = max(1, len(prompt) // 2) if caches else len(prompt)
        chunks = [list(prompt[:split])] + [[t] for t in prompt[split:]]
        state = {c.name: np.zeros(dims.evaluate_shape(c.shape, {"B": 1, **EMPTY}), c.dtype.numpy) for c in caches}
        past, logits = 0, []
        for chunk in chunks:
            t = len(chunk)
            feeds = {"input_ids": np.asarray([chunk], np.int64),
                     "attention_mask": np.ones((1, past + t), np.int64),
                     "position_ids": np.arange(past, past + t, dtype=np.int64)[None, :], **state}
            outputs = interpreter.run({k: v for k, v in feeds.items() if k in names})
            logits.append(np.asarray(outputs["logits"][0], dtype=np.float32))
            state = {name: outputs[present_name(name)] for name in state}
            past += t
        results.append(np.concatenate(logits, axis=0))
    return results


def logits_agreement(float_logits: list, quant_logits: list) -> dict:
    """Relative error (max and RMS) and top-1 agreement over every position of every prompt."""
    f = np.concatenate(float_logits, axis=0).astype(np.float64)
    q = np.concatenate(quant_logits, axis=0).astype(np.float64)
    return {"positions": int(f.shape[0]),
            "logits_max_relative_error": max(relative_error(a, b) for a, b in zip(quant_logits, float_logits)),
            "logits_rms_relative_error": float(np.linalg.norm(q - f) / np.linalg.norm(f)),
            "top1_agreement": float(np.mean(np.argmax(q, axis=-1) == np.argmax(f, axis=-1)))}


def quantization_report(float_graph: Graph, quant_graph: Graph, prompts: Optional[Sequence[Sequence[int]]] = None,
                        seed: int = 0) -> dict:
    """The report (module docstring) of ``quant_graph`` against ``float_graph``; ``prompts``
    default to ``default_prompts`` for the graph's vocabulary."""
    if prompts is None:
        prompts = default_prompts(int(float_graph.meta.get("vocab_size", 2)), seed=seed)
    tensors = tensor_report(float_graph, quant_graph)
    sqnrs = [t["sqnr_db"] for t in tensors]
    float_bytes = sum(p.nbytes for p in float_graph.params.values())
    quant_bytes = sum(p.nbytes for p in quant_graph.params.values())
    report = {
        "model": quant_graph.name,
        "params": {"float": logical_param_count(float_graph), "quantized": logical_param_count(quant_graph)},
        "param_bytes": {"float": float_bytes, "quantized": quant_bytes,
                        "ratio": quant_bytes / float_bytes if float_bytes else None},
        "int8_kv_cache": any(n.op == "quantize_kv" for n in quant_graph.nodes),
        "tensors": tensors,
        "tensor_summary": {"count": len(tensors), "min_sqnr_db": min(sqnrs, default=None),
                           "mean_sqnr_db": float(np.mean(sqnrs)) if sqnrs else None,
                           "max_abs_error": max((t["max_abs_error"] for t in tensors), default=None),
                           "max_error_steps": max((t["max_error_steps"] for t in tensors), default=None)},
        "prompts": [list(map(int, p)) for p in prompts],
    }
    report["end_to_end"] = logits_agreement(prompt_logits(float_graph, prompts, seed),
                                            prompt_logits(quant_graph, prompts, seed))
    return report


def format_report(report: dict) -> str:
    """The report as a text table."""
    e2e, size = report["end_to_end"], report["param_bytes"]
    lines = [f"quantization report: {report['model']}",
             f"  params {report['params']['float']:,} -> {report['params']['quantized']:,} (logical elements); "
             f"bytes {size['float']:,} -> {size['quantized']:,} ({size['ratio']:.3f}x)",
             f"  int8 KV cache: {'yes' if report['int8_kv_cache'] else 'no'}",
             "",
             f"  {'tensor':<32} {'shape':<14} {'scheme':<14} {'SQNR dB':>8} {'max |err|':>10} {'steps':>6}"]
    for t in report["tensors"]:
        scheme = f"int{t['bits']} b{t['block_size']} {'sym' if t['symmetric'] else 'asym'}"
        shape = "x".join(map(str, t["shape"]))
        lines.append(f"  {t['name']:<32} {shape:<14} {scheme:<14} {t['sqnr_db']:>8.2f} {t['max_abs_error']:>10.4g} "
                     f"{t['max_error_steps']:>6.3f}")
    lines += ["",
              f"  end to end over {len(report['prompts'])} prompts, {e2e['positions']} positions:",
              f"    logits relative error: max {e2e['logits_max_relative_error']:.4g}, "
              f"rms {e2e['logits_rms_relative_error']:.4g}",
              f"    top-1 agreement: {e2e['top1_agreement']:.1%}"]
    return "\n".join(lines) + "\n"


# ---- error against position (recurrent models) -----------------------------------------------

POSITION_MARKS = (128, 1024, 4096)
CHUNK = 256


def has_recurrent_state(graph: Graph) -> bool:
    """Does ``graph`` carry a recurrent or conv state between calls?"""
    return any(v.name.endswith((".recurrent_state", ".conv_state")) for v in graph.inputs)


def position_marks(positions: int) -> list[int]:
    """The ends of the position buckets: the ``POSITION_MARKS`` below ``positions``, then ``positions``."""
    return [mark for mark in POSITION_MARKS if mark < positions] + [positions]


def chunk_logits(graph: Graph, tokens: Sequence[int], chunk: int = CHUNK, between=None, seed: int = 0):
    """Logits [t, V] (float32) of each consecutive chunk of ``tokens`` (batch 1), each chunk
    fed the present caches and states of the one before; ``between(states) -> states``, when
    given, rewrites them between chunks (a simulated state precision)."""
    from irc.interpreter import Interpreter, past_inputs, present_name

    interpreter = Interpreter(graph.clone(), seed)
    names = {v.name for v in graph.inputs}
    state = {c.name: np.zeros(dims.evaluate_shape(c.shape, {"B": 1, **EMPTY}), c.dtype.numpy)
             for c in past_inputs(graph)}
    for past in range(0, len(tokens), chunk):
        ids = list(tokens[past:past + chunk])
        feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, past + len(ids)), np.int64),
                 "position_ids": np.arange(past, past + len(ids), dtype=np.int64)[None, :], **state}
        outputs = interpreter.run({k: v for k, v in feeds.items() if k in names})
        state = {name: outputs[present_name(name)] for name in state}
        if between is not None:
            state = between(state)
        yield np.asarray(outputs["logits"][0], dtype=np.float32)


def error_by_position(reference_chunks, candidate_chunks, marks: Sequence[int]) -> list[dict]:
    """Per bucket of positions [previous mark, mark): the logits' RMS relative error
    ‖Δ‖/‖reference‖, max relative error max|Δ| / max|reference| and top-1 agreement, from
    two streams of logits chunks (each reduced to per-position sums as it arrives)."""
    sums = {"d2": [], "f2": [], "dmax": [], "fmax": [], "agree": []}
    for f, q in zip(reference_chunks, candidate_chunks):
        f, q = f.astype(np.float64), q.astype(np.float64)
        d = q - f
        for key, values in (("d2", (d * d).sum(-1)), ("f2", (f * f).sum(-1)), ("dmax", np.abs(d).max(-1)),
                            ("fmax", np.abs(f).max(-1)), ("agree", f.argmax(-1) == q.argmax(-1))):
            sums[key].append(values)
    per = {key: np.concatenate(values) for key, values in sums.items()}
    rows, start = [], 0
    for mark in marks:
        span = slice(start, min(mark, per["d2"].shape[0]))
        rows.append({"start": start, "stop": span.stop,
                     "rms_relative_error": float(np.sqrt(per["d2"][span].sum() / per["f2"][span].sum())),
                     "max_relative_error": float(per["dmax"][span].max() / per["fmax"][span].max()),
                     "top1_agreement": float(per["agree"][span].mean())})
        start = span.stop
    return rows


def position_curve(float_graph: Graph, quant_graph: Graph, tokens: Sequence[int], chunk: int = CHUNK,
                   between=None) -> dict:
    """{"tokens", "chunk", "rows"}: ``error_by_position`` of ``quant_graph`` against
    ``float_graph`` over ``tokens`` run chunk by chunk through their own states
    (``chunk_logits``; ``between`` applies to the quantized graph's), buckets ending at
    ``position_marks(len(tokens))``."""
    rows = error_by_position(chunk_logits(float_graph, tokens, chunk),
                             chunk_logits(quant_graph, tokens, chunk, between), position_marks(len(tokens)))
    return {"tokens": len(tokens), "chunk": chunk, "rows": rows}


# ---- theory ----------------------------------------------------------------------------------

def gaussian_rtn_sqnr_db(bits: int, group: int) -> float:
    """Theoretical SQNR (dB) of symmetric max-abs RTN on i.i.d. Gaussian weights in groups.

    With w ~ N(0, σ²) and a group of n, the scale is s = M / q, M = max|w_i| and
    q = 2^(bits-1) - 1. The element at the maximum maps to ±q exactly (no error); each of
    the other n - 1 rounds with an error close to uniform on [-s/2, s/2] (the step, ~0.35σ
    for int4 g32, is small against the density's curvature), variance s²/12. So

        MSE = (n - 1)/n · E[M²] / (12 q²),   SQNR = σ² / MSE,

    and E[M²]/σ² = ∫₀^∞ 2m (1 - erf(m/√2)^n) dm (the max of n half-normals), integrated
    numerically here. int4 g32: E[M²]/σ² = 5.7095, SQNR = 10·log10(12·49·32 / (31·5.7095))
    = 20.27 dB; g64 19.36 dB, g128 18.62 dB.
    """
    q = 2 ** (bits - 1) - 1
    m = np.linspace(0.0, 12.0, 120_001)
    erf = np.vectorize(math.erf)(m / math.sqrt(2.0))
    tail = 2.0 * m * (1.0 - erf ** group)
    second_moment = float(np.sum((tail[1:] + tail[:-1]) * np.diff(m)) / 2.0)
    mse = (group - 1) / group * second_moment / (12.0 * q * q)
    return 10.0 * math.log10(1.0 / mse)


__all__ = ["quantization_report", "pass_report", "format_pass_report", "format_report", "default_prompts",
           "gaussian_rtn_sqnr_db", "sqnr_db", "position_curve", "chunk_logits", "error_by_position",
           "position_marks", "has_recurrent_state", "POSITION_MARKS",
           "weight_error", "logical_param_count", "prompt_logits"]
