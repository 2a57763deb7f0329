"""The ONNX targets' entry in ``backends.TARGETS``: options in, ``emit_model``, lines out."""
from __future__ import annotations

import os

from irc.graph import Graph
from irc.progress import SILENT
from irc.text import describe_bytes
from irc.world import KEY

from backends.onnx.dual import emit_dual
from backends.onnx.emit import emit_model
from backends.onnx.mtp import emit_with_head
from backends.onnx.shard import emit_sharded
from backends.onnx.vlm import EMBEDDING, emit_vlm
from backends.onnx.targets import resolve_options, resolve_tied_head, resolve_unfused


def emit_target(graph: Graph, path: str, options) -> list[str]:
    opset, weights = resolve_options(options.name, options.target)
    kwargs = dict(target=options.name, opset=opset, weights=weights, seed=options.seed, context=options.context,
                  files=options.files, progress=options.progress or SILENT,
                  tied_head=resolve_tied_head(options.name, options.target), unfused=resolve_unfused(options.target))
    if graph.meta.get(KEY):  # sharded: one model per rank and the launch note (backends.onnx.shard)
        ranks, note = emit_sharded(graph, path, **kwargs)
        return [line for result in ranks for line in _lines(result)] + [f"wrote {note} (how to launch the ranks)"]
    if "vision" in graph.parts:  # a VLM: vision, embedding and decoder models (backends.onnx.vlm)
        vision, result, lines = emit_vlm(graph, path, **kwargs)
        merged = any(node.op == "merge_tokens" for node in graph.nodes)  # else read by cross-attention
        what = "the token embedding and the image features' merge" if merged else "the token embedding"
        return _lines(vision) + _lines(result) + [f"wrote {os.path.join(os.path.dirname(result.path), EMBEDDING)} "
                                                  f"({what})"] + lines
    if "mtp" in graph.parts:  # a multi-token-prediction head beside the decoder (backends.onnx.mtp)
        decoder, head = emit_with_head(graph, path, **kwargs)
        return _lines(decoder) + _lines(head)
    if "text" in graph.parts:  # a dual encoder: image and text towers (backends.onnx.dual)
        image, text, lines = emit_dual(graph, path, **kwargs)
        return _lines(image) + _lines(text) + lines
    return _lines(emit_model(graph, path, **kwargs))


def _lines(result) -> list[str]:
    lines = [f"wrote {result.path} (target {result.target}, opset {result.opset})"]
    if result.data_path and result.weights_written:
        lines.append(f"wrote {result.data_path} ({describe_bytes(result.weight_bytes)} of weights)")
    elif result.data_path:
        lines.append(f"shape-only compile: the model references {describe_bytes(result.weight_bytes)} of weights in "
                     f"{result.data_path}, which was not written (--weights none)")
    if result.genai_config:
        lines.append(f"wrote {result.genai_config}")
    elif result.genai_note:
        lines.append(result.genai_note)
    lines += [f"wrote {path}" for path in result.files]
    return lines
