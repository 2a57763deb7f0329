"""A sharded graph (``passes/shard.py``) as one ONNX model per rank, for ``--target onnx-ort``.

The graph is one rank's program; rank r's model is that program with rank r's blocks of the
weights (``irc.world.Shard.for_rank``) and rank r's constants, so the files differ only in
their weights and in the constants that say which rows or experts the rank holds:

- ``all_reduce {world}`` -> ``com.microsoft.AllReduce`` (a sum; ORT's schema has no
  attribute, its kernel reduces over the whole NCCL communicator); types f16, f32, f64, so
  another float type is cast to f32 around it;
- ``all_gather {world, axis}`` -> ``com.microsoft.AllGather`` with ``group_size`` = world and
  ``axis`` written non-negative (ORT's CUDA kernel transposes only for ``axis_ > 0``);
- ``vocab_embedding {world, scale}`` -> standard ops with the rank's first row r x rows as a
  constant: ``Sub``, ``GreaterOrEqual`` / ``Less`` / ``And``, ``Where`` to row 0 outside the
  block, ``Gather``, times the mask (and ``scale``);
- ``moe`` with ``expert_shards`` > 1 -> the standard-ops MoE (``backends.onnx.moe.lower_moe``)
  routing over every expert and keeping the gating columns of the rank's experts
  (``rank_gating``); ORT's ``MoE`` op routes only over the experts it is given, so it is not
  used there (a width-split MoE, ``ep`` = 1, still gets it).

Files, in the folder of the path given (``OUT/model.onnx``): ``model.rank{r}.onnx`` for each
rank (``model.rank{r}.onnx.data`` beside it when the weights go to external data) and
``irc_shard.json``, the launch note: world size, the file per rank, how each cache input and
present output is cut, and how onnxruntime is launched (``launch_note``). All are staged and
committed together (``irc.output``). No ``genai_config.json``: onnxruntime-genai runs one
model in one process, with no tensor parallelism.

ORT runs these collectives only in its CUDA provider, built with NCCL (``--enable_nccl``,
``--use_mpi`` for mpirun; ``onnxruntime.has_collective_ops()``); another build refuses the
models at load (1.32's CPU wheel: "com.microsoft:AllReduce(-1) is not a registered
function/op"). ``tests/backends/
test_onnx_shard.py`` runs the rank models on CPU split at their collectives, torch.distributed
(gloo) doing the exchanges.
"""
from __future__ import annotations

import json
import os
from functools import partial
from typing import Optional

import numpy as np
from onnx import TensorProto

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph, Node
from irc.output import OutputFolder
from irc.world import KEY, Shard

from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.emit import ORT, PORTABLE, Emitted, emit_model
from backends.onnx.moe import lower_moe

NOTE = "irc_shard.json"
REDUCE_TYPES = (DType.f16, DType.f32)   # AllReduce's T: float16, float, double
GATHER_TYPES = (DType.f16, DType.f32, DType.i64, DType.bool)
NCCL_PORT = "18888"                      # ORT's default RANK0_PORT


def _collective(b: Builder, op: str, node: Node, outs: list[str], types: tuple, **attrs) -> None:
    x = node.inputs[0]
    if x.dtype in types:
        b.node(op, [b.value(x)], outs, domain=MS_DOMAIN, **attrs)
        return
    if not x.dtype.is_float:
        raise BackendError(f"{node.op} of {x.dtype}: onnxruntime's {op} takes {', '.join(map(str, types))}")
    wide = b.op("Cast", [b.value(x)], f"{outs[0]}/f32", to=TensorProto.FLOAT)
    b.node("Cast", [b.op(op, [wide], f"{outs[0]}/{op}_f32", domain=MS_DOMAIN, **attrs)], outs,
           to=ONNX_TYPES[x.dtype])


def lower_all_reduce(b: Builder, node: Node, outs: list[str]) -> None:
    _collective(b, "AllReduce", node, outs, REDUCE_TYPES)


def lower_all_gather(b: Builder, node: Node, outs: list[str]) -> None:
    rank = len(node.inputs[0].shape)
    axis = node.attrs["axis"] % rank
    _collective(b, "AllGather", node, outs, GATHER_TYPES, group_size=int(node.attrs["world"]), axis=axis)


def lower_vocab_embedding(b: Builder, node: Node, outs: list[str], rank: int) -> None:
    """Rank ``rank``'s rows of the table: each id's row where it falls in the block, zero
    elsewhere (``irc.ops.collective``)."""
    ids, table = node.inputs
    if not table.dtype.is_float:
        raise BackendError(f"vocab_embedding over a {table.dtype} table", hint="dequantize the embedding first")
    out, rows = outs[0], table.shape[0]
    index = b.value(ids)
    if ids.dtype != DType.i64:
        index = b.op("Cast", [index], f"{out}/ids_i64", to=TensorProto.INT64)
    local = b.op("Sub", [index, b.i64(rank * rows, f"{out}/first_row")], f"{out}/local_ids")
    inside = b.op("And", [b.op("GreaterOrEqual", [local, b.i64(0, f"{out}/zero")], f"{out}/from_first"),
                          b.op("Less", [local, b.i64(rows, f"{out}/rows")], f"{out}/before_last")], f"{out}/inside")
    safe = b.op("Where", [inside, local, b.i64(0, f"{out}/zero")], f"{out}/safe_ids")
    gathered = b.op("Gather", [b.value(table), safe], f"{out}/rows", axis=0)
    mask = b.op("Unsqueeze", [b.op("Cast", [inside], f"{out}/mask", to=ONNX_TYPES[table.dtype]), b.i64([-1])],
                f"{out}/mask3")
    if node.attrs["scale"] is None:
        b.node("Mul", [gathered, mask], outs)
        return
    kept = b.op("Mul", [gathered, mask], f"{out}/kept")
    b.node("Mul", [kept, b.const(node.attrs["scale"], table.dtype.numpy, f"{out}/scale")], outs)


def lower_rank_moe(b: Builder, node: Node, outs: list[str], rank: int) -> None:
    if node.attrs.get("expert_shards", 1) > 1:
        lower_moe(b, node, outs, rank=rank)
    else:
        (ORT if b.flavour == "ort" else PORTABLE)["moe"](b, node, outs)


def rank_lowerings(rank: int) -> dict:
    """The lowerings that differ from the target's for rank ``rank``'s model."""
    return {"all_reduce": lower_all_reduce, "all_gather": lower_all_gather,
            "vocab_embedding": partial(lower_vocab_embedding, rank=rank), "moe": partial(lower_rank_moe, rank=rank)}


class RankBlock:
    """Rank ``rank``'s block of a sharded param, read when the model is written."""

    def __init__(self, shard: Shard, rank: int, seed: int, centre: float):
        self.shard, self.rank, self.seed, self.centre = shard, rank, seed, centre

    def load(self) -> np.ndarray:
        return self.shard.for_rank(self.rank, self.seed, centre=self.centre)


def rank_graph(graph: Graph, rank: int, seed: int) -> Graph:
    """A copy of ``graph`` whose sharded params hold rank ``rank``'s blocks (the interpreter's
    seeding: ``irc.interpreter.Interpreter.weight``)."""
    ranked = graph.clone()
    centre = 1.0 - float(graph.meta.get("norm_offset", 0.0) or 0.0)
    for param in ranked.params.values():
        if isinstance(param.data, Shard):
            param.data = RankBlock(param.data, rank, seed, centre)
    return ranked


def rank_file(path: str, rank: int) -> str:
    """``OUT/model.onnx`` -> ``model.rank{rank}.onnx``."""
    name = os.path.basename(path)
    stem = name[:-len(".onnx")] if name.endswith(".onnx") else name
    return f"{stem}.rank{rank}.onnx"


def launch_note(graph: Graph, files: list[str]) -> dict:
    """What ``irc_shard.json`` says (module docstring); the launch as onnxruntime's NCCL context
    reads it (onnxruntime/contrib_ops/cuda/collective/nccl_kernels.cc, ``NcclContext``)."""
    spec = graph.meta[KEY]
    size = spec["tp"]
    return {
        "format": "irc tensor-parallel ONNX: one model per rank, com.microsoft AllReduce / AllGather between them",
        "world_size": size, "tp": size, "ep": spec.get("ep", 1),
        "ranks": [{"rank": r, "model": file} for r, file in enumerate(files)],
        "inputs": spec.get("inputs", {}), "outputs": spec.get("outputs", {}),
        "cuts": "rank r feeds (and gets back) elements [i*block, (i+1)*block) of a cut tensor along axis, "
                "i = r // rep; with segments (an axis of concatenated blocks of these sizes), its share of each "
                "segment, joined: 1/ways[s] of segment s, block r // (world / ways[s]) (ways: N for every "
                "segment where absent); everything else whole, the same on every rank",
        "runtime": "onnxruntime built with CUDA and NCCL (build.sh --use_cuda --enable_nccl, --use_mpi for mpirun); "
                   "onnxruntime.has_collective_ops() is True there. Each process: InferenceSession(its rank's "
                   "model, providers=['CUDAExecutionProvider'], provider_options=[{'device_id': str(local rank)}])",
        "launch": {
            "mpi": f"mpirun -n {size} python RUNNER.py (an MPI build reads the rank and world size from "
                   "MPI_COMM_WORLD and broadcasts NCCL's id with MPI_Bcast)",
            "env": {"LOCAL_WORLD_SIZE": str(size), "LOCAL_RANK": "<rank>", "RANK0_IP": "<rank 0's host>",
                    "RANK0_PORT": NCCL_PORT},
            "env_note": "without MPI each process sets LOCAL_WORLD_SIZE and LOCAL_RANK; rank 0 hands NCCL's id to "
                        f"the others over TCP at RANK0_IP:RANK0_PORT (defaults localhost:{NCCL_PORT})",
        },
        "genai_config": "not written: onnxruntime-genai runs one model in one process (no tensor parallelism)",
    }


def emit_sharded(graph: Graph, path: str, *, target: str, files: Optional[dict] = None, seed: int = 0,
                 **kwargs) -> tuple[list[Emitted], str]:
    """Write every rank's model and the launch note beside ``path``; (the models, the note's path)."""
    if target != "onnx-ort":
        raise BackendError(f"a graph sharded over {graph.meta[KEY]['tp']} ranks needs collective ops, which only "
                           f"onnxruntime has (com.microsoft AllReduce / AllGather): target {target} has none",
                           location=f"graph {graph.name}", hint="use --target onnx-ort")
    if graph.parts:
        raise BackendError(f"a sharded graph with parts ({', '.join(sorted(graph.parts))}): irc writes one "
                           "sharded decoder per rank, nothing beside it", location=f"graph {graph.name}")
    folder = os.path.dirname(os.path.abspath(path))
    names = [rank_file(path, r) for r in range(graph.meta[KEY]["tp"])]
    if NOTE in names:
        raise BackendError(f"the models cannot be named {NOTE}", hint="use -o FOLDER/model.onnx")
    results = []
    with OutputFolder(folder, primary=NOTE) as out:
        for rank, name in enumerate(names):
            results.append(emit_model(rank_graph(graph, rank, seed), os.path.join(folder, name), target=target,
                                      seed=seed, genai=False, files=files if rank == 0 else None, out=out,
                                      lowerings=rank_lowerings(rank), **kwargs))
        note = out.write(NOTE, json.dumps(launch_note(graph, names), indent=2) + "\n")
    return results, note


__all__ = ["NOTE", "emit_sharded", "launch_note", "lower_all_gather", "lower_all_reduce", "lower_vocab_embedding",
           "rank_file", "rank_graph", "rank_lowerings"]
