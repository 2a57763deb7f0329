"""``mla-absorb``: DeepSeek MLA with W^UK and W^UV absorbed, attending over the cached latent."""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from irc.graph import Graph, Node, Param, Value
from irc.ops.mla import absorb_output_weight, absorb_query_weight
from irc.passmanager import register_pass
from irc.rewrite.edit import is_graph_output
from irc.rewrite.lowering import Emitter, LoweringPass
from irc.weights import Derived, materialize

# mla_attention operand positions
X, POSITIONS, MASK, PAST_KEY, PAST_VALUE, WQ, Q_A, Q_A_NORM, Q_B, KV_A, KV_A_NORM, KV_B, WO = range(13)


def lower_mla(e: Emitter, node: Node) -> Union[list[Value], str]:
    """The absorbed attention replacing ``node``, or why it stays."""
    return refusal(e.graph, node) or absorb(e, node)


@register_pass
class MlaAbsorb(LoweringPass):
    """Rewrite each un-absorbed ``mla_attention`` as ``mla_absorbed_attention``.

    W^UK (the key rows of ``kv_b``) is folded into the query weight and W^UV (its value
    rows) into the output weight, so attention runs directly over the normalised latent
    c_kv plus the shared decoupled RoPE key (see ``irc.ops.mla``). New params, lazy
    ``irc.weights.Derived`` data computed in float64 from the sources and stored in the
    source's dtype:

    - ``<q_b>_absorbed`` [H*(d_c+rope), q_lora] (``layers.{i}.attn.q_b_absorbed``), or
      ``<wq>_absorbed`` [H*(d_c+rope), d] for a direct query: per head W^UK_h^T times the
      nope rows, then the head's RoPE rows unchanged;
    - ``<wo>_absorbed`` [d, H*d_c] (``layers.{i}.attn.wo_absorbed``): block h is wo_h W^UV_h.

    ``kv_b``, ``wo`` and ``q_b``/``wq`` are dropped when nothing else reads them (only the
    params this pass leaves unread: other unused params are ``dce``'s business). A source
    without data (a shape-only compile) still gives a param of the right shape; loading it
    raises ``ValueError``.

    The KV cache becomes the latent and the RoPE key, d_c + rope elements per token per
    layer, in the layout transformers' DeepseekV2/V3Attention keep in their cache (key =
    latent, value = RoPE key, one "head" each), under the same names:
    ``past_key_values.{i}.key`` / ``present.{i}.key``: [B, 1, P, d_c], c_kv after
    ``kv_a_norm``; ``past_key_values.{i}.value`` / ``present.{i}.value``: [B, 1, P, rope],
    the rotated RoPE key in the layout of the op's rope convention (what DeepseekV2 caches;
    DeepseekV3 with ``rope_interleave`` caches it de-interleaved, a fixed permutation of the
    last axis that leaves every score unchanged). These graph inputs and outputs change
    shape, which is the point; every other value keeps its name and type.

    Refuses, with a note saying why, a node whose ``kv_b``, ``wo`` or query weight is not a
    param, or whose past caches are not graph inputs read by that node alone, or whose
    present caches feed other nodes. New nodes keep the replaced node's origin. Guarantees: the same outputs as before up to float32 rounding, for prefill
    and for decoding where each graph is fed its own present caches back.
    """

    name = "mla-absorb"
    lowerings = {"mla_attention": lower_mla}
    keep_origin = True

    def run(self, graph: Graph) -> bool:
        sources = [v for n in graph.nodes if n.op == "mla_attention" for v in n.inputs if isinstance(v, Param)]
        changed = super().run(graph)
        readers = {v.name for n in graph.nodes for v in n.inputs if isinstance(v, Param)}
        for param in sources:  # a refused node still reads its params, so they stay
            if param.name not in readers and graph.params.get(param.name) is param:
                del graph.params[param.name]
        return changed


def refusal(graph: Graph, node: Node) -> Optional[str]:
    """Why ``node`` cannot be absorbed, or None."""
    query = node.inputs[WQ] if node.inputs[WQ] is not None else node.inputs[Q_B]
    for role, value in (("kv_b", node.inputs[KV_B]), ("wo", node.inputs[WO]), ("the query weight", query)):
        if not isinstance(value, Param):
            return f"{role} is not a param (%{value.name}), so it cannot be folded at compile time"
    past_key, past_value = node.inputs[PAST_KEY], node.inputs[PAST_VALUE]
    for past in (past_key, past_value):
        if past is None:
            continue
        if not any(v is past for v in graph.inputs):
            return f"the past cache %{past.name} is not a graph input"
        if graph.users(past) != [node] or len(past.uses) != 1 or is_graph_output(graph, past):
            return f"the past cache %{past.name} has other readers"
    for present in node.outputs[1:]:
        if present.uses:
            return f"the present cache %{present.name} feeds other nodes"
    return None


class AbsorbedWeight:
    """``fold(*sources, **sizes)`` over the sources' data, cast to ``dtype``: the lazy data of
    an absorbed param. A source without data raises ValueError when loaded."""

    def __init__(self, fold, sources: list[Param], sizes: dict, dtype):
        self.fold, self.sources, self.sizes, self.dtype = fold, sources, sizes, dtype

    def __call__(self) -> np.ndarray:
        arrays = [materialize(p) for p in self.sources]
        return self.fold(*arrays, **self.sizes).astype(self.dtype.numpy)


def _absorbed_param(graph: Graph, source: Param, kv_b: Param, fold, sizes: dict, shape: tuple) -> Param:
    hint = name = f"{source.name}_absorbed"
    n = 0
    while name in graph.params:
        n += 1
        name = f"{hint}_{n}"
    param = graph.add_param(name, source.dtype, shape)
    param.data = Derived(AbsorbedWeight(fold, [source, kv_b], sizes, source.dtype),
                         f"{fold.__name__} @{source.name}, @{kv_b.name}")
    return param


def _latent_cache(value: Value, width: int) -> None:
    """Retype a past-cache graph input [B, H, P, D] in place to [B, 1, P, width]; its name,
    position among the inputs and dtype stay."""
    batch, _, past, _ = value.shape
    value.shape = (batch, 1, past, width)


def absorb(e: Emitter, node: Node) -> list[Value]:
    graph, a = e.graph, node.attrs
    heads, rank, nope, rope_dim, v_dim = (a["heads"], a["kv_lora_rank"], a["qk_nope_head_dim"],
                                          a["qk_rope_head_dim"], a["v_head_dim"])
    ins = node.inputs
    kv_b, wo = ins[KV_B], ins[WO]
    query = ins[WQ] if ins[WQ] is not None else ins[Q_B]
    q_absorbed = _absorbed_param(graph, query, kv_b, absorb_query_weight,
                                 {"heads": heads, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope_dim,
                                  "v_head_dim": v_dim},
                                 (heads * (rank + rope_dim), query.shape[1]))
    wo_absorbed = _absorbed_param(graph, wo, kv_b, absorb_output_weight,
                                  {"heads": heads, "qk_nope_head_dim": nope, "v_head_dim": v_dim},
                                  (wo.shape[0], heads * rank))
    if ins[PAST_KEY] is not None:
        _latent_cache(ins[PAST_KEY], rank)
        _latent_cache(ins[PAST_VALUE], rope_dim)
    direct = ins[WQ] is not None
    operands = [ins[X], ins[POSITIONS], ins[MASK], ins[PAST_KEY], ins[PAST_VALUE],
                q_absorbed if direct else None, ins[Q_A], ins[Q_A_NORM], None if direct else q_absorbed,
                ins[KV_A], ins[KV_A_NORM], wo_absorbed]
    return e.emit("mla_absorbed_attention", operands, [f"{out.name}.absorbed" for out in node.outputs], dict(a))
