"""LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini) against transformers 5.25.

Tiny random Phi-3 twins with random-ish short and long factors and a small
``original_max_position_embeddings`` n, so the switch to the long factors happens where
it matters: "decode-switch" (n = 16) prefills the 11-token batch with the short factors
and crosses n during the 16 greedy steps (transformers' generate drops the cache there and
runs the whole sequence again: ``irc.ops.rope.cache_refresh_length``); "prefill-long"
(n = 8, partial rotary, an explicit attention factor) is past n already in the prefill,
the 6-token row included (one choice for the batch); "gqa-rotary" (head_dim 16, n = 12)
takes onnx-ort's GroupQueryAttention rotary path. Each is a row of the twin harness
(test_hf_twins.py: the reference interpreter, both ONNX targets with a left-padded batch of
two + 16 greedy steps) and runs the onnxruntime-genai folder; the rope op is held against a direct transcription of HF's
formula; bad settings are SpecErrors naming config.json and the key."""
import json

import numpy as np
import pytest

from irc.errors import SpecError
from irc.interpreter import generate
from frontends import load_spec

from test_hf_models import NEW_TOKENS, TOLERANCE, hf_logits, irc_logits, prompts, relative_error
from tests.frontends.twins import GREEDY, LOGITS, ONNX, family, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HEAD_DIM = 8


def factors(seed: int, count: int, low: float, high: float) -> list:
    return np.round(np.random.default_rng(seed).uniform(low, high, count), 4).tolist()


CASES = {  # name: Phi3Config overrides
    "decode-switch": dict(original_max_position_embeddings=16, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": factors(1, HEAD_DIM // 2, 1.0, 2.0),
        "long_factor": factors(2, HEAD_DIM // 2, 2.0, 40.0)}),
    "prefill-long": dict(original_max_position_embeddings=8, num_key_value_heads=4, rope_parameters={
        "rope_type": "longrope", "rope_theta": 500.0, "partial_rotary_factor": 0.5, "attention_factor": 1.3,
        "short_factor": factors(3, HEAD_DIM // 4, 1.0, 3.0), "long_factor": factors(4, HEAD_DIM // 4, 3.0, 30.0)}),
    # head_dim 16: onnx-ort's GroupQueryAttention rotates q and k itself (do_rotary, the two
    # sets' caches stacked and the rows offset), and the switch comes at decode step 2
    "gqa-rotary": dict(hidden_size=64, original_max_position_embeddings=12, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": factors(7, 8, 1.0, 1.5),
        "long_factor": factors(8, 8, 1.5, 20.0)}),
}
SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=127)


TWINS = family("Phi3Config", SMALL, CASES, first_seed=11, checks=(LOGITS, GREEDY, ONNX))


models = models_fixture(TWINS)


def hf_greedy(model, ids, mask):
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[:, ids.shape[1]:].numpy()


def graph_tokens_without_refresh(graph, prompt, monkeypatch) -> list:
    """What the graph computes per call, the cache kept across the switch (no re-run)."""
    import irc.interpreter

    with monkeypatch.context() as patch:
        patch.setattr(irc.interpreter, "cache_refresh_length", lambda graph: None)
        return generate(graph, prompt, NEW_TOKENS)[0]


def test_the_switch_and_the_rerun_both_bite(models, monkeypatch):
    """Without transformers' re-run at n + 1 tokens the decode-switch twin's tokens differ
    from transformers' (so the tests above see the rule), and the long factors matter."""
    model, folder = models("decode-switch")
    graph = load_spec(folder)
    prompt = prompts()[0][0]
    want = hf_greedy(model, prompt[None], np.ones((1, len(prompt)), np.int64))[0].tolist()
    assert graph_tokens_without_refresh(graph, prompt.tolist(), monkeypatch) != want
    (rope,) = {json.dumps(n.attrs["scaling"], sort_keys=True) for n in graph.nodes if n.op == "rope"}
    assert json.loads(rope)["original_max_position"] == 16 and len(prompt) < 16 < len(prompt) + NEW_TOKENS



@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_genai_folder(models, tmp_path, monkeypatch, name, target):
    """onnxruntime-genai 0.18 runs the folder. Past n already in the prefill its tokens are
    transformers'; across the switch during decode genai keeps the cache (its loop has no
    re-run, as with its own Phi-3 builds), so its tokens are the graph's per-call ones."""
    genai = pytest.importorskip("onnxruntime_genai")
    from backends.onnx.emit import emit_model

    model, folder = models(name)
    graph = load_spec(folder)
    emit_model(graph, str(tmp_path / "model.onnx"), target=target, context=64)
    prompt = prompts()[0][0]
    folder_model = genai.Model(str(tmp_path))
    params = genai.GeneratorParams(folder_model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False, batch_size=1)
    generator = genai.Generator(folder_model, params)
    generator.append_tokens(prompt[None].astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    got = [int(t) for t in generator.get_sequence(0)][len(prompt):]
    if name == "prefill-long":  # past n from the prefill on: nothing to re-run
        assert got == hf_greedy(model, prompt[None], np.ones((1, len(prompt)), np.int64))[0].tolist()
    else:
        assert got == graph_tokens_without_refresh(graph, prompt.tolist(), monkeypatch)


# ---- the op, and bad settings -----------------------------------------------------------------

def test_rope_op_matches_a_transcription_and_phi3_rotary():
    """The rope op against HF's formula written out here and against Phi3RotaryEmbedding, on
    both sides of the switch (max(position_ids) + 1 = n and n + 1) and for a partial rotary."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb
    from irc.testing import run_op

    heads, head_dim, rotary, original = 3, 16, 8, 16
    short, long = factors(5, rotary // 2, 1.0, 2.0), factors(6, rotary // 2, 2.0, 50.0)
    scaling = {"kind": "longrope", "short_factor": short, "long_factor": long, "original_max_position": original,
               "factor": 8.0}
    config = transformers.Phi3Config(hidden_size=heads * head_dim, num_attention_heads=heads,
                                     max_position_embeddings=128, original_max_position_embeddings=original,
                                     rope_parameters={"rope_type": "longrope", "rope_theta": 500.0,
                                                      "partial_rotary_factor": rotary / head_dim,
                                                      "short_factor": short, "long_factor": long})
    rotary_embedding = Phi3RotaryEmbedding(config)
    rng = np.random.default_rng(0)
    for longest in (original - 1, original, 40):
        positions = np.sort(rng.integers(0, longest + 1, (2, 7)), axis=-1)
        positions[0, -1] = longest
        x = rng.standard_normal((2, 7, heads * head_dim)).astype(np.float32)
        (got,) = run_op("rope", [x, positions], {"head_dim": head_dim, "rotary_dim": rotary, "base": 500.0,
                                                 "scaling": scaling})
        ext = np.asarray(long if longest + 1 > original else short, np.float64)
        inv_freq = 1.0 / (ext * 500.0 ** (np.arange(0, rotary, 2) / rotary))
        angles = positions[..., None] * inv_freq
        mult = np.sqrt(1 + np.log(8.0) / np.log(original))
        cos, sin = np.cos(angles)[:, :, None] * mult, np.sin(angles)[:, :, None] * mult
        x4 = x.reshape(2, 7, heads, head_dim).astype(np.float64)
        x1, x2 = x4[..., :rotary // 2], x4[..., rotary // 2:rotary]
        want = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x4[..., rotary:]], -1).reshape(x.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        xt = torch.from_numpy(x).view(2, 7, heads, head_dim).transpose(1, 2)
        cos_t, sin_t = rotary_embedding(xt, torch.from_numpy(positions))
        hf, _ = apply_rotary_pos_emb(xt, xt, cos_t, sin_t)
        np.testing.assert_allclose(got, hf.transpose(1, 2).reshape(x.shape).numpy(), rtol=1e-5, atol=2e-5)


def phi3_config(tmp_path, rope_scaling, **extra):
    data = {"model_type": "phi3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "rope_scaling": rope_scaling, **extra}
    (tmp_path / "config.json").write_text(json.dumps(data, indent=2))
    return tmp_path


def rope_of(folder):
    return next(n.attrs for n in load_spec(str(folder)).nodes if n.op == "rope")


@pytest.mark.parametrize("kind", ["longrope", "su", "yarn"])
def test_old_style_rope_scaling_reads_as_transformers_does(tmp_path, kind):
    """``rope_scaling: {type: su | yarn | longrope}`` is LongRoPE to Phi-3's config class; the
    top-level original_max_position_embeddings wins over the inner one under every name
    (transformers 5.24 made an exception of "su", renamed after that step; 5.25 renames first,
    as Phi-3's own modeling code reads the top-level key); factor is max_position_embeddings /
    that length."""
    scaling = {"type": kind, "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 5.0, 6.0],
               "original_max_position_embeddings": 8}
    attrs = rope_of(phi3_config(tmp_path, scaling, original_max_position_embeddings=16))
    config = transformers.Phi3Config(**json.loads((tmp_path / "config.json").read_text()))
    original = config.rope_parameters["original_max_position_embeddings"]
    assert config.rope_parameters["rope_type"] == "longrope" and original == 16
    assert attrs["scaling"] == {"kind": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5],
                                "long_factor": [3.0, 4.0, 5.0, 6.0], "original_max_position": original,
                                "factor": 64 / original}


def test_phi3_class_default_original_length(tmp_path):
    scaling = {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 32.0}
    attrs = rope_of(phi3_config(tmp_path, scaling))
    assert attrs["scaling"]["original_max_position"] == 4096 and attrs["scaling"]["factor"] == 32.0


@pytest.mark.parametrize("key, value, message", [
    ("long_factor", [1.0, 2.0, 3.0], "rope_scaling.long_factor: has 3 entries; a rotary dim of 8 needs 4"),
    ("short_factor", [1.0, 2.0, "x", 4.0], "rope_scaling.short_factor: expected a positive number, got 'x'"),
    ("short_factor", None, "rope_scaling.short_factor: longrope RoPE needs it"),
    ("attention_factor", -1.0, "rope_scaling.attention_factor: expected a positive number, got -1.0"),
])
def test_bad_longrope_settings_are_spec_errors(tmp_path, key, value, message):
    scaling = {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, key: value}
    folder = phi3_config(tmp_path, scaling)
    with pytest.raises(SpecError) as err:
        load_spec(str(folder))
    assert message in str(err.value) and "config.json" in str(err.value)


# ---- GGUF: the twin as llama.cpp's converter writes it ------------------------------------------

def llama_cpp_longrope(model):
    """``extra`` for gguf_writer.write_model: Phi3MiniModel's LongRoPE keys and tensors."""
    import math

    config = model.config
    params = config.rope_parameters
    original = config.original_max_position_embeddings
    scale = config.max_position_embeddings / original

    def add(writer):
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        writer.add_tensor("rope_factors_long.weight", np.asarray(params["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(params["short_factor"], np.float32))

    return add


def test_gguf_phi3_longrope_matches_transformers(models, tmp_path):
    """decode-switch written as llama.cpp writes Phi-3 (fused qkv, gate/up, the factor
    tensors): the same scaling as the HF frontend reads, transformers' logits and tokens."""
    pytest.importorskip("gguf")
    from gguf_writer import write_model

    model, folder = models("decode-switch")
    path = write_model(tmp_path / "phi3.gguf", model, "phi3", extra=llama_cpp_longrope(model))
    graph = load_spec(str(path))
    (scaling,) = {json.dumps(n.attrs["scaling"], sort_keys=True) for n in graph.nodes if n.op == "rope"}
    want = next(n.attrs["scaling"] for n in load_spec(folder).nodes if n.op == "rope")
    got = json.loads(scaling)
    assert got.pop("attention_factor") == pytest.approx(math_attention(want), rel=1e-6)
    for key in ("short_factor", "long_factor"):  # stored as float32, as transformers computes with them
        np.testing.assert_array_equal(np.float32(got.pop(key)), np.float32(want[key]))
    assert got == {k: v for k, v in want.items() if k not in ("short_factor", "long_factor")}
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real],
                          hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    prompt = ids[0]
    tokens, _ = generate(graph, prompt.tolist(), NEW_TOKENS)
    assert tokens == hf_greedy(model, prompt[None], np.ones((1, len(prompt)), np.int64))[0].tolist()


def math_attention(scaling):
    from irc.ops.rope import longrope_attention_factor

    return longrope_attention_factor(scaling)


@pytest.mark.parametrize("broken", ["short-missing", "wrong-length"])
def test_gguf_bad_longrope_tensors(models, tmp_path, broken):
    pytest.importorskip("gguf")
    from gguf_writer import write_model

    model, _ = models("decode-switch")
    config = model.config

    def add(writer):
        writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
        writer.add_tensor("rope_factors_long.weight", np.ones(3 if broken == "wrong-length" else 4, np.float32))
        if broken != "short-missing":
            writer.add_tensor("rope_factors_short.weight", np.ones(4, np.float32))

    path = write_model(tmp_path / "bad.gguf", model, "phi3", extra=add)
    with pytest.raises(SpecError) as err:
        load_spec(str(path))
    text = str(err.value)
    assert ("rope_factors_short.weight" in text and "needs it" in text) if broken == "short-missing" else \
        ("rope_factors_long.weight" in text and "has 3 entries; 8 rotary dims need 4" in text)


@pytest.mark.parametrize("engine", ["interpreter", "ort"])
def test_irc_run_reruns_at_the_switch(models, tmp_path, capsys, engine):
    """``irc run`` on the spec (reference interpreter) and on an onnx folder in onnxruntime
    (its model carries the re-run length as metadata): transformers' tokens."""
    from irc_cli.commands import main

    model, folder = models("decode-switch")
    prompt = prompts()[0][0]
    where = [str(folder)]
    if engine == "ort":
        out = tmp_path / "out"
        assert main(["compile", str(folder), "--target", "onnx", "--context", "64", "-o", str(out / "model.onnx"),
                     "--quiet"]) == 0
        where = [str(out), "--engine", "ort"]
    capsys.readouterr()
    assert main(["run", where[0], "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS),
                 "--json", "--quiet", *where[1:]]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == hf_greedy(model, prompt[None], np.ones((1, len(prompt)), np.int64))[0].tolist()


def test_phi4_mini_full_size_config(tmp_path):
    """Phi-4-mini's shapes (no weights: a shape-only graph): 96 of 128 dims rotate, 48
    factors per set, n = 4096, factor 131072 / 4096 = 32, attention factor
    sqrt(1 + ln 32 / ln 4096) = 1.19024."""
    from irc.ops.rope import longrope_attention_factor

    data = {"model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75, "rope_theta": 10000.0, "tie_word_embeddings": True,
            "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i for i in range(48)],
                             "short_factor": [1.0] * 48}}
    (tmp_path / "config.json").write_text(json.dumps(data, indent=2))
    attrs = rope_of(tmp_path)
    assert (attrs["head_dim"], attrs["rotary_dim"]) == (128, 96)
    assert attrs["scaling"]["original_max_position"] == 4096 and attrs["scaling"]["factor"] == 32.0
    assert longrope_attention_factor(attrs["scaling"]) == pytest.approx(1.1902380714238083, rel=1e-12)
