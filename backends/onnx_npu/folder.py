"""What every onnx-npu folder is made of, written once for the decoder's ``chunk.onnx`` and
``decode.onnx`` (``backends.onnx_npu.emit``) and an image encoder's ``vision.onnx``
(``backends.onnx_npu.vision``): the static graphs as ONNX models at the target's opset, one
shared weights file, companion files copied in, and ``irc_npu.json`` (the host contract)
written last, atomically (``irc.output.OutputFolder``)."""
from __future__ import annotations

import json
import os
from typing import Mapping

import onnx
from onnx import helper

from irc.errors import BackendError
from irc.output import OutputFolder

from backends.onnx.writer import write_data
from backends.onnx_npu.lower import OPSET


def model_proto(name: str, nodes: list, inputs: list, outputs: list, tensors: list, doc: str) -> onnx.ModelProto:
    """One static graph as an ONNX model at onnx-npu's opset."""
    body = helper.make_graph(nodes, name, inputs, outputs, initializer=tensors)
    imports = [helper.make_opsetid("", OPSET)]
    model = helper.make_model(body, opset_imports=imports, producer_name="irc", producer_version="0.1.0",
                              doc_string=f"{doc}, compiled by irc for target onnx-npu")
    model.ir_version = helper.find_min_ir_version_for(imports)
    return model


def write_folder(folder: str, layout, data: str, graphs: Mapping[str, onnx.ModelProto],
                 files: Mapping[str, object], contract_name: str, contract: dict) -> list[str]:
    """Write the weights (``layout`` into ``data``), the graphs (file name -> model), the
    companion ``files`` (name -> bytes, or a path to copy) and the contract; returns the
    paths written. A companion that would overwrite the folder's own output is refused."""
    written = []
    with OutputFolder(os.path.abspath(folder), primary=contract_name) as out:
        out.require(layout.size)
        write_data(layout, out.stage(data))
        written.append(out.final(data))
        for name, proto in graphs.items():
            written.append(out.write(name, proto.SerializeToString(deterministic=True)))
        for name, source in sorted(files.items()):
            if name in (data, contract_name, *graphs) or os.path.basename(name) != name:
                raise BackendError(f"companion file {name!r} would overwrite the folder's own output")
            written.append(out.write(name, source) if isinstance(source, bytes) else out.copy(name, source))
        written.append(out.write(contract_name, json.dumps(contract, indent=2, sort_keys=True) + "\n"))
    return written
