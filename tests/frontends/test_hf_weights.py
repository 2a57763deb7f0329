"""HF checkpoints are read lazily: building a graph reads headers only; loading one param
reads only its bytes from the shard that holds it (experts: each expert's tensor), only its
rows of a fused projection (Phi-3), or only the rows asked for; the result equals
transformers' own weights. Checkpoints that do not fit config.json, truncated shards and
corrupt headers are refused with the tensor's name."""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from frontends import load_spec
from frontends.hf import load_hf, read_arch
from frontends.hf import weights as hf_weights
from frontends.hf.families import checkpoint_source
from frontends.hf.weights import CheckpointData
from irc.dtypes import DType
from irc.errors import SpecError

TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


class ReadLog:
    """Wraps the positioned reads of frontends.hf.weights: (file name, offset, bytes) of each."""

    def __init__(self, monkeypatch):
        self.reads = []
        real = hf_weights.read_bytes

        def logged(path, offset, size):
            self.reads.append((str(path), offset, size))
            return real(path, offset, size)

        monkeypatch.setattr(hf_weights, "read_bytes", logged)

    @property
    def files(self) -> list:
        return sorted({path for path, _, _ in self.reads})

    @property
    def total(self) -> int:
        return sum(size for _, _, size in self.reads)


# ---- transformers checkpoints ------------------------------------------------------------

@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def save(transformers, tmp_path, class_name, shard_size=None, **config):
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, class_name)(**config))
    folder = tmp_path / class_name
    model.save_pretrained(folder, **({"max_shard_size": shard_size} if shard_size else {}))
    return model, folder


def test_sharded_checkpoint_loads_one_shard_per_param(transformers, tmp_path, monkeypatch):
    model, folder = save(transformers, tmp_path, "LlamaConfig", shard_size="20KB", vocab_size=128, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 2
    log = ReadLog(monkeypatch)
    graph = load_spec(folder)
    assert log.reads == []  # building reads headers, never tensors
    assert all(isinstance(p.data, CheckpointData) for p in graph.params.values())
    param = graph.params["layers.2.mlp.w_up"]
    array = param.array()
    assert log.files == [str(folder / index["model.layers.2.mlp.up_proj.weight"])]
    assert log.total == array.nbytes == 64 * 32 * 4
    np.testing.assert_array_equal(array, model.model.layers[2].mlp.up_proj.weight.detach().numpy())


def test_experts_stack_from_their_shards(transformers, tmp_path, monkeypatch):
    from safetensors.numpy import load_file
    model, folder = save(transformers, tmp_path, "MixtralConfig", vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                         num_experts_per_tok=2)
    # transformers keeps one layer's experts in one shard; split them over two by hand
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    shard_of = {name: "b.safetensors" if ".experts.2." in name or ".experts.3." in name else "a.safetensors"
                for name in tensors}
    for shard in ("a.safetensors", "b.safetensors"):
        save_file({k: v for k, v in tensors.items() if shard_of[k] == shard}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shard_of}))
    log = ReadLog(monkeypatch)
    param = load_spec(folder).params["layers.0.moe.w_gate"]
    w_gate = param.array()
    assert log.files == [str(folder / "a.safetensors"), str(folder / "b.safetensors")]
    assert [size for _, _, size in log.reads] == [32 * 16 * 4] * 4  # one read per expert's w1
    gate_up = model.model.layers[0].mlp.experts.gate_up_proj.detach().numpy()  # fused in memory: [E, 2f, d]
    np.testing.assert_array_equal(w_gate, gate_up[:, :32])
    np.testing.assert_array_equal(param.data.rows(1, 3), w_gate[1:3])  # experts 1 and 2, from both shards


def test_phi3_fused_projections_split_by_rows(transformers, tmp_path, monkeypatch):
    model, folder = save(transformers, tmp_path, "Phi3Config", vocab_size=64, hidden_size=32, intermediate_size=24,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    log = ReadLog(monkeypatch)
    graph = load_spec(folder)
    qkv = model.model.layers[0].self_attn.qkv_proj.weight.detach().numpy()
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight.detach().numpy()
    for name, want in (("attn.wq", qkv[:32]), ("attn.wk", qkv[32:48]), ("attn.wv", qkv[48:]),
                       ("mlp.w_gate", gate_up[:24]), ("mlp.w_up", gate_up[24:])):
        np.testing.assert_array_equal(graph.params[f"layers.0.{name}"].array(), want)
    assert [size for _, _, size in log.reads] == [32 * 32 * 4, 16 * 32 * 4, 16 * 32 * 4, 24 * 32 * 4, 24 * 32 * 4]


# ---- hand-made checkpoints -----------------------------------------------------------------

def write_tiny(tmp_path, config=None, dtype=np.float32, edit=None, name="tiny"):
    """A folder with config.json and a model.safetensors that fits it (``edit`` may change
    the tensors first); returns the folder and the tensors."""
    config = config or TINY
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    arch, _ = read_arch(folder)
    graph = load_hf(folder, weights=False)
    rng = np.random.default_rng(0)
    tensors = {}
    for param in graph.params.values():
        source = checkpoint_source(arch, param.name)
        for key in source.names():
            shape = param.shape[1:] if len(source.names()) > 1 else param.shape
            tensors[key] = rng.standard_normal(shape).astype(dtype)
    if edit:
        edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, tensors


def test_weights_false_and_config_only_folders_leave_params_absent(tmp_path):
    folder, _ = write_tiny(tmp_path)
    assert all(p.data is None for p in load_hf(folder, weights=False).params.values())
    (folder / "model.safetensors").unlink()
    assert all(p.data is None for p in load_spec(folder).params.values())


def test_bf16_checkpoint_gives_a_bf16_graph(tmp_path):
    folder, tensors = write_tiny(tmp_path, dtype=ml_dtypes.bfloat16)
    graph = load_spec(folder)
    assert graph.meta["dtype"] == "bf16" and graph.params["embed"].dtype == DType.bf16
    np.testing.assert_array_equal(graph.params["lm_head"].array(), tensors["lm_head.weight"])


def test_tied_models_ignore_a_stored_lm_head(tmp_path):
    folder, _ = write_tiny(tmp_path, {**TINY, "tie_word_embeddings": True},
                           edit=lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}))
    assert "lm_head" not in load_spec(folder).params


@pytest.mark.parametrize("edit, pattern", [
    (lambda t: t.pop("model.layers.0.mlp.up_proj.weight"), "has no tensor model.layers.0.mlp.up_proj.weight"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight": np.zeros((24, 8), np.float32)}),
     r"up_proj.weight has shape \[24, 8\]; config.json describes @layers.0.mlp.w_up as \[24, 16\]"),
    (lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(16, np.float32)}),
     "checkpoint tensor model.layers.0.self_attn.o_proj.bias has no place"),
    (lambda t: t.update({"model.layers.0.mlp.down_proj.weight": np.zeros((16, 24), np.int8)}),
     "stored as I8; irc reads float weights"),
])
def test_checkpoints_that_do_not_fit_are_refused(tmp_path, edit, pattern):
    folder, _ = write_tiny(tmp_path, edit=edit)
    with pytest.raises(SpecError, match=pattern):
        load_spec(folder)


def test_quantized_checkpoints_are_refused_but_their_structure_compiles(tmp_path):
    folder, _ = write_tiny(tmp_path, {**TINY, "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(SpecError, match="quantization_config: quantized checkpoints are not supported"):
        load_spec(folder)
    assert load_hf(folder, weights=False).params["embed"].data is None


def test_shard_index_naming_a_missing_file(tmp_path):
    folder, _ = write_tiny(tmp_path)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(SpecError, match="shard model-00001-of-00002.safetensors is missing"):
        load_spec(folder)


def test_rows_read_only_the_rows_asked_for(tmp_path, monkeypatch):
    folder, tensors = write_tiny(tmp_path, dtype=ml_dtypes.bfloat16)
    data = load_spec(folder).params["lm_head"].data
    log = ReadLog(monkeypatch)
    rows = data.rows(10, 13)
    assert log.total == 3 * 16 * 2  # three bf16 rows of 16
    np.testing.assert_array_equal(rows, tensors["lm_head.weight"][10:13])
    as_f32 = CheckpointData(data.checkpoint, data.source, DType.f32)
    assert as_f32.rows(10, 13).dtype == np.float32 and as_f32.load().shape == (64, 16)


def test_a_truncated_shard_is_refused_before_anything_is_read(tmp_path):
    folder, _ = write_tiny(tmp_path)
    path = folder / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(SpecError, match=r"model.safetensors: truncated shard: tensor .* ends at byte"):
        load_spec(folder)


def test_a_header_whose_bytes_disagree_with_its_dtype_and_shape(tmp_path):
    folder, _ = write_tiny(tmp_path)
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    name = "model.layers.0.mlp.up_proj.weight"
    header[name]["shape"] = [24, 15]  # the bytes still hold 24 x 16 floats
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + size:])
    with pytest.raises(SpecError, match=rf"tensor {name}: F32 \[24, 15\] needs 1,440 bytes but the header gives "
                                        r"it 1,536"):
        load_spec(folder)
