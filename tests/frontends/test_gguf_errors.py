"""Bad GGUF input through the CLI: one message naming the file and the key or tensor, exit
code 2, no traceback, no output. And the good cases next to them: a split set loads as the
single file does, from any of its parts."""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from frontends import load_spec
from gguf_writer import write_file
from irc.errors import SpecError
from irc_cli import main

D, HEADS, KV_HEADS, FF, VOCAB = 32, 4, 2, 64, 64
KEYS = {"llama.block_count": 1, "llama.context_length": 128, "llama.embedding_length": D,
        "llama.feed_forward_length": FF, "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0}


def tensors(rng=None) -> dict:
    rng = rng or np.random.default_rng(0)
    kv = D // HEADS * KV_HEADS
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,), "blk.0.attn_norm.weight": (D,),
              "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (kv, D), "blk.0.attn_v.weight": (kv, D),
              "blk.0.attn_output.weight": (D, D), "blk.0.ffn_norm.weight": (D,), "blk.0.ffn_gate.weight": (FF, D),
              "blk.0.ffn_up.weight": (FF, D), "blk.0.ffn_down.weight": (D, FF)}
    return {name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name, shape in shapes.items()}


def fails(capsys, path, *words) -> str:
    """``irc show path`` exits 2 with one message holding ``words``."""
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("irc: error: ") and err.count("irc: error:") == 1
    for word in words:
        assert word in err, err
    return err


def test_a_good_file_loads(tmp_path, capsys):
    path = write_file(tmp_path / "tiny.gguf", "llama", KEYS, tensors())
    assert main(["show", path]) == 0
    assert "1 layers" in capsys.readouterr().out


def test_unknown_architecture(tmp_path, capsys):
    path = write_file(tmp_path / "m.gguf", "rwkv6", {"rwkv6.block_count": 1}, {"token_embd.weight": np.zeros((4, 4),
                                                                                                             np.float32)})
    fails(capsys, path, "m.gguf", "general.architecture", "'rwkv6' is not supported")


def test_missing_hyperparameter(tmp_path, capsys):
    keys = {k: v for k, v in KEYS.items() if k != "llama.attention.head_count"}
    fails(capsys, write_file(tmp_path / "m.gguf", "llama", keys, tensors()), "llama.attention.head_count",
          "missing required key")


def test_shape_disagrees_with_the_hyperparameters(tmp_path, capsys):
    bad = tensors()
    bad["blk.0.attn_k.weight"] = np.zeros((D, D), np.float32)  # 4 kv heads' worth for head_count_kv 2
    fails(capsys, write_file(tmp_path / "m.gguf", "llama", KEYS, bad), "blk.0.attn_k.weight", "[32, 32]",
          "@layers.0.attn.wk", "[16, 32]")


def test_unsupported_block_type(tmp_path, capsys):
    bad = tensors()
    block, size = GGML_QUANT_SIZES[T.Q8_1]
    bad["blk.0.ffn_up.weight"] = (np.zeros((FF, D // block * size), np.uint8), T.Q8_1)
    fails(capsys, write_file(tmp_path / "m.gguf", "llama", KEYS, bad), "blk.0.ffn_up.weight", "Q8_1",
          "cannot read")


def test_truncated_file(tmp_path, capsys):
    path = write_file(tmp_path / "m.gguf", "llama", KEYS, tensors())
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) - 100)
    fails(capsys, path, "m.gguf", "truncated file", "blk.0.ffn_down.weight")  # the last tensor runs past the end


def test_truncated_header(tmp_path, capsys):
    path = write_file(tmp_path / "m.gguf", "llama", KEYS, tensors())
    with open(path, "r+b") as f:
        f.truncate(200)
    fails(capsys, path, "m.gguf", "truncated or corrupt")


def test_wrong_magic(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    fails(capsys, path, "m.gguf", "not a GGUF file", "b'GGML'")


def write_split(folder, parts: int = 3) -> list:
    import gguf
    writer = gguf.GGUFWriter(str(folder / "tiny.gguf"), "llama", split_max_tensors=4)
    for key, value in KEYS.items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(key, value)
    for name, array in tensors().items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [folder / f"tiny-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]


def test_split_set_with_a_missing_part(tmp_path, capsys):
    parts = write_split(tmp_path)
    parts[1].unlink()
    fails(capsys, parts[0], "split part 2 of 3 is missing", "tiny-00002-of-00003.gguf")


def test_split_set_loads_like_one_file(tmp_path):
    whole = load_spec(write_file(tmp_path / "tiny.gguf", "llama", KEYS, tensors()))
    (tmp_path / "split").mkdir()
    parts = write_split(tmp_path / "split")
    for part in (parts[0], parts[2]):
        split = load_spec(part)
        assert split.name == "tiny" and whole.name == "tiny"
        assert split.params.keys() == whole.params.keys()
        for name, param in whole.params.items():
            np.testing.assert_array_equal(split.params[name].array(), param.array())


def test_weights_option_is_checked(tmp_path):
    from frontends.gguf import load_gguf
    with pytest.raises(SpecError, match="weights="):
        load_gguf(write_file(tmp_path / "m.gguf", "llama", KEYS, tensors()), weights="int3")


def test_other_formats_are_dequantized_with_a_note(tmp_path, capsys):
    """A block type with no exact form (MXFP4 here) becomes float32 through gguf's
    dequantizer, and ``irc compile`` says which tensors went which way."""
    import gguf

    from frontends.gguf import load_gguf

    stored = tensors()
    stored["blk.0.ffn_up.weight"] = (gguf.quants.quantize(stored["blk.0.ffn_up.weight"], T.MXFP4), T.MXFP4)
    stored["blk.0.ffn_gate.weight"] = (gguf.quants.quantize(stored["blk.0.ffn_gate.weight"], T.Q4_0), T.Q4_0)
    path = write_file(tmp_path / "m.gguf", "llama", KEYS, stored)
    graph = load_gguf(path)
    assert "layers.0.mlp.w_up" in graph.params and "layers.0.mlp.w_gate.qweight" in graph.params
    np.testing.assert_array_equal(graph.params["layers.0.mlp.w_up"].array(),
                                  gguf.quants.dequantize(stored["blk.0.ffn_up.weight"][0], T.MXFP4))
    assert main(["compile", path, "--target", "ir", "-o", str(tmp_path / "m.ir")]) == 0
    err = capsys.readouterr().err
    assert "gguf: 1 MXFP4 tensor(s) dequantized to float32" in err
    assert "gguf: 1 Q4_0 tensor(s) kept as 4-bit codes, block 32, symmetric" in err
