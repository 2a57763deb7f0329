"""``irc run DUAL --image FILE --text TEXT [--text TEXT ...]``: a CLIP or SigLIP dual encoder's
zero-shot scores of one image against each text.

The texts are tokenized with the folder's tokenizer.json, padded (CLIP: to the longest, with
its ``pad_token_id``; SigLIP: to its ``max_position_embeddings``, as its processor is used with
``padding="max_length"`` and no attention mask: the padding is attended), and embedded by the text tower (``text.onnx`` of a compiled folder,
``graph.parts["text"]`` in the interpreter); with the image's embedding they give
transformers' ``logits_per_image`` (``frontends.hf.dual_text.similarity``) and the scores:
softmax over the texts (CLIP) or a sigmoid per text (SigLIP).
"""
from __future__ import annotations

import os

import numpy as np

from irc.errors import IRCError
from irc.inputs import read_json
from irc_cli.text import find_text

MANIFEST = "irc_dual.json"


def text_model(source, folder: str):
    """(run(ids, mask) -> text_embeds, settings) of a compiled folder's text tower or a
    graph's ``parts["text"]``; None when the model has no text tower."""
    if isinstance(source, str):
        path = os.path.join(folder, MANIFEST)
        if not os.path.isfile(path):
            return None
        from backends.onnx.runtime import ort_session
        settings = read_json(path)
        session = ort_session(os.path.join(folder, settings["text"]), threads=None)
        return (lambda ids, mask: session.run(["text_embeds"], {"input_ids": ids, "attention_mask": mask})[0],
                settings)
    text = source.parts.get("text")
    if text is None:
        return None
    from irc.interpreter import Interpreter
    interpreter = Interpreter(text)
    return (lambda ids, mask: interpreter.run({"input_ids": ids, "attention_mask": mask})["text_embeds"],
            text.meta)


def batch(texts: list, folder: str, settings: dict) -> tuple[np.ndarray, np.ndarray]:
    """The texts' ids and mask [N, T], padded as the model's processor pads them."""
    tokenizer = find_text(folder)
    if tokenizer is None:
        raise IRCError("--text needs the model's tokenizer.json beside it", location=folder)
    rows = [tokenizer.encode(text) for text in texts]
    width = settings.get("pad_to") or max(len(row) for row in rows)
    if max(len(row) for row in rows) > width:
        raise IRCError(f"a text of {max(len(row) for row in rows)} tokens is longer than the text tower's {width}",
                       hint="shorten the text")
    pad = int(settings.get("pad_token_id") or 0)
    ids = np.asarray([row + [pad] * (width - len(row)) for row in rows], np.int64)
    mask = np.asarray([[1] * len(row) + [0] * (width - len(row)) for row in rows], np.int64)
    if settings.get("pad_to"):  # SigLIP's processor gives no attention mask: the padding is attended
        mask[:] = 1
    return ids, mask


def zero_shot(source, folder: str, texts: list, image_embeds: np.ndarray) -> dict:
    """The report's ``texts``, ``logits_per_image`` and ``scores`` for one image's embedding."""
    from frontends.hf.dual_text import similarity

    model = text_model(source, folder)
    if model is None:
        raise IRCError("--text goes with a dual encoder (CLIP, SigLIP) and its text tower", location=folder,
                       hint="compile the clip or siglip checkpoint with --target onnx or onnx-ort")
    run, settings = model
    if "logit_scale" not in settings:
        raise IRCError("the model has no logit_scale: it was compiled without the checkpoint's weights",
                       location=folder)
    ids, mask = batch(texts, folder, settings)
    logits = similarity(image_embeds, run(ids, mask), settings["logit_scale"], settings.get("logit_bias", 0.0))[0]
    if "logit_bias" in settings:  # SigLIP: each text on its own
        scores = 1 / (1 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max())
        scores = scores / scores.sum()
    return {"texts": list(texts), "logits_per_image": [float(x) for x in logits],
            "scores": [float(x) for x in scores]}
