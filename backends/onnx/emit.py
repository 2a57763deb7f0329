"""Graph -> ONNX model file: the emitter's main loop, the model's signature and its weights.

``emit_model(graph, path, target=..., opset=..., weights=...)`` lowers every node through
the target's table (``backends.onnx.portable`` and friends; ``backends.onnx.ort`` for
``onnx-ort``), so an op the target cannot express raises one BackendError naming the node
before anything is written. Then it writes the model, its weights, ``genai_config.json``
and any companion files (``files``: a tokenizer) into the model's folder through
``irc.output.OutputFolder``: staged beside it and renamed only when all are complete, after
a free-space check, so a failure, Ctrl-C or SIGTERM leaves the previous output untouched.

Signature: the irc graph's own inputs and outputs (``input_ids`` [B, T], ``attention_mask``
[B, P+T], ``position_ids`` [B, T], ``past_key_values.{i}.key/.value`` [B, K, P, D] ->
``logits``, ``present.{i}.key/.value``), with the dim names onnxruntime-genai's builder
uses: B ``batch_size``, T ``sequence_length``, P ``past_sequence_length``, P+T
``total_sequence_length``; other symbols keep their irc text. An encoder (an embedding
model: ``frontends.dsl_encoder``) has no cache I/O: ``input_ids``, ``attention_mask`` [B, T]
-> ``last_hidden_state`` [B, T, d] (and ``sentence_embedding`` [B, n]).

Weights: params become initializers (seeded by name when absent, ``irc.weights``, so the
model holds the reference interpreter's weights). When they add up to more than
``external_threshold`` bytes (64 MiB by default, and always above 2 GiB, protobuf's limit)
every tensor of 1 KiB or more goes to one file beside the model, ``<model>.data``, each
at a 4 KiB-aligned offset, streamed there a few row blocks at a time
(``backends.onnx.writer``): the protobuf holds only references, and memory stays bounded
whatever the model's size. fp16 graphs cast to f32 around ops ORT's CPU provider has no
fp16 kernel for (``backends.onnx.precision``). ``weights="none"`` is a shape-only compile: nothing is loaded
or seeded; the model is written with external-data references of the right sizes into
``<model>.data``, and that file is not written (the model loads once it is provided).

Deterministic: names come from the graph, initializers and nodes follow the order of
emission, and nothing depends on time or addresses, so the same graph gives the same bytes.
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import onnx
from onnx import helper

from irc.errors import BackendError
from irc.graph import Graph
from irc.ops.rope import CACHE_REFRESH_KEY, cache_refresh_length
from irc.output import OutputFolder
from irc.progress import SILENT, Progress
from irc.weights import seed_absent

from backends.onnx import delta, moe_sorted, ort, portable, positions, quant, rglru, rwkv, sparse_index, ssm
from backends.onnx import activations
from backends.onnx import mlstm
from backends.onnx import ngram
from backends.onnx import nvfp4
from backends.onnx.attention import lower_attention, lower_rope
from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder, dim_param
from backends.onnx.genai import CONFIG, write_genai_config
from backends.onnx.mla import lower_mla_absorbed_attention, lower_mla_attention, lower_mla_latent_attention
from backends.onnx.moe import lower_moe
from backends.onnx.precision import lower_in_f32, needs_f32
from backends.onnx.targets import DEFAULT_OPSET, check_options
from backends.onnx.writer import SMALL_TENSOR, WORKERS, inline_tensors, plan, write_data

EXTERNAL_DATA_THRESHOLD = 64 << 20
PROTO_LIMIT = 2 << 30
PRODUCER_VERSION = "0.1.0"

PORTABLE = {**portable.LOWERINGS, **quant.LOWERINGS, **moe_sorted.LOWERINGS, "rope": lower_rope, "attention": lower_attention,
            "mla_attention": lower_mla_attention, "mla_absorbed_attention": lower_mla_absorbed_attention,
            "mla_latent_attention": lower_mla_latent_attention,
            "moe": lower_moe, **ssm.LOWERINGS, **delta.LOWERINGS, **rwkv.LOWERINGS, **rglru.LOWERINGS,
            **sparse_index.LOWERINGS, **positions.LOWERINGS, **activations.LOWERINGS, **mlstm.LOWERINGS,
            **nvfp4.LOWERINGS, **ngram.LOWERINGS}
ORT = {**PORTABLE, **ort.OVERRIDES, **quant.ORT_OVERRIDES, **ssm.ORT_OVERRIDES, **delta.ORT_OVERRIDES}


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
    files: list = field(default_factory=list)  # companion files written beside the model


def _value_info(value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, ONNX_TYPES[value.dtype], [dim_param(d) for d in value.shape])


def build(graph: Graph, *, target: str = "onnx", opset: int = DEFAULT_OPSET, context: int = 4096,
          tied_head: str = "auto", unfused: frozenset = frozenset(), lowerings: Optional[Mapping] = None) -> Builder:
    """Lower every node of ``graph`` into a Builder (no weight is touched); ``tied_head``:
    ``backends.onnx.portable.shared_linear``; ``unfused``: ``backends.onnx.gqa_fuse``;
    ``lowerings`` (op -> lowering) replace the target's own (a benchmark comparing two)."""
    flavour = check_options(target, opset, "seeded").flavour
    if not isinstance(context, int) or context < 1:
        raise BackendError(f"context {context!r} must be a positive int (the longest sequence the model serves)")
    b = Builder(graph, opset, flavour, context, tied_head, frozenset(unfused))
    for value in graph.inputs:
        b.bind(value, b.claim(value.name))
    for value in graph.outputs:
        if b.is_bound(value) or value.producer is None:
            raise BackendError(f"graph output %{value.name} is a graph input or listed twice",
                               location=f"graph {graph.name}", hint="ONNX outputs must be computed values")
        b.bind(value, b.claim(value.name))
    table = {**(ORT if flavour == "ort" else PORTABLE), **(lowerings or {})}
    for node in graph.nodes:
        if id(node) in b.handled:
            continue
        where = f"node %{node.name} ({node.op})" + (f", from {node.origin}" if node.origin else "")
        if node.op not in table:
            raise BackendError(f"op {node.op!r} has no lowering for target {target}", location=where,
                               hint=f"lower it with a pass first; the target takes {', '.join(sorted(table))}")
        try:
            outs = [b.name_for(v) for v in node.outputs]
            if needs_f32(node):
                lower_in_f32(b, table[node.op], node, outs)
            else:
                table[node.op](b, node, outs)
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
    rerun = cache_refresh_length(graph)
    if rerun is not None:  # LongRoPE: where a generate loop runs the whole sequence again (irc run reads it)
        helper.set_model_props(model, {CACHE_REFRESH_KEY: str(rerun)})
    return model


def emit_model(graph: Graph, path: str, *, target: str = "onnx", opset: int = DEFAULT_OPSET, weights: str = "seeded",
               seed: int = 0, context: int = 4096, external_threshold: int = EXTERNAL_DATA_THRESHOLD,
               genai: bool = True, files: Optional[Mapping[str, object]] = None, progress: Progress = SILENT,
               workers: int = WORKERS, tied_head: str = "auto", unfused: frozenset = frozenset(),
               lowerings: Optional[Mapping] = None, out: Optional[OutputFolder] = None,
               pieces: Optional[Callable] = None) -> Emitted:
    """Compile ``graph`` to ``path`` (see the module docstring). ``files`` are companions the
    output folder receives as they are (name -> bytes to write, or the path of a file to
    copy: a tokenizer); ``progress`` shows the weights being written. ``out``: an open
    ``OutputFolder`` to write into (several models committed together: a VLM's);
    ``pieces(model, builder) -> {file name: ModelProto}`` writes the model as several files
    sharing its weights file (a VLM decoder's embedding and decoder models)."""
    check_options(target, opset, weights)
    b = build(graph, target=target, opset=opset, context=context, tied_head=tied_head, unfused=unfused,
              lowerings=lowerings)
    shape_only = weights == "none"
    if not shape_only:
        seed_absent(graph, seed)
    total = sum(init.nbytes for init in b.weights)
    external = shape_only or total > min(external_threshold, PROTO_LIMIT)
    name = os.path.basename(path)
    data_name = name + ".data" if external else None
    companions = _companions(files or {}, name, data_name)
    folder = OutputFolder(os.path.dirname(os.path.abspath(path)), primary=name) if out is None else nullcontext(out)
    with folder as out:
        tensors = list(b.constants)
        layout = plan(b.weights, data_name, small=0 if shape_only else SMALL_TENSOR) if external else None
        out.require((0 if shape_only else max(total, layout.size if layout else 0))
                    + sum(_size(v) for v in companions.values()))  # before anything is written
        if external:
            tensors += layout.tensors(b.weights)  # shape-only: every weight referenced, none written
            if not shape_only:
                write_data(layout, out.stage(data_name), progress, workers)
        else:
            tensors += inline_tensors(b.weights)
        model = model_proto(graph, b, target, tensors)
        if not external and model.ByteSize() > PROTO_LIMIT:
            raise BackendError("the model would be over 2 GiB, protobuf's limit",
                               hint="pass a lower external_threshold so the weights go to external data")
        for file, proto in (pieces(model, b) if pieces else {name: model}).items():
            out.write(file, proto.SerializeToString(deterministic=True))
        result = Emitted(path, target, opset, total, out.final(data_name) if external else None, not shape_only)
        if genai:
            caches = sum(1 for v in graph.inputs if v.name.startswith("past_key_values.") and v.name.endswith(".key"))
            in_place = caches > 0 and sum(n.op_type == "GroupQueryAttention" for n in b.nodes) == caches
            result.genai_config, result.genai_note = write_genai_config(graph, out, name, context=context,
                                                                        share_buffer=in_place)
        for companion, source in companions.items():
            result.files.append(out.write(companion, source) if isinstance(source, bytes) else
                                out.copy(companion, source))
    return result


def _companions(files: Mapping[str, object], name: str, data_name: Optional[str]) -> dict:
    """``files`` checked: plain names that are not the model's own outputs."""
    taken = {name, data_name, CONFIG}
    checked = {}
    for companion, source in sorted(files.items()):
        if companion in taken or os.path.basename(companion) != companion:
            raise BackendError(f"companion file {companion!r} would overwrite the model's own output or leave "
                               "its folder", hint="companions are plain file names such as tokenizer.json")
        if not isinstance(source, (bytes, str, os.PathLike)):
            raise TypeError(f"companion {companion!r}: expected bytes or a path, got {type(source).__name__}")
        checked[companion] = source if isinstance(source, bytes) else os.fspath(source)
    return checked


def _size(source) -> int:
    return len(source) if isinstance(source, bytes) else os.path.getsize(source)
