"""One tiny twin per model_type of ``test_hf_models`` (the breadth families: Cohere, Falcon,
GLM-4, GPT-2, GPT-NeoX, OLMo, Phi, StarCoder2, ...) on the targets whose kernels are not ONNX
Runtime's standard ones:

- ``--target triton`` (its default pipeline), run by Triton's interpreter on CPU: the prefill
  logits of the left-padded batch of two equal the reference interpreter's within 1e-4;
- the NumPy emitter: the generated module, run where irc cannot be imported, gives the
  reference interpreter's outputs bit for bit (2 rows, 3 new tokens after 2 past, the last row
  left-padded);
- ``--target onnx-npu`` in f32 on ONNX Runtime's CPU provider (static chunk and decode
  graphs, the host loop): the long row's greedy tokens equal the reference interpreter's.
  The dynamic-NTK Llama twin is left out there: the ONNX backends refuse dynamic RoPE by
  design (it depends on the longest position at run time).

Transformers is the judge of the reference interpreter in ``test_hf_models``; here the
reference interpreter is the judge of the targets."""
import numpy as np
import pytest

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

from frontends import load_spec  # noqa: E402
from tests.frontends.test_hf_models import CASES, TOLERANCE, build_case, irc_logits, prompts, relative_error  # noqa: E402

pytest.importorskip("transformers")
STEPS = 4
ONE_PER_TYPE = sorted({CASES[name][0]: name for name in sorted(CASES, reverse=True)}.values())
# onnx-npu refuses by name: JetMoE's mixture of attention is sorted-MoE ops (moe_route, moe_dispatch,
# grouped_gemm) that target does not lower; Hunyuan-V4's experts are too (its indexer's selection lowers)
NPU_REFUSED = {"jetmoe-moa-top2-gqa": "op 'moe_route' has no NPU lowering",
               "hy-v4-three-streams-shared-indexer": "op 'moe_route' has no NPU lowering",
               # Ergo's per-expert output norms and ZAYA1's router MLP are written with the same sorted-MoE ops
               "ergo-dense-then-moe-scaled-full": "op 'moe_route' has no NPU lowering",
               "zaya-cca-two-taps-tied": "op 'moe_route' has no NPU lowering",
               # Inkling's attention is primitives over slot indices (range_like, dim_size) and its MoE sorted-MoE ops
               # DeepSeek-V4's compressed windows count cache slots (dim_size, range_like over P + T)
               "deepseek-v4-compressed-hash-routed": "op 'dim_size' has no NPU lowering",
               **{name: "op 'range_like' has no NPU lowering" for name in (
                   "inkling-mqa-full-then-sliding-all-moe-top1", "inkling2-mqa-full-first-blocks-of-1-top1",
                   "inkling2-loop-mqa-two-passes-post-loop-layer")}}
STATIC_ROPE = [name for name in ONE_PER_TYPE if name != "llama-dynamic-rope" and name not in NPU_REFUSED]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cache = {}

    def folder(name):
        if name not in cache:
            cache[name] = build_case(name, tmp_path_factory.mktemp(name) / "hf")[1]
        return cache[name]
    return folder


def triton_engine(folder, tmp_path, source: str) -> tuple:
    """(the graph after Triton's default pipeline, an engine running its emitted module in
    Triton's interpreter: feeds -> NumPy outputs), for ``backends.onnx.runtime.greedy``."""
    pytest.importorskip("triton")
    import passes  # noqa: F401  (registers the passes)
    from backends.triton import DEFAULT_PIPELINE
    from backends.triton.emit import emit_module, load_module
    from irc.passmanager import PassManager, parse_pipeline

    graph = load_spec(str(folder))
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    emit_module(graph, str(tmp_path / "m_tt.py"), source=source)
    module = load_module(str(tmp_path / "m_tt.py"))
    weights = module.load_weights()

    def engine(feeds):
        out = module.forward(weights, **feeds)
        return {k: v.cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in out.items()}
    return graph, engine


@pytest.mark.parametrize("name", ONE_PER_TYPE)
def test_triton_prefill_matches_the_reference(folders, tmp_path, name):
    from backends.onnx import runtime

    folder = folders(name)
    graph, engine = triton_engine(folder, tmp_path, name)
    ids, mask, positions = prompts()
    result = runtime.greedy(engine, graph, [ids[0].tolist(), ids[1][mask[1] == 1].tolist()], STEPS)
    real = mask.astype(bool)
    want = irc_logits(load_spec(str(folder)), ids, mask, positions)[real]
    assert relative_error(np.asarray(result["prefill"]["logits"])[real], want) <= TOLERANCE


@pytest.mark.parametrize("name", STATIC_ROPE)
def test_onnx_npu_f32_generates_the_reference_tokens(folders, tmp_path, name):
    from backends.onnx_npu.host import generate
    from irc.interpreter import generate as reference_generate
    from irc_cli.commands import main

    folder = folders(name)
    prompt = prompts()[0][0].tolist()
    expected, _ = reference_generate(load_spec(str(folder)), prompt, STEPS)
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) == 0
    assert generate(str(tmp_path / "npu"), prompt, STEPS) == expected


@pytest.mark.parametrize("name", sorted(NPU_REFUSED))
def test_onnx_npu_refuses_what_it_cannot_lower_by_name(folders, tmp_path, capsys, name):
    from irc_cli.commands import main

    assert main(["compile", str(folders(name)), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context",
                 "32", "--chunk", "4", "--quiet", "--precision", "f32"]) != 0
    assert NPU_REFUSED[name] in capsys.readouterr().err


@pytest.mark.parametrize("name", ONE_PER_TYPE)
def test_numpy_module_matches_the_reference_exactly(folders, tmp_path, name):
    from irc.interpreter import random_feeds
    from tests.backends.test_numpy_emit import assert_matches_interpreter

    graph = load_spec(str(folders(name)))
    assert_matches_interpreter(graph, random_feeds(graph, batch=2, tokens=3, past=2, left_pad=1), tmp_path)
