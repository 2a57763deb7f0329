"""Hyper-connections (``frontends.dsl_hyper``) and Hunyuan-V4 (``frontends.hf.families_hyper``):
the DSL's hyper-connection and hyper head equal transformers' modules, in Hunyuan-V4's
independent form and DeepSeek-V4's manifold form (Sinkhorn); the Hunyuan-V4 twins (cases of
``test_hf_models``, which holds them against transformers through the interpreter and both
ONNX targets) depend on their indexer's selection and their experts' clamp, carry no ties at
the selection's boundary, and give the reference's results on the Triton interpreter and the
NumPy emitter; onnx-npu refuses their sorted experts' routing (moe_route) by name."""
import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_models import (CASES, SMALL, TOLERANCE, hf_logits, models, prompts,  # noqa: F401
                                            randomize, relative_error)
from tests.frontends.twins import check_numpy_and_triton

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HY_CASES = sorted(name for name in CASES if name.startswith("hy-v4-"))
STREAMS, WIDTH = 3, 8


def _module_graph(form: str, iters: int, magnitude: float):
    """A graph of one hyper-connection (entered and left) and one hyper head over inputs
    ``streams`` [B, T, N, d] and ``out`` [B, T, d]: outputs (block input, new streams, head)."""
    from frontends.dsl import ACTIVATION, Model, Tensor
    from frontends.dsl_hyper import HyperConnections

    m = Model("hc", vocab=4, d_model=WIDTH)
    hc = HyperConnections(m, STREAMS, WIDTH, 1e-5, 1e-6, form=form, magnitude=magnitude, sinkhorn_iters=iters)
    streams = Tensor(m, m.graph.add_input("streams", ACTIVATION, ("B", "T", STREAMS, WIDTH)))
    out = Tensor(m, m.graph.add_input("out", ACTIVATION, ("B", "T", WIDTH)))
    state, collapsed = hc.enter(streams, "hc.")
    graph = m.graph
    graph.outputs = [collapsed.value, hc.leave(state, out, "hc.").value, hc.head(streams, "head.").value]
    return graph


@pytest.mark.parametrize("form", ["independent", "manifold"])
def test_hyper_connections_equal_transformers_modules(form):
    from irc.interpreter import Interpreter

    if form == "independent":
        from transformers.models.hy_v4 import modeling_hy_v4 as module
        config = transformers.HYV4Config(hidden_size=WIDTH, hc_mult=STREAMS, hc_magnitude=1.5, rms_norm_eps=1e-5)
        block, head = module.HYV4HyperConnection(config), module.HYV4HyperHead(config)
    else:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as module
        config = transformers.DeepseekV4Config(hidden_size=WIDTH, hc_mult=STREAMS, rms_norm_eps=1e-5,
                                               hc_sinkhorn_iters=5)
        block, head = module.DeepseekV4HyperConnection(config), module.DeepseekV4HyperHead(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in [*block.parameters(), *head.parameters()]:
            p.copy_(0.5 * torch.randn(p.shape, generator=generator))
    graph = _module_graph(form, 5 if form == "manifold" else 0, 1.5)
    for name in ("fn", "base", "scale"):
        graph.params[f"hc.{name}"].data = getattr(block, name).detach().numpy()
        graph.params[f"head.{name}"].data = getattr(head, f"hc_{name}").detach().numpy()
    streams, out = torch.randn(2, 5, STREAMS, WIDTH, generator=generator), torch.randn(2, 5, WIDTH, generator=generator)
    got = list(Interpreter(graph).run({"streams": streams.numpy(), "out": out.numpy()}).values())
    with torch.no_grad():
        if form == "independent":
            post, collapsed = block(streams)
            mixed = streams
        else:
            post, comb, collapsed = block(streams)
            mixed = torch.matmul(comb.transpose(-1, -2), streams)
        want = [collapsed, post.unsqueeze(-1) * out.unsqueeze(-2) + mixed, head(streams)]
    for name, a, b in zip(("block input", "streams", "head"), got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def _variant(name: str, **changes):
    """The twin ``name`` rebuilt with ``changes`` (the same weights: none of them adds one)."""
    class_name, overrides = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides, **changes})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=1.0)
    return model


@pytest.mark.parametrize("name, changes", [("hy-v4-three-streams-shared-indexer", {"index_topk": 64}),
                                           ("hy-v4-two-streams-clamp-magnitude", {"index_topk": 64}),
                                           ("hy-v4-two-streams-clamp-magnitude", {"swiglu_limit": 1e4})])
def test_the_selection_and_the_clamp_change_transformers_logits(models, name, changes):  # noqa: F811
    model, _ = models(name)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got, other = hf_logits(model, ids, mask, positions), hf_logits(_variant(name, **changes), ids, mask, positions)
    assert relative_error(got[real], other[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", HY_CASES)
def test_no_visible_keys_tie_at_the_kth_place(models, monkeypatch, name):  # noqa: F811
    """torch.topk leaves the order of equal scores open, irc keeps the lower key index; ReLU'd
    index scores tie where every head is zero for two keys, so the twins (16 index heads)
    are checked free of ties at the selection's boundary on their "full" layers."""
    model, _ = models(name)
    seen, topk = [], torch.Tensor.topk

    def recording(self, *args, **kwargs):
        seen.append(self.detach().clone())
        return topk(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", recording)
    hf_logits(model, *prompts())
    k, full = model.config.index_topk, model.config.indexer_types.count("full")
    rows = [np.sort(row[row > -1e30])[::-1] for scores in seen if tuple(scores.shape) == (2, 11, 11)
            for row in scores.reshape(-1, 11).numpy()]
    assert len(rows) == 2 * 11 * full
    assert all(row[k - 1] > row[k] for row in rows if len(row) > k)


def test_triton_and_numpy_targets_match_the_reference(models, tmp_path):  # noqa: F811
    name = "hy-v4-three-streams-shared-indexer"
    check_numpy_and_triton(models(name)[1], tmp_path, name)


def test_onnx_npu_refuses_the_sorted_experts_by_name(models, tmp_path, capsys):  # noqa: F811
    """onnx-npu lowers the indexer's selection (backends/onnx_npu/sparse.py); the sorted
    experts' routing (``moe_route``) it has no lowering for."""
    from irc_cli.commands import main

    folder = models("hy-v4-two-streams-clamp-magnitude")[1]
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) != 0
    err = capsys.readouterr().err
    assert "'moe_route' has no NPU lowering for target onnx-npu" in err and "topk_mask" not in err.split("hint")[0]


def test_the_hub_names_are_the_ones_read(models):  # noqa: F811
    """The checkpoint holds the hub's names (transformers renames them on load): irc reads
    every tensor of it and no other."""
    from frontends.hf.weights import Checkpoint

    _, folder = models("hy-v4-two-streams-clamp-magnitude")
    stored = set(Checkpoint.find(str(folder)).files)
    assert "model.layers.0.hc_pre.hc_attn_layer.hc_fn" in stored and "model.hc_pre.hc_head.hc_head_fn" in stored
    graph = load_spec(folder)
    assert {"layers.0.attn_hc.fn", "hc_head.fn", "layers.1.moe.w_gate"} <= set(graph.params)


def test_the_full_size_config_counts_what_transformers_builds(tmp_path):
    """HYV4Config's defaults (tencent/Hy4-preview's sizes): irc's params are transformers'
    parameters plus its persistent buffers (the 33 MoE routers' e_score_correction_bias),
    58.3B; per token the per-head caches of 34 layers and the indexer keys of its 10 "full"
    ones (f32: the config names no dtype)."""
    from irc.analysis import analyze

    config = transformers.HYV4Config()
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    want = sum(t.numel() for t in model.state_dict().values())
    assert want - params == 33 * 256 and config.indexer_types.count("full") == 10
    summary = analyze(load_spec(tmp_path))
    assert summary["params_total"] == want and round(want / 1e9, 1) == 58.3
    assert summary["kv_cache_bytes_per_token"] == (34 * 32 * ((192 + 64) + 256) + 10 * 128) * 4


def test_transformers_own_names_read_alike(models, tmp_path):  # noqa: F811
    """The twin's tensors renamed as transformers' modules hold them (``attn_hc.fn``,
    ``self_attn.gate_proj``, ``hc_head.hc_fn``...): the same graph."""
    import re

    from safetensors.numpy import load_file, save_file

    _, folder = models("hy-v4-two-streams-clamp-magnitude")
    renames = [(r"\.hc_pre\.hc_", ".hc_"), (r"\.learnable_sink_param", ".sinks"), (r"\.linear_gate", ".gate_proj"),
               (r"\.hc_attn_layer\.hc_", ".attn_hc."), (r"\.hc_mlp_layer\.hc_", ".ffn_hc."), (r"\.hc_head_", ".hc_")]
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, value in tensors.items():
        for pattern, repl in renames:
            name = re.sub(pattern, repl, name)
        renamed[name] = value
    assert "model.hc_head.hc_fn" in renamed and "model.layers.1.ffn_hc.scale" in renamed
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    want, got = load_spec(folder), load_spec(tmp_path)
    for name, param in want.params.items():
        np.testing.assert_array_equal(got.params[name].array(), param.array(), err_msg=name)
