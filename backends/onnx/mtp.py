"""A decoder and its multi-token-prediction head (``frontends.hf.mtp``, ``irc compile --mtp``)
as two ONNX models in one folder: ``model.onnx`` (or the name given), which also returns
``hidden_states`` (its final norm's output), and ``mtp.onnx`` (``input_ids``,
``attention_mask``, ``position_ids``, ``hidden_states``, ``past_key_values.0.*`` -> ``logits``,
``present.0.*``, ``hidden_states_out``): the names onnxruntime-genai 0.18's MTP generator
reads; where the decoder gets a ``genai_config.json``, it gains the head's ``model.mtp`` section
(``backends.onnx.genai_mtp``). The head holds its own copies of the embedding and the LM head.
Everything is staged and committed together (``irc.output``)."""
from __future__ import annotations

import os

from irc.errors import BackendError
from irc.graph import Graph
from irc.output import OutputFolder

from backends.onnx.emit import Emitted, emit_model
from backends.onnx.genai import CONFIG
from backends.onnx.genai_mtp import add_mtp

MTP_FILE = "mtp.onnx"


def emit_with_head(graph: Graph, path: str, **kwargs) -> tuple[Emitted, Emitted]:
    """Write the decoder (with ``kwargs``' companion files) and its head."""
    head = graph.parts["mtp"]
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if name == MTP_FILE:
        raise BackendError(f"the decoder cannot be named {MTP_FILE}: the folder writes the MTP head there",
                           hint="use -o FOLDER/model.onnx")
    with OutputFolder(folder, primary=name) as out:
        decoder = emit_model(graph, path, out=out, **kwargs)
        kwargs.pop("files", None)
        drafter = emit_model(head, os.path.join(folder, MTP_FILE), genai=False, out=out, **kwargs)
        if decoder.genai_config:
            drafter.genai_note = add_mtp(out.stage(CONFIG), head, MTP_FILE)  # said under the head's lines
    return decoder, drafter
