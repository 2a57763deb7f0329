"""The encoder form against transformers 5.24: a tiny EmbeddingGemma-shaped twin
(``gemma3_text`` with ``use_bidirectional_attention: true``, sliding and full layers) and a
Qwen3-Embedding-shaped one (a causal ``qwen3`` with sentence-transformers' last-token
pooling), saved as transformers saves them, give the base model's (``AutoModel``)
``last_hidden_state`` on padded batches of two through the reference interpreter and both
ONNX targets (<= 1e-4 relative on the real tokens), and the ``sentence_embedding`` of
sentence-transformers' Pooling / Dense / Normalize arithmetic (written out below from
sentence-transformers 6.2's ``Pooling._forward_padded``, ``Dense.forward`` and
``Normalize.forward``; the package is not installed here)."""
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from frontends.dsl import Model, Rope
from irc.errors import SpecError
from irc.interpreter import Interpreter
from irc.ops.attention import visible_keys
from irc.parser import parse_graph
from irc.printer import print_graph
from irc.testing import check_golden
from irc_cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOLERANCE = 1e-4
SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CASES = {  # name: (config class, overrides, saved as the base model or as the causal LM, modules)
    "gemma3-bidirectional": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=6, use_bidirectional_attention=True,
                                                      layer_types=["sliding_attention", "full_attention",
                                                                   "sliding_attention"]), "base", None),
    "gemma3-bidirectional-causal-lm-layout": ("Gemma3TextConfig", dict(
        head_dim=8, num_key_value_heads=1, sliding_window=5, use_bidirectional_attention=True,
        attn_logit_softcapping=5.0, query_pre_attn_scalar=8), "lm", None),
    "qwen3-lasttoken": ("Qwen3Config", dict(head_dim=16, num_key_value_heads=1, tie_word_embeddings=True), "base",
                        dict(pooling={"pooling_mode_lasttoken": True}, dense=[], normalize=True)),
}
GEMMA_MODULES = dict(pooling={"pooling_mode_mean_tokens": True},
                     dense=[dict(out_features=48, bias=False, activation_function="torch.nn.modules.linear.Identity"),
                            dict(out_features=24, bias=True, activation_function="torch.nn.modules.activation.Tanh")],
                     normalize=True)


def randomize(model, seed: int, norm_centre: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(norm_centre + 0.2 * noise if p.ndim == 1 else noise * p.shape[-1] ** -0.5)


def write_modules(folder, width: int, pooling: dict, dense: list, normalize: bool, seed: int = 0) -> list:
    """sentence-transformers' files, as its save() writes them: modules.json, 1_Pooling,
    k_Dense (config.json + model.safetensors with linear.weight/bias), Normalize. Returns
    the Dense layers as torch modules, for the reference arithmetic."""
    generator = torch.Generator().manual_seed(seed)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    os.makedirs(folder / "1_Pooling", exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": width, **{k: False for k in LEGACY}, **pooling, "include_prompt": True},
        indent=2))
    width *= max(1, sum(bool(pooling.get(k)) for k in LEGACY)) if "pooling_mode" not in pooling else \
        len([pooling["pooling_mode"]] if isinstance(pooling["pooling_mode"], str) else pooling["pooling_mode"])
    layers = []
    for k, spec in enumerate(dense):
        path = f"{k + 2}_Dense"
        os.makedirs(folder / path, exist_ok=True)
        config = {"in_features": width, **spec}
        (folder / path / "config.json").write_text(json.dumps(config, indent=2))
        linear = torch.nn.Linear(width, spec["out_features"], bias=spec["bias"])
        with torch.no_grad():
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * width ** -0.5)
            if spec["bias"]:
                linear.bias.copy_(0.2 * torch.randn(linear.bias.shape, generator=generator))
        safetensors_torch.save_file({f"linear.{n}": t.contiguous() for n, t in linear.state_dict().items()},
                                    str(folder / path / "model.safetensors"))
        tanh = spec["activation_function"].endswith("Tanh")
        layers.append((linear, tanh))
        modules.append({"idx": k + 2, "name": str(k + 2), "path": path, "type": "sentence_transformers.models.Dense"})
        width = spec["out_features"]
    if normalize:
        index = len(modules)
        os.makedirs(folder / f"{index}_Normalize", exist_ok=True)
        modules.append({"idx": index, "name": str(index), "path": f"{index}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    return layers


LEGACY = ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_tokens",
          "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
MODE_OF = dict(zip(LEGACY, ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")))


def st_pool(token_embeddings, attention_mask, modes) -> "torch.Tensor":
    """sentence-transformers 6.2's ``Pooling._forward_padded`` (no prompt, float32)."""
    out = []
    for mode in modes:
        if mode == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)
            index = first.unsqueeze(-1).unsqueeze(1).expand(-1, 1, token_embeddings.shape[-1])
            out.append(torch.gather(token_embeddings, 1, index).squeeze(1))
        elif mode == "max":
            mask = attention_mask.unsqueeze(-1).expand_as(token_embeddings).to(token_embeddings.dtype)
            out.append(token_embeddings.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            total = (token_embeddings * mask).sum(dim=1)
            count = torch.clamp(mask.sum(dim=1), min=1e-9)
            out.append(total / (count if mode == "mean" else torch.sqrt(count)))
        elif mode == "weightedmean":
            mask = attention_mask.unsqueeze(-1).to(torch.float32)
            weights = torch.arange(1, token_embeddings.shape[1] + 1, dtype=torch.float32).view(1, -1, 1)
            weights = weights - attention_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
            weighted = mask * weights
            out.append((token_embeddings * weighted).sum(dim=1) / torch.clamp(weighted.sum(dim=1), min=1e-9))
        else:  # lasttoken
            seq_len = token_embeddings.shape[1]
            values, indices = attention_mask.flip(1).max(1)
            indices = torch.where(values == 0, seq_len - 1, indices)
            index = (seq_len - indices - 1).unsqueeze(-1).unsqueeze(1).expand(-1, 1, token_embeddings.shape[-1])
            mask = attention_mask.unsqueeze(-1).expand_as(token_embeddings).to(token_embeddings.dtype)
            out.append(torch.gather(token_embeddings * mask, 1, index).squeeze(dim=1))
    return torch.cat(out, dim=-1)


def st_embedding(hidden, mask, modes, layers, normalize: bool) -> np.ndarray:
    """Pooling, then each Dense (``activation(linear(x))``), then Normalize."""
    with torch.no_grad():
        e = st_pool(torch.from_numpy(hidden), torch.from_numpy(mask), modes)
        for linear, tanh in layers:
            e = linear(e)
            e = torch.tanh(e) if tanh else e
        if normalize:
            e = torch.nn.functional.normalize(e, p=2, dim=-1)
    return e.numpy()


def build(name: str, folder):
    class_name, overrides, layout, modules = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    auto = transformers.AutoModel if layout == "base" else transformers.AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation="sdpa").eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=0.0 if "gemma" in name else 1.0)
    model.save_pretrained(folder)
    layers = write_modules(folder, config.hidden_size, **modules) if modules else []
    return (model if layout == "base" else model.model), folder, modules, layers


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            built[name] = build(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


def batch(side: str):
    """Two uneven rows, the shorter padded on ``side`` (11 tokens: past every window)."""
    rng = np.random.default_rng(1)
    long, short = rng.integers(1, 128, 11), rng.integers(1, 128, 6)
    ids, mask = np.zeros((2, 11), np.int64), np.zeros((2, 11), np.int64)
    ids[0], mask[0] = long, 1
    cut = slice(-6, None) if side == "left" else slice(0, 6)
    ids[1, cut], mask[1, cut] = short, 1
    return ids, mask


def hf_hidden(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()


def relative_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# ---- the reference interpreter ---------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_last_hidden_state_matches_transformers(twins, name, side):
    model, folder, modules, layers = twins(name)
    graph = load_spec(folder)
    assert [v.name for v in graph.inputs] == ["input_ids", "attention_mask"]
    assert graph.outputs[0].name == "last_hidden_state" and not any(n.op == "linear" and n.outputs[0].name == "logits"
                                                                    for n in graph.nodes)
    ids, mask = batch(side)
    got = Interpreter(graph).run({"input_ids": ids, "attention_mask": mask})
    want = hf_hidden(model, ids, mask)
    real = mask.astype(bool)
    assert relative_error(got["last_hidden_state"][real], want[real]) <= TOLERANCE
    if modules:
        modes = tuple(MODE_OF[k] for k in LEGACY if modules["pooling"].get(k))
        reference = st_embedding(want, mask, modes, layers, modules["normalize"])
        assert relative_error(got["sentence_embedding"], reference) <= TOLERANCE


def test_the_bidirectional_window_is_transformers_symmetric_one(twins):
    """config.json's sliding_window 6 is the op's window 4 (6 // 2 + 1): |i - j| < 4."""
    graph = load_spec(twins("gemma3-bidirectional")[1])
    attention = [n for n in graph.nodes if n.op == "attention"]
    assert [(n.attrs["causal"], n.attrs["window"]) for n in attention] == [(False, 4), (False, None), (False, 4)]
    visible = visible_keys(1, 7, 0, causal=False, window=4)[0]
    assert visible[3].tolist() == [True] * 7 and visible[0].tolist() == [True] * 4 + [False] * 3
    assert (visible == visible.T).all()


# ---- sentence-transformers' modules ----------------------------------------------------------

POOLINGS = {
    "mean": {"pooling_mode_mean_tokens": True},
    "cls": {"pooling_mode_cls_token": True},
    "max": {"pooling_mode_max_tokens": True},
    "lasttoken": {"pooling_mode_lasttoken": True},
    "mean_sqrt_len_tokens": {"pooling_mode_mean_sqrt_len_tokens": True},
    "weightedmean": {"pooling_mode_weightedmean_tokens": True},
    "cls+max+mean (legacy order)": {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True,
                                    "pooling_mode_max_tokens": True},
    "pooling_mode list": {"pooling_mode": ["lasttoken", "mean"]},
}


@pytest.fixture(scope="module")
def gemma(twins):
    return twins("gemma3-bidirectional")


def copy_twin(source, target):
    os.makedirs(target, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("pooling", sorted(POOLINGS))
def test_sentence_embedding_is_sentence_transformers_arithmetic(gemma, tmp_path, pooling, side):
    model, source, _, _ = gemma
    folder = copy_twin(source, tmp_path / "twin")
    layers = write_modules(folder, 32, POOLINGS[pooling], GEMMA_MODULES["dense"], True)
    graph = load_spec(folder)
    assert [v.name for v in graph.outputs] == ["last_hidden_state", "sentence_embedding"]
    ids, mask = batch(side)
    got = Interpreter(graph).run({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    config = POOLINGS[pooling]
    modes = tuple(config["pooling_mode"]) if "pooling_mode" in config else \
        tuple(MODE_OF[k] for k in LEGACY if config.get(k))
    want = st_embedding(hf_hidden(model, ids, mask), mask, modes, layers, True)
    assert got.shape == want.shape == (2, 24)
    assert relative_error(got, want) <= TOLERANCE
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


# ---- through ONNX Runtime --------------------------------------------------------------------

@pytest.mark.parametrize("target,opset", [("onnx", 23), ("onnx", 21), ("onnx-ort", 23)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_matches_transformers(twins, tmp_path, capsys, name, target, opset):
    from backends.onnx import runtime

    model, folder, modules, layers = twins(name)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", target, "--opset", str(opset), "-o",
                 str(out / "model.onnx")]) == 0
    printed = "".join(capsys.readouterr())
    assert "genai_config.json not written: the model is an encoder" in printed
    assert not (out / "genai_config.json").exists()
    engine = runtime.ort_engine(str(out / "model.onnx"))
    for side in ("left", "right"):
        ids, mask = batch(side)
        got = engine({"input_ids": ids, "attention_mask": mask})
        want = hf_hidden(model, ids, mask)
        real = mask.astype(bool)
        assert relative_error(got["last_hidden_state"][real], want[real]) <= TOLERANCE
        if modules:
            modes = tuple(MODE_OF[k] for k in LEGACY if modules["pooling"].get(k))
            reference = st_embedding(want, mask, modes, layers, modules["normalize"])
            assert relative_error(got["sentence_embedding"], reference) <= TOLERANCE


def test_onnx_embedding_model_with_modules_and_tokenizer(gemma, tmp_path, capsys):
    """The EmbeddingGemma form end to end: bidirectional layers, mean pooling, two Dense,
    Normalize; the tokenizer is copied; the same input compiles to the same bytes."""
    import onnx
    from backends.onnx import runtime

    model, source, _, _ = gemma
    folder = copy_twin(source, tmp_path / "twin")
    layers = write_modules(folder, 32, **GEMMA_MODULES)
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "config_sentence_transformers.json").write_text('{"prompts": {"query": "task: search result | query: "}}')
    paths = []
    for run in ("a", "b"):
        path = tmp_path / run / "model.onnx"
        assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(path)]) == 0
        paths.append(path)
    printed = "".join(capsys.readouterr())
    assert "wrote " + str(tmp_path / "a" / "tokenizer.json") in printed
    assert (tmp_path / "a" / "config_sentence_transformers.json").exists()
    assert not (tmp_path / "a" / "modules.json").exists()  # the graph pools: nothing to pool again
    assert paths[0].read_bytes() == paths[1].read_bytes()
    proto = onnx.load(str(paths[0]))
    onnx.checker.check_model(proto)
    assert [i.name for i in proto.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in proto.graph.output] == ["last_hidden_state", "sentence_embedding"]
    assert not any(n.op_type == "GroupQueryAttention" for n in proto.graph.node)
    ids, mask = batch("left")
    got = runtime.ort_engine(str(paths[0]))({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    want = st_embedding(hf_hidden(model, ids, mask), mask, ("mean",), layers, True)
    assert relative_error(got, want) <= TOLERANCE


def test_irc_run_refuses_an_encoder(gemma, capsys):
    assert main(["run", str(gemma[1]), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]) == 2
    assert "is an encoder" in capsys.readouterr().err


# ---- the DSL ---------------------------------------------------------------------------------

def tiny_encoder(window=3, modes=("mean",)):
    m = Model("tiny-embed", vocab=64, d_model=16, encoder=True)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x), heads=2, kv_heads=1, rope=Rope(base=1e4), causal=False,
                                window=window if layer.index == 0 else None)
        x = x + layer.swiglu(layer.rms_norm(x), d_ff=32)
    h = m.last_hidden_state(m.rms_norm(x))
    m.sentence_embedding(m.l2_normalize(m.dense(m.pool(h, modes), 8, bias=True, activation="tanh")))
    return m.graph


def test_the_dsl_declares_an_encoder_that_round_trips():
    graph = tiny_encoder(modes=("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"))
    assert [v.name for v in graph.inputs] == ["input_ids", "attention_mask"]
    assert graph.inputs[1].shape == ("B", "T")
    assert [v.name for v in graph.outputs] == ["last_hidden_state", "sentence_embedding"]
    assert graph.meta["encoder"] is True and graph.params["dense.0"].shape == (8, 96)
    text = print_graph(graph)
    check_golden("encoder-dsl.ir", text)
    assert print_graph(parse_graph(text)) == text
    assert text == print_graph(tiny_encoder(modes=("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean",
                                                   "lasttoken")))


def test_an_encoder_without_rope_keeps_no_position_nodes():
    m = Model("no-rope", vocab=16, d_model=8, encoder=True)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.attention(layer.rms_norm(x), heads=2, causal=False)
    graph = m.graph
    m.last_hidden_state(m.rms_norm(x))
    assert not any(n.op in ("range_like", "expand") for n in graph.nodes)


@pytest.mark.parametrize("call,message", [
    (lambda m, x: m.logits(x), "an encoder has no logits"),
    (lambda m, x: m.pool(x, ("median",)), "unknown pooling mode 'median'"),
    (lambda m, x: m.dense(x, 4, activation="relu"), "expected None \\(identity\\) or 'tanh'"),
])
def test_the_dsl_refuses_what_an_encoder_is_not(call, message):
    m = Model("bad", vocab=16, d_model=8, encoder=True)
    x = m.embed(m.input_ids())
    with pytest.raises(SpecError, match=message):
        call(m, x)


def test_a_decoder_cannot_pool():
    m = Model("decoder", vocab=16, d_model=8)
    with pytest.raises(SpecError, match="an encoder's output"):
        m.pool(m.embed(m.input_ids()))


# ---- bad input -------------------------------------------------------------------------------

def bad_folder(gemma, tmp_path, edit):
    folder = copy_twin(gemma[1], tmp_path / "twin")
    write_modules(folder, 32, **GEMMA_MODULES)
    edit(folder)
    return folder


def rewrite(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


BAD = {
    "unknown pooling mode": (lambda f: rewrite(f / "1_Pooling" / "config.json", lambda d: d.update(
        pooling_mode="median")), "1_Pooling/config.json", "pooling_mode: \"median\" is not supported"),
    "unknown pooling switch": (lambda f: rewrite(f / "1_Pooling" / "config.json", lambda d: d.update(
        pooling_mode_median_tokens=True)), "1_Pooling/config.json", "pooling_mode_median_tokens: true"),
    "prompt excluded": (lambda f: rewrite(f / "1_Pooling" / "config.json", lambda d: d.update(include_prompt=False)),
                        "1_Pooling/config.json", "include_prompt: false is not supported"),
    "pooling width": (lambda f: rewrite(f / "1_Pooling" / "config.json", lambda d: d.update(
        word_embedding_dimension=64)), "1_Pooling/config.json", "word_embedding_dimension: 64 does not match"),
    "dense dims mismatch": (lambda f: rewrite(f / "3_Dense" / "config.json", lambda d: d.update(in_features=40)),
                            "3_Dense/config.json", "in_features: 40 does not match the 48 features before it"),
    "dense activation": (lambda f: rewrite(f / "2_Dense" / "config.json", lambda d: d.update(
        activation_function="torch.nn.modules.activation.ReLU")), "2_Dense/config.json",
        "activation_function: \"torch.nn.modules.activation.ReLU\" is not supported"),
    "dense widths that do not chain": (lambda f: rewrite(f / "2_Dense" / "config.json", lambda d: d.update(
        out_features=40)), "3_Dense/config.json", "in_features: 48 does not match the 40 features before it"),
    "module type": (lambda f: rewrite(f / "modules.json", lambda d: d.insert(2, {
        "idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})),
        "modules.json:", "type: 'sentence_transformers.models.LayerNorm' is not supported"),
    "bidirectional not a boolean": (lambda f: rewrite(f / "config.json", lambda d: d.update(
        use_bidirectional_attention="yes")), "config.json", "use_bidirectional_attention: expected true or false"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_modules_are_one_spec_error_naming_file_and_key(gemma, tmp_path, capsys, case):
    edit, where, message = BAD[case]
    folder = bad_folder(gemma, tmp_path, edit)
    with pytest.raises(SpecError, match=message) as err:
        load_spec(folder)
    assert where in str(err.value)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx")]) == 2
    assert message.split(":")[0] in capsys.readouterr().err and not out.exists()


def test_dense_weights_that_do_not_match_the_config(gemma, tmp_path):
    def swap(folder):
        safetensors_torch.save_file({"linear.weight": torch.zeros(48, 16)},
                                    str(folder / "2_Dense" / "model.safetensors"))

    with pytest.raises(SpecError, match=r"tensor linear.weight has shape \[48, 16\]; config.json describes \[48, 32\]"):
        load_spec(bad_folder(gemma, tmp_path, swap))



def test_a_gemma3_decoder_ignores_attn_logit_softcapping_as_transformers_does(tmp_path):
    """transformers 5.24's Gemma3Attention never passes attn_logit_softcapping on; nor does irc."""
    from test_hf_models import hf_logits, irc_logits, prompts

    config = transformers.Gemma3TextConfig(**{**SMALL, "head_dim": 8, "sliding_window": 4,
                                              "attn_logit_softcapping": 2.0})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=7, norm_centre=0.0)
    model.save_pretrained(tmp_path)
    graph = load_spec(tmp_path)
    assert all(n.attrs["softcap"] is None for n in graph.nodes if n.op == "attention")
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got, want = irc_logits(graph, ids, mask, positions), hf_logits(model, ids, mask, positions)
    assert relative_error(got[real], want[real]) <= TOLERANCE


def test_gqa_broadcast_keeps_the_symmetric_window():
    """gqa-broadcast on a bidirectional grouped attention with a window: the reference's
    result on a left-padded batch, changed once, idempotent (irc.testing.assert_pass)."""
    from irc.testing import assert_pass
    from passes.gqa_broadcast import GqaBroadcast

    graph = tiny_encoder(window=3)
    mask = np.ones((2, 9), np.int64)
    mask[1, :4] = 0
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 64, (2, 9)), "attention_mask": mask}
    assert assert_pass(GqaBroadcast(), graph, golden="gqa-broadcast-bidirectional", feeds=feeds) is True
    after = tiny_encoder(window=3)
    GqaBroadcast().run(after)
    assert any(n.outputs[0].name.endswith("in_window_ahead") for n in after.nodes)


def test_triton_refuses_a_bidirectional_window(tmp_path):
    """Its kernels' window looks back only: one clear refusal, not a one-sided answer."""
    from backends.triton import emit as triton_emit
    from irc.errors import BackendError

    m = Model("bidirectional-decoder", vocab=16, d_model=8)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.attention(layer.rms_norm(x), heads=2, causal=False, window=2)
    m.logits(m.rms_norm(x))
    with pytest.raises(BackendError, match="no symmetric window for bidirectional attention"):
        triton_emit.emit_module(m.graph, str(tmp_path / "m.py"))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_every_pooling_mode_through_onnx_equals_the_interpreter(tmp_path, target):
    from backends.onnx import emit, runtime
    from irc.weights import seed_absent

    graph = tiny_encoder(modes=("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"))
    seed_absent(graph, 0)
    ids, mask = np.random.default_rng(2).integers(0, 64, (3, 7)), np.ones((3, 7), np.int64)
    mask[1, :3] = 0  # left-padded
    mask[2, 5:] = 0  # right-padded
    want = Interpreter(graph).run({"input_ids": ids, "attention_mask": mask})
    path = emit.emit_model(graph, str(tmp_path / "model.onnx"), target=target).path
    got = runtime.ort_engine(path)({"input_ids": ids, "attention_mask": mask})
    assert relative_error(got["sentence_embedding"], want["sentence_embedding"]) <= 1e-5
    real = mask.astype(bool)
    assert relative_error(got["last_hidden_state"][real], want["last_hidden_state"][real]) <= 1e-5


def test_the_numpy_target_runs_the_embedding_model_as_the_interpreter(gemma, tmp_path):
    import importlib.util

    from backends.numpy.emit import emit_module

    _, source, _, _ = gemma
    folder = copy_twin(source, tmp_path / "twin")
    write_modules(folder, 32, **GEMMA_MODULES)
    graph = load_spec(folder)
    emit_module(graph, str(tmp_path / "model_np.py"))
    spec = importlib.util.spec_from_file_location("model_np", tmp_path / "model_np.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ids, mask = batch("left")
    got = module.forward(module.load_weights(), input_ids=ids, attention_mask=mask)
    want = Interpreter(graph).run({"input_ids": ids, "attention_mask": mask})
    for name in ("last_hidden_state", "sentence_embedding"):
        np.testing.assert_array_equal(got[name], want[name])
