"""Mutated Hugging Face folders: config.json (the examples' configs and a tiny checkpoint's),
model.safetensors.index.json, and safetensors shards (lying offsets, overlapping tensors,
unknown dtypes, a header length beyond the file, truncated data, byte garbage). Every case
ends with exit 0 or one message and exit 2, in time, and no output unless it succeeded
(``fuzzing``)."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save

from fuzzing import EXTREMES, check_irc, fuzz_settings, mutated_bytes, mutated_text, mutated_tree, workspace

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"
D, FF, VOCAB, KV = 16, 24, 64, 8
TINY = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
SHAPES = {"model.embed_tokens.weight": (VOCAB, D), "model.norm.weight": (D,), "lm_head.weight": (VOCAB, D),
          "model.layers.0.input_layernorm.weight": (D,), "model.layers.0.post_attention_layernorm.weight": (D,),
          "model.layers.0.self_attn.q_proj.weight": (D, D), "model.layers.0.self_attn.k_proj.weight": (KV, D),
          "model.layers.0.self_attn.v_proj.weight": (KV, D), "model.layers.0.self_attn.o_proj.weight": (D, D),
          "model.layers.0.mlp.gate_proj.weight": (FF, D), "model.layers.0.mlp.up_proj.weight": (FF, D),
          "model.layers.0.mlp.down_proj.weight": (D, FF)}
NAMES = sorted(SHAPES)
SHARDS = {"model-00001-of-00002.safetensors": NAMES[:6], "model-00002-of-00002.safetensors": NAMES[6:]}
DATA = {file: save({n: np.full(SHAPES[n], 0.01, np.float32) for n in names}) for file, names in SHARDS.items()}
INDEX = {"metadata": {"total_size": 4 * sum(int(np.prod(s)) for s in SHAPES.values())},
         "weight_map": {n: file for file, names in SHARDS.items() for n in names}}


def _small(config: dict) -> dict:
    """An example config with two layers: the same keys, a fast build."""
    config = dict(config, num_hidden_layers=2)
    if isinstance(config.get("first_k_dense_replace"), int):
        config["first_k_dense_replace"] = min(config["first_k_dense_replace"], 1)
    return config


CONFIGS = {p.parent.name: _small(json.loads(p.read_text())) for p in sorted(EXAMPLES.glob("*/config.json"))}
CONFIGS["tiny-checkpoint"] = TINY


@st.composite
def mutated_json(draw, tree) -> bytes:
    if draw(st.booleans()):
        return json.dumps(draw(mutated_tree(tree)), indent=1).encode()
    return draw(mutated_text(json.dumps(tree, indent=1)))


def _write_checkpoint(folder: Path, shards: dict, index: bytes = None) -> None:
    folder.joinpath("config.json").write_text(json.dumps(TINY))
    folder.joinpath("model.safetensors.index.json").write_bytes(index or json.dumps(INDEX).encode())
    for file, data in shards.items():
        folder.joinpath(file).write_bytes(data)


def _compile(draw, folder: Path, outputs: Path) -> list[str]:
    if draw(st.integers(0, 3)) == 0:
        return ["show", str(folder)]
    return ["compile", str(folder), "--target", "numpy", "-o", str(outputs / "model.py")]


@fuzz_settings
@given(st.data(), st.sampled_from(sorted(CONFIGS)))
def test_config_json(data, name):
    with workspace() as (inputs, outputs):
        folder = inputs / name
        folder.mkdir()
        if name == "tiny-checkpoint":
            _write_checkpoint(folder, DATA)
        folder.joinpath("config.json").write_bytes(data.draw(mutated_json(CONFIGS[name])))
        command = _compile(data.draw, folder, outputs) if name == "tiny-checkpoint" else ["show", str(folder)]
        check_irc(command, outputs)


@fuzz_settings
@given(st.data())
def test_safetensors_index(data):
    with workspace() as (inputs, outputs):
        _write_checkpoint(inputs, DATA, data.draw(mutated_json(INDEX)))
        check_irc(_compile(data.draw, inputs, outputs), outputs)


def _header(data: bytes) -> tuple[dict, bytes]:
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]), data[8 + size:]


def _with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + body


@st.composite
def lying_shard(draw, data: bytes) -> bytes:
    """A shard whose header lies: offsets past the data or overlapping another tensor, an
    unknown dtype, a shape that does not fit, a header length beyond the file, cut data."""
    header, body = _header(data)
    names = sorted(n for n in header if n != "__metadata__")
    name = draw(st.sampled_from(names))
    entry = header[name]
    lie = draw(st.sampled_from(["offsets", "overlap", "dtype", "shape", "length", "truncate"]))
    if lie == "offsets":
        entry["data_offsets"] = [draw(st.sampled_from(EXTREMES + [len(body), len(body) + 4])) for _ in range(2)]
    elif lie == "overlap":
        other = header[draw(st.sampled_from(names))]
        begin = other["data_offsets"][0] + draw(st.sampled_from([0, 4, 8]))
        entry["data_offsets"] = [begin, begin + entry["data_offsets"][1] - entry["data_offsets"][0]]
    elif lie == "dtype":
        entry["dtype"] = draw(st.sampled_from(["F4", "Q8", "", "f32", "I64", "F64", "BOOL", "U8", 7, None]))
    elif lie == "shape":
        entry["shape"] = draw(st.sampled_from([[], [0], [-1, 16], [2 ** 40, 2 ** 40], [1.5], "16", [D, D, 1]]))
    if lie == "length":
        size = len(json.dumps(header).encode()) + draw(st.sampled_from([1, len(body) + 1, 2 ** 40, 2 ** 63]))
        return size.to_bytes(8, "little") + json.dumps(header).encode() + body
    shard = _with_header(header, body)
    return shard[:-draw(st.integers(1, len(body)))] if lie == "truncate" else shard


@fuzz_settings
@given(st.data(), st.sampled_from(sorted(SHARDS)))
def test_safetensors_shard(data, file):
    original = DATA[file]
    header, body = _header(original)
    kind = data.draw(st.sampled_from(["lie", "tree", "bytes"]))
    if kind == "lie":
        shard = data.draw(lying_shard(original))
    elif kind == "tree":
        shard = _with_header(data.draw(mutated_tree(header)), body)
    else:
        shard = data.draw(mutated_bytes(original, 8 + int.from_bytes(original[:8], "little")))
    with workspace() as (inputs, outputs):
        _write_checkpoint(inputs, {**DATA, file: shard})
        check_irc(_compile(data.draw, inputs, outputs), outputs)
