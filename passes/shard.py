"""``shard{tp=N}``: tensor parallelism, Megatron-LM's layout, as one rank's program; or
``shard{pp=P}``: the layers in P pipeline stages (``passes/shard_pipeline.py``).

Every rank runs the same graph on its own blocks of the weights (``irc.world``):

- attention: q / k / v projections column-parallel (rank r keeps its heads' rows, biases
  too), the heads split by KV group (each rank owns whole groups: H / N query heads and
  H_kv / N KV heads, the cache inputs and presents cut alike); where H_kv < N the KV heads are
  replicated, N / H_kv ranks holding each (said in the pass's note), and where neither divides
  the pass refuses; the output projection row-parallel (its columns), then ``all_reduce``
  (its bias, if any, added once after it);
- dense MLPs (SwiGLU, GeGLU): gate and up column-parallel, down row-parallel, ``all_reduce``;
- MLA: the heads split, the latent projections replicated; as stored the cache is per head and
  splits too, in the latent forms ``mla-absorb`` makes every rank holds the latent cache whole;
- mixtures of experts: every expert's width split the same way (the router replicated, each
  rank routing every token; a bias on the down projections held by rank 0, zeros elsewhere,
  so it is added once), the shared expert too, then ``all_reduce``; with ``ep`` = N, whole
  experts instead, E / N a rank (``moe``'s ``expert_shards``: each rank adds its experts'
  share of every token, an all-reduce combining them where a serving engine would send
  tokens to their experts and back with two all-to-alls), the shared expert still split by width;
- the embedding vocabulary-parallel (``vocab_embedding``: each rank its block of rows, zero
  elsewhere, then ``all_reduce``) and the LM head column-parallel over the vocabulary, then
  ``all_gather`` of the logits (a tied head reads the embedding's block);
- GELU MLPs (``gelu_mlp``) and linear -> element-wise -> linear chains (Nemotron-H's squared
  ReLU, Phi's and GPT-2's MLPs) column- then row-parallel, ``all_reduce``;
- attention's per-head operands (GPT-OSS's sinks, ALiBi's slopes) by heads;
- gated DeltaNet (Qwen3-Next, Qwen3.5) by key heads, the convolution's channels and the states
  with them (``passes/shard_delta.py``), then ``all_reduce``;
- Mamba-2 (``ssd``) by heads, B and C by groups or replicated, the gated norm's sum of squares
  all-reduced where its group spans ranks, and LFM2's short convolution by channels
  (``passes/shard_ssm.py``), then ``all_reduce``;
- everything else (norms, residual adds, RoPE) replicated: every rank computes it on the same
  values.

Refused, naming the node: layers whose weights the pass does not yet split (Mamba-1's
selective scan, mLSTM; Kimi's and MiniMax's delta rules, whose decay weights are computed;
identity experts), block-sparse attention, a norm across
heads between a projection and the attention other than one over all of them (per-head q/k
norms are kept; OLMo-2's over all heads is summed across ranks, ``passes/shard_norm.py``), and
a dimension N does not divide. Other layers (RWKV's and RG-LRU's mixers, routers, patch
embeddings) run whole on every rank: correct, counted in the pass's note.

Guarantees: run as a world (``irc.world.run_world``: the reference interpreter runs every
sharded graph so), the graph gives the unsharded graph's outputs from its feeds, caches
included (presents joined along their heads); ``graph.meta["shard"]`` says how each param,
cache and present is cut; ``tp=1`` changes nothing, and a graph already sharded at N is left
as it is (unchanged; another N is refused).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc import ops
from irc.build import emit1
from irc.errors import PassError
from irc.graph import Graph, Node, Param, Value
from irc.passmanager import Pass, register_pass
from irc.world import KEY, Shard
from passes import shard_pipeline
from passes.shard_delta import plan_delta
from passes.shard_norm import world_norm
from passes.shard_ssm import plan_short_conv, plan_ssd

ELEMENTWISE = ("maximum", "mul", "add", "gelu", "silu", "tanh", "sigmoid", "softcap")  # one operand, constants beside
THROUGH = ("rope", "reshape", "rms_norm", "slice")  # per-head ops between a projection and the attention
REFUSED = ("selective_scan", "mlstm")  # mixers whose weights the pass does not split


@register_pass
class ShardPass(Pass):
    """Tensor parallelism over ``tp`` ranks (Megatron-LM's column / row-parallel layout): one
    rank's program with ``all_reduce`` / ``all_gather``, proven equal as a world of ranks."""

    name = "shard"
    options = {"tp": 1, "ep": 1, "pp": 1}

    def run(self, graph: Graph) -> bool:
        tp, ep, pp = int(self.config["tp"]), int(self.config["ep"]), int(self.config["pp"])
        if tp < 1 or pp < 1:
            raise PassError(f"shard: tp and pp must be at least 1, got tp={tp}, pp={pp}")
        if pp > 1 and tp > 1:
            raise PassError(f"shard: tp={tp} with pp={pp}: irc shards one way at a time for now (a stage's "
                            "ranks splitting its layers is not built)", hint="shard{tp=N} or shard{pp=P}")
        if ep not in (1, tp):
            raise PassError(f"shard: ep is {ep}: irc spreads the experts over the tensor-parallel ranks (ep=1: "
                            f"every expert split by width; ep={tp}: whole experts, {tp} ways)")
        done = graph.meta.get(KEY)
        if done:
            if (done["tp"], done.get("pp", 1)) != (tp, pp):
                raise PassError(f"shard: the graph is already sharded (tp={done['tp']}, pp={done.get('pp', 1)}), "
                                f"not tp={tp}, pp={pp}")
            self.notes = []
            return False
        if pp > 1:
            stages, self.notes = shard_pipeline.split(graph, pp)
            graph.meta[KEY] = {"tp": 1, "ep": 1, "pp": pp, "stages": stages, "params": {}, "inputs": {},
                               "outputs": {}}
            return True
        if tp == 1:
            self.notes = []
            return False
        plan = _Plan(graph, tp, ep > 1)
        for node in list(graph.nodes):
            plan.visit(node)
        plan.apply()
        reinfer(graph)
        whole = [p for p in graph.params.values()
                 if p.name not in plan.params and p.name not in plan.replicated and len(p.shape) >= 2]
        if whole:  # matrices every rank holds whole: correct, but not spread
            plan.notes.append(f"shard: {sum(p.numel for p in whole):,} parameters in {len(whole)} matrices stay whole "
                              f"on every rank (no tensor-parallel form for them yet), e.g. @{whole[0].name}")
        graph.meta[KEY] = {"tp": tp, "ep": ep, "params": plan.params, "inputs": plan.inputs, "outputs": plan.outputs}
        self.notes = plan.notes
        return True


class _Plan:
    def __init__(self, graph: Graph, tp: int, expert_parallel: bool = False):
        self.graph, self.tp, self.expert_parallel = graph, tp, expert_parallel
        self.params: dict = {}  # name -> cut
        self.inputs: dict = {}
        self.outputs: dict = {}
        self.attrs: list = []  # (node, attrs) to set
        self.after: list = []  # (node, collective op, attrs, bias to add after it)
        self.embeddings: list = []
        self.replicated: set = set()  # params every rank holds whole by design (routers, MLA's latent projections)
        self.edits: list = []  # graph -> None, run once the params are cut (a norm across ranks rewritten)
        self.notes: list = []
        self.seen: set = set()  # per-head steps re-aimed already

    def error(self, node: Node, detail: str) -> PassError:
        return PassError(f"shard: node %{node.name} ({node.op}): {detail}", location=node.origin)

    def divide(self, node: Node, size: int, what: str) -> int:
        if size % self.tp:
            raise self.error(node, f"{what} is {size}, which {self.tp} ranks do not divide")
        return size // self.tp

    def cut(self, node: Node, param, axis: int, block: int, rep: int = 1, segments: Optional[list] = None,
            **ways) -> None:
        """Cut ``param`` along ``axis``: rank r's ``block`` (shared by ``rep`` ranks); with
        ``segments``, the axis is blocks of these sizes and r takes its 1/N of each (or of
        ``ways``, with ``world``: ``irc.world.block``)."""
        if not isinstance(param, Param):
            raise self.error(node, "its weight is computed, not a param: the pass cuts params only")
        cut = {"axis": axis, "block": block, "rep": rep, **({"segments": list(segments)} if segments else {}), **ways}
        if self.params.get(param.name, cut) != cut:
            raise self.error(node, f"@{param.name} is read by two nodes that would cut it differently")
        self.params[param.name] = cut

    def state(self, past: Value, present: Value, axis: int, block: int, rep: int = 1, **segments) -> None:
        """A cache or state input and its present output cut alike (``irc.world``'s cut)."""
        self.inputs[past.name] = {"axis": axis, "block": block, "rep": rep, **segments}
        self.outputs[present.name] = dict(self.inputs[past.name])

    def conv(self, conv: Node, block: int, **segments) -> None:
        """A causal convolution's channels: its weight, bias, state and present, rank r's ``block``."""
        for param in conv.inputs[1:3]:  # the weight, and the bias where there is one
            if param is not None:
                self.cut(conv, param, 0, block, **segments)
        if len(conv.inputs) > 3 and conv.inputs[3] is not None:
            self.state(conv.inputs[3], conv.outputs[1], 1, block, **segments)

    def row_parallel(self, linear: Node, block: int) -> None:
        """``linear``'s input columns cut (rank r's ``block``), then ``all_reduce`` of the ranks'
        partial sums, its bias added once after it."""
        self.cut(linear, linear.inputs[1], 1, block)
        self.after.append((linear, "all_reduce", {"world": self.tp},
                           linear.inputs[2] if len(linear.inputs) > 2 else None))

    def visit(self, node: Node) -> None:
        if node.op in REFUSED:
            raise self.error(node, "the shard pass splits GQA attention, dense MLPs, the embedding and the head; "
                                   "this layer's weights have no tensor-parallel form in irc yet")
        if node.op == "attention":
            self.attention(node)
        elif node.op in ("swiglu", "geglu"):
            d_ff = node.inputs[1].shape[0]
            block = self.divide(node, d_ff, "the MLP's width (d_ff)")
            self.cut(node, node.inputs[1], 0, block)
            self.cut(node, node.inputs[2], 0, block)
            self.cut(node, node.inputs[3], 1, block)
            self.after.append((node, "all_reduce", {"world": self.tp}, None))
        elif node.op in ("mla_attention", "mla_latent_attention", "mla_absorbed_attention"):
            self.mla(node)
        elif node.op == "moe":
            self.moe(node)
        elif node.op == "gated_delta_rule":
            plan_delta(self, node)
        elif node.op == "ssd":
            plan_ssd(self, node)
        elif node.op == "causal_conv1d" and plan_short_conv(self, node):
            pass
        elif node.op == "gelu_mlp":
            ops_ = dict(zip(ops.get_op("gelu_mlp").operand_names(len(node.inputs)), node.inputs))
            block = self.divide(node, ops_["w_up"].shape[0], "the MLP's width (d_ff)")
            self.cut(node, ops_["w_up"], 0, block)
            if ops_.get("b_up") is not None:
                self.cut(node, ops_["b_up"], 0, block)
            self.cut(node, ops_["w_down"], 1, block)
            self.after.append((node, "all_reduce", {"world": self.tp}, ops_.get("b_down")))
        elif node.op == "linear" and id(node) not in self.seen and self.mlp_chain(node):
            pass
        elif node.op == "embedding":
            table = node.inputs[1]
            self.cut(node, table, 0, self.divide(node, table.shape[0], "the vocabulary (embedding rows)"))
            self.embeddings.append(node)
        elif node.op == "linear" and self.is_head(node):
            weight = node.inputs[1]
            self.cut(node, weight, 0, self.divide(node, weight.shape[0], "the vocabulary (head rows)"))
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                self.cut(node, node.inputs[2], 0, weight.shape[0] // self.tp)
            self.after.append((node, "all_gather", {"world": self.tp, "axis": -1}, None))

    def mlp_chain(self, up: Node) -> bool:
        """linear -> element-wise ops of one operand (relu², GELU; constants beside) -> linear,
        each read once (Nemotron-H's and Phi's MLPs, vision projectors): the first
        column-parallel, the second row-parallel, then ``all_reduce``. False where the pattern
        does not hold."""
        value, width = up.outputs[0], up.inputs[1].shape[0]
        while True:
            users = self.graph.users(value)
            if len(users) != 1 or value in self.graph.outputs:
                return False
            step = users[0]
            if step.op == "linear":
                break
            others = [v for v in step.inputs if v is not value]
            if step.op not in ELEMENTWISE or any(v is None or v.shape != () for v in others):
                return False
            value = step.outputs[0]
        down = step
        if not isinstance(up.inputs[1], Param) or not isinstance(down.inputs[1], Param) or down.inputs[0] is not value:
            return False
        if width % self.tp:  # left whole (and counted in the note)
            return False
        block = width // self.tp
        self.cut(up, up.inputs[1], 0, block)
        if len(up.inputs) > 2 and up.inputs[2] is not None:
            self.cut(up, up.inputs[2], 0, block)
        self.row_parallel(down, block)
        self.seen.add(id(down))
        return True

    def mla(self, node: Node) -> None:
        """MLA: the heads split, the latent projections (q_a, kv_a and their norms) replicated;
        the query rows and the output columns of the rank's heads (inside the op), then
        ``all_reduce``. As stored (``mla_attention``) the cache is per head and splits with
        them; the latent forms (``mla-absorb``) cache the latent every head reads, and every rank
        holds it whole (vLLM's choice too): their per-head weights are W^UK / W^UV
        (``mla_latent_attention``) or folded into the query and output weights
        (``mla_absorbed_attention``)."""
        a = node.attrs
        ops_ = dict(zip(ops.get_op(node.op).operand_names(len(node.inputs)), node.inputs))
        heads = self.divide(node, a["heads"], "the attention heads")
        nope, rope_dim, v_dim, rank = a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"], a["kv_lora_rank"]
        absorbed = node.op == "mla_absorbed_attention"
        self.replicated.update(ops_[name].name for name in ("q_a", "kv_a") if ops_.get(name) is not None)
        query = next(n for n in ("q_b", "wq", "q_b_absorbed", "wq_absorbed") if ops_.get(n) is not None)
        self.cut(node, ops_[query], 0, heads * ((rank if absorbed else nope) + rope_dim))
        wo = "wo_absorbed" if absorbed else "wo"
        self.cut(node, ops_[wo], 1, heads * (rank if absorbed else v_dim))
        if node.op == "mla_attention":
            self.cut(node, ops_["kv_b"], 0, heads * (nope + v_dim))
            for i, name in ((3, "past_key"), (4, "past_value")):
                if ops_.get(name) is not None:
                    self.state(ops_[name], node.outputs[i - 2], 1, heads)
        elif node.op == "mla_latent_attention":
            self.cut(node, ops_["w_uk"], 0, heads)
            self.cut(node, ops_["w_uv"], 0, heads)
        self.attrs.append((node, {"heads": heads}))
        self.after.append((node, "all_reduce", {"world": self.tp}, None))

    def moe(self, node: Node) -> None:
        """Every expert's width split (the router replicated): each rank's experts give a partial
        sum of every expert's output, as a dense MLP's do; the shared expert likewise."""
        a = node.attrs
        ops_ = dict(zip(ops.get_op("moe").operand_names(len(node.inputs)), node.inputs))
        if a["identity_experts"]:
            raise self.error(node, "a MoE with identity experts would add them on every rank: no tensor-parallel "
                                   "form yet")
        self.replicated.add(ops_["router"].name)
        if self.expert_parallel:  # whole experts, E / N a rank (irc.ops.moe's expert_shards)
            block = self.divide(node, a["experts"], "the experts")
            for name in ("w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"):
                if ops_.get(name) is not None:
                    self.cut(node, ops_[name], 0, block)
            self.attrs.append((node, {"expert_shards": self.tp}))
        else:
            block = self.divide(node, ops_["w_up"].shape[1], "the experts' width (moe_intermediate_size)")
            for name, axis in (("w_gate", 1), ("w_up", 1), ("w_down", 2), ("b_gate", 1), ("b_up", 1)):
                if ops_.get(name) is not None:
                    self.cut(node, ops_[name], axis, block)
            if ops_.get("b_down") is not None:  # GPT-OSS: added once, by rank 0 (zeros on the others)
                self.cut(node, ops_["b_down"], 0, a["experts"], self.tp, owner=0)
        if ops_.get("shared_up") is not None:
            shared = self.divide(node, ops_["shared_up"].shape[0], "the shared expert's width")
            for name, axis in (("shared_gate", 0), ("shared_up", 0), ("shared_down", 1)):
                if ops_.get(name) is not None:
                    self.cut(node, ops_[name], axis, shared)
        self.after.append((node, "all_reduce", {"world": self.tp}, None))

    def is_head(self, node: Node) -> bool:
        """The LM head: its output becomes ``logits`` through position-wise ops only."""
        value = node.outputs[0]
        while True:
            if value in self.graph.outputs:
                return value.name == "logits"
            users = self.graph.users(value)
            if len(users) != 1 or users[0].op not in ("softcap", "cast", "scale"):
                return False
            value = users[0].outputs[0]

    def attention(self, node: Node) -> None:
        a = node.attrs
        names = ops.get_op("attention").operand_names(len(node.inputs))
        operands = {n: v for n, v in zip(names, node.inputs) if v is not None}
        if "blocks" in operands:
            raise self.error(node, "attention with blocks has no tensor-parallel form in irc yet")
        heads = self.divide(node, a["heads"], "the query heads")
        for name in ("sinks", "alibi"):  # a value per query head: the rank's heads'
            if name in operands:
                self.per_head(node, operands[name], heads)
        kv, rep = self.kv_split(node, a["kv_heads"])
        head_dim, v_dim = a["head_dim"], a["v_head_dim"] or a["head_dim"]
        full = (a["heads"], a["kv_heads"], a["kv_heads"])
        for i, r, local, dim in ((0, 1, heads, head_dim), (1, rep, kv, head_dim), (2, rep, kv, v_dim)):
            linear = self.projection(node, node.inputs[i], full[i], local, dim)
            block = linear.inputs[1].shape[0] * local // full[i]  # rows grouped by head (q with its gate, too)
            self.cut(linear, linear.inputs[1], 0, block, r)
            if len(linear.inputs) > 2 and linear.inputs[2] is not None:
                self.cut(linear, linear.inputs[2], 0, block, r)
        for i in (4, 5):
            if len(node.inputs) > i and node.inputs[i] is not None:
                self.state(node.inputs[i], node.outputs[i - 3], 1, kv, rep)
        out = self.graph.users(node.outputs[0])
        if len(out) == 1 and out[0].op == "mul":  # an output gate (Qwen3-Next): its heads follow the query's
            gate = next(v for v in out[0].inputs if v is not node.outputs[0])
            self.gate(node, gate, a["heads"], heads, head_dim)
            out = self.graph.users(out[0].outputs[0])
        if len(out) != 1 or out[0].op != "linear":
            raise self.error(node, "its output is not read by one output projection (linear)")
        self.row_parallel(out[0], heads * v_dim)
        self.attrs.append((node, {"heads": heads, "kv_heads": kv}))

    def per_head(self, node: Node, value: Value, local: int) -> None:
        """Cut a [heads] operand (GPT-OSS's sinks, ALiBi's slopes) by heads; a constant becomes a
        param first, so that each rank can hold its block."""
        if value.producer is not None and value.producer.op == "constant":
            data = np.asarray(ops.get_op("constant").reference([], value.producer.attrs)[0], dtype=value.dtype.numpy)
            param = Param(f"{node.name}.{value.name.rsplit('.', 1)[-1]}", value.dtype, value.shape, data)
            self.graph.params[param.name] = param
            self.graph.replace_all_uses(value, param)
            if not self.graph.users(value):
                self.graph.remove(value.producer)
            value = param
        self.cut(node, value, 0, local)

    def gate(self, node: Node, value: Value, heads: int, local: int, dim: int) -> None:
        """The output gate's path back to the query's projection: its reshapes re-aimed."""
        while value.producer is not None and id(value.producer) not in self.seen:
            step = value.producer
            if step.op not in ("sigmoid", "reshape", "slice"):
                raise self.error(node, f"its output gate passes %{step.name} ({step.op}): no tensor-parallel form")
            self.reaim(node, step, heads, local, dim)
            value = step.inputs[0]

    def reaim(self, node: Node, step: Node, heads: int, local: int, dim: int) -> None:
        """A per-head op on the way to a projection: a reshape's head count or width the rank's
        share; a slice within heads kept; a per-head norm kept, one over all heads summed across
        ranks (``passes/shard_norm.py``), any other across heads refused."""
        self.seen.add(id(step))
        if step.op == "reshape":
            sizes = {heads: local, heads * dim: local * dim}
            self.attrs.append((step, {"shape": [sizes.get(d, d) if isinstance(d, int) else d
                                                for d in step.attrs["shape"]]}))
        elif step.op == "slice" and step.inputs[0].rank != 4:
            raise self.error(node, f"%{step.name} slices across heads: no tensor-parallel form")
        elif step.op == "rms_norm" and step.inputs[1] is not None and step.inputs[1].shape != (dim,):
            if step.inputs[1].shape != (heads * dim,):
                raise self.error(node, f"%{step.name} normalises across heads: no tensor-parallel form")
            # OLMo-2's q / k norm over all heads: the rank's heads' gains, the sum of squares all-reduced
            self.cut(step, step.inputs[1], 0, local * dim, self.tp * local // heads)
            self.edits.append(lambda graph: world_norm(graph, step, self.tp, self.tp * local * dim))

    def kv_split(self, node: Node, kv_heads: int) -> tuple[int, int]:
        """(KV heads per rank, ranks per KV head)."""
        if kv_heads % self.tp == 0:
            return kv_heads // self.tp, 1
        if self.tp % kv_heads == 0:
            self.notes.append(f"shard: %{node.name} has {kv_heads} KV heads for {self.tp} ranks: each KV head is "
                              f"replicated on {self.tp // kv_heads} ranks (its cache too)")
            return 1, self.tp // kv_heads
        raise self.error(node, f"{kv_heads} KV heads and {self.tp} ranks: neither divides the other")

    def projection(self, node: Node, value: Value, heads: int, local: int, dim: int) -> Node:
        """The linear making ``value`` (through ``THROUGH`` ops: RoPE, per-head norms and the
        reshapes around them, those re-aimed at the rank's ``local`` of ``heads`` heads), read
        by nothing else."""
        while value.producer is not None and value.producer.op in THROUGH:
            step = value.producer
            self.reaim(node, step, heads, local, dim)
            value = step.inputs[0]
        producer = value.producer
        if producer is None or producer.op != "linear" or len(self.graph.users(value)) != 1:
            what = "an input" if producer is None else f"%{producer.name} ({producer.op})"
            raise self.error(node, f"q, k and v must come from their own projections (linear, then RoPE); "
                                   f"one comes from {what}")
        return producer

    def apply(self) -> None:
        g = self.graph
        for name, cut in self.params.items():
            old = g.params[name]
            shape = list(old.shape)
            shape[cut["axis"]] = cut["block"]
            new = Param(name, old.dtype, tuple(shape), Shard(old.data, name, old.shape, old.dtype, cut))
            g.params[name] = new
            g.replace_all_uses(old, new)
        for value in g.inputs:
            if value.name in self.inputs:
                cut = self.inputs[value.name]
                shape = list(value.shape)
                shape[cut["axis"]] = cut["block"]
                value.shape = tuple(shape)
        for node, attrs in self.attrs:
            node.attrs = {**node.attrs, **attrs}
        for node in self.embeddings:
            self.vocab_parallel(node)
        if self.edits:
            reinfer(g)  # the edits emit nodes on the rank's shapes
        for edit in self.edits:
            edit(g)
        for node, op, attrs, bias in self.after:
            self.collective(node, op, attrs, bias)

    def vocab_parallel(self, node: Node) -> None:
        g = self.graph
        local = emit1(g, "vocab_embedding", node.inputs[:2], {"world": self.tp, "scale": node.attrs["scale"]},
                      f"{node.outputs[0].name}.local", before=node, origin=node.origin)
        joined = emit1(g, "all_reduce", [local], {"world": self.tp}, f"{node.outputs[0].name}.reduced", before=node,
                       origin=node.origin)
        name = node.outputs[0].name
        g.replace_all_uses(node.outputs[0], joined)
        g.remove(node)
        g.rename(joined, name)

    def collective(self, node: Node, op: str, attrs: dict, bias) -> None:
        g = self.graph
        out = node.outputs[0]
        users, outputs = list(out.uses), [v is out for v in g.outputs]
        if bias is not None:
            node.set_input(next(i for i, v in enumerate(node.inputs) if v is bias), None)
        after = g.nodes[g.nodes.index(node) + 1] if node is not g.nodes[-1] else None
        done = emit1(g, op, [out], attrs, f"{out.name}.{op}", before=after, origin=node.origin)
        if bias is not None:
            done = emit1(g, "add", [done, bias], None, f"{out.name}.biased", before=after, origin=node.origin)
        for user in users:
            for i, v in enumerate(user.inputs):
                if v is out:
                    user.set_input(i, done)
        g.outputs = [done if is_out else v for v, is_out in zip(g.outputs, outputs)]
        if any(outputs):  # the graph's output keeps its name
            name = out.name
            g.rename(out, f"{name}.local")
            g.rename(done, name)


def reinfer(graph: Graph) -> None:
    """Every node's output types again from its (cut) inputs and attributes, in order."""
    for node in graph.nodes:
        for value, t in zip(node.outputs, ops.infer(node.op, list(node.inputs), node.attrs)):
            value.dtype, value.shape = t.dtype, t.shape
