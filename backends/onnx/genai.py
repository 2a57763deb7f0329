"""``genai_config.json`` beside the model, so onnxruntime-genai loads and generates with it.

Never for an encoder (meta ``encoder``: an embedding model), which genai does not run.
Written when the graph has genai's decoder signature: ``input_ids``, ``attention_mask``
(and ``position_ids``, which genai fills from the mask), one ``past_key_values.{i}.key``
/ ``.value`` pair per attention layer with equal [K, D] for keys and values, and for a
state-space layer its ``past_key_values.{i}.conv_state`` / ``.recurrent_state`` (genai
0.18's ``RecurrentState`` finds a recurrent layer by the pair, at any layer index, beside
the KV caches of the attention layers; the names are its defaults, written out in
``decoder.inputs``/``outputs``), or only a conv state (LFM2's short convolution: see
``layer_types`` below); genai allocates both
caches with one head size (``num_hidden_layers`` counts the layers with a cache: a layer
that reuses another's K/V, Gemma-3n's KV sharing, has none); MLA's caches differ, so
DeepSeek specs get no config unless
``mla-absorb{cache=halves}`` splits the latent cache into two equal halves; nor does
an int8 cache from ``quantize{kv_cache=true}``, whose ``*_scale`` inputs genai does not
allocate; and ``logits`` plus ``present.{i}.key/.value``.

A layer with only a conv state genai finds only through ``decoder.layer_types`` (one entry
per layer: "full_attention" for a KV cache, "conv" for a conv state alone,
"linear_attention" for a conv and a recurrent state), so that list is written when a graph
has such layers, and only then. Its ``model.type`` is then "lfm2" when every layer is
"conv" or "full_attention" (genai's LFM2 cache: conv states and KV caches, as LiquidAI's
models), else "llama" (its ``ConvKeyValueCache``, which also finds the recurrent layers);
both ran irc's LFM2 folders with the same tokens (0.18). With that list genai binds a conv
state to every layer that is not full_attention and gives all conv states one shape, so a
graph with conv-only layers beside a layer with no state (an MLP alone), a layer with a KV
cache and a state (Falcon-H1's), or conv states of another shape (a Mamba layer's) gets no
config.

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
from typing import Optional

from irc.graph import Graph
from irc.output import OutputFolder

CONFIG = "genai_config.json"


STATE_KINDS = ("conv_state", "recurrent_state")


def decoder_layers(graph: Graph):
    """(layers, kv_heads, head_size, reason): the cache layout genai needs, or why not.
    ``layers`` is the model's layer count; kv_heads and head_size are those of its
    attention layers (a model without any: 1 and its width, which genai does not read)."""
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    if graph.meta.get("encoder"):
        return None, None, None, "the model is an encoder (an embedding model), and onnxruntime-genai runs decoders"
    for name in ("input_ids", "attention_mask"):
        if name not in inputs:
            return None, None, None, f"no {name} input"
    if "logits" not in outputs:
        return None, None, None, "no logits output"
    if any(re.fullmatch(r"past_key_values\.\d+\.(key|value)_scale", v.name) for v in graph.inputs):
        return None, None, None, "an int8 KV cache with scale inputs (genai allocates no scale caches)"
    kv = sorted(int(m.group(1)) for m in (re.fullmatch(r"past_key_values\.(\d+)\.key", v.name) for v in graph.inputs)
                if m)
    states = _state_layers(inputs)
    if not kv and not states:
        return None, None, None, "no past_key_values.{i}.key or recurrent-state inputs"
    layers = graph.meta.get("n_layers") or max(kv + list(states)) + 1
    if kv and not states:  # the layers with a cache: a KV-sharing layer (Gemma-3n's) has none
        layers = len(kv)
    if kv and not states and kv != list(range(len(kv))):
        return None, None, None, "no past_key_values.{i}.key inputs numbered from 0"
    for i, kinds in sorted(states.items()):
        for kind in kinds:
            if f"present.{i}.{kind}" not in outputs:
                return None, None, None, f"layer {i} lacks present.{i}.{kind}"
        if "recurrent_state" in kinds and "conv_state" not in kinds:
            return None, None, None, (f"layer {i} has a recurrent state without a conv state (genai's RecurrentState "
                                      "finds a recurrent layer by both)")
    reason = _layer_types_reason(inputs, kv, states, layers)
    if reason:
        return None, None, None, reason
    layouts = set()
    for i in kv:
        for kind in ("key", "value"):
            past = inputs.get(f"past_key_values.{i}.{kind}")
            if past is None or f"present.{i}.{kind}" not in outputs:
                return None, None, None, f"layer {i} lacks past_key_values.{i}.{kind} or present.{i}.{kind}"
            layouts.add((past.shape[1], past.shape[3], past.dtype))
    if len(layouts) > 1:
        return None, None, None, ("keys and values (or layers) have different cache layouts, which genai cannot "
                                  "allocate (it gives a layer's key and value one head size; for an MLA latent "
                                  "cache, compile with mla-absorb{cache=halves})")
    kv_heads, head_size, _ = layouts.pop() if layouts else (1, graph.meta.get("d_model", 1), None)
    if not isinstance(kv_heads, int) or not isinstance(head_size, int):
        return None, None, None, "symbolic kv heads or head size"
    return layers, kv_heads, head_size, ""


def _state_layers(inputs: dict) -> dict:
    """layer -> the recurrent-state kinds its inputs carry (``past_key_values.{i}.conv_state``...)."""
    found: dict = {}
    for name in inputs:
        match = re.fullmatch(r"past_key_values\.(\d+)\.(%s)" % "|".join(STATE_KINDS), name)
        if match:
            found.setdefault(int(match.group(1)), []).append(match.group(2))
    return found


def _conv_only(states: dict) -> bool:
    """Has some layer only a conv state (``states``: ``_state_layers``)?"""
    return any(kinds == ["conv_state"] for kinds in states.values())


def _layer_types_reason(inputs: dict, kv: list, states: dict, layers: int) -> str:
    """Why genai cannot run a graph with conv-only layers through ``layer_types`` ("" when
    it can, or when there are none): with that list genai 0.18 binds a conv state to every
    layer that is not full_attention, and allocates every conv state with one shape."""
    if not _conv_only(states):
        return ""
    for i in range(layers):
        if (i in states) == (i in kv):
            what = "both a KV cache and a state" if i in kv else "neither a KV cache nor a state"
            return (f"layer {i} has {what} beside layers with only a conv state (genai's layer_types gives a layer "
                    "one or the other)")
    shapes = {tuple(inputs[f"past_key_values.{i}.conv_state"].shape[1:]) for i in states}
    if len(shapes) > 1:
        return (f"conv states of {len(shapes)} shapes beside layers with only a conv state (genai allocates them "
                "all with one)")
    return ""


def layer_types(graph: Graph, layers: int) -> Optional[list]:
    """genai's ``decoder.layer_types`` (see the module docstring), None unless some layer has
    only a conv state."""
    names = {v.name for v in graph.inputs}
    states = _state_layers(names)
    if not _conv_only(states):
        return None
    kinds = {("conv_state",): "conv", ("conv_state", "recurrent_state"): "linear_attention"}
    return ["full_attention" if f"past_key_values.{i}.key" in names else kinds[tuple(sorted(states[i]))]
            for i in range(layers)]


def genai_config(graph: Graph, filename: str, context: int, share_buffer: bool = False) -> dict:
    layers, kv_heads, head_size, _ = decoder_layers(graph)
    meta = graph.meta
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    outputs = {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    if _state_layers({v.name: v for v in graph.inputs}):  # genai's RecurrentState (its default names, written out)
        inputs.update(past_conv_names="past_key_values.%d.conv_state",
                      past_recurrent_names="past_key_values.%d.recurrent_state")
        outputs.update(present_conv_names="present.%d.conv_state", present_recurrent_names="present.%d.recurrent_state")
    if any(v.name == "position_ids" for v in graph.inputs):
        inputs["position_ids"] = "position_ids"
    token = {key: meta.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": head_size,
        "hidden_size": meta.get("d_model", 0),
        "inputs": inputs,
        "outputs": outputs,
        "num_attention_heads": meta.get("n_heads") or kv_heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
    }
    types = layer_types(graph, layers)
    if types is not None:
        decoder["layer_types"] = types
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
        "type": "lfm2" if types and set(types) <= {"conv", "full_attention"} else "llama",
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
