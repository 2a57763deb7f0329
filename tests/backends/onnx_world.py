"""Rank models (backends.onnx.shard) run as a world on CPU, for tests: each rank a process
(torch.multiprocessing, gloo through a file store) that loads its rank's model, cuts it at its
com.microsoft AllReduce / AllGather nodes, runs the pieces in onnxruntime's CPU provider and
does each collective with torch.distributed between them. Kept light (numpy, onnx,
onnxruntime, torch: no irc but ``irc.world.block``) so the processes start fast; one world runs
several models. ``ORT_THREADS`` sets each session's intra-op threads (benchmarks/shard.py's
timing); each greedy step's wall time is kept beside its tokens."""
import json
import os
import time

import numpy as np
import onnx
import onnxruntime as ort

COLLECTIVES = ("AllReduce", "AllGather")
NOTE = "irc_shard.json"  # backends.onnx.shard.NOTE
STEPS = 8


def names_used(node: onnx.NodeProto) -> set:
    """The node's inputs and every name its subgraphs read (outer-scope names included)."""
    used = {name for name in node.input if name}
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in graph.node:
                used |= names_used(inner)
    return used


def pieces(model: onnx.ModelProto) -> list:
    """The graph's nodes cut at its collectives: [(nodes, names needed after them), (collective,
    ...), ...]."""
    runs, current = [], []
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type in COLLECTIVES:
            runs += [current, node]
            current = []
        else:
            current.append(node)
    runs.append(current)
    needed, later = [], {o.name for o in model.graph.output}
    for piece in reversed(runs):
        needed.append(set(later))
        for node in piece if isinstance(piece, list) else [piece]:
            later |= names_used(node)
    return list(zip(runs, reversed(needed)))


class Runner:
    """One model in onnxruntime on CPU, ``exchange(node, array)`` doing its collectives (each
    piece a model of its own: inputs typed from the arrays that reach it, outputs untyped)."""

    def __init__(self, path: str, exchange=None):
        self.model = onnx.load(path)
        self.inits = {t.name: t for t in self.model.graph.initializer}
        self.pieces, self.exchange, self.sessions = pieces(self.model), exchange, {}
        self.inputs = [i.name for i in self.model.graph.input]
        self.outputs = [o.name for o in self.model.graph.output]

    def _session(self, index: int, nodes: list, env: dict, needed: set):
        if index not in self.sessions:
            produced = {o for node in nodes for o in node.output}
            used = set().union(*(names_used(n) for n in nodes)) - produced
            inputs = sorted(name for name in used if name in env)
            outputs = [name for node in nodes for name in node.output if name in needed]
            graph = onnx.helper.make_graph(
                nodes, f"piece{index}",
                [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(env[n].dtype), None)
                 for n in inputs],
                [onnx.ValueInfoProto(name=name) for name in outputs],
                initializer=[self.inits[name] for name in sorted(used & set(self.inits))])
            model = onnx.helper.make_model(graph, opset_imports=self.model.opset_import)
            model.ir_version = self.model.ir_version
            options = ort.SessionOptions()
            options.intra_op_num_threads = int(os.environ.get("ORT_THREADS", "0"))
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            self.sessions[index] = (session, inputs, outputs)
        return self.sessions[index]

    def run(self, feeds: dict) -> dict:
        env = dict(feeds)
        for index, (piece, needed) in enumerate(self.pieces):
            if isinstance(piece, onnx.NodeProto):
                env[piece.output[0]] = self.exchange(piece, env[piece.input[0]])
                continue
            if piece:
                session, inputs, outputs = self._session(index, piece, env, needed)
                env.update(zip(outputs, session.run(outputs, {n: env[n] for n in inputs})))
        return {name: env[name] for name in self.outputs}


def greedy(runner: Runner, feeds: dict, cut=lambda name, array: array, steps: int = STEPS) -> tuple[dict, list]:
    """The first step's outputs and ``steps`` greedy tokens after it, the cache fed back (each
    step's seconds in ``runner.times``)."""
    first = outputs = runner.run({name: cut(name, feeds[name]) for name in runner.inputs})
    tokens, runner.times = [], []
    past = feeds["attention_mask"].shape[1]
    for _ in range(steps):
        started = time.perf_counter()
        ids = outputs["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(ids[:, 0].tolist())
        step = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], past + 1), np.int64),
                "position_ids": np.full(ids.shape, past, np.int64)}
        step.update({name: outputs[name.replace("past_key_values.", "present.")] for name in runner.inputs
                     if name.startswith("past_key_values.")})
        outputs, past = runner.run(step), past + 1
        runner.times.append(time.perf_counter() - started)
    return first, tokens


def block(array: np.ndarray, cut: dict, rank: int) -> np.ndarray:
    """Rank ``rank``'s block of a cut input, as irc_shard.json describes it (irc.world.block)."""
    from irc.world import block as world_block

    return world_block(array, cut, rank)


def exchange(node: onnx.NodeProto, array: np.ndarray) -> np.ndarray:
    import torch
    import torch.distributed as dist

    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if node.op_type == "AllReduce":
        dist.all_reduce(tensor)
        return tensor.numpy()
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    parts = [torch.empty_like(tensor) for _ in range(attrs["group_size"])]
    dist.all_gather(parts, tensor)
    return np.concatenate([p.numpy() for p in parts], axis=attrs["axis"])


def rank_main(rank: int, store: str, folders: list, feeds: list) -> None:
    """Rank ``rank``: every folder's model in turn, its first outputs and tokens saved beside it."""
    import torch.distributed as dist

    notes = [json.load(open(os.path.join(folder, NOTE))) for folder in folders]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=notes[0]["world_size"])
    try:
        for folder, note, fed in zip(folders, notes, feeds):
            runner = Runner(os.path.join(folder, note["ranks"][rank]["model"]), exchange)
            cuts = note["inputs"]
            first, tokens = greedy(runner, fed, lambda n, a: block(a, cuts[n], rank) if n in cuts else a,
                                   int(os.environ.get("WORLD_STEPS", STEPS)))
            np.savez(os.path.join(folder, f"result{rank}.npz"), tokens=np.array(tokens), times=np.array(runner.times),
                     **first)
    finally:
        dist.destroy_process_group()


def run_world(store: str, folders: list, feeds: list, size: int) -> list:
    """For each folder, each rank's results (``rank_main``); ``store``: a file path for gloo."""
    import torch.multiprocessing

    torch.multiprocessing.spawn(rank_main, args=(store, folders, feeds), nprocs=size, join=True)
    return [[dict(np.load(os.path.join(folder, f"result{r}.npz"))) for r in range(size)] for folder in folders]
