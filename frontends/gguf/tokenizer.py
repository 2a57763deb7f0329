"""The tokenizer a GGUF file carries (``tokenizer.ggml.*``) as ``tokenizer.json`` and
``tokenizer_config.json``, built with the ``tokenizers`` library, for onnxruntime-genai.

``tokenizer_files(gguf)`` -> ({file name: text}, note). Token ids are the file's own:
the vocabulary in file order, control tokens (type 3) as special added tokens and
user-defined ones (type 4) as plain added tokens, each at its id.

- ``gpt2`` (byte-level BPE): the file's vocabulary and merges; the pre-tokenizer is the one
  the original tokenizer.json of that vocabulary family has, picked by
  ``tokenizer.ggml.pre`` (the names llama.cpp gives them; ``PRE_TOKENIZERS``), byte-level
  decoding. A ``pre`` irc does not know cannot be reproduced faithfully: no files are
  written and the note says why (the model is still compiled).
- ``llama`` (SentencePiece-style BPE with byte fallback): merges recovered from the
  vocabulary and its scores, best score first (what transformers does for such files),
  ``Metaspace`` with a prefix space when ``tokenizer.ggml.add_space_prefix`` (default true);
  Gemma (no prefix space) orders merges by file position and spells multi-space tokens
  with U+2581, Phi-3 prepends the prefix space with a normaliser, as transformers' GGUF
  tokenizer does for them.

BOS/EOS are added by a template when ``tokenizer.ggml.add_bos_token`` /
``add_eos_token`` say so. ``tokenizer_config.json`` names the special tokens and carries
the chat template. Both texts are deterministic (sorted keys, vocabulary in id order).
"""
from __future__ import annotations

import json
from typing import Optional

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from frontends.gguf.reader import GGUFFile

CONTROL, USER_DEFINED = 3, 4
SPACE = "\u2581"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's pre-tokenizer names -> the split their original tokenizer.json makes before
# byte-level encoding: None is GPT-2's own regex, "digits" splits digits first, else a regex
_GROUPS = {
    None: ("gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion", "granite-docling"),
    "digits": ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
    _LLAMA3: ("llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3", "pixtral", "midm-2.0", "lfm2"),
    _QWEN2: ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"),
    _GPT4O: ("gpt-4o", "llama4", "minimax-m2"),
    _TEKKEN: ("tekken",),
}
PRE_TOKENIZERS = {name: split for split, names in _GROUPS.items() for name in names}


class Unfaithful(Exception):
    """The file's tokenizer cannot be reproduced faithfully (the message says why)."""


def tokenizer_files(gguf: GGUFFile) -> tuple[dict, str]:
    """({"tokenizer.json": text, "tokenizer_config.json": text}, "") or ({}, why not)."""
    try:
        tokenizer, config = build_tokenizer(gguf)
    except Unfaithful as err:
        return {}, f"tokenizer.json not written: {err}"
    return {"tokenizer.json": tokenizer.to_str(pretty=True) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"}, ""


def build_tokenizer(gguf: GGUFFile) -> tuple[Tokenizer, dict]:
    """The ``tokenizers.Tokenizer`` and the tokenizer_config dict (raises ``Unfaithful``)."""
    kind = gguf.get("tokenizer.ggml.model", str, None)
    if kind is None:
        raise Unfaithful("the file has no tokenizer (tokenizer.ggml.model)")
    tokens = gguf.get("tokenizer.ggml.tokens", list)
    types = gguf.get("tokenizer.ggml.token_type", list, [1] * len(tokens))
    if kind == "gpt2":
        tokenizer = _byte_level(gguf, tokens)
    elif kind == "llama":
        tokenizer = _sentencepiece(gguf, tokens)
    else:
        raise Unfaithful(f"tokenizer.ggml.model {kind!r} is not one irc converts (gpt2, llama)")
    _add_special(tokenizer, tokens, types)
    moved = [t for t, i in tokenizer.get_vocab(with_added_tokens=True).items() if i >= len(tokens)]
    if moved:  # an added token that is not the file's own at its id: the model has no row for it
        raise Unfaithful(f"token {moved[0]!r} would get id {tokenizer.token_to_id(moved[0])}, past the file's "
                         f"{len(tokens)} tokens")
    special = _special_tokens(gguf, tokens)
    add_bos = gguf.get("tokenizer.ggml.add_bos_token", bool, kind == "llama")
    add_eos = gguf.get("tokenizer.ggml.add_eos_token", bool, False)
    template = _template(special, add_bos, add_eos)
    if template is not None:
        tokenizer.post_processor = template
    return tokenizer, _config(gguf, special, add_bos, add_eos)


def _vocab(tokens: list) -> dict:
    """Token text -> id; a text the file lists twice takes its last id, as transformers' GGUF
    tokenizer and llama.cpp's token-to-id map do (the earlier id still exists in the model,
    but no text encodes to it)."""
    return {token: index for index, token in enumerate(tokens)}


def _byte_level(gguf: GGUFFile, tokens: list) -> Tokenizer:
    pre = gguf.get("tokenizer.ggml.pre", str, "default")
    if pre not in PRE_TOKENIZERS:
        raise Unfaithful(f"tokenizer.ggml.pre {pre!r} is a pre-tokenizer irc does not know",)
    merges = [tuple(m.split(" ", 1)) for m in gguf.get("tokenizer.ggml.merges", list)]
    tokenizer = Tokenizer(models.BPE(vocab=_vocab(tokens), merges=merges, fuse_unk=False, byte_fallback=False))
    split = PRE_TOKENIZERS[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=split in (None, "digits"))
    if split is None:
        tokenizer.pre_tokenizer = byte_level
    elif split == "digits":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False), byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _sentencepiece(gguf: GGUFFile, tokens: list) -> Tokenizer:
    arch = gguf.arch
    scores = gguf.get("tokenizer.ggml.scores", list, None)
    if scores is None or len(scores) != len(tokens):
        raise Unfaithful("a SentencePiece vocabulary without one score per token (tokenizer.ggml.scores)")
    if arch in ("gemma", "gemma2", "gemma3"):  # multi-space tokens are stored as spaces; merges follow file order
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    vocab = _vocab(tokens)
    unk = gguf.get("tokenizer.ggml.unknown_token_id", int, 0)
    model = models.BPE(vocab=vocab, merges=_merges(vocab, tokens, scores), unk_token=tokens[unk], fuse_unk=True,
                       byte_fallback=True)
    tokenizer = Tokenizer(model)
    prefix = gguf.get("tokenizer.ggml.add_space_prefix", bool, arch not in ("gemma", "gemma2", "gemma3"))
    if arch == "phi3":
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, split=False,
                                                           prepend_scheme="first" if prefix else "never")
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix or arch == "phi3":
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges(vocab: dict, tokens: list, scores: list) -> list:
    """Merges implied by a scored vocabulary: every split of a token into two tokens, best
    merged score first (then the longer left piece, as transformers orders them)."""
    merges = []
    for token, score in zip(tokens, scores):
        if vocab.get(token) is None:
            continue
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges.extend((left, right, score) for left, right in local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _add_special(tokenizer: Tokenizer, tokens: list, types: list) -> None:
    """Control tokens as special added tokens, user-defined ones as plain added tokens, each
    at its own id: a token whose text the vocabulary does not hold as spelled (Gemma's
    multi-space tokens, respelled with U+2581) is left to the model's merges, as
    transformers' GGUF tokenizer leaves it, rather than given a new id past the file's."""
    vocab = tokenizer.get_vocab()
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
               if k == CONTROL and t in vocab]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types)
            if k == USER_DEFINED and t in vocab]
    if control:
        tokenizer.add_special_tokens(control)
    if user:
        tokenizer.add_tokens(user)


def _special_tokens(gguf: GGUFFile, tokens: list) -> dict:
    """bos/eos/unk/pad token text by the file's ids (absent or out of range: left out)."""
    found = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        index = gguf.get(f"tokenizer.ggml.{key}", int, None)
        if index is not None and 0 <= index < len(tokens):
            found[name] = (tokens[index], index)
    return found


def _template(special: dict, add_bos: bool, add_eos: bool) -> Optional[processors.TemplateProcessing]:
    pieces = [name for name, wanted in (("bos", add_bos), ("eos", add_eos)) if wanted and name in special]
    if not pieces:
        return None
    bos = [f"{special['bos'][0]}:0"] if "bos" in pieces else []
    eos = [f"{special['eos'][0]}:0"] if "eos" in pieces else []
    single = bos + ["$A:0"] + eos
    pair = single + [p.replace(":0", ":1") for p in bos] + ["$B:1"] + [p.replace(":0", ":1") for p in eos]
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=[special[name] for name in pieces])


def _config(gguf: GGUFFile, special: dict, add_bos: bool, add_eos: bool) -> dict:
    config = {"add_bos_token": add_bos, "add_eos_token": add_eos, "clean_up_tokenization_spaces": False,
              "model_max_length": gguf.get(gguf.arch_key("context_length"), int, 4096),
              "tokenizer_class": "PreTrainedTokenizerFast"}
    for name, (text, _) in special.items():
        config[f"{name}_token"] = text
    if gguf.has("tokenizer.chat_template"):
        config["chat_template"] = gguf.get("tokenizer.chat_template", str)
    return config
