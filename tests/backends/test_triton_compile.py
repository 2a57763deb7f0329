"""Every generated Triton kernel compiles for real NVIDIA GPUs with none present.

The tiny examples (and an int4 model, for the dequant kernels) are emitted; a fresh Python
process without TRITON_INTERPRET imports each module and calls ``triton.compile`` on every
distinct kernel (the same text in two modules compiles once) for GPUTarget("cuda", 90, 32)
(H100) and ("cuda", 80, 32) (A100), in two processes side by side. The matmul, attention,
MLA, MoE, dequant and chunked recurrent (SSD, delta rule: two models emitted with
chunk=64) kernels are also compiled for sm_90 with MIXED on (their dots in 16 bits, as
MIXED_DOT runs them) and their PTX must hold tensor-core instructions (wgmma, or
mma.sync for tiles under 64 rows such as a decode step's; the GEMMs' 64-row tiles must
use wgmma); the chunked recurrent kernels also for sm_80 (mma.sync).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:  # the optional `triton` extra (not imported here: the
    pytest.skip("triton is not installed", allow_module_level=True)  # interpreter tests import it their way)

import passes  # noqa: E402,F401  (registers the passes)
from backends.triton import DEFAULT_PIPELINE  # noqa: E402
from backends.triton.emit import emit_module  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from irc.testing import one_graph  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHUNKED = "chunked"  # a spec's pipeline: the default one, then chunk=64 on ssd and gated_delta_rule
CHUNK_KERNELS = {"ssd_chunk_state", "ssd_chunk_scan", "delta_chunk_solve", "delta_chunk_scan"}

COMPILER = textwrap.dedent("""
    import importlib.util, json, re, sys, warnings
    warnings.filterwarnings("ignore")
    jobs, paths = [(job.split(":") + [""])[:3] for job in sys.argv[1].split(",")], sys.argv[2:]
    modules = []
    for index, path in enumerate(paths):
        spec = importlib.util.spec_from_file_location(f"emitted_{index}", path)
        modules.append((path, importlib.util.module_from_spec(spec)))
        spec.loader.exec_module(modules[-1][1])
    results = {}
    for capability, tensor_cores, families in jobs:  # families: "ssd|delta" (name prefixes), or all
        seen, done = set(), {}
        for path, module in modules:
            for name, (signature, constexprs, tensor_types) in module.KERNEL_SPECS.items():
                fn = getattr(module, name)
                while not hasattr(fn, "src"):
                    fn = fn.fn
                key = (re.sub('"' * 3 + "[\\s\\S]*?" + '"' * 3, "", fn.src), repr(signature))  # docstrings differ
                wanted = not families or name.split("_")[0] in families.split("|")
                if key in seen or (tensor_cores == "1" and tensor_types is None) or not wanted:
                    continue
                seen.add(key)
                compiled = module.compile_kernels(int(capability), tensor_cores=tensor_cores == "1",
                                                  names=[name])[name]
                ptx = compiled.asm["ptx"]
                done[f"{path}:{name}"] = {"wgmma": "wgmma." in ptx, "mma": "mma.sync" in ptx or "wgmma." in ptx}
        results[":".join(filter(None, (capability, tensor_cores, families)))] = done
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("triton_compile")
    specs = [(p.stem, DEFAULT_PIPELINE) for p in sorted(EXAMPLES.glob("tiny-*.yaml")) if one_graph(p)]
    specs.append(("tiny-mixtral-8x7b", DEFAULT_PIPELINE + ",lower-mlp,quantize{bits=4,group=32,symmetric=false}"))
    specs += [(stem, CHUNKED) for stem in ("tiny-mamba2-2.7b", "tiny-qwen3-next-80b-a3b")]
    paths = []
    for index, (stem, pipeline) in enumerate(specs):
        graph = load_spec(str(EXAMPLES / f"{stem}.yaml"))
        seed_absent(graph)
        PassManager(parse_pipeline(DEFAULT_PIPELINE if pipeline == CHUNKED else pipeline)).run(graph)
        for node in graph.nodes:  # a chunked prefill, as the scan-chunk pass asks for it
            if pipeline == CHUNKED and node.op in ("ssd", "gated_delta_rule"):
                node.attrs["chunk"] = 64
        path = directory / f"m{index}_{stem.replace('-', '_')}.py"
        emit_module(graph, str(path))
        paths.append(str(path))
    return paths


def compile_all(paths: list[str], processes: list[str]) -> dict:
    """One compiler process per entry of ``processes`` ("90:0,90:1": sm_90, then sm_90 with
    fp16 operands), run concurrently; returns {"90:0": {kernel: PTX facts}, ...}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    procs = [subprocess.Popen([sys.executable, "-c", COMPILER, jobs, *paths], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for jobs in processes]
    results = {}
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-4000:]
        results.update(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.fixture(scope="module")
def compiled(emitted) -> dict:
    """Two processes for two cores: sm_90 and its tensor-core check, and sm_80 with the
    recurrent kernels' tensor-core check on sm_80."""
    return compile_all(emitted, ["90:0,90:1", "80:0,80:1:ssd|delta"])


def test_every_kernel_compiles_for_sm90_and_sm80(compiled):
    sm90, sm80 = compiled["90:0"], compiled["80:0"]
    assert sm90 and set(sm90) == set(sm80)
    families = {name.rsplit(":", 1)[1].split("_")[0] for name in sm90}
    assert {"matmul", "attention", "mla", "moe", "dequant", "rope", "store", "embedding", "conv", "scan", "ssd",
            "delta", "gated"} <= families


def test_dot_kernels_use_tensor_cores_on_sm90(compiled):
    sm90 = compiled["90:1"]
    names = {name.rsplit(":", 1)[1] for name in sm90}
    assert {"matmul", "matmul_silu_glu", "attention_prefill", "attention_decode", "mla_decode", "moe_glu_gemm",
            "moe_down_gemm", "dequant_matmul"} <= names
    assert all(result["mma"] for result in sm90.values()), [n for n, r in sm90.items() if not r["mma"]]
    gemms = [name for name in sm90 if name.endswith((":matmul", ":matmul_silu_glu", ":dequant_matmul"))]
    assert gemms and all(sm90[name]["wgmma"] for name in gemms), "sm_90 GEMM tiles of 64 rows use wgmma"


def test_chunked_recurrent_kernels_use_tensor_cores(compiled):
    """The chunked SSD and delta-rule kernels' matmuls (tl.dot, tiles of 32 in the check)
    become mma on sm_80 and sm_90 with 16-bit operands."""
    for job in ("90:1", "80:1:ssd|delta"):
        found = {name.rsplit(":", 1)[1]: result for name, result in compiled[job].items()}
        assert CHUNK_KERNELS <= set(found), (job, sorted(found))
        assert all(found[name]["mma"] for name in CHUNK_KERNELS), (job, found)
