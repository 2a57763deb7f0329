"""A dual encoder (CLIP, SigLIP) as two ONNX models in one folder: the image tower
(``model.onnx``, or the name given: ``pixel_values`` -> ``last_hidden_state``, ``pooler_output``,
CLIP's ``image_embeds``) and the text tower (``text.onnx``: ``input_ids``, ``attention_mask``
-> ``last_hidden_state``, ``text_embeds``), and ``irc_dual.json`` naming them with the
checkpoint's exp(logit_scale) and SigLIP's logit_bias, with which ``irc run OUT --image FILE
--text TEXT ...`` makes transformers' ``logits_per_image`` (``frontends.hf.dual_text.similarity``).
Everything is staged and committed together (``irc.output``)."""
from __future__ import annotations

import json
import os

from irc.errors import BackendError
from irc.graph import Graph
from irc.output import OutputFolder

from backends.onnx.emit import Emitted, emit_model

TEXT = "text.onnx"
MANIFEST = "irc_dual.json"


def emit_dual(graph: Graph, path: str, **kwargs) -> tuple[Emitted, Emitted, list]:
    """Write both towers and the manifest (``kwargs``: ``emit_model``'s, ``files`` going with
    the image tower: its processor and the tokenizer)."""
    text = graph.parts["text"]
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if name == TEXT:
        raise BackendError(f"the image tower cannot be named {TEXT}: the folder writes the text tower there",
                           hint="use -o FOLDER/model.onnx")
    with OutputFolder(folder, primary=name) as out:
        image = emit_model(graph, path, genai=False, out=out, **kwargs)
        kwargs.pop("files", None)
        words = emit_model(text, os.path.join(folder, TEXT), genai=False, out=out, **kwargs)
        manifest = {"model_type": graph.meta.get("model_type"), "image": name, "text": TEXT,
                    **{key: text.meta[key] for key in ("logit_scale", "logit_bias", "pad_token_id", "pad_to")
                       if key in text.meta}}
        written = out.write(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return image, words, [f"wrote {written}"]
