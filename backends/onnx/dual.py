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
from contextlib import contextmanager

from irc.errors import BackendError
from irc.graph import Graph
from irc.output import OutputFolder

from backends.onnx.emit import Emitted, emit_model

TEXT = "text.onnx"
MANIFEST = "irc_dual.json"


@contextmanager
def two_models(graph: Graph, part: Graph, path: str, part_file: str, roles: tuple, genai: bool = False, **kwargs):
    """Stage ``graph`` at ``path`` (with ``kwargs``' companion files, a genai_config.json where
    ``genai``) and ``part`` beside it as ``part_file``, committed together when the block ends;
    yields (the open folder, both ``Emitted``). ``roles``: their names in the refusal of a
    ``path`` that takes ``part_file``."""
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if name == part_file:
        raise BackendError(f"the {roles[0]} cannot be named {part_file}: the folder writes the {roles[1]} there",
                           hint="use -o FOLDER/model.onnx")
    with OutputFolder(folder, primary=name) as out:
        first = emit_model(graph, path, genai=genai, out=out, **kwargs)
        kwargs.pop("files", None)
        yield out, first, emit_model(part, os.path.join(folder, part_file), genai=False, out=out, **kwargs)


def emit_dual(graph: Graph, path: str, **kwargs) -> tuple[Emitted, Emitted, list]:
    """Write both towers and the manifest (``kwargs``: ``emit_model``'s, ``files`` going with
    the image tower: its processor and the tokenizer)."""
    text = graph.parts["text"]
    name = os.path.basename(path)
    with two_models(graph, text, path, TEXT, ("image tower", "text tower"), **kwargs) as (out, image, words):
        manifest = {"model_type": graph.meta.get("model_type"), "image": name, "text": TEXT,
                    **{key: text.meta[key] for key in ("logit_scale", "logit_bias", "pad_token_id", "pad_to")
                       if key in text.meta}}
        written = out.write(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return image, words, [f"wrote {written}"]
