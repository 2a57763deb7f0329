"""An image encoder (a ViT: CLIP, SigLIP, DINOv2; a VLM's vision model, Qwen-VL's and Pixtral's
at their reference image: the pipeline's ``fix-image-grid``) for onnx-npu: one static-shape graph.

``irc compile SPEC --target onnx-npu -o OUT`` on a graph whose input is ``pixel_values``
writes the folder OUT:

- ``vision.onnx``: batch 1, the image size fixed: ``pixel_values`` [1, C, H, W] in,
  the graph's outputs (``last_hidden_state`` [1, tokens, d], ``pooler_output`` [1, d]) out;
- ``model.data``: the weights, as the decoder folders hold them;
- ``irc_npu.json``: the host contract (``kind`` ``vision``: the input's shape and dtype, the
  outputs, ``graph.meta["vision"]``).

The ops are the decoder table's (``backends.onnx_npu.lower``): ``patch_embed`` arrives as
reshapes, transposes and a ``linear`` (``lower-patch-embed``, in the default pipeline), and
attention is the bidirectional form (no cache, no mask). ``--chunk`` and ``--context`` do not
apply. ``w8a16`` / ``w4a16`` calibrate on ``--calibration IMAGES.npy``: preprocessed pixel
values [N, C, H, W] (or one [C, H, W] image) that the reference interpreter runs.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

import numpy as np
import onnx
from onnx import helper

from irc.errors import BackendError
from irc.graph import Graph
from irc.weights import seed_absent

from backends.onnx.writer import SMALL_TENSOR
from backends.onnx.writer import plan as plan_layout
from backends.onnx_npu import folder
from backends.onnx_npu.lower import OPSET, NpuBuilder, check_lowerable, to_onnx_type
from backends.onnx_npu.qdq import BITS, QuantPlan, RangeRecorder

INPUT = "pixel_values"
GRAPH = "vision.onnx"


def is_vision(graph: Graph) -> bool:
    return any(v.name == INPUT for v in graph.inputs)


def build(graph: Graph, table: Mapping, quant: Optional[QuantPlan] = None) -> NpuBuilder:
    """Lower ``graph`` at batch 1 (its only symbol: the image size is fixed)."""
    b = NpuBuilder(graph, OPSET, "npu", 1, bindings={"B": 1}, quant=quant)
    for value in [*graph.inputs, *graph.outputs]:
        b.bind(value, b.claim(value.name))
    check_lowerable(graph, table)
    for node in graph.nodes:
        table[node.op](b, node, [b.name_for(v) for v in node.outputs])
    return b


def calibration_images(path: str, graph: Graph) -> np.ndarray:
    """The calibration images [N, C, H, W] from a ``.npy`` file, checked against the input."""
    shape = [1 if not isinstance(d, int) else d for d in next(v for v in graph.inputs if v.name == INPUT).shape]
    if not path or not os.path.isfile(path) or not path.endswith(".npy"):
        raise BackendError(f"calibration images {path!r} are not a .npy file", location=str(path),
                           hint=f"an image encoder calibrates on --calibration IMAGES.npy: preprocessed "
                                f"pixel values [N, {', '.join(map(str, shape[1:]))}] (numpy.save)")
    try:
        images = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise BackendError(f"calibration images cannot be read: {err}", location=path) from None
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or list(images.shape[1:]) != shape[1:] or not np.issubdtype(images.dtype, np.floating):
        raise BackendError(f"calibration images have shape {list(images.shape)} ({images.dtype}); the model takes "
                           f"pixel values [N, {', '.join(map(str, shape[1:]))}] (float)", location=path)
    return images.astype(np.float32)


def calibrate(graph: Graph, images: np.ndarray, bits: int, seed: int) -> QuantPlan:
    """Ranges of the linear layers' activations over the images, one at a time."""
    runner = RangeRecorder(graph.clone(), seed)
    for image in images:
        runner.run({INPUT: image[None]})
    return QuantPlan(bits, runner.ranges, len(images))


def model_proto(graph: Graph, b: NpuBuilder, tensors: list) -> onnx.ModelProto:
    def info(value):
        return helper.make_tensor_value_info(value.name, to_onnx_type(value.dtype), [b.size(d) for d in value.shape])

    return folder.model_proto(f"{graph.name}.vision", b.nodes, [info(v) for v in graph.inputs],
                              [info(v) for v in graph.outputs], tensors, f"{graph.name} (image encoder, batch 1)")


def contract(graph: Graph, b: NpuBuilder, settings: dict, data: str) -> dict:
    def entry(value):
        return {"name": value.name, "shape": [b.size(d) for d in value.shape], "dtype": value.dtype.name}

    return {"format": 1, "target": "onnx-npu", "kind": "vision", "model": graph.name,
            "precision": settings["precision"], "graphs": {"vision": GRAPH}, "data": data,
            "inputs": [entry(v) for v in graph.inputs], "outputs": [entry(v) for v in graph.outputs],
            "vision": dict(graph.meta.get("vision", {})),
            **({"calibration": settings["calibration"]} if "calibration" in settings else {})}


def emit_folder(graph: Graph, path: str, table: Mapping, *, precision: str, seed: int,
                calibration: Optional[str], files: Mapping[str, object], data: str, contract_name: str) -> list[str]:
    """Write the vision folder (module docstring); returns the paths written."""
    plan = None
    settings: dict = {"precision": precision}
    if precision in BITS:
        images = calibration_images(calibration, graph)
        check_lowerable(graph, table)  # refuse before the calibration run
        plan = calibrate(graph, images, BITS[precision], seed)
    b = build(graph, table, plan)
    if plan is not None:
        settings["calibration"] = {"images": plan.tokens, "quantized_weights": len(plan.quantized)}
    seed_absent(graph, seed)
    layout = plan_layout(b.weights, data, small=SMALL_TENSOR)
    graphs = {GRAPH: model_proto(graph, b, list(b.constants) + layout.tensors(b.weights))}
    return folder.write_folder(path, layout, data, graphs, files, contract_name, contract(graph, b, settings, data))
