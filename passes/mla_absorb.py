"""``mla-absorb``: DeepSeek MLA attending over the cached latent, with W^UK and W^UV applied at
run time (the default) or folded into the query and output weights (``fold_weights=true``)."""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from irc.errors import PassError
from irc.graph import Graph, Node, Param, Value
from irc.ops.mla import absorb_output_weight, absorb_query_weight
from irc.passmanager import register_pass
from irc.rewrite.edit import is_graph_output
from irc.rewrite.lowering import Emitter, LoweringPass
from irc.weights import Derived, materialize

from passes.mla_views import kv_b_view_params

# mla_attention operand positions
X, POSITIONS, MASK, PAST_KEY, PAST_VALUE, WQ, Q_A, Q_A_NORM, Q_B, KV_A, KV_A_NORM, KV_B, WO = range(13)


CACHES = ("split", "halves")


def lower_mla(e: Emitter, node: Node) -> Union[list[Value], str]:
    """The absorbed attention replacing ``node``, or why it stays."""
    fold, cache = e.options["fold_weights"], e.options["cache"]
    reason = refusal(e.graph, node, fold)
    if reason:
        return reason
    halves = cache == "halves" and node.inputs[PAST_KEY] is not None
    if halves:
        reason = _halves_refusal(node)
        if reason:
            return reason
    pasts = _halves_in(e, node) if halves else None
    outs = absorb(e, node, pasts) if fold else absorb_at_run_time(e, node, pasts)
    return _halves_out(e, node, outs) if halves else outs


@register_pass
class MlaAbsorb(LoweringPass):
    """Rewrite each un-absorbed ``mla_attention`` so that attention runs directly over the
    normalised latent c_kv plus the shared decoupled RoPE key.

    Default (``fold_weights=false``): ``mla_latent_attention`` (``irc.ops.mla_latent``), as
    FlashMLA, vLLM and SGLang deploy MLA. ``kv_b`` [H*(nope+v), d_c] is replaced by its two
    per-head blocks, params ``<kv_b>.uk`` W^UK [H, nope, d_c] and ``<kv_b>.uv`` W^UV
    [H, v, d_c], whose lazy data are views of the checkpoint tensor (no copy, no arithmetic:
    together they are ``kv_b``'s elements, once). The query's nope part goes through W^UK by
    a batched matmul over heads into latent space; the attention result comes back out through
    W^UV, then ``wo``. Parameters stay exactly the checkpoint's.

    ``fold_weights=true``: ``mla_absorbed_attention`` (``irc.ops.mla``). W^UK (the key rows
    of ``kv_b``) is folded into the query weight and W^UV (its value rows) into the output
    weight. New params, lazy ``irc.weights.Derived`` data computed in float64 from the sources
    and stored in the source's dtype:

    - ``<q_b>_absorbed`` [H*(d_c+rope), q_lora] (``layers.{i}.attn.q_b_absorbed``), or
      ``<wq>_absorbed`` [H*(d_c+rope), d] for a direct query: per head W^UK_h^T times the
      nope rows, then the head's RoPE rows unchanged;
    - ``<wo>_absorbed`` [d, H*d_c] (``layers.{i}.attn.wo_absorbed``): block h is wo_h W^UV_h.

    ``kv_b``, ``wo`` and ``q_b``/``wq`` are dropped when nothing else reads them (only the
    params this pass leaves unread: other unused params are ``dce``'s business). A source
    without data (a shape-only compile) still gives a param of the right shape; loading it
    raises ``ValueError``.

    The trade, for DeepSeek-V2 (60 layers, H 128, q_lora 1536, d_c 512, nope 128, rope 64,
    v 128, d 5120; bf16 weights and cache; per decoded token, batch 1; ``irc show --passes
    mla-absorb`` prints this table for any MLA model, ``irc.analysis_mla`` computes it):

    =====================  ================  =================  ==================
    DeepSeek-V2            un-absorbed       runtime (default)  folded
    =====================  ================  =================  ==================
    parameters             235,741,434,880   235,741,434,880    254,364,144,640
    KV cache / token       4.69 MiB          67.5 KiB           67.5 KiB
    FLOPs / token @ 4,096  61.8 G            110.2 G            147.4 G
    FLOPs / token @ 32,768 202.8 G           589.3 G            626.6 G
    bytes read @ 4,096     58.6 GiB          40.1 GiB           74.8 GiB
    bytes read @ 32,768    189.8 GiB         41.9 GiB           76.6 GiB
    =====================  ================  =================  ==================

    (bytes read = the weights one token touches, 6 of 160 experts, + the whole cache.)
    Folding buys no FLOPs here: with d_c > nope and d_c > v, q_b_absorbed [H*(d_c+rope),
    q_lora] and wo_absorbed [d, H*d_c] are larger than q_b + W^UK and W^UV + wo, so the
    folded form stores 18.6 B more parameters, reads 37 GB more per token and does 37 GFLOP
    more per token than the runtime form. What folding saves is the two per-head GEMMs per
    layer (two launches of H small GEMMs): worth it only where those run far below the
    device's peak, or for shapes with d_c smaller than nope and v.

    The KV cache becomes the latent and the RoPE key, d_c + rope elements per token per
    layer, in the layout transformers' DeepseekV2/V3Attention keep in their cache (key =
    latent, value = RoPE key, one "head" each), under the same names:
    ``past_key_values.{i}.key`` / ``present.{i}.key``: [B, 1, P, d_c], c_kv after
    ``kv_a_norm``; ``past_key_values.{i}.value`` / ``present.{i}.value``: [B, 1, P, rope],
    the rotated RoPE key in the layout of the op's rope convention (what DeepseekV2 caches;
    DeepseekV3 with ``rope_interleave`` caches it de-interleaved, a fixed permutation of the
    last axis that leaves every score unchanged). These graph inputs and outputs change
    shape, which is the point; every other value keeps its name and type.

    ``cache=halves`` (either form; ``split``, the layout above, is the default) stores the
    same d_c + rope elements per token as two equal halves of [latent | RoPE key]:
    ``past_key_values.{i}.key`` and ``.value`` both [B, 1, P, (d_c + rope) / 2], joined and
    split again around the op. That is the layout onnxruntime-genai (0.18) can allocate: it
    gives a layer's key and value caches one head size (``DefaultKeyValueCache`` in its
    ``src/models/kv_cache.cpp`` takes the config's ``head_size``, or per layer the key
    input's width, for both), so it cannot run caches of widths d_c and rope. It costs two
    concats and four slices of the cache per step; d_c + rope must be even.

    Refuses, with a note saying why, a node whose ``kv_b`` is not a param (folding: also
    ``wo`` or the query weight), or whose past caches are not graph inputs read by that node
    alone, or whose present caches feed other nodes, or (``cache=halves``) whose d_c + rope
    is odd. New nodes keep the replaced node's origin. Guarantees: the same outputs as before
    up to float32 rounding, for prefill and for decoding where each graph is fed its own
    present caches back.
    """

    name = "mla-absorb"
    options = {"fold_weights": False, "cache": "split"}
    lowerings = {"mla_attention": lower_mla}
    keep_origin = True

    def __init__(self, **options):
        super().__init__(**options)
        if self.config["cache"] not in CACHES:
            raise PassError(f"pass mla-absorb: cache must be one of {', '.join(CACHES)}, got {self.config['cache']!r}")
        if not isinstance(self.config["fold_weights"], bool):
            raise PassError(f"pass mla-absorb: fold_weights must be true or false, got {self.config['fold_weights']!r}")

    def precondition(self, graph: Graph):
        sharded = (graph.meta.get("shard") or {}).get("params", {})
        cut = next((v.name for n in graph.nodes if n.op == "mla_attention" for v in n.inputs
                    if isinstance(v, Param) and v.name in sharded), None)
        if cut is not None:  # the absorbed weights are products of whole kv_b rows
            return f"@{cut} is already cut across ranks by shard; run mla-absorb before shard"
        return None

    def run(self, graph: Graph) -> bool:
        sources = [v for n in graph.nodes if n.op == "mla_attention" for v in n.inputs if isinstance(v, Param)]
        changed = super().run(graph)
        readers = {v.name for n in graph.nodes for v in n.inputs if isinstance(v, Param)}
        for param in sources:  # a refused node still reads its params, so they stay
            if param.name not in readers and graph.params.get(param.name) is param:
                del graph.params[param.name]
        return changed


def refusal(graph: Graph, node: Node, fold: bool = True) -> Optional[str]:
    """Why ``node`` cannot be absorbed, or None. Folding needs ``kv_b``, ``wo`` and the
    query weight as params; absorbing at run time needs ``kv_b`` alone (its views)."""
    query = node.inputs[WQ] if node.inputs[WQ] is not None else node.inputs[Q_B]
    weights = (("kv_b", node.inputs[KV_B]), ("wo", node.inputs[WO]), ("the query weight", query))
    for role, value in weights if fold else weights[:1]:
        if not isinstance(value, Param):
            how = "folded at compile time" if fold else "split into per-head views"
            return f"{role} is not a param (%{value.name}), so it cannot be {how}"
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


def _latent_caches(ins: list, rank: int, rope_dim: int) -> tuple:
    """The past caches retyped in place to the latent [B, 1, P, d_c] and the RoPE key
    [B, 1, P, rope] (None, None without caches)."""
    if ins[PAST_KEY] is not None:
        _latent_cache(ins[PAST_KEY], rank)
        _latent_cache(ins[PAST_VALUE], rope_dim)
    return ins[PAST_KEY], ins[PAST_VALUE]


def _halves_refusal(node: Node) -> Optional[str]:
    width = node.attrs["kv_lora_rank"] + node.attrs["qk_rope_head_dim"]
    return f"cache=halves needs an even d_c + rope, got {width}" if width % 2 else None


def _halves_in(e: Emitter, node: Node) -> tuple:
    """``cache=halves``: the past caches become two equal halves of [latent | RoPE key],
    [B, 1, P, (d_c + rope) / 2] each (what onnxruntime-genai can allocate: one head size for
    keys and values); the op reads the latent and the RoPE key sliced from their join."""
    rank, rope_dim = node.attrs["kv_lora_rank"], node.attrs["qk_rope_head_dim"]
    past_key, past_value = node.inputs[PAST_KEY], node.inputs[PAST_VALUE]
    _latent_cache(past_key, (rank + rope_dim) // 2)
    _latent_cache(past_value, (rank + rope_dim) // 2)
    joined = e("concat", [past_key, past_value], "past_joined", {"axis": 3})
    return (e("slice", [joined], "past_latent", {"axis": 3, "start": 0, "end": rank}),
            e("slice", [joined], "past_rope", {"axis": 3, "start": rank, "end": rank + rope_dim}))


def _halves_out(e: Emitter, node: Node, outs: list[Value]) -> list[Value]:
    """The op's presents (latent, RoPE key) as the two equal halves of their join."""
    width = node.attrs["kv_lora_rank"] + node.attrs["qk_rope_head_dim"]
    joined = e("concat", outs[1:], "present_joined", {"axis": 3})
    return [outs[0], e("slice", [joined], "present_key", {"axis": 3, "start": 0, "end": width // 2}),
            e("slice", [joined], "present_value", {"axis": 3, "start": width // 2, "end": width})]


def _latent_cache(value: Value, width: int) -> None:
    """Retype a past-cache graph input [B, H, P, D] in place to [B, 1, P, width]; its name,
    position among the inputs and dtype stay."""
    batch, _, past, _ = value.shape
    value.shape = (batch, 1, past, width)


def absorb(e: Emitter, node: Node, pasts: Optional[tuple] = None) -> list[Value]:
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
    past_latent, past_rope = pasts or _latent_caches(ins, rank, rope_dim)
    direct = ins[WQ] is not None
    operands = [ins[X], ins[POSITIONS], ins[MASK], past_latent, past_rope,
                q_absorbed if direct else None, ins[Q_A], ins[Q_A_NORM], None if direct else q_absorbed,
                ins[KV_A], ins[KV_A_NORM], wo_absorbed]
    return e.emit("mla_absorbed_attention", operands, [f"{out.name}.absorbed" for out in node.outputs], dict(a))


def absorb_at_run_time(e: Emitter, node: Node, pasts: Optional[tuple] = None) -> list[Value]:
    """``mla_latent_attention`` over the same weights, ``kv_b`` read as W^UK and W^UV."""
    a, ins = node.attrs, node.inputs
    w_uk, w_uv = kv_b_view_params(e.graph, ins[KV_B], a["heads"], a["qk_nope_head_dim"], a["v_head_dim"])
    past_latent, past_rope = pasts or _latent_caches(ins, a["kv_lora_rank"], a["qk_rope_head_dim"])
    operands = list(ins[:PAST_KEY]) + [past_latent, past_rope] + list(ins[WQ:KV_B]) + [w_uk, w_uv, ins[WO]]
    return e.emit("mla_latent_attention", operands, [f"{out.name}.absorbed" for out in node.outputs], dict(a))
