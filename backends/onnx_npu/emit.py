"""Graph -> an onnx-npu folder: two static-shape ONNX graphs over one weights file.

``irc compile SPEC --target onnx-npu -o OUT`` writes the folder OUT:

- ``chunk.onnx``: batch 1, T = ``--chunk`` tokens per call (prefill in chunks);
- ``decode.onnx``: the same model for T = 1;
- ``model.data``: the weights (and RoPE tables) both graphs reference, at the same
  offsets: the two builders meet the same initializers in the same order, which is checked;
- ``irc_npu.json``: the contract the host loop (``backends.onnx_npu.host``) drives.

Signature of both graphs (N = ``--context``, the fixed cache length):

- inputs: ``input_ids`` int32 [1, T], ``position_ids`` int32 [1, T], ``attention_bias``
  [1, 1, T, N + T] (additive: 0 where query t may see key j, ``MASK_VALUE`` elsewhere; keys
  0..N-1 are the cache slots, N..N+T-1 the new tokens), one ``attention_bias.window{W}``
  per sliding window (``.chunk{C}`` per chunk size: Llama-4's chunked layers), LongRoPE's ``rope_rows`` int32 [1, T] (the cos/sin table rows:
  ``backends.onnx_npu.lower``), ``past_key_values.{i}.key/.value`` [1, K, N, D] (and a DSA
  indexer's ``.index_key`` [1, 1, N, D_i]: ``backends.onnx_npu.sparse``) and a recurrent
  layer's fixed-size states (``past_key_values.{i}.conv_state`` [1, C, K-1],
  ``.recurrent_state`` [1, H, N, P]; ``backends.onnx_npu.recurrent``);
- outputs: ``logits`` [1, T, V], ``present.{i}.key/.value`` [1, K, T, D], the new
  entries only: the host writes them into the cache slots it chooses, and
  ``present.{i}.conv_state`` / ``.recurrent_state``, the whole states after the T tokens.

Quantized precisions (``w8a16``, ``w4a16``) put every linear layer in a QDQ unit with
calibrated uint16 activations (``backends.onnx_npu.qdq``). Companion files (a tokenizer)
are copied in. The outputs are staged and renamed into place together
(``irc.output.OutputFolder``); the same graph gives the same bytes.
"""
from __future__ import annotations

from typing import Mapping, Optional

import onnx
from onnx import helper

from irc.analysis import state_inputs
from irc.errors import BackendError
from irc.graph import Graph
from irc.weights import seed_absent

from backends.onnx.builder import ONNX_TYPES
from backends.onnx.writer import SMALL_TENSOR
from backends.onnx.writer import plan as plan_layout
from backends.onnx_npu.host import load_contract
from backends.onnx_npu.lower import LOWERINGS, MASK_VALUE, OPSET, NpuBuilder, check_lowerable, to_onnx_type
from backends.onnx_npu import folder, vision
from backends.onnx_npu.mla import lower_mla_attention
from backends.onnx_npu.recurrent import LOWERINGS as RECURRENT
from backends.onnx_npu.recurrent_steps import LOWERINGS as STEPPED
from backends.onnx_npu.mlstm import LOWERINGS as MLSTM
from backends.onnx_npu.sparse import LOWERINGS as SPARSE
from backends.onnx_npu.qdq import BITS, WINDOW, calibrate, calibration_tokens, output_step
from backends.onnx_npu.targets import check_context, resolve

CONTRACT = "irc_npu.json"
DATA = "model.data"
GRAPHS = {"chunk": "chunk.onnx", "decode": "decode.onnx"}
TABLE = {**LOWERINGS, **RECURRENT, **STEPPED, **MLSTM, **SPARSE, "mla_attention": lower_mla_attention}


def build(graph: Graph, tokens: int, context: int, quant=None) -> NpuBuilder:
    """Lower ``graph`` for ``tokens`` per call over a ``context``-slot cache (``quant``: the
    QDQ plan of a quantized precision)."""
    names = {v.name for v in graph.outputs}
    if "logits" not in names or "input_ids" not in {v.name for v in graph.inputs}:
        raise BackendError("onnx-npu compiles decoder graphs: input_ids in, logits (and present.* caches) out; "
                           "and image encoders: pixel_values in",
                           location=f"graph {graph.name}", hint=f"this graph returns {', '.join(sorted(names))}")
    b = NpuBuilder(graph, OPSET, "npu", context, bindings={"B": 1, "T": tokens, "P": context}, quant=quant)
    for value in graph.inputs:
        if value.name != "attention_mask":
            b.bind(value, b.claim(value.name))
    for value in graph.outputs:
        b.bind(value, b.claim(value.name))
    check_lowerable(graph, TABLE)
    for node in graph.nodes:
        TABLE[node.op](b, node, [b.name_for(v) for v in node.outputs])
    return b


def signature(graph: Graph, b: NpuBuilder) -> tuple[list, list]:
    """The ONNX inputs and outputs (module docstring)."""
    tokens, context = b.bindings["T"], b.context
    inputs, outputs = [], []
    for value in graph.inputs:
        if value.name != "attention_mask":
            inputs.append(helper.make_tensor_value_info(value.name, to_onnx_type(value.dtype),
                                                        [b.size(d) for d in value.shape]))
    masks = [helper.make_tensor_value_info(name, ONNX_TYPES[_float_type(graph)], [1, 1, tokens, context + tokens])
             for name in b.masks.values()]
    masks += [helper.make_tensor_value_info(name, onnx.TensorProto.INT32, [1, tokens])
              for name in [*b.rope_rows.values(), *([b.positions] if b.positions else [])]]
    after = next((i + 1 for i, v in enumerate(inputs) if v.name == "position_ids"), 1)  # masks after the ids
    inputs[after:after] = masks
    states = {present_name(v.name) for v in state_inputs(graph)}
    for value in graph.outputs:
        shape = [b.size(d) for d in value.shape]
        if value.name.startswith("present.") and value.name not in states:
            shape[2] = tokens
        outputs.append(helper.make_tensor_value_info(value.name, ONNX_TYPES[value.dtype], shape))
    return inputs, outputs


def present_name(past: str) -> str:
    return "present." + past[len("past_key_values."):]


def _float_type(graph: Graph):
    return next(v.dtype for v in graph.outputs if v.name == "logits")


def model_proto(graph: Graph, b: NpuBuilder, tensors: list, role: str) -> onnx.ModelProto:
    inputs, outputs = signature(graph, b)
    return folder.model_proto(f"{graph.name}.{role}", b.nodes, inputs, outputs, tensors,
                              f"{graph.name} ({role}: {b.bindings['T']} tokens per call, {b.context}-slot cache)")


def contract(graph: Graph, builders: dict, settings: dict) -> dict:
    chunk = builders["chunk"]
    fixed = {v.name for v in state_inputs(graph)}

    def entry(v):
        return {"past": v.name, "present": present_name(v.name), "shape": [chunk.size(d) for d in v.shape],
                "dtype": v.dtype.name}

    past = [v for v in graph.inputs if v.name.startswith("past_key_values.")]
    caches = [entry(v) for v in past if v.name not in fixed]
    states = [entry(v) for v in past if v.name in fixed]
    return {"format": 1, "target": "onnx-npu", "model": graph.name, "chunk": settings["chunk"],
            "context": chunk.context, "precision": settings["precision"], "dtype": _float_type(graph).name,
            "vocab_size": int(graph.meta.get("vocab_size", 0)), "graphs": dict(GRAPHS), "data": DATA,
            "inputs": {"ids": "input_ids", "positions": "position_ids", "ids_dtype": "int32"},
            "masks": [{"name": name, "window": window, **({"chunk": size} if size else {})}
                      for (window, size), name in chunk.masks.items()],
            **({"rope_rows": [{"name": name, "original": original, "offset": chunk.context}
                              for original, name in chunk.rope_rows.items()]} if chunk.rope_rows else {}),
            "mask_value": MASK_VALUE, "caches": caches, "states": states, "logits": "logits",
            **({"calibration": settings["calibration"]} if "calibration" in settings else {})}


def emit_folder(graph: Graph, path: str, *, chunk: int, context: int, precision: str = "fp16", seed: int = 0,
                calibration: Optional[str] = None, files: Optional[Mapping[str, object]] = None) -> list[str]:
    """Write the onnx-npu folder (module docstring); returns the paths written. ``files``
    are companions copied in as they are (name -> bytes, or a path: a tokenizer)."""
    files = dict(files or {})
    if vision.is_vision(graph):  # an image encoder: one graph, vision.onnx (backends.onnx_npu.vision)
        return vision.emit_folder(graph, path, TABLE, precision=precision, seed=seed, calibration=calibration,
                                  files=files, data=DATA, contract_name=CONTRACT)
    check_context(context, chunk)
    plan = None
    if precision in BITS:
        tokens = calibration_tokens(calibration, files, int(graph.meta.get("vocab_size", 0)))
        check_lowerable(graph, TABLE)  # refuse before the calibration run, which is the slow part
        plan = calibrate(graph, tokens, BITS[precision], seed, window=min(WINDOW, context))
    builders = {"chunk": build(graph, chunk, context, plan), "decode": build(graph, 1, context, plan)}
    seed_absent(graph, seed)
    layouts = {role: plan_layout(b.weights, DATA, small=SMALL_TENSOR) for role, b in builders.items()}
    first, second = ([(init.name, offset) for init, offset in layout.placed] for layout in layouts.values())
    if first != second:
        raise AssertionError("the chunk and decode graphs disagree on their weights' layout")
    settings = {"chunk": chunk, "precision": precision}
    if plan is not None:
        settings["calibration"] = {"tokens": plan.tokens, "quantized_weights": len(plan.quantized),
                                   "logits_step": output_step(plan, "logits") if "logits" in plan.ranges else None}
    graphs = {GRAPHS[role]: model_proto(graph, b, list(b.constants) + layouts[role].tensors(b.weights), role)
              for role, b in builders.items()}
    return folder.write_folder(path, layouts["chunk"], DATA, graphs, files, CONTRACT,
                               contract(graph, builders, settings))


def emit_target(graph: Graph, path: str, options) -> list[str]:
    settings = resolve(options.target)
    written = emit_folder(graph, path, chunk=settings["chunk"], context=options.context,
                          precision=settings["precision"], seed=options.seed, calibration=settings["calibration"],
                          files=options.files)
    lines = [f"wrote {p}" for p in written]
    if getattr(options, "report", None):   # --report: what the NPU compiler placed, per layer
        from backends.onnx_npu.placement import write as write_placement

        lines += write_placement(path, load_contract(path), graph.meta.get("npu_plan"), options.report)
    if vision.is_vision(graph):
        shape = next(v["shape"] for v in load_contract(path)["inputs"] if v["name"] == vision.INPUT)
        lines.append(f"onnx-npu: {vision.GRAPH}, an image encoder over pixel_values {shape}, precision "
                     f"{settings['precision']}")
        return lines
    lines.append(f"onnx-npu: chunk {settings['chunk']} tokens, decode 1 token, {options.context}-slot KV cache, "
                 f"precision {settings['precision']}; `irc run {path}` drives it on ONNX Runtime's CPU provider")
    return lines
