"""A Hugging Face folder's token ids and generation defaults, for the graph's meta.

A runtime beside the compiled model (onnxruntime-genai's ``genai_config.json``) needs to
know where an answer ends. The folder says so in two places, read in this order:
``generation_config.json`` (what ``generate`` uses), then ``config.json``:

- ``bos_token_id``, ``eos_token_id`` (an int, or a list when there are several),
  ``pad_token_id`` (the first eos when neither file gives one, as ``generate`` does);
- ``max_positions``: ``max_position_embeddings`` from config.json, the longest sequence
  the model was trained for;
- ``generation``: the search defaults generation_config.json sets (``do_sample``,
  ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ...), under genai's names,
  which are transformers' own. With ``do_sample`` and no ``top_k`` transformers samples
  from the top 50; that default is written out so a runtime with other defaults agrees.

A value of the wrong type is a ``SpecError`` naming the file and the key.
"""
from __future__ import annotations

import os

from irc import inputs
from irc.errors import SpecError

GENERATION_CONFIG = "generation_config.json"
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
SEARCH_KEYS = {"do_sample": bool, "temperature": float, "top_k": int, "top_p": float, "repetition_penalty": float,
               "num_beams": int, "length_penalty": float, "no_repeat_ngram_size": int, "min_length": int,
               "diversity_penalty": float, "early_stopping": bool, "num_return_sequences": int}
SAMPLING_DEFAULTS = {"top_k": 50}  # transformers' GenerationConfig default, used only when do_sample


def read_json(path: str) -> dict:
    """A JSON object from ``path``, or {} when there is no such file."""
    if not os.path.isfile(path):
        return {}
    data = inputs.read_json(path, SpecError)  # unreadable, not UTF-8, not JSON: one SpecError naming the file
    if not isinstance(data, dict):
        raise SpecError("expected a JSON object", location=path)
    return data


def _token_ids(value, key: str, path: str):
    """An int, or a list of ints (one id: the int itself); None for null or []."""
    ids = value if isinstance(value, list) else [value]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise SpecError(f"{key}: expected a token id or a list of token ids, got {value!r}", location=path)
    ids = list(dict.fromkeys(ids))
    return None if not ids else ids[0] if len(ids) == 1 else ids


def _search(generation: dict, path: str) -> dict:
    search = {}
    for key, kind in SEARCH_KEYS.items():
        value = generation.get(key)
        if value is None:
            continue
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float)) or (
                kind is int and not isinstance(value, int)):
            raise SpecError(f"{key}: expected {kind.__name__}, got {value!r}", location=path)
        search[key] = kind(value)
    if search.get("do_sample"):
        search = {**SAMPLING_DEFAULTS, **search}
    return search


def generation_meta(folder: str, config: dict) -> dict:
    """The graph meta entries the folder gives (module docstring); ``config`` is config.json's
    data. A multimodal config's ``text_config`` (Qwen3.5) is read after the top level."""
    path = os.path.join(folder, GENERATION_CONFIG)
    generation = read_json(path)
    config_path = os.path.join(folder, "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    meta = {}
    for key in TOKEN_KEYS:
        for source, where in ((generation, path), (config, config_path), (text, config_path)):
            ids = _token_ids(source[key], key, where) if source.get(key) is not None else None
            if ids is not None:
                if key != "eos_token_id" and isinstance(ids, list):
                    raise SpecError(f"{key}: expected one token id, got {ids!r}", location=where)
                meta[key] = ids
                break
    if "pad_token_id" not in meta and "eos_token_id" in meta:
        eos = meta["eos_token_id"]
        meta["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    positions = config.get("max_position_embeddings", text.get("max_position_embeddings"))
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        meta["max_positions"] = positions
    search = _search(generation, path)
    if search:
        meta["generation"] = search
    return meta
