"""The ``model.mtp`` section of ``genai_config.json`` for a folder with a multi-token-prediction
head (``backends.onnx.mtp``), and how onnxruntime-genai 0.18 loads that head.

The section is the one genai's own builder writes (0.18 ``models/builders/qwen.py``
``add_mtp_to_genai_config``), key for key, with the head's cache layout (``num_key_value_heads``,
``head_size``: one KV layer, index 0); the decoder's ``outputs.hidden_states`` names the output
the head reads. A plain ``og.Generator`` ignores the section.

``og.MtpGenerator(main, head, params)`` takes the head as its own ``og.Model`` whose
``decoder`` is ``mtp.onnx`` with ``inputs.hidden_states``. genai 0.18 reads one config file per
folder (``genai_config.json``), so the head's model is the folder's config with ``head_overlay``
laid over it::

    config = og.Config(folder); config.overlay(head_overlay(json.load(genai_config.json)))
    og.MtpGenerator(og.Model(folder), og.Model(config), params)

(``irc run --engine genai --speculative mtp`` does that: ``irc_cli.engines.genai_mtp``). The
draft count is ``speculative.max_draft_tokens`` (genai's default 4, at most 16), set at run time
with ``params.set_speculative_options(max_draft_tokens=K)``.

What 0.18 refuses (``CPU_FLOAT32``): on the CPU (the provider irc's configs name) the generator
casts the decoder's logits to float32 to pick a token and throws "Cast - input and output types
are the same" on logits that already are float32, so only a folder compiled with ``--dtype f16``
(or bf16) runs there. Its head sees the last prompt position only (irc's drafter feeds it the
whole prompt), so its drafts, though never its tokens, may differ from irc's.
"""
from __future__ import annotations

import json

from irc.graph import Graph

from backends.onnx.genai import CONFIG, decoder_layers

MAIN_HIDDEN = "hidden_states"  # the decoder's output the head reads (its final norm's output)
HEAD_HIDDEN = "hidden_states_out"  # the head's own, fed back to chain drafts
CPU_FLOAT32 = ("onnxruntime-genai 0.18's MtpGenerator on the CPU casts the logits to float32 to pick each token and "
               "refuses logits that already are float32 (\"Cast - input and output types are the same\")")


def mtp_section(head: Graph, filename: str) -> tuple:
    """(``model.mtp`` for the head graph ``head`` written as ``filename``, "") or (None, why not)."""
    _, kv_heads, head_size, reason = decoder_layers(head)
    if reason:
        return None, f"no model.mtp in {CONFIG}: the head's {reason}"
    return {
        "enabled": True,
        "filename": filename,
        "num_hidden_layers": 1,
        "num_key_value_heads": kv_heads,
        "head_size": head_size,
        "main_hidden_states": MAIN_HIDDEN,
        "inputs": {"input_ids": "input_ids", "hidden_states": MAIN_HIDDEN, "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "hidden_states": HEAD_HIDDEN, "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }, ""


def add_mtp(path: str, head: Graph, filename: str) -> str:
    """Add the head's section and the decoder's ``outputs.hidden_states`` to the config at
    ``path`` (staged, not yet committed); "" or why not."""
    section, reason = mtp_section(head, filename)
    if section is None:
        return reason
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["model"]["decoder"].setdefault("outputs", {})["hidden_states"] = MAIN_HIDDEN
    config["model"]["mtp"] = section
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=4, sort_keys=True) + "\n")
    return ""


def head_overlay(config: dict) -> str:
    """The JSON laid over the folder's config (``og.Config.overlay``) so that it loads the head
    of ``config``'s ``model.mtp`` as a decoder of one layer (module docstring)."""
    mtp = config["model"]["mtp"]
    decoder = {"filename": mtp["filename"], "num_hidden_layers": mtp["num_hidden_layers"],
               "num_key_value_heads": mtp["num_key_value_heads"], "head_size": mtp["head_size"],
               "inputs": dict(mtp["inputs"]), "outputs": dict(mtp["outputs"])}
    return json.dumps({"model": {"decoder": decoder}})
