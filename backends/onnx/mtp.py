"""A decoder and its multi-token-prediction head (``frontends.hf.mtp``, ``irc compile --mtp``)
as two ONNX models in one folder: ``model.onnx`` (or the name given), which also returns
``hidden_states`` (its final norm's output), and ``mtp.onnx`` (``input_ids``,
``attention_mask``, ``position_ids``, ``hidden_states``, ``past_key_values.0.*`` -> ``logits``,
``present.0.*``, ``hidden_states_out``): the names onnxruntime-genai 0.18's MTP generator
reads; where the decoder gets a ``genai_config.json``, it gains the head's ``model.mtp`` section
(``backends.onnx.genai_mtp``). The head holds its own copies of the embedding and the LM head.
Everything is staged and committed together (``irc.output``)."""
from __future__ import annotations

from irc.graph import Graph

from backends.onnx.dual import two_models
from backends.onnx.emit import Emitted
from backends.onnx.genai import CONFIG
from backends.onnx.genai_mtp import add_mtp

MTP_FILE = "mtp.onnx"


def emit_with_head(graph: Graph, path: str, **kwargs) -> tuple[Emitted, Emitted]:
    """Write the decoder (with ``kwargs``' companion files) and its head."""
    head = graph.parts["mtp"]
    with two_models(graph, head, path, MTP_FILE, ("decoder", "MTP head"), genai=True, **kwargs) as \
            (out, decoder, drafter):
        if decoder.genai_config:
            drafter.genai_note = add_mtp(out.stage(CONFIG), head, MTP_FILE)  # said under the head's lines
    return decoder, drafter
