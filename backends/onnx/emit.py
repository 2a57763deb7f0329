"""Graph -> ONNX model file: the emitter's main loop, the model's signature and its weights.

``emit_model(graph, path, target=..., opset=..., weights=...)`` lowers every node through
the target's table (``backends.onnx.portable`` and friends; ``backends.onnx.ort`` for
``onnx-ort``), so an op the target cannot express raises one BackendError naming the node
before anything is written. Then it writes the model (and ``genai_config.json``)
through temporary files and renames: no half-written outputs.

Signature: the irc graph's own inputs and outputs (``input_ids`` [B, T], ``attention_mask``
[B, P+T], ``position_ids`` [B, T], ``past_key_values.{i}.key/.value`` [B, K, P, D] ->
``logits``, ``present.{i}.key/.value``), with the dim names onnxruntime-genai's builder
uses: B ``batch_size``, T ``sequence_length``, P ``past_sequence_length``, P+T
``total_sequence_length``; other symbols keep their irc text.

Weights: params become initializers (seeded by name when absent, ``irc.weights``, so the
model holds the reference interpreter's weights). When they add up to more than
``external_threshold`` bytes (64 MiB by default, and always above 2 GiB, protobuf's limit)
every tensor of 1 KiB or more goes to one file beside the model, ``<model>.data``, each
at a 4 KiB-aligned offset. ``weights="none"`` is a shape-only compile: nothing is loaded
or seeded; the model is written with external-data references of the right sizes into
``<model>.data``, and that file is not written (the model loads once it is provided).

Deterministic: names come from the graph, initializers and nodes follow the order of
emission, and nothing depends on time or addresses, so the same graph gives the same bytes.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import onnx
from onnx import TensorProto, helper, numpy_helper

from irc import dims
from irc.errors import BackendError
from irc.graph import Graph
from irc.passmanager import write_atomic
from irc.weights import seed_absent

from backends.onnx import moe_sorted, ort, portable, quant
from backends.onnx.attention import lower_attention, lower_rope
from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.mla import lower_mla_absorbed_attention, lower_mla_attention
from backends.onnx.moe import lower_moe
from backends.onnx.targets import DEFAULT_OPSET, check_options

EXTERNAL_DATA_THRESHOLD = 64 << 20
PROTO_LIMIT = 2 << 30
SMALL_TENSOR = 1024
ALIGN = 4096
PRODUCER_VERSION = "0.1.0"
DIM_NAMES = {"B": "batch_size", "T": "sequence_length", "P": "past_sequence_length", "P+T": "total_sequence_length"}

PORTABLE = {**portable.LOWERINGS, **quant.LOWERINGS, **moe_sorted.LOWERINGS, "rope": lower_rope, "attention": lower_attention,
            "mla_attention": lower_mla_attention, "mla_absorbed_attention": lower_mla_absorbed_attention,
            "moe": lower_moe}
ORT = {**PORTABLE, **ort.OVERRIDES, **quant.ORT_OVERRIDES}


@dataclass
class Emitted:
    """What ``emit_model`` wrote."""

    path: str
    target: str
    opset: int
    weight_bytes: int
    data_path: Optional[str] = None     # the external data file, when weights went there
    weights_written: bool = True        # False for a shape-only compile
    genai_config: Optional[str] = None  # its path, or None
    genai_note: str = ""                # why no genai_config.json was written


def dim_param(d):
    d = dims.canonical(d)
    return d if isinstance(d, int) else DIM_NAMES.get(d, d)


def _value_info(value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, ONNX_TYPES[value.dtype], [dim_param(d) for d in value.shape])


def build(graph: Graph, *, target: str = "onnx", opset: int = DEFAULT_OPSET, context: int = 4096) -> Builder:
    """Lower every node of ``graph`` into a Builder (no weight is touched)."""
    flavour = check_options(target, opset, "seeded").flavour
    if not isinstance(context, int) or context < 1:
        raise BackendError(f"context {context!r} must be a positive int (the longest sequence the model serves)")
    b = Builder(graph, opset, flavour, context)
    for value in graph.inputs:
        b.bind(value, b.claim(value.name))
    for value in graph.outputs:
        if b.is_bound(value) or value.producer is None:
            raise BackendError(f"graph output %{value.name} is a graph input or listed twice",
                               location=f"graph {graph.name}", hint="ONNX outputs must be computed values")
        b.bind(value, b.claim(value.name))
    table = ORT if flavour == "ort" else PORTABLE
    for node in graph.nodes:
        if id(node) in b.handled:
            continue
        where = f"node %{node.name} ({node.op})" + (f", from {node.origin}" if node.origin else "")
        if node.op not in table:
            raise BackendError(f"op {node.op!r} has no lowering for target {target}", location=where,
                               hint=f"lower it with a pass first; the target takes {', '.join(sorted(table))}")
        try:
            table[node.op](b, node, [b.name_for(v) for v in node.outputs])
        except BackendError as err:
            if err.location:
                raise
            raise BackendError(err.message, location=where, hint=err.hint) from None
    return b


def model_proto(graph: Graph, b: Builder, target: str, initializers: list) -> onnx.ModelProto:
    body = helper.make_graph(b.nodes, graph.name, [_value_info(v) for v in graph.inputs],
                             [_value_info(v) for v in graph.outputs], initializer=initializers)
    imports = [helper.make_opsetid("", b.opset)] + ([helper.make_opsetid(MS_DOMAIN, 1)] if MS_DOMAIN in b.domains
                                                     else [])
    model = helper.make_model(body, opset_imports=imports, producer_name="irc", producer_version=PRODUCER_VERSION,
                              doc_string=f"{graph.name}, compiled by irc for target {target} (opset {b.opset})")
    model.ir_version = helper.find_min_ir_version_for(imports[:1])
    return model


def emit_model(graph: Graph, path: str, *, target: str = "onnx", opset: int = DEFAULT_OPSET, weights: str = "seeded",
               seed: int = 0, context: int = 4096, external_threshold: int = EXTERNAL_DATA_THRESHOLD,
               genai: bool = True) -> Emitted:
    """Compile ``graph`` to ``path`` (see the module docstring)."""
    check_options(target, opset, weights)
    b = build(graph, target=target, opset=opset, context=context)
    shape_only = weights == "none"
    if not shape_only:
        seed_absent(graph, seed)
    total = sum(init.nbytes for init in b.weights)
    external = shape_only or total > min(external_threshold, PROTO_LIMIT)
    data_path = path + ".data" if external else None
    directory = os.path.dirname(os.path.abspath(path))
    tmp_data = None
    try:
        tensors = list(b.constants)
        if external and not shape_only:
            fd, tmp_data = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(data_path))
            with os.fdopen(fd, "wb") as stream:
                tensors += _write_external(b.weights, stream, os.path.basename(data_path))
        elif external:
            tensors += _reference_external(b.weights, os.path.basename(data_path))
        else:
            tensors += [numpy_helper.from_array(init.array(), init.name) for init in b.weights]
        model = model_proto(graph, b, target, tensors)
        if not external and model.ByteSize() > PROTO_LIMIT:
            raise BackendError("the model would be over 2 GiB, protobuf's limit",
                               hint="pass a lower external_threshold so the weights go to external data")
        blob = model.SerializeToString(deterministic=True)
        if tmp_data is not None:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_data, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual mode
            os.replace(tmp_data, data_path)
            tmp_data = None
        write_atomic(path, blob)
    finally:
        if tmp_data is not None and os.path.exists(tmp_data):
            os.unlink(tmp_data)
    result = Emitted(path, target, opset, total, data_path, not shape_only)
    if genai:
        from backends.onnx.genai import write_genai_config
        caches = sum(1 for v in graph.inputs if v.name.startswith("past_key_values.") and v.name.endswith(".key"))
        in_place = caches > 0 and sum(n.op_type == "GroupQueryAttention" for n in b.nodes) == caches
        result.genai_config, result.genai_note = write_genai_config(graph, path, context=context,
                                                                    share_buffer=in_place)
    return result


def _external(tensor: TensorProto, location: str, offset: int, length: int) -> TensorProto:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _empty(init) -> TensorProto:
    tensor = TensorProto()
    tensor.name, tensor.data_type = init.name, ONNX_TYPES[init.dtype]
    tensor.dims.extend(init.shape)
    return tensor


def _write_external(weights: list, stream, location: str) -> list:
    """Write each weight of 1 KiB or more to ``stream`` (4 KiB aligned); smaller ones inline."""
    tensors, offset = [], 0
    for init in weights:
        tensor = numpy_helper.from_array(init.array(), init.name)
        if init.nbytes < SMALL_TENSOR:
            tensors.append(tensor)
            continue
        padding = -offset % ALIGN
        stream.write(b"\0" * padding)
        offset += padding
        raw = tensor.raw_data
        stream.write(raw)
        tensor.ClearField("raw_data")
        tensors.append(_external(tensor, location, offset, len(raw)))
        offset += len(raw)
    return tensors


def _reference_external(weights: list, location: str) -> list:
    """External-data references laid out as ``_write_external`` would write them, no data."""
    tensors, offset = [], 0
    for init in weights:
        offset += -offset % ALIGN
        tensors.append(_external(_empty(init), location, offset, init.nbytes))
        offset += init.nbytes
    return tensors
