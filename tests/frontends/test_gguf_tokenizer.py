"""The tokenizer.json a GGUF's tokenizer becomes (``frontends.gguf.tokenizer``), held
against transformers' tokenizer for the same file (``AutoTokenizer.from_pretrained(folder,
gguf_file=...)``) where both follow llama.cpp: SentencePiece vocabularies (Llama-style with
a prefix space, Gemma-style without) and byte-level BPE with the Llama 3 and Qwen2 splits.
The ids are the file's, special tokens stay whole, text round-trips, output is
deterministic, and a vocabulary irc cannot reproduce writes no file and says why."""
import json

import pytest

from frontends import companion_files
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tokenizer import tokenizer_files
from gguf_writer import write_file
from test_gguf_errors import KEYS, tensors

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["Hello world", " leading space and  double  spaces", "abc abd\nbcd\tab 123 4567", "<s>ab</s> cab",
         "unicode: é ü ✓ 日本"]
LETTERS = "abcdehlorwnsput"


def sentencepiece_vocab():
    """<unk> <s> </s>, the 256 byte tokens, then scored pieces (merges implied by scores)."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    tokens += [f"<0x{i:02X}>" for i in range(256)]
    scores += [0.0] * 256
    types += [6] * 256
    pieces = ["▁"] + list(LETTERS) + ["ab", "▁a", "▁ab", "bc", "▁bc", "abc", "▁abc", "he", "ll", "hell", "hello",
                                      "▁hello", "wo", "▁wor", "▁world", "ld", "or", "▁w", "▁h", "sp", "ace", "▁▁"]
    tokens += pieces
    scores += [-float(i) for i in range(len(pieces))]
    types += [1] * len(pieces)
    return tokens, scores, types


def byte_level_vocab():
    """The 256 byte-level symbols, merges of a few words, two control tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = ["a b", "ab c", "Ġ a", "Ġa b", "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "1 2",
              "Ġ Ġ"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = symbols + merged + ["<|begin|>", "<|end|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    return tokens, merges, types


def write_tokenizer_file(path, arch: str, model: str, **extra) -> str:
    keys = {k.replace("llama.", f"{arch}."): v for k, v in KEYS.items()}
    keys.update({"tokenizer.ggml.model": model, **extra})
    return write_file(path, arch, keys, tensors())


def sentencepiece_file(path, arch="llama", **extra):
    tokens, scores, types = sentencepiece_vocab()
    return write_tokenizer_file(path, arch, "llama", **{
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        **extra})


def byte_level_file(path, pre: str):
    tokens, merges, types = byte_level_vocab()
    return write_tokenizer_file(path, "llama", "gpt2", **{
        "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": len(tokens) - 2,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1, "tokenizer.ggml.add_bos_token": True})


def ours(path):
    files, note = tokenizer_files(GGUFFile.open(path))
    assert not note
    return tokenizers.Tokenizer.from_str(files["tokenizer.json"]), json.loads(files["tokenizer_config.json"])


def theirs(path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


CASES = {
    "llama-sentencepiece": lambda p: sentencepiece_file(p),
    "gemma-sentencepiece": lambda p: sentencepiece_file(p, arch="gemma2", **{"tokenizer.ggml.add_space_prefix": False}),
    "phi3-sentencepiece": lambda p: sentencepiece_file(p, arch="phi3"),
    "llama3-byte-level": lambda p: byte_level_file(p, "llama-bpe"),
    "qwen2-byte-level": lambda p: byte_level_file(p, "qwen2"),
}


@pytest.mark.parametrize("case", CASES)
def test_ids_match_transformers(case, tmp_path):
    path = tmp_path / f"{case}.gguf"
    CASES[case](path)
    mine, config = ours(path)
    reference = theirs(path)
    for text in TEXTS:
        ids = mine.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert mine.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    assert config["bos_token"] == reference.bos_token and config["eos_token"] == reference.eos_token


def test_special_tokens_keep_their_ids_and_output_is_deterministic(tmp_path):
    path = byte_level_file(tmp_path / "t.gguf", "llama-bpe")
    tokens = byte_level_vocab()[0]
    mine, config = ours(path)
    ids = mine.encode("ab<|end|>abc").ids
    assert ids[0] == tokens.index("<|begin|>")  # add_bos_token
    assert tokens.index("<|end|>") in ids and mine.get_vocab_size() == len(tokens)
    assert config["add_bos_token"] is True
    first, again = companion_files(path), companion_files(path)
    assert first == again and sorted(first[0]) == ["tokenizer.json", "tokenizer_config.json"]


def test_unknown_pre_tokenizer_writes_nothing_and_says_why(tmp_path):
    path = byte_level_file(tmp_path / "t.gguf", "some-new-model")
    files, notes = companion_files(path)
    assert files == {} and "'some-new-model'" in notes[0] and "tokenizer.json not written" in notes[0]


def test_a_file_without_tokenizer_says_so(tmp_path):
    from gguf_writer import write_file as write
    path = write(tmp_path / "t.gguf", "llama", KEYS, tensors())
    files, notes = companion_files(path)
    assert files == {} and "no tokenizer" in notes[0]


def test_merges_and_byte_fallback_are_used(tmp_path):
    mine, _ = ours(sentencepiece_file(tmp_path / "t.gguf"))
    pieces = mine.encode("hello world é").tokens
    assert pieces[:2] == ["<s>", "▁hello"] and "<0xC3>" in pieces  # BOS, merged pieces, é as its UTF-8 bytes


def gemma_file(path):
    """A Gemma-3-style vocabulary: no prefix space, multi-space tokens stored as spaces and
    typed user-defined (Gemma-3-270M has 30 of them), and one text listed twice."""
    tokens, scores, types = sentencepiece_vocab()
    tokens, scores, types = ["<unk>", "<bos>", "<eos>"] + tokens[3:-1], scores[:-1], types[:-1]  # Gemma's names
    spaces = ["  ", "   ", "    "]  # "▁▁" comes back spelled with spaces
    tokens += ["<pad>"] + spaces + ["ab"]  # "ab" again: its last id wins, as in transformers and llama.cpp
    scores += [0.0] * 5
    types += [3, 4, 4, 4, 1]
    return write_tokenizer_file(path, "gemma3", "llama", **{
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False})


def test_user_defined_spaces_and_a_repeated_token_match_transformers(tmp_path):
    """Gemma-3's GGUF used to write no tokenizer ("repeated tokens"): its multi-space
    user-defined tokens were added a second time, at new ids past the file's. Now they are
    the vocabulary's own entries (respelled), every id is the file's, and the ids match
    transformers' GGUF tokenizer."""
    path = tmp_path / "g.gguf"
    gemma_file(path)
    tokens = GGUFFile.open(path).get("tokenizer.ggml.tokens", list)
    mine, _ = ours(path)
    reference = theirs(path)
    assert max(mine.get_vocab(with_added_tokens=True).values()) < len(tokens)
    assert mine.token_to_id("ab") == len(tokens) - 1
    for text in TEXTS + ["a  b   c    d", "ab abc  ab"]:
        ids = mine.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        if len(tokens) - 1 in ids:  # transformers gives its own extra "<mask>" that id (past its vocab dict)
            assert mine.decode(ids, skip_special_tokens=True) == text
        else:
            assert mine.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
