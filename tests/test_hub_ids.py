"""Hugging Face ids as specs (``frontends.hub``): ``irc compile owner/name`` reads the
repository's snapshot from the hub's cache. No network: each test lays out a cache in
tmp_path as huggingface_hub writes it (``models--owner--name/blobs/SHA256``,
``snapshots/COMMIT/FILE`` linking to the blob, ``refs/BRANCH`` holding the commit) and runs
``irc`` in a subprocess with ``HF_HUB_OFFLINE=1`` and ``HF_HOME`` or ``HF_HUB_CACHE``
pointing at it, so huggingface_hub reads its settings as it does for a user."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parent.parent
REPO = "owner/tiny-llama"
MAIN = "a" * 40
TAGGED = "b" * 40
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 64,
          "rope_theta": 10000.0, "torch_dtype": "float32", "eos_token_id": 2}


def tiny_folder(path: Path) -> Path:
    """A one-layer Llama checkpoint: config.json, model.safetensors, generation_config.json."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (32, 16), "model.norm.weight": (16,),
              "model.layers.0.input_layernorm.weight": (16,), "model.layers.0.post_attention_layernorm.weight": (16,),
              "model.layers.0.self_attn.q_proj.weight": (16, 16), "model.layers.0.self_attn.k_proj.weight": (8, 16),
              "model.layers.0.self_attn.v_proj.weight": (8, 16), "model.layers.0.self_attn.o_proj.weight": (16, 16),
              "model.layers.0.mlp.gate_proj.weight": (32, 16), "model.layers.0.mlp.up_proj.weight": (32, 16),
              "model.layers.0.mlp.down_proj.weight": (16, 32)}
    save_file({name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return path


def cache_repo(cache: Path, repo: str, folder: Path, commit: str, refs=("main",)) -> None:
    """``folder``'s files as the snapshot ``commit`` of ``repo`` in the hub cache ``cache``."""
    store = cache / ("models--" + repo.replace("/", "--"))
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = store / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = store / "snapshots" / commit / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (store / "refs").mkdir(parents=True, exist_ok=True)
        (store / "refs" / ref).write_text(commit)


@pytest.fixture
def hub(tmp_path) -> dict:
    """A hub cache under HF_HOME (``HF_HOME/hub``) holding REPO at MAIN (branch main) and
    TAGGED (tag v1), and the folder it came from; the environment of an offline user."""
    folder = tiny_folder(tmp_path / "src" / "tiny-llama")
    cache = tmp_path / "hf-home" / "hub"
    cache_repo(cache, REPO, folder, MAIN)
    cache_repo(cache, REPO, folder, TAGGED, refs=("v1",))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return {"folder": folder, "cache": cache, "env": env}


def irc(env, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irc_cli", *map(str, argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def refused(result, *words) -> None:
    """Exit 2 with one message (no traceback) that holds every word."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("irc: error:")]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_an_id_compiles_to_the_bytes_its_folder_compiles_to(hub, tmp_path):
    by_id, by_folder = tmp_path / "by-id", tmp_path / "by-folder"
    done = irc(hub["env"], "compile", REPO, "--target", "onnx", "-o", by_id / "model.onnx", "--quiet")
    assert done.returncode == 0, done.stderr
    done = irc(hub["env"], "compile", hub["folder"], "--target", "onnx", "-o", by_folder / "model.onnx", "--quiet")
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in by_id.iterdir())
    assert names == sorted(p.name for p in by_folder.iterdir())
    assert "generation_config.json" in names  # the companion files come from the snapshot too
    for name in names:
        assert (by_id / name).read_bytes() == (by_folder / name).read_bytes(), name


@pytest.mark.parametrize("revision", ["v1", "main", TAGGED])
def test_a_revision_that_exists_is_read(hub, revision):
    shown = irc(hub["env"], "show", REPO, "--revision", revision, "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["name"] == "tiny-llama" and summary["weights"] == "from 1 safetensors file"


def test_a_revision_that_does_not_exist_is_one_message(hub, tmp_path):
    out = tmp_path / "out"
    refused(irc(hub["env"], "compile", REPO, "--revision", "v9", "--target", "onnx", "-o", out / "model.onnx"),
            f"{REPO}@v9", "'v9'", "not in the local Hugging Face cache")
    assert not out.exists()


def test_an_id_not_in_the_cache_offline_is_one_message(hub, tmp_path):
    out = tmp_path / "out"
    refused(irc(hub["env"], "compile", "owner/absent", "--target", "onnx", "-o", out / "model.onnx"),
            "owner/absent:", "HF_HUB_OFFLINE is set")
    assert not out.exists()


def test_a_repository_without_a_model_is_one_message(hub, tmp_path):
    readme = tmp_path / "readme-only"
    readme.mkdir()
    (readme / "README.md").write_text("weights elsewhere\n")
    (readme / "pytorch_model.bin").write_bytes(b"\0" * 16)
    env = {**hub["env"], "HF_HUB_CACHE": str(tmp_path / "other-cache")}  # HF_HUB_CACHE over HF_HOME
    cache_repo(tmp_path / "other-cache", "owner/readme-only", readme, MAIN)
    out = tmp_path / "out"
    refused(irc(env, "compile", "owner/readme-only", "--target", "onnx", "-o", out / "model.onnx"),
            "owner/readme-only:", "no config.json")
    refused(irc(env, "show", "owner/readme-only:model-Q4_K_M.gguf"), "no model-Q4_K_M.gguf")
    refused(irc(env, "show", REPO), "not in the local Hugging Face cache")  # HF_HOME's cache is not read
    assert not out.exists()


def test_a_revision_with_a_local_path_is_one_message(hub, tmp_path):
    refused(irc(hub["env"], "show", hub["folder"], "--revision", "main"), "applies to a Hugging Face id")


def test_a_missing_spec_file_is_not_taken_for_an_id(hub):
    refused(irc(hub["env"], "show", "examples/no-such-model.yaml"), "no such file")


def test_a_yaml_compile_does_not_import_huggingface_hub(tmp_path):
    probe = ("import sys\nfrom irc_cli import main\ncode = main(sys.argv[1:])\n"
             "print(code, 'huggingface_hub' in sys.modules)\n")
    spec = ROOT / "examples" / "llama3-8b.yaml"
    if not spec.exists():
        spec = next(ROOT.glob("examples/*.yaml"))
    done = subprocess.run([sys.executable, "-c", probe, "compile", str(spec), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines()[-1] == "0 False", done.stderr


def test_only_the_files_irc_reads_are_fetched(tmp_path, monkeypatch):
    """The patterns handed to snapshot_download: config, tokenizer files, then the shards
    the index names (not a consolidated.safetensors beside them); for a GGUF, the file and
    its split set."""
    import huggingface_hub

    from frontends import hub as hub_ids

    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (folder / "q" ).mkdir()
    (folder / "q" / "m-00001-of-00002.gguf").write_bytes(b"GGUF")
    asked = []

    def fake(repo, *, revision=None, allow_patterns=None):
        asked.append((repo, revision, list(allow_patterns)))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert hub_ids.resolve("o/n", "dev") == str(folder)
    (_, revision, small), (_, _, weights) = asked
    assert revision == "dev" and {"config.json", "tokenizer.json", "generation_config.json"} <= set(small)
    assert not any(p.endswith(".safetensors") for p in small)
    assert weights == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "*/*.safetensors"]
    assert hub_ids.resolve("o/n:q/m-00001-of-00002.gguf") == str(folder / "q" / "m-00001-of-00002.gguf")
    assert asked[-1][2] == ["q/m-00001-of-00002.gguf", "q/m-*-of-00002.gguf"]
