"""The Triton target on a GPU: each generated kernel and the whole decode step, against torch.

Builds a Llama-3-8B-shaped model (examples/llama3-8b.yaml, bf16, d 4096, 32/8 heads of
128, SwiGLU 14336, vocab 128256) with --layers layers, emits its Triton module, puts
random weights on the GPU and a KV cache of --context past tokens in a Session, and times
one decode step (B = --batch, T = 1):

1. per launch step of the emitted forward (one fused kernel, or a short sequence such as
   store-V + attention): the Triton time, the same graph nodes run as torch eager ops and
   through torch.compile (where it compiles), the step's ideal bytes and FLOPs (irc's
   cost rules, intermediates of a fused step not counted) and the fraction of the
   roofline it reaches: max(bytes / bandwidth, FLOPs / peak) / measured time;
2. the whole decode step: the emitted Session (Python launcher), the same step captured
   in a CUDA graph, torch eager and torch.compile over the same graph, and the roofline.

With --hybrid it builds a hybrid model instead (examples/nemotron-h-8b.yaml: Mamba-2 layers
beside attention, bf16; the layer pattern --pattern over --layers layers, the SSD chunked
by --chunk tokens as the scan-chunk pass sets it) and measures both a decode step at
--context past tokens (random recurrent states; the step kernels) and a prefill of
--prefill tokens (default 4,096: the conv kernel and the chunked SSD kernels), each with
the per-step table and the whole step's roofline.

The module runs with MIXED_DOT on (the bf16 weights' dots on tensor cores with the fp32
activations cast to bf16; --exact keeps fp32 dots) and prints its decode logits' error
against the torch eager run. Medians of CUDA-event timings; nothing is asserted. Peaks
default to the detected GPU's datasheet (H100/H200 SXM, A100), or --bandwidth-gbs /
--peak-tflops.

    python benchmarks/triton_gpu.py [--layers 2] [--batch 1] [--context 2048] [--spec ...]
    python benchmarks/triton_gpu.py --hybrid [--prefill 4096] [--chunk 64] [--pattern "M-*-"]
    python benchmarks/triton_gpu.py --interpret   # plumbing check on CPU: tiny model, times meaningless

Without a CUDA GPU (and without --interpret) it says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from functools import partial
import tempfile
import time

from common import ROOT

# datasheet peaks, dense 16-bit tensor-core TFLOP/s and HBM GB/s, by device name fragment
PEAKS = {"H200": (989.0, 4800.0), "H100": (989.0, 3350.0), "A100": (312.0, 2039.0), "L40S": (362.0, 864.0)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=os.path.join(ROOT, "examples", "llama3-8b.yaml"))
    parser.add_argument("--layers", type=int, default=2, help="decoder layers kept from the spec")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=2048, help="past tokens in the KV cache")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--bandwidth-gbs", type=float, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile columns")
    parser.add_argument("--exact", action="store_true",
                        help="keep MIXED_DOT off: fp32 dots (exact, slow) instead of 16-bit tensor-core dots")
    parser.add_argument("--hybrid", action="store_true",
                        help="a hybrid Mamba-2 + attention model (Nemotron-H): a decode step and a --prefill")
    parser.add_argument("--prefill", type=int, default=4096, help="--hybrid: the prefill's new tokens")
    parser.add_argument("--chunk", type=int, default=64, help="--hybrid: the chunk of the ssd/delta-rule prefill")
    parser.add_argument("--pattern", default="M-*-",
                        help="--hybrid: the layer letters (M Mamba-2, * attention, - MLP), repeated over --layers")
    parser.add_argument("--interpret", action="store_true",
                        help="run tiny-llama3 through Triton's interpreter on CPU (checks the plumbing only)")
    return parser.parse_args()


ARGS = parse_args()
if ARGS.hybrid:
    ARGS.spec = os.path.join(ROOT, "examples", "nemotron-h-8b.yaml")
    ARGS.layers = ARGS.layers if ARGS.layers % len(ARGS.pattern) == 0 else len(ARGS.pattern)
if ARGS.interpret:
    os.environ["TRITON_INTERPRET"] = "1"  # Triton's switch, set before triton is imported
    tiny = "tiny-nemotron-h-8b.yaml" if ARGS.hybrid else "tiny-llama3.yaml"
    ARGS.spec, ARGS.context, ARGS.repeat, ARGS.prefill = os.path.join(ROOT, "examples", tiny), 12, 2, 16
    ARGS.layers, ARGS.chunk = (ARGS.layers, 8) if ARGS.hybrid else (2, ARGS.chunk)

try:
    import torch
    import torch.nn.functional as F
    import triton  # noqa: F401
except ImportError as err:
    sys.exit(f"benchmarks/triton_gpu.py needs torch and triton (pip install -e .[triton]): {err}")
if not ARGS.interpret and not torch.cuda.is_available():
    print("benchmarks/triton_gpu.py needs a CUDA GPU: torch.cuda.is_available() is False here, so nothing was "
          "measured. Run it on a GPU machine (or with --interpret to check the plumbing on CPU).", file=sys.stderr)
    sys.exit(2)

import passes  # noqa: E402,F401
from backends.triton import DEFAULT_PIPELINE  # noqa: E402
from backends.triton.emit import load_module, module_source  # noqa: E402
from backends.triton.plan import Planner  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc import dims  # noqa: E402
from irc.analysis import node_cost  # noqa: E402
from irc.graph import Param  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402

DEVICE = torch.device("cpu" if ARGS.interpret else "cuda")
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i64": torch.int64,
                "i32": torch.int32}


# ---- the model -------------------------------------------------------------------------------

def build():
    """(graph, planner, emitted module, weights on the device)."""
    text = open(ARGS.spec).read()
    text = re.sub(r"n_layers:\s*\d+", f"n_layers: {ARGS.layers}", text, count=1)
    if ARGS.hybrid:
        text = re.sub(r'pattern:\s*"[^"]*"', f'pattern: "{ARGS.pattern}"', text, count=1)
    directory = tempfile.mkdtemp(prefix="irc_triton_bench_")
    spec = os.path.join(directory, os.path.basename(ARGS.spec))
    with open(spec, "w") as f:
        f.write(text)
    graph = load_spec(spec)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    for node in graph.nodes:  # the chunked prefill, as the scan-chunk pass asks for it
        if ARGS.hybrid and node.op in ("ssd", "gated_delta_rule"):
            node.attrs["chunk"] = ARGS.chunk
    planner = Planner(graph).run()
    path = os.path.join(directory, "model_tt.py")
    with open(path, "w") as f:
        f.write(module_source(graph, planner, source=ARGS.spec))
    module = load_module(path)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    weights = {}
    for param in {v.name: v for n in graph.nodes for v in n.inputs if isinstance(v, Param)}.values():
        scale = 1.0 if param.rank == 1 else param.shape[-1] ** -0.5
        data = torch.randn(param.shape, generator=generator, device=DEVICE) * scale
        weights[param.name] = (data + (1.0 if param.rank == 1 else 0.0)).to(TORCH_DTYPES[str(param.dtype)])
    weights.update({name: torch.from_numpy(array).to(DEVICE) for name, array in planner.weights.items()})
    return graph, planner, module, weights


# ---- timing --------------------------------------------------------------------------------

def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` (CUDA events on a GPU)."""
    fn()
    sync()
    samples = []
    for _ in range(repeat):
        if DEVICE.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def launch_sequence(planner) -> list[int]:
    """The step index of every launch_* call the forward makes, in order."""
    order = []
    for index, step in enumerate(planner.steps):
        for line in step.lines:
            order += [index] * len(re.findall(r"\blaunch_\w+\(", line))
    return order


def per_step_times(module, session, token, order, repeat, past) -> dict[int, float]:
    """Median seconds per planner step, timing each launch_* helper the forward calls."""
    names = [n for n in dir(module) if n.startswith("launch_")]
    originals = {n: getattr(module, n) for n in names}
    samples: dict[int, list] = {}
    calls = []

    def wrap(fn):
        def timed_launch(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            if DEVICE.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*args, **kwargs)
                end.record()
                end.synchronize()
                calls.append(start.elapsed_time(end) / 1e3)
            else:
                fn(*args, **kwargs)
                calls.append(time.perf_counter() - t0)
        return timed_launch

    for n in names:
        setattr(module, n, wrap(originals[n]))
    try:
        for _ in range(repeat):
            calls.clear()
            session.length = past
            session(token)
            per_step: dict[int, float] = {}
            for index, seconds in zip(order, calls):
                per_step[index] = per_step.get(index, 0.0) + seconds
            for index, seconds in per_step.items():
                samples.setdefault(index, []).append(seconds)
    finally:
        for n in names:
            setattr(module, n, originals[n])
    return {index: statistics.median(values) for index, values in samples.items()}


# ---- torch eager over the same graph ---------------------------------------------------------

INV_FREQ: dict = {}  # RoPE inverse frequencies per configuration, on the device (as HF keeps them)


def rope_eager(x, positions, attrs):
    from irc.ops.rope import rope_inv_freq

    head, rotary = attrs["head_dim"], attrs["rotary_dim"] or attrs["head_dim"]
    key = (rotary, attrs["base"], repr(attrs["scaling"]))
    if key not in INV_FREQ:
        inv, factor = rope_inv_freq(rotary, attrs["base"], attrs["scaling"])
        INV_FREQ[key] = (torch.from_numpy(inv).to(x.device), factor)
    inv, factor = INV_FREQ[key]
    angles = positions.float()[..., None] * inv
    cos, sin = (torch.cos(angles) * factor)[:, :, None], (torch.sin(angles) * factor)[:, :, None]
    x4 = x.view(*x.shape[:2], -1, head).float()
    half = rotary // 2
    if attrs["convention"] == "half":
        first, second = x4[..., :half], x4[..., half:rotary]
    else:
        first, second = x4[..., 0:rotary:2], x4[..., 1:rotary:2]
    out = x4.clone()
    if attrs["convention"] == "half":
        out[..., :half], out[..., half:rotary] = first * cos - second * sin, second * cos + first * sin
    else:
        out[..., 0:rotary:2], out[..., 1:rotary:2] = first * cos - second * sin, second * cos + first * sin
    return out.to(x.dtype).view(x.shape)


def attention_eager(q, k, v, mask, past_k, past_v, attrs):
    """Concatenate the past (as a dynamic cache does) and run SDPA with grouped KV heads."""
    b, t = q.shape[:2]
    heads, kv, d = attrs["heads"], attrs["kv_heads"], attrs["head_dim"]
    key = torch.cat([past_k, k.view(b, t, kv, d).transpose(1, 2)], dim=2)
    value = torch.cat([past_v, v.view(b, t, kv, -1).transpose(1, 2)], dim=2)
    s = key.shape[2]
    query_pos = torch.arange(s - t, s, device=q.device)[:, None]
    visible = torch.arange(s, device=q.device)[None, :] <= query_pos
    if attrs["window"]:
        visible &= torch.arange(s, device=q.device)[None, :] > query_pos - attrs["window"]
    out = F.scaled_dot_product_attention(q.view(b, t, heads, d).transpose(1, 2), key, value, attn_mask=visible,
                                         scale=attrs["scale"], enable_gqa=True)
    return out.transpose(1, 2).reshape(b, t, -1), key, value


def rms_norm_eager(x, w, attrs):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + attrs["eps"]) * (w.float() + attrs["offset"])
            ).to(x.dtype)


def embedding_eager(ids, table, attrs):
    return F.embedding(ids, table) * (attrs["scale"] or 1.0)


def _mixed(x, weight):  # 16-bit weights, fp32 activations: the dot in the weights' type, as MIXED_DOT
    return x.to(weight.dtype) if weight.dtype != x.dtype else x


def linear_eager(x, weight, bias=None, attrs=None):
    return F.linear(_mixed(x, weight), weight, bias).to(x.dtype)


def swiglu_eager(x, gate, up, down, attrs):
    h = F.silu(F.linear(_mixed(x, gate), gate).to(x.dtype)) * F.linear(_mixed(x, up), up).to(x.dtype)
    return F.linear(_mixed(h, down), down).to(x.dtype)


def cast_eager(x, attrs):  # the bf16 model's embedding -> f32 cast
    return x.to(TORCH_DTYPES[str(attrs["to"])])


def add_eager(a, b, attrs):
    return a + b


def mul_eager(a, b, attrs):
    return a * b


def silu_eager(x, attrs):
    return F.silu(x)


def softcap_eager(x, attrs):
    return attrs["cap"] * torch.tanh(x / attrs["cap"])


# op -> torch eager function(*operands, attrs) returning its output (a tuple for several)
EAGER = {"embedding": embedding_eager, "rms_norm": rms_norm_eager, "linear": linear_eager, "add": add_eager,
         "mul": mul_eager, "silu": silu_eager, "swiglu": swiglu_eager, "rope": rope_eager,
         "attention": attention_eager, "softcap": softcap_eager, "cast": cast_eager}


def eager_nodes(nodes, env, weights):
    for node in nodes:
        args = [None if v is None else weights[v.name] if isinstance(v, Param) else env[v.name] for v in node.inputs]
        result = EAGER[node.op](*args, attrs=node.attrs) if node.op == "linear" else EAGER[node.op](*args, node.attrs)
        for value, array in zip(node.outputs, result if isinstance(result, tuple) else (result,)):
            env[value.name] = array


# ---- roofline --------------------------------------------------------------------------------

def step_cost(nodes, graph, bindings) -> tuple[int, int]:
    """(bytes, FLOPs) of a step: node costs, less the intermediates a fused kernel keeps."""
    total_bytes, flops = 0, 0
    inside = {id(n) for n in nodes}
    for node in nodes:
        cost = node_cost(node, bindings)
        total_bytes += cost.bytes_read + cost.bytes_written
        flops += cost.flops
        for value in node.outputs:
            readers = [u for u in value.uses if id(u) in inside]
            if readers and value not in graph.outputs and len(readers) == len(value.uses):
                size = value.dtype.nbytes(dims.product(dims.evaluate_shape(value.shape, bindings)))
                total_bytes -= size * (1 + len(readers))
    return max(total_bytes, 0), flops


def main() -> None:
    graph, planner, module, weights = build()
    module.MIXED_DOT = not (ARGS.exact or ARGS.interpret)  # bf16 weights, fp32 activations: dots in bf16
    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "CPU (Triton interpreter)"
    peak, bandwidth = next((p for key, p in PEAKS.items() if key in name), (None, None))
    roofline = (ARGS.peak_tflops or peak or 1.0, ARGS.bandwidth_gbs or bandwidth or 1.0)
    print(f"{name}: {ARGS.spec} with {ARGS.layers} layer(s), B={ARGS.batch}; roofline {roofline[0]:g} TFLOP/s, "
          f"{roofline[1]:g} GB/s; MIXED_DOT={module.MIXED_DOT}")
    phases = [("decode step", 1, ARGS.context)]
    if ARGS.hybrid:
        phases.append((f"prefill (chunk {ARGS.chunk})", ARGS.prefill, 0))
    for label, new, past in phases:
        print(f"\n== {label}: T={new} new token(s) after P={past} past ==")
        measure(graph, planner, module, weights, label, new, past, roofline)
    if ARGS.interpret:
        print("(--interpret: CPU interpreter timings, meaningless as performance)")


def phase_session(graph, module, weights, new: int, past: int):
    """(a Session holding ``past`` random cache positions and random recurrent states, the new ids)."""
    session = module.Session(weights, batch=ARGS.batch, capacity=past + new)
    for buffer in session.storage.values():
        buffer.normal_()
    for buffer in session.states.values():  # a decode step's states: as after a long prompt
        buffer.normal_().mul_(0.1 if past else 0.0)
    token = torch.randint(0, graph.meta["vocab_size"], (ARGS.batch, new), device=DEVICE)
    return session, token


def measure(graph, planner, module, weights, label: str, new: int, past: int, roofline) -> None:
    """The per-step table and the whole step (Triton, CUDA graph, torch eager/compile where
    every op has an eager form) for T = ``new`` tokens after ``past``, against the roofline."""
    peak, bandwidth = roofline
    session, token = phase_session(graph, module, weights, new, past)

    def triton_step():
        session.length = past
        return session(token)

    per_step = per_step_times(module, session, token, launch_sequence(planner), ARGS.repeat, past)
    bindings = {"B": ARGS.batch, "T": new, "P": past}
    env = {"input_ids": token, "position_ids": torch.arange(past, past + new, device=DEVICE).expand(ARGS.batch, new),
           "attention_mask": torch.ones((ARGS.batch, past + new), dtype=torch.int64, device=DEVICE)}
    env.update({n: buf[:, :, :past] for n, buf in session.storage.items()})
    eager_ok = all(node.op in EAGER for node in graph.nodes)  # a hybrid's recurrent ops have none: n/a
    values = dict(env)
    if eager_ok:  # every value of the step, so each step's eager nodes run on real inputs
        eager_nodes(graph.nodes, values, weights)
    print(f"{'step':<40} {'kernels':<34} {'triton us':>9} {'eager us':>9} {'compile us':>10} {'MB':>8} "
          f"{'GFLOP':>7} {'roof us':>8} {'% roof':>6}")
    for index, step in enumerate(planner.steps):
        if index in per_step:
            print_step(step, per_step[index], graph, bindings, values if eager_ok else None, weights, roofline)
    whole = timed(triton_step, ARGS.repeat)
    graphed = cuda_graph_time(triton_step) if DEVICE.type == "cuda" else None
    total_bytes, total_flops = step_cost(graph.nodes, graph, bindings)
    roof = max(total_bytes / (bandwidth * 1e9), total_flops / (peak * 1e12))
    print(f"\nwhole {label}: triton {whole * 1e3:.3f} ms (Python launcher), {_ms(graphed)} (CUDA graph); "
          f"roofline {roof * 1e3:.3f} ms ({total_bytes / 1e9:.3f} GB, {total_flops / 1e9:.2f} GFLOP), "
          f"{100 * roof / whole:.1f}% of it")
    if eager_ok:
        logits = triton_step()["logits"].float()
        error = float((logits - values["logits"].float()).abs().max() / values["logits"].float().abs().max())
        print(f"logits, Triton against torch eager: {error:.2e} relative")
        eager = timed(partial(eager_nodes, graph.nodes, dict(env), weights), ARGS.repeat)
        compiled = compiled_time(partial(eager_nodes, graph.nodes, dict(env), weights))
        print(f"torch eager {eager * 1e3:.3f} ms, torch.compile {_ms(compiled)} over the same graph")


def print_step(step, seconds: float, graph, bindings, values, weights, roofline) -> None:
    """One row of the per-step table (eager columns n/a when ``values`` is None)."""
    peak, bandwidth = roofline
    nodes = step.nodes
    eager = compiled = None
    if values is not None:
        eager = timed(partial(eager_nodes, nodes, dict(values), weights), ARGS.repeat)
        compiled = compiled_time(partial(eager_nodes, nodes, dict(values), weights))
    nbytes, flops = step_cost(nodes, graph, bindings)
    roof = max(nbytes / (bandwidth * 1e9), flops / (peak * 1e12))
    label = (nodes[0].name + (f" (+{len(nodes) - 1})" if len(nodes) > 1 else ""))[:40] if nodes else "(torch)"
    print(f"{label:<40} {','.join(step.kernels)[:34]:<34} {seconds * 1e6:>9.1f} "
          f"{_us(eager):>9} {_us(compiled):>10} {nbytes / 1e6:>8.2f} {flops / 1e9:>7.3f} {roof * 1e6:>8.1f} "
          f"{100 * roof / seconds:>5.1f}%")


def compiled_time(fn):
    """Seconds of ``fn`` through torch.compile, or None (skipped, or it does not compile)."""
    if ARGS.no_compile or ARGS.interpret:
        return None
    try:
        torch._dynamo.reset()  # a fresh dynamo cache per compile: past recompile_limit (8) dynamo silently runs eager
        return timed(torch.compile(fn), ARGS.repeat)
    except Exception as err:  # noqa: BLE001 -- report n/a: torch.compile does not take every step
        print(f"  torch.compile failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
        return None


def cuda_graph_time(step):
    """The decode step replayed from a CUDA graph (no Python launch overhead), or None."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.synchronize()
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            step()
        return timed(captured.replay, ARGS.repeat)
    except Exception as err:  # noqa: BLE001 -- capture is best effort
        print(f"  CUDA graph capture failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
        return None


def _us(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def _ms(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"


if __name__ == "__main__":
    main()
