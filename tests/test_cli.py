"""The command line end to end: show, compile (dumps, check, targets), run, passes, and
one clear message with exit code 2 for every kind of bad input."""
import json
import os
import subprocess
import sys

import pytest

from irc_cli import main

TINY = "examples/tiny-llama3.yaml"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_json_keys(capsys):
    code, out, _ = run_cli(capsys, "show", "examples/llama3-8b.yaml", "--json")
    s = json.loads(out)
    assert code == 0
    for key in ("params_total", "params_active", "flops_per_token", "kv_cache_bytes_per_token",
                "kv_cache_elements_per_token_per_layer", "layers"):
        assert key in s
    assert s["params_total"] == 8_030_261_248 and s["kv_cache_bytes_per_token"] == 131_072


def test_show_cache_dtype_and_passes(capsys):
    code, out, _ = run_cli(capsys, "show", "examples/llama2-7b.yaml", "--json", "--cache-dtype", "f32",
                           "--passes", "dce,cse")
    assert code == 0 and json.loads(out)["kv_cache_bytes_per_token"] == 2 * 524_288


def test_compile_numpy_with_dumps_and_check(capsys, tmp_path):
    dump, module = tmp_path / "dump", tmp_path / "model_np.py"
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "numpy", "--passes", "dce,cse",
                           "--dump-dir", str(dump), "--check", "-o", str(module))
    assert code == 0, err
    names = sorted(os.listdir(dump))
    for stem in ("00-input", "01-dce", "02-cse"):
        assert f"{stem}.ir" in names and f"{stem}.dot" in names and f"{stem}.stats.json" in names
    stats = json.loads((dump / "02-cse.stats.json").read_text())
    assert {"nodes", "params_total", "flops_per_token", "kv_cache_bytes_per_token"} <= set(stats)
    assert "check passed" in err
    assert module.exists() and module.with_suffix(".npz").exists()


def test_compile_is_deterministic(capsys, tmp_path):
    outs = []
    for i in range(2):
        path = tmp_path / f"m{i}.ir"
        assert run_cli(capsys, "compile", TINY, "--passes", "lower-mlp,lower-linear,fold,dce,cse",
                       "-o", str(path))[0] == 0
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]


def test_print_after_change(capsys):
    code, out, _ = run_cli(capsys, "compile", TINY, "--passes", "dce,lower-mlp", "--print-after-change",
                           "-o", os.devnull)
    assert code == 0
    assert "after lower-mlp (changed)" in out and "after dce" not in out


def test_check_names_a_wrong_pass(capsys, tmp_path):
    from irc.passmanager import PASSES, Pass, register_pass

    @register_pass
    class ScaleLogits(Pass):
        """Planted bug: doubles the embedding table's use (a wrong rewrite)."""
        name = "test-wrong-rewrite"

        def run(self, graph):
            from irc.build import emit1
            node = next(n for n in graph.nodes if n.op == "embedding")
            out = node.outputs[0]
            doubled = emit1(graph, "add", [out, out], name="doubled", before=graph.nodes[graph.nodes.index(node) + 1])
            for user in list(out.uses):
                if user is not doubled.producer:
                    for i, v in enumerate(user.inputs):
                        if v is out:
                            user.set_input(i, doubled)
            return True

    try:
        code, _, err = run_cli(capsys, "compile", TINY, "--passes", "dce,test-wrong-rewrite,cse", "--check")
    finally:
        del PASSES["test-wrong-rewrite"]
    assert code == 2
    assert "numeric check failed after pass test-wrong-rewrite" in err and "after dce" in err


def test_run_json(capsys):
    argv = ["run", TINY, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--json"]
    code, out, _ = run_cli(capsys, *argv, "--logits")
    result = json.loads(out)
    assert code == 0 and len(result["tokens"]) == 4 and len(result["logits_last"]) == 256
    again = json.loads(run_cli(capsys, *argv, "--logits")[1])
    assert again["tokens"] == result["tokens"] and again["logits_last"] == result["logits_last"]
    assert "logits_last" not in json.loads(run_cli(capsys, *argv)[1])  # logits only when asked for


def test_passes_lists_docs(capsys):
    code, out, _ = run_cli(capsys, "passes")
    assert code == 0
    assert any(line.startswith("dce ") for line in out.splitlines())


LLAMA = open(TINY).read() if os.path.exists(TINY) else ""

BAD_SPECS = {
    "syntax": ("model:\n  name: x\n  d_model: [64\n", ":3:", None),
    "unknown key": (LLAMA.replace("  n_layers: 2", "  n_layers: 2\n  n_layrs: 2"), "n_layrs", None),
    "heads not divisible": (LLAMA.replace("n_kv_heads: 2", "n_kv_heads: 3"), "n_kv_heads", None),
    "odd head_dim with rope": (LLAMA.replace("head_dim: 16", "head_dim: 15"), "head_dim", None),
    "negative size": (LLAMA.replace("d_model: 64", "d_model: -64"), "d_model", None),
    "wrong type": (LLAMA.replace("n_layers: 2", "n_layers: two"), "n_layers", None),
}

GRAPH_BASE = """graph:
  name: g
  inputs: [{name: x, dtype: f32, shape: [B, 8]}]
  params: [{name: w, dtype: f32, shape: [8, 8]}]
  nodes:
    - {op: linear, inputs: [x, "@w"], outputs: [y]}
    - {op: silu, inputs: [y], outputs: [z]}
  outputs: [z]
"""

BAD_GRAPHS = {
    "unknown op": (GRAPH_BASE.replace("op: silu", "op: swish"), "swish"),
    "dangling reference": (GRAPH_BASE.replace("inputs: [y]", "inputs: [q]"), "q"),
    "cycle": (GRAPH_BASE.replace("inputs: [x, \"@w\"]", "inputs: [z, \"@w\"]"), "z"),
    "duplicate name": (GRAPH_BASE.replace("outputs: [z]}", "outputs: [y]}"), "duplicate name 'y'"),
    "unknown param": (GRAPH_BASE.replace('"@w"', '"@v"'), "@v"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS) + sorted(BAD_GRAPHS))
def test_bad_input_one_message_exit_2_no_output(case, capsys, tmp_path):
    text, key = (BAD_SPECS[case][:2] if case in BAD_SPECS else BAD_GRAPHS[case])
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    out = tmp_path / "out.ir"
    code, _, err = run_cli(capsys, "compile", str(spec), "-o", str(out))
    assert code == 2
    assert err.startswith(f"irc: error: {spec}:") and key in err, err
    assert "Traceback" not in err
    assert not out.exists() and os.listdir(tmp_path) == ["bad.yaml"]


def test_bad_input_in_a_real_process(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD_SPECS["heads not divisible"][0])
    proc = subprocess.run([sys.executable, "-m", "irc_cli", "show", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") <= 2 and "Traceback" not in proc.stderr and "n_kv_heads" in proc.stderr


def test_missing_file_and_unknown_pass(capsys):
    assert run_cli(capsys, "show", "nope.yaml")[0] == 2
    code, _, err = run_cli(capsys, "compile", TINY, "--passes", "dce,bogus")
    assert code == 2 and "unknown pass 'bogus'" in err
