"""The ``moe`` op's ``identity_experts`` (LongCat-Flash's zero-computation experts, which
``frontends.hf.families_moe_2026d`` reads): the reference against transformers'
LongcatFlashMoE, the dense and per-token references alike, the ONNX lowerings (both targets,
with and without moe-sort) and moe-sort through the interpreter against the reference, and
the op's shape checks; and LongCat-Flash's twin (a ``test_hf_models`` case, as the families'
other twins) on the targets beyond the interpreter and ONNX Runtime: Triton's default pipeline
(moe-sort) in its interpreter, the NumPy emitter bit for bit, onnx-npu's greedy tokens."""
from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from irc import ops  # noqa: E402
from irc.build import emit1  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.errors import ShapeError  # noqa: E402
from irc.graph import Graph, Value  # noqa: E402
from irc.ops.moe import OPERANDS, moe_dense, moe_per_token  # noqa: E402
from irc.testing import run_op  # noqa: E402

D, F, E, Z, K = 16, 8, 4, 3, 3
B, T = 2, 5
NAMES = [spec.rstrip("?") for spec in OPERANDS]
ATTRS = {"experts": E, "identity_experts": Z, "top_k": K, "scoring": "softmax", "norm_topk_prob": False,
         "routed_scale": 2.0}


def weights(seed: int) -> dict:
    rng = np.random.default_rng(seed)

    def randn(*shape, s=1.0):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = dict.fromkeys(NAMES)
    w.update(x=randn(B, T, D), router=randn(E + Z, D, s=D ** -0.5), w_gate=randn(E, F, D, s=0.5),
             w_up=randn(E, F, D, s=0.5), w_down=randn(E, D, F, s=0.5), router_bias=randn(E + Z, s=0.1))
    return w


def irc_moe(w, attrs=ATTRS):
    (out,) = run_op("moe", [w[name] for name in NAMES], attrs)
    return out


def test_identity_experts_match_transformers_longcat_moe():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMoE

    w = weights(1)
    config = transformers.LongcatFlashConfig(hidden_size=D, n_routed_experts=E, zero_expert_num=Z, moe_topk=K,
                                             expert_ffn_hidden_size=F, routed_scaling_factor=2.0)
    block = LongcatFlashMoE(config).eval()
    with torch.no_grad():
        block.router.classifier.weight.copy_(torch.from_numpy(w["router"]))
        block.router.e_score_correction_bias.copy_(torch.from_numpy(w["router_bias"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["w_down"]))
        want = block(torch.from_numpy(w["x"])).numpy()
    got = irc_moe(w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    ids = np.argsort(-(w["x"].reshape(-1, D) @ w["router"].T), axis=-1)[:, :K]
    assert (ids >= E).any(), "no token chose an identity expert: the test would not see them"


def test_dense_and_per_token_references_agree():
    w = weights(2)
    operands = [w[name] for name in NAMES]
    routing = {key: ATTRS.get(key, default) for key, default in (
        ("top_k", K), ("scoring", "softmax"), ("norm_topk_prob", False), ("routed_scale", 2.0))}
    np.testing.assert_allclose(moe_dense(*operands, **routing), moe_per_token(*operands, **routing), rtol=1e-5,
                               atol=1e-6)


def moe_graph(w, attrs=ATTRS) -> Graph:
    g = Graph("moe_identity")
    x = g.add_input("x", DType.f32, ("B", "T", D))
    inputs = [x] + [g.add_param(f"moe.{name}", DType.f32, w[name].shape, w[name])
                    for name in ("router", "w_gate", "w_up", "w_down", "router_bias")]
    g.outputs = [emit1(g, "moe", inputs, attrs, "out")]
    return g


@pytest.mark.parametrize("sort", [False, True], ids=["moe", "moe-sorted"])
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_lowerings_equal_the_reference(tmp_path, target, sort):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    w = weights(3)
    path = str(tmp_path / "moe.onnx")
    graph = moe_graph(w)
    emit_model(apply_pass(MoeSort(), graph)[0] if sort else graph, path, target=target, genai=False)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": w["x"]})
    want = irc_moe(w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_moe_sort_keeps_the_identity_experts():
    from irc.interpreter import Interpreter
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    w = weights(4)
    sorted_graph, changed = apply_pass(MoeSort(), moe_graph(w))
    assert changed and not any(node.op == "moe" for node in sorted_graph.nodes)
    (got,) = Interpreter(sorted_graph).run({"x": w["x"]}).values()
    np.testing.assert_allclose(got, irc_moe(w), rtol=1e-5, atol=1e-6)
    left, changed = apply_pass(MoeSort(capacity_factor=1.25), moe_graph(w))
    assert not changed and any(node.op == "moe" for node in left.nodes)


@pytest.mark.parametrize("change, message", [
    ({"identity_experts": -1}, "identity_experts must be a non-negative int"),
    ({"identity_experts": 1}, "router [7,16] should be [5,16]"),
    ({"top_k": 8}, "top_k must be in 1..7"),
])
def test_shape_checks(change, message):
    values = [Value("x", DType.f32, (2, 3, D)), Value("r", DType.f32, (E + Z, D)), Value("g", DType.f32, (E, F, D)),
              Value("u", DType.f32, (E, F, D)), Value("d", DType.f32, (E, D, F))]
    with pytest.raises(ShapeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs({**ATTRS, **change}))


# ---- LongCat-Flash's twin on the other targets ---------------------------------------------

LONGCAT = "longcat-flash-zero-experts-shortcut"


@pytest.fixture(scope="module")
def longcat(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.frontends.test_hf_models import build_case, built_once
    return str(built_once(build_case, tmp_path_factory)(LONGCAT)[1])


def test_longcat_triton_prefill_matches_the_reference(longcat, tmp_path):
    from backends.onnx import runtime
    from frontends import load_spec
    from tests.frontends.test_hf_models import TOLERANCE, irc_logits, prompts, relative_error
    from tests.frontends.test_hf_targets import triton_engine

    graph, engine = triton_engine(longcat, tmp_path, LONGCAT)
    assert not any(n.op == "moe" for n in graph.nodes)  # moe-sort's grouped GEMMs, the identity experts split off
    ids, mask, positions = prompts()
    rows = [ids[0].tolist(), ids[1][mask[1] == 1].tolist()]
    result = runtime.greedy(engine, graph, rows, 3)
    real = mask.astype(bool)
    want = irc_logits(load_spec(longcat), ids, mask, positions)[real]
    assert relative_error(np.asarray(result["prefill"]["logits"])[real], want) <= TOLERANCE


def test_longcat_numpy_module_matches_the_reference_exactly(longcat, tmp_path):
    from frontends import load_spec
    from irc.interpreter import random_feeds
    from tests.backends.test_numpy_emit import assert_matches_interpreter

    graph = load_spec(longcat)
    assert_matches_interpreter(graph, random_feeds(graph, batch=2, tokens=3, past=2, left_pad=1), tmp_path)


def test_longcat_onnx_npu_f32_generates_the_reference_tokens(longcat, tmp_path):
    from backends.onnx_npu.host import generate
    from frontends import load_spec
    from irc.interpreter import generate as reference_generate
    from irc_cli.commands import main
    from tests.frontends.test_hf_models import prompts

    prompt = prompts()[0][0].tolist()
    expected, _ = reference_generate(load_spec(longcat), prompt, 4)
    assert main(["compile", longcat, "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) == 0
    assert generate(str(tmp_path / "npu"), prompt, 4) == expected


def test_beams_query_scale_holds_past_max_position_embeddings(tmp_path):
    """Beam's NoPE query scale (1 + (p + 1) / 2048) ** 0.1 is computed at every position, not
    looked up in a table over max_position_embeddings: a twin whose max_position_embeddings (8)
    the prompt and its 16 greedy tokens outrun gives transformers' tokens."""
    from frontends import load_spec
    from irc.interpreter import generate
    from tests.frontends.test_hf_models import CASES, SMALL, hf_greedy_tokens, prompts, randomize, save_twin

    transformers = pytest.importorskip("transformers")
    kind, overrides = CASES["beam-gate-nope-scale-depth-residuals"]
    config = getattr(transformers, kind)(**{**SMALL, **overrides, "max_position_embeddings": 8})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=3, norm_centre=1.0)
    _, folder = save_twin(model, tmp_path / "hf")
    prompt = prompts()[0][0].tolist()
    tokens, _ = generate(load_spec(folder), prompt, 16)
    assert tokens == hf_greedy_tokens(model, prompt, 16)
