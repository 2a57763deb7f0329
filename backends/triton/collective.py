"""A sharded graph (``passes/shard.py``) in the Triton target: one rank's program, run in one
process per rank under ``torch.distributed`` (NCCL on GPUs, gloo on CPU).

- ``all_reduce`` and ``all_gather`` become ``torch.distributed`` calls: the sum in fp32 (the
  op's reference sums so; the result in the value's dtype), the gather as ``all_gather`` of
  equal blocks then ``torch.cat`` along the axis (gloo has no ``all_gather_into_tensor``);
- ``vocab_embedding`` a few torch ops: the ids of this rank's block of rows looked up, zero
  for the others (the ``all_reduce`` after it gives every id its row);
- ``moe`` with ``expert_shards`` > 1 (``shard{ep=N}``) is refused: the sorted MoE the
  kernels run has no local expert offset (shard by width, ``ep=1``, then moe-sort), and so is
  a graph cut into pipeline stages.

The module's weights are one file per rank, ``<stem>.rank{r}.pt``, each holding that rank's
blocks (``irc.world.Shard.for_rank``); ``load_weights()`` reads the file of the process's
rank (``torch.distributed.get_rank()``). Every collective and the rank lookup check that a
process group of ``WORLD_SIZE`` ranks is initialised and say how to start one otherwise.
"""
from __future__ import annotations

from irc.errors import BackendError
from irc.graph import Graph, Node
from irc.world import KEY

from backends.triton.kernels import torch_type

OPS = ("all_reduce", "all_gather", "vocab_embedding")

HELPERS = {
    "world_rank": '''def world_rank():
    """This process's rank in the world of WORLD_SIZE ranks the module was compiled for."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"this module is one rank's program of a {WORLD_SIZE}-rank world: run it in "
                           f"{WORLD_SIZE} processes with a torch.distributed process group initialised (torchrun "
                           f"--nproc-per-node {WORLD_SIZE}, or irc run FOLDER --tp {WORLD_SIZE})")
    if dist.get_world_size() != WORLD_SIZE:
        raise RuntimeError(f"the process group has {dist.get_world_size()} ranks; this module was compiled "
                           f"for {WORLD_SIZE} (shard{{tp={WORLD_SIZE}}})")
    return dist.get_rank()''',
    "all_reduce": '''def all_reduce(x):
    """The sum of every rank's x, on every rank (fp32 accumulation, in x's dtype)."""
    world_rank()
    total = x.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(x.dtype)''',
    "all_gather": '''def all_gather(x, axis):
    """Every rank's x joined along ``axis`` in rank order (bf16 travels as its int16 bits)."""
    world_rank()
    local = x.contiguous()
    bits = local.view(torch.int16) if local.dtype == torch.bfloat16 else local
    parts = [torch.empty_like(bits) for _ in range(WORLD_SIZE)]
    dist.all_gather(parts, bits)
    return torch.cat([p.view(x.dtype) for p in parts], dim=axis)''',
    "vocab_embedding": '''def vocab_embedding(ids, table, scale, dtype):
    """This rank's block of a vocabulary split in WORLD_SIZE equal blocks: each id's row
    there (times ``scale``), zero for ids outside it."""
    rows = table.shape[0]
    local = ids - world_rank() * rows
    inside = (local >= 0) & (local < rows)
    out = table[torch.where(inside, local, torch.zeros_like(local))].float() * inside[..., None]
    if scale is not None:
        out = out * scale
    return out.to(dtype)''',
}


def check(graph: Graph) -> None:
    """Refuse what the sharded Triton module cannot run, naming the node."""
    spec = graph.meta.get(KEY) or {}
    if spec.get("stages") or spec.get("pp", 1) > 1:
        raise BackendError("the triton target runs tensor-parallel ranks, not pipeline stages",
                           location=f"graph {graph.name}", hint="shard with tp only: --passes \"shard{tp=N}\"")
    for node in graph.nodes:
        if node.op == "moe" and node.attrs.get("expert_shards", 1) > 1:
            raise BackendError(f"the triton target does not take a moe whose experts are split across ranks "
                               f"(expert_shards={node.attrs['expert_shards']}): its sorted MoE kernels have no "
                               "local expert offset", location=f"node %{node.name}",
                               hint="split the experts by width: --passes \"shard{tp=N},moe-sort\" (ep=1)")


def plan_collective(planner, node: Node) -> None:
    """One launcher line calling the node's helper (``HELPERS``)."""
    args = [planner.var(v) for v in node.inputs]
    out = node.outputs[0]
    if node.op == "all_reduce":
        call = f"all_reduce({args[0]})"
    elif node.op == "all_gather":
        call = f"all_gather({args[0]}, {node.attrs['axis']})"
    else:
        scale = node.attrs["scale"]
        call = f"vocab_embedding({args[0]}, {args[1]}, {None if scale is None else float(scale)!r}, " \
               f"{torch_type(out.dtype)})"
    planner.helpers |= {"world_rank", node.op}
    planner.step([node], [f"{planner.var(out)} = {call}"], torch_ops=[node.op])


# a sharded module run as a script under torchrun (its RANK, WORLD_SIZE, MASTER_ADDR and PORT)
MAIN_TEXT = '''    if "RANK" in os.environ:  # torchrun --nproc-per-node WORLD_SIZE this_module.py
        if DEVICE.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
        dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")
'''
MAIN_END = """
    if dist.is_initialized():
        dist.destroy_process_group()"""


def load_weights_text() -> str:
    """``load_weights`` of a sharded module: the file of this process's rank."""
    return '''def load_weights(path=None, device=None, rank=None):
    """This rank's weights by param name (torch tensors on ``device``, default DEVICE), from
    ``path`` or the <stem>.rank{rank}.pt beside this module (``rank``: default the process's
    rank in the torch.distributed group)."""
    if path is None:
        rank = world_rank() if rank is None else rank
        path = os.path.splitext(os.path.abspath(__file__))[0] + f".rank{rank}.pt"
    return torch.load(path, map_location=device or DEVICE, weights_only=True)'''


def weight_files(stem: str, world: int) -> list[str]:
    return [f"{stem}.rank{rank}.pt" for rank in range(world)]
