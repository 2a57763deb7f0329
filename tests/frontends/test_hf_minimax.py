"""MiniMax (lightning attention beside softmax attention, a Mixtral MoE) against transformers
on tiny random twins: logits on a left-padded batch of two (each row held against the row
run alone, and transformers' own padded batch against the same), 16 greedy tokens through
the reference interpreter; both ONNX targets in ONNX Runtime (prefill logits and 16 greedy
tokens per row, the recurrent states and KV caches fed back). The slopes come from the
checkpoint's buffers where it has them (one twin stores slopes unlike the formula's) and
from the formula where it has none. Then the CLI: ``irc show`` prints the recurrent-state
bytes, ``irc run`` drives a compiled folder, a bad setting is one message naming
config.json:line and the key (exit 2, nothing written)."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.interpreter import generate
from irc_cli import main
from tests.frontends.test_hf_models import NEW_TOKENS, TOLERANCE, assert_ort_run_matches, built_once, hf_logits, \
    irc_logits, prompts, randomize, relative_error
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.test_hf_ssm_onnx import hf_greedy  # noqa: F401 (a fixture)

try:
    import torch
    import transformers
except ImportError:  # the refusals below need neither
    torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2, block_size=4,
             pad_token_id=0, bos_token_id=0, eos_token_id=0)
FACTORS = dict(linear_attn_alpha_factor=1.5, linear_attn_beta_factor=0.7, full_attn_alpha_factor=0.8,
               full_attn_beta_factor=1.3, mlp_alpha_factor=1.2, mlp_beta_factor=0.9)
CASES = {  # name: (settings, what becomes of the decay buffers in the saved checkpoint)
    # the default alternation (attention first), four layers so every lightning layer's slopes differ
    "alternating-factors": (dict(SMALL, **FACTORS, num_hidden_layers=4), "kept"),
    # lightning first, MQA, head_dim 12, a window, RoPE base 5e4, top-1 of 3 experts, tied; stored slopes x 1.7
    "linear-first-window-tied-stored-slopes": (dict(
        SMALL, num_hidden_layers=3, layer_types=["linear_attention", "linear_attention", "full_attention"],
        num_key_value_heads=1, head_dim=12, sliding_window=5, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 5e4},
        num_local_experts=3, num_experts_per_tok=1, tie_word_embeddings=True, mlp_alpha_factor=2.0), "scaled"),
    # the checkpoint without buffers: transformers and irc both derive the slopes
    "alternating-no-buffers": (dict(SMALL, **FACTORS, num_hidden_layers=4, num_attention_heads=2, head_dim=16), "dropped"),
}
BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


def _store_scaled_slopes(model, factor: float) -> None:
    """Each lightning layer's slope buffers times ``factor``, its decay tables remade from them."""
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = layer.self_attn
            if hasattr(mixer, "slope_rate"):
                slope = mixer.slope_rate * factor
                for name, value in zip(BUFFERS, (slope, *mixer.decay_factors(slope))):
                    getattr(mixer, name).copy_(value)


def build_case(name: str, folder):
    from safetensors.torch import load_file, save_file

    settings, buffers = CASES[name]
    config = transformers.MiniMaxConfig(**settings)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=1.0)
    if buffers == "scaled":
        _store_scaled_slopes(model, 1.7)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    path = folder / "model.safetensors"
    if buffers == "dropped":
        tensors = load_file(path)
        save_file({k: v for k, v in tensors.items() if not k.endswith(BUFFERS)}, path, metadata={"format": "pt"})
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return loaded, folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def recomputed_greedy(model, prompt: list) -> list:
    """transformers' greedy tokens with every step a full forward over the sequence so far
    (no cache)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = torch.tensor([tokens])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           position_ids=torch.arange(len(tokens))[None]).logits
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt):]


@pytest.fixture(scope="module")
def greedy(models, hf_greedy):  # noqa: F811
    """name -> transformers' 16 greedy tokens per prompt run alone [2, 16]: ``generate`` with
    its cache, except with a sliding window, where transformers 5.24's cached decode departs
    from its own forward pass (MiniMaxCache holds plain, unwindowed layers); there each step
    is a full forward, as ``recomputed_greedy``."""
    def get(name):
        model, _ = models(name)
        if model.config.sliding_window is None:
            return hf_greedy(name)
        ids, mask, _ = prompts()
        return np.array([recomputed_greedy(model, ids[row][mask[row] == 1].tolist()) for row in range(len(ids))])

    return get


@needs_torch
def test_the_twins_hold_the_buffers_as_described(models):
    """transformers saves the four buffers; loading takes the stored slopes, or derives them."""
    from safetensors import safe_open

    for name, (_, buffers) in CASES.items():
        model, folder = models(name)
        with safe_open(folder / "model.safetensors", "pt") as f:
            stored = [k for k in f.keys() if k.endswith(BUFFERS)]
        mixer = next(layer.self_attn for layer in model.model.layers if hasattr(layer.self_attn, "slope_rate"))
        derived = mixer.get_slope_rate()
        assert bool(stored) == (buffers != "dropped")
        scale = 1.7 if buffers == "scaled" else 1.0
        torch.testing.assert_close(mixer.slope_rate, derived * scale)


@needs_torch
@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_transformers(models, greedy, name):
    model, folder = models(name)
    graph = load_spec(folder)
    assert graph.meta["ssm"]["kind"] == "lightning_attention"
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    alone = unpadded_logits(model, ids, mask)
    assert relative_error(hf_logits(model, ids, mask, positions)[real], alone[real]) <= TOLERANCE  # HF's batch is right
    assert relative_error(irc_logits(graph, ids, mask, positions)[real], alone[real]) <= TOLERANCE
    tokens, _ = generate(graph, ids[0].tolist(), NEW_TOKENS)
    assert tokens == greedy(name)[0].tolist()


@needs_torch
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_matches_transformers(models, greedy, tmp_path, name, target):
    """Both rows through ONNX Runtime (irc's greedy loop, the states fed back). genai gets no
    config: its RecurrentState finds a recurrent layer by a conv state, which MiniMax lacks."""
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    emitted = emit.emit_model(graph, path, target=target, context=64)
    assert not emitted.genai_config and "without a conv state" in emitted.genai_note
    assert_ort_run_matches(path, graph, unpadded_logits(model, *prompts()[:2]), greedy(name))


@needs_torch
def test_a_long_prompt_takes_the_portable_chunked_form(models, tmp_path):
    """Prompts of 70 and 40 tokens, left-padded (past one 64-token chunk, and inside one;
    transformers' blocks are 4 tokens): the portable target's chunked form (``scan-chunk``)
    against transformers."""
    from passes.scan_chunk import ScanChunk
    from tests.frontends.test_hf_delta import assert_long_prompt_matches

    model, folder = models("alternating-factors")
    graph = load_spec(folder)
    assert ScanChunk(size=64).run(graph)
    assert_long_prompt_matches(model, graph, tmp_path)


# ---- the CLI ---------------------------------------------------------------------------------

@needs_torch
def test_show_prints_the_state_and_run_drives_the_compiled_folder(models, hf_greedy, tmp_path, capsys):  # noqa: F811
    model, folder = models("alternating-factors")
    assert main(["show", str(folder)]) == 0
    shown = capsys.readouterr().out
    row = next(line.split() for line in shown.splitlines() if "recurrent state/sequence" in line)
    assert row[2:5] == ["2,048", "bytes", "(512"], row  # two lightning layers, [H, D, D] = [4, 8, 8] f32 each
    ids, mask, _ = prompts()
    prompt = ",".join(str(t) for t in ids[0])
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--prompt-ids", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json",
                 "--engine", "ort"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == hf_greedy("alternating-factors")[0].tolist()


BASE = {"model_type": "minimax", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24, "num_local_experts": 4}
REFUSALS = {  # name: (changes, the key named, a fragment of the message)
    "unknown-layer-kind": ({"layer_types": ["full_attention", "sliding_attention", "linear_attention",
                                            "linear_attention"]}, "layer_types", '"sliding_attention" is not supported'),
    "layer-types-too-short": ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types",
                              "has 2 entries for 4 layers"),
    "heads-not-dividing": ({"num_attention_heads": 5, "num_key_value_heads": 5}, "num_attention_heads",
                           "hidden_size 32 is not divisible by 5 heads"),
    "kv-heads-not-dividing": ({"num_key_value_heads": 3}, "num_key_value_heads", "4 heads are not divisible by 3"),
    "activation": ({"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    "factor-zero": ({"linear_attn_beta_factor": 0}, "linear_attn_beta_factor", "expected a positive number"),
    "top-k-above-experts": ({"num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 exceeds 4 experts"),
}


def test_the_base_config_derives_the_kinds_and_takes_no_conv_state(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(BASE, indent=2))
    graph = load_spec(tmp_path)
    assert graph.meta["layer_kinds"] == ["attention", "lightning_attention"] * 2
    states = sorted(v.name for v in graph.inputs if v.name.endswith("_state"))
    assert states == ["past_key_values.1.recurrent_state", "past_key_values.3.recurrent_state"]
    assert main(["show", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state_bytes_per_sequence"] == 2 * 4 * 8 * 8 * 4


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_bad_setting_is_one_message_exit_2_nothing_written(tmp_path, capsys, name):
    changes, key, fragment = REFUSALS[name]
    folder = tmp_path / "model"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text(json.dumps({**BASE, **changes}, indent=2))
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx")]) == 2
    err = capsys.readouterr().err
    line = next(i + 1 for i, text in enumerate(config.read_text().splitlines()) if f'"{key}"' in text)
    assert err.startswith(f"irc: error: {config}:{line}") and f"{key}: " in err and fragment in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
