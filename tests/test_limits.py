"""Size limits (``irc.limits``): a spec implying an absurd graph is refused at once, naming
the key, the size it implies and the limit; real large models (DeepSeek-V3 671B, a 405B
dense model) still load shape-only; ``--max-nodes`` and ``IRC_MAX_*`` set the limits."""
import json
import sys
import time
from pathlib import Path

import pytest

from irc import limits
from irc.errors import IRCError
from irc_cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LLAMA_405B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16384,
              "intermediate_size": 53248, "num_attention_heads": 128, "num_hidden_layers": 126,
              "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
HUGE = 2 ** 40


def refused(capsys, argv, *words) -> str:
    """``irc argv`` exits 2 at once with one message holding ``words``."""
    start = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err
    assert err.startswith("irc: error: ") and err.count("irc: error:") == 1 and "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


def architecture(tmp_path, **changes) -> Path:
    text = (EXAMPLES / "tiny-llama3.yaml").read_text()
    for key, value in changes.items():
        lines = [line for line in text.splitlines() if line.strip().startswith(f"{key}:")]
        text = text.replace(lines[0], lines[0].split(":")[0] + f": {value}", 1)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def show_json(capsys, spec) -> dict:
    assert main(["show", str(spec), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_real_large_models_load_shape_only(tmp_path, capsys):
    v3 = show_json(capsys, EXAMPLES / "hf" / "deepseek-v3")
    assert v3["n_layers"] == 61 and 670e9 < v3["params_total"] < 690e9
    folder = tmp_path / "llama-405b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_405B))
    dense = show_json(capsys, folder)
    assert dense["n_layers"] == 126 and 400e9 < dense["params_total"] < 410e9


def test_two_to_the_forty_layers_are_refused_at_once(tmp_path, capsys):
    refused(capsys, ["show", str(architecture(tmp_path, n_layers=HUGE))],
            "model.n_layers", "layer count 1,099,511,627,776", "limit of 4,096", "IRC_MAX_LAYERS")


def test_a_huge_dimension_names_its_key(tmp_path, capsys):
    refused(capsys, ["show", str(architecture(tmp_path, d_model=HUGE))], "model.d_model", "1,073,741,824")
    refused(capsys, ["show", str(architecture(tmp_path, vocab_size=HUGE))], "model.vocab_size")
    refused(capsys, ["show", str(architecture(tmp_path, n_heads=HUGE))], "n_heads")


def test_max_nodes_flag_and_environment(tmp_path, capsys, monkeypatch):
    spec = str(architecture(tmp_path, n_layers=150))
    err = refused(capsys, ["show", spec, "--max-nodes", "1000"], "model.n_layers", "estimated node count",
                  "limit of 1,000", "--max-nodes")
    assert "spec.yaml:" in err
    monkeypatch.setenv("IRC_MAX_NODES", "1000")
    refused(capsys, ["show", spec], "limit of 1,000")
    assert main(["show", spec, "--max-nodes", "100000"]) == 0  # the flag wins over the environment
    assert "150 layers" in capsys.readouterr().out
    monkeypatch.setenv("IRC_MAX_NODES", "lots")
    refused(capsys, ["show", spec], "IRC_MAX_NODES='lots'")
    monkeypatch.delenv("IRC_MAX_NODES")
    refused(capsys, ["show", spec, "--max-nodes", "0"], "--max-nodes 0")


def test_hf_config_keys(tmp_path, capsys):
    folder = tmp_path / "hf"
    folder.mkdir()
    for key, value in (("num_hidden_layers", HUGE), ("hidden_size", HUGE), ("intermediate_size", HUGE)):
        (folder / "config.json").write_text(json.dumps({**LLAMA_405B, key: value}))
        refused(capsys, ["show", str(folder)], key, "config.json")


def test_gguf_block_count(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tests" / "frontends"))
    try:
        import numpy as np
        from gguf_writer import write_file
    finally:
        sys.path.pop(0)
    keys = {"llama.block_count": 2 ** 31, "llama.context_length": 128, "llama.embedding_length": 8,
            "llama.feed_forward_length": 16, "llama.attention.head_count": 2, "llama.attention.head_count_kv": 1,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    path = write_file(tmp_path / "m.gguf", "llama", keys, {"token_embd.weight": np.zeros((16, 8), np.float32)})
    refused(capsys, ["show", path], "llama.block_count", "layer count 2,147,483,648")


def test_graph_form_and_ir_text(tmp_path, capsys):
    text = (EXAMPLES / "tiny-llama-graph.yaml").read_text()
    spec = tmp_path / "graph.yaml"
    spec.write_text(text.replace("count: 2", f"count: {HUGE}"))
    refused(capsys, ["show", str(spec)], "graph.nodes[1].repeat.count", "layer count")
    spec.write_text(text.replace("shape: [256, 64]}", f"shape: [{HUGE}, {HUGE}]}}", 1))
    refused(capsys, ["show", str(spec)], "graph.params[0].shape", "@embed", "element count", "IRC_MAX_TENSOR_ELEMENTS")
    ir = tmp_path / "model.ir"
    assert main(["compile", str(EXAMPLES / "tiny-llama3.yaml"), "--target", "ir", "-o", str(ir)]) == 0
    capsys.readouterr()
    ir.write_text(ir.read_text().replace("param @embed: f32[256,64]", f"param @embed: f32[{HUGE},{HUGE}]"))
    refused(capsys, ["show", str(ir)], "model.ir:", "@embed", "element count")


def test_applied_limits_are_scoped(monkeypatch):
    monkeypatch.delenv("IRC_MAX_LAYERS", raising=False)
    assert limits.current() == limits.Limits()
    with limits.applied(layers=8, nodes=None):
        assert limits.current().layers == 8 and limits.current().nodes == limits.Limits().nodes
        with pytest.raises(limits.LimitError, match="layer count 9 is beyond the limit of 8"):
            limits.check_layers(9)
    assert limits.current() == limits.Limits()
    with pytest.raises(IRCError):
        with limits.applied(nodes=-1):
            pass
