"""The ONNX targets' entry in ``backends.TARGETS``: options in, ``emit_model``, lines out."""
from __future__ import annotations

from irc.graph import Graph
from irc.progress import SILENT
from irc.text import describe_bytes

from backends.onnx.emit import emit_model
from backends.onnx.targets import resolve_options, resolve_tied_head, resolve_unfused


def emit_target(graph: Graph, path: str, options) -> list[str]:
    opset, weights = resolve_options(options.name, options.target)
    result = emit_model(graph, path, target=options.name, opset=opset, weights=weights, seed=options.seed,
                        context=options.context, files=options.files, progress=options.progress or SILENT,
                        tied_head=resolve_tied_head(options.name, options.target),
                        unfused=resolve_unfused(options.target))
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
