"""``genai_config.json`` beside the model, so onnxruntime-genai loads and generates with it.

Written when the graph has genai's decoder signature: ``input_ids``, ``attention_mask``
(and ``position_ids``, which genai fills from the mask), one ``past_key_values.{i}.key``
/ ``.value`` pair per layer with equal [K, D] for keys and values (genai allocates both
caches with one head size; MLA's caches differ, so DeepSeek specs get no config unless
``mla-absorb{cache=halves}`` splits the latent cache into two equal halves; nor does
an int8 cache from ``quantize{kv_cache=true}``, whose ``*_scale`` inputs genai does not
allocate), and
``logits`` plus ``present.{i}.key/.value``.

``past_present_share_buffer``: true when every layer's attention is ORT's
GroupQueryAttention, which updates a max-length cache in place when genai hands it the
same buffer as past and present (and concatenates when it does not, as the graph's
signature says); false otherwise (standard ``Attention`` and the written-out form
concatenate, so the cache must grow).

Token ids come from the graph's meta (``bos_token_id``, ``eos_token_id`` — an int, or a
list when the model has several —, ``pad_token_id``) where a frontend put them there (the
Hugging Face frontend reads generation_config.json, then config.json; the GGUF frontend its
tokenizer keys); otherwise bos 1, pad the first eos (else 0), and no end-of-sequence token
(eos ``[]``: generation runs to ``max_length``; genai refuses -1). ``context_length`` and
``max_length`` are the compile's ``context`` capped by the model's trained length (meta
``max_positions``). The search defaults are greedy unless meta ``generation`` (the
checkpoint's generation_config.json) says otherwise. Returns (path, "") or (None, reason).
"""
from __future__ import annotations

import json
import re

from irc.graph import Graph
from irc.output import OutputFolder

CONFIG = "genai_config.json"


def decoder_layers(graph: Graph):
    """(layers, kv_heads, head_size, reason): the cache layout genai needs, or why not."""
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    for name in ("input_ids", "attention_mask"):
        if name not in inputs:
            return None, None, None, f"no {name} input"
    if "logits" not in outputs:
        return None, None, None, "no logits output"
    if any(re.fullmatch(r"past_key_values\.\d+\.(key|value)_scale", v.name) for v in graph.inputs):
        return None, None, None, "an int8 KV cache with scale inputs (genai allocates no scale caches)"
    keys = [re.fullmatch(r"past_key_values\.(\d+)\.key", v.name) for v in graph.inputs]
    layers = sorted(int(m.group(1)) for m in keys if m)
    if not layers or layers != list(range(len(layers))):
        return None, None, None, "no past_key_values.{i}.key inputs numbered from 0"
    layouts = set()
    for i in layers:
        for kind in ("key", "value"):
            past = inputs.get(f"past_key_values.{i}.{kind}")
            if past is None or f"present.{i}.{kind}" not in outputs:
                return None, None, None, f"layer {i} lacks past_key_values.{i}.{kind} or present.{i}.{kind}"
            layouts.add((past.shape[1], past.shape[3], past.dtype))
    if len(layouts) != 1:
        return None, None, None, ("keys and values (or layers) have different cache layouts, which genai cannot "
                                  "allocate (it gives a layer's key and value one head size; for an MLA latent "
                                  "cache, compile with mla-absorb{cache=halves})")
    kv_heads, head_size, _ = layouts.pop()
    if not isinstance(kv_heads, int) or not isinstance(head_size, int):
        return None, None, None, "symbolic kv heads or head size"
    return len(layers), kv_heads, head_size, ""


def genai_config(graph: Graph, filename: str, context: int, share_buffer: bool = False) -> dict:
    layers, kv_heads, head_size, _ = decoder_layers(graph)
    meta = graph.meta
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    if any(v.name == "position_ids" for v in graph.inputs):
        inputs["position_ids"] = "position_ids"
    token = {key: meta.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": head_size,
        "hidden_size": meta.get("d_model", 0),
        "inputs": inputs,
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
        "num_attention_heads": meta.get("n_heads", kv_heads),
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
    }
    eos = [] if token["eos_token_id"] is None else token["eos_token_id"]
    first_eos = eos[0] if isinstance(eos, list) and eos else None if isinstance(eos, list) else eos
    pad = token["pad_token_id"] if token["pad_token_id"] is not None else first_eos
    length = context_length(meta, context)
    model = {
        "bos_token_id": 1 if token["bos_token_id"] is None else token["bos_token_id"],
        "context_length": length,
        "decoder": decoder,
        "eos_token_id": eos,
        "pad_token_id": 0 if pad is None else pad,
        "type": "llama",
        "vocab_size": meta.get("vocab_size", 0),
    }
    search = {**GREEDY, **(meta.get("generation") or {}), "max_length": length,
              "past_present_share_buffer": share_buffer}
    return {"model": model, "search": search}


GREEDY = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
          "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
          "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1, "top_p": 1.0}


def context_length(meta: dict, context: int) -> int:
    """The compile's ``context``, capped by the model's trained length where meta gives it."""
    positions = meta.get("max_positions")
    return min(context, positions) if isinstance(positions, int) and positions > 0 else context


def write_genai_config(graph: Graph, out: OutputFolder, model_name: str, context: int,
                       share_buffer: bool = False) -> tuple:
    """Stage ``genai_config.json`` for the model ``model_name`` in the output folder ``out``:
    (its final path, "") or (None, reason)."""
    reason = decoder_layers(graph)[3]
    if reason:
        return None, f"genai_config.json not written: {reason}"
    config = genai_config(graph, model_name, context, share_buffer)
    return out.write(CONFIG, json.dumps(config, indent=4, sort_keys=True) + "\n"), ""
