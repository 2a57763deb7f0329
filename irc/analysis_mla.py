"""The MLA absorption trade: one model's numbers under each form of its MLA layers, and which
form decodes faster on a device of a given bandwidth and compute (``irc show``, the report).

The three forms of one DeepSeek MLA layer (``irc.ops``): ``un-absorbed`` (``mla_attention``:
per-head K and V cached, H·(nope+rope+v) elements per token), ``runtime``
(``mla_latent_attention``, ``mla-absorb``'s default: the checkpoint's weights, W^UK and W^UV
applied per head at run time, d_c + rope cached) and ``folded``
(``mla_absorbed_attention``, ``mla-absorb{fold_weights=true}``: W^UK and W^UV folded into
the query and output weights, the same cache). Each form's FLOPs are its op's own cost rule
applied to the operand types that form would have; the rest of the model is as compiled.

Per decoded token (B = 1, T = 1, context S = P + 1): FLOPs as ``irc.analysis``; bytes read =
the weights one token touches (MoE: the active experts) + the whole cache of S tokens. On a
device of B bytes/s and F FLOP/s the roofline time is max(bytes / B, FLOPs / F) (batch 1;
a batch of b shares the weight bytes b ways, which favours the form with fewer FLOPs).
"""
from __future__ import annotations

from typing import Optional

from irc import ops
from irc.analysis import MLA_OPS, _param_fractions, analyze, cache_inputs, elements_per_token, node_cost
from irc.dtypes import DType
from irc.graph import Graph, Node, Param
from irc.ops.registry import TensorType
from irc.text import BINARY, DECIMAL, format_seconds, in_unit

FORMS = {"un-absorbed": "mla_attention", "runtime": "mla_latent_attention", "folded": "mla_absorbed_attention"}
CONTEXTS = (4096, 32768)
# (device, bytes/s, FLOP/s): nominal datasheet figures (dense bf16 for the GPUs), and this
# project's measured 2-core CPU (../shared/FACTS.md)
DEVICES = (("2-core CPU (measured: 24 GB/s, 196 GFLOP/s)", 24e9, 196e9),
           ("edge NPU (68 GB/s, 10 TOP/s)", 68e9, 10e12),
           ("Apple M2 Max GPU (400 GB/s, 13.6 TFLOP/s)", 400e9, 13.6e12),
           ("NVIDIA H100 SXM (3.35 TB/s, 989 TFLOP/s)", 3.35e12, 989e12))


def _form_operands(node: Node, form: str, context: int, weight: DType) -> tuple[list, list, list]:
    """(operand types, result types, weight operand types) of ``node`` redone as ``form`` for
    one decoded token at ``context``."""
    a = node.attrs
    named = dict(zip(ops.get_op(node.op).operand_names(len(node.inputs)), node.inputs))
    x = named["x"]
    d, d_out = x.shape[-1], (named.get("wo") or named.get("wo_absorbed")).shape[0]
    heads, rank, nope, rope, v = a["heads"], a["kv_lora_rank"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], \
        a["v_head_dim"]
    past = context - 1
    act, i64 = x.dtype, DType.i64
    if form == "un-absorbed":
        caches = [(1, heads, past, nope + rope), (1, heads, past, v)]
    else:
        caches = [(1, 1, past, rank), (1, 1, past, rope)]
    q_width = heads * ((rank if form == "folded" else nope) + rope)
    q_rank = a["q_lora_rank"]
    query = [(q_width, d), None, None, None] if q_rank is None else [None, (q_rank, d), (q_rank,), (q_width, q_rank)]
    tail = {"un-absorbed": [(heads * (nope + v), rank), (d_out, heads * v)],
            "runtime": [(heads, nope, rank), (heads, v, rank), (d_out, heads * v)],
            "folded": [(d_out, heads * rank)]}[form]
    weights = query + [(rank + rope, d), (rank,)] + tail
    weight_types = [None if s is None else TensorType(weight, s) for s in weights]
    positions = None if a["rope"] is None else TensorType(i64, (1, 1))  # NoPE MLA reads no positions
    inputs = [TensorType(act, (1, 1, d)), positions, TensorType(i64, (1, context))]
    inputs += [TensorType(act, c) for c in caches] + weight_types
    outputs = [TensorType(act, (1, 1, d_out))] + [TensorType(act, c[:2] + (context,) + c[3:]) for c in caches]
    return inputs, outputs, [t for t in weight_types if t is not None]


def _weight_dtype(graph: Graph, node: Node) -> DType:
    kv_a = node.inputs[9]
    return kv_a.dtype if isinstance(kv_a, Param) else DType.parse(graph.meta.get("dtype", "bf16"))


def mla_forms(graph: Graph, contexts=CONTEXTS, cache_dtype: Optional[DType] = None, devices=DEVICES) -> Optional[dict]:
    """Each MLA form's params, param bytes, FLOPs per token, KV bytes per token and bytes
    read per decoded token at each context, with the roofline pick per device and context;
    None for a graph without MLA."""
    nodes = [n for n in graph.nodes if n.op in MLA_OPS]
    if not nodes:
        return None
    summaries = {c: analyze(graph, c, cache_dtype) for c in contexts}
    cache_dtype = DType.parse(summaries[contexts[0]]["cache_dtype"])
    fractions = _param_fractions(graph)
    active_bytes = sum(round(p.nbytes * fractions.get(name, 1.0)) for name, p in graph.params.items())
    compiled_caches = [c for c in cache_inputs(graph) if any(u in nodes for u in c.uses)]
    compiled_kv = sum(cache_dtype.nbytes(elements_per_token(c)) for c in compiled_caches)
    mine = {p.name: p for n in nodes for p in n.inputs if isinstance(p, Param)}
    rest_params = summaries[contexts[0]]["params_total"] - sum(p.numel for p in mine.values())
    rest_bytes = summaries[contexts[0]]["param_bytes"] - sum(p.nbytes for p in mine.values())
    rest_active = active_bytes - sum(p.nbytes for p in mine.values())
    rest_kv = summaries[contexts[0]]["kv_cache_bytes_per_token"] - compiled_kv
    forms = []
    for form, op in FORMS.items():
        params = nbytes = kv = 0
        flops = {}
        for c in contexts:
            bindings = {"B": 1, "T": 1, "P": c - 1}
            flops[c] = summaries[c]["flops_per_token"] - sum(node_cost(n, bindings).flops for n in nodes)
        for node in nodes:
            weight = _weight_dtype(graph, node)
            for c in contexts:
                inputs, outputs, weights = _form_operands(node, form, c, weight)
                flops[c] += ops.get_op(op).cost(inputs, outputs, node.attrs).flops
            params += sum(t.numel for t in weights)
            nbytes += sum(t.nbytes for t in weights)
            kv += cache_dtype.nbytes(sum(elements_per_token_of(t) for t in outputs[1:]))
        forms.append({"form": form, "op": op, "params": rest_params + params, "param_bytes": rest_bytes + nbytes,
                      "flops_per_token": flops, "kv_bytes_per_token": rest_kv + kv,
                      "bytes_per_token": {c: rest_active + nbytes + (rest_kv + kv) * c for c in contexts}})
        forms[-1]["flops_per_byte"] = {c: flops[c] / forms[-1]["bytes_per_token"][c] for c in contexts}
    compiled = {n.op for n in nodes}
    return {"compiled": sorted(f for f, op in FORMS.items() if op in compiled), "contexts": list(contexts),
            "cache_dtype": str(cache_dtype), "forms": forms, "roofline": roofline(forms, contexts, devices)}


def elements_per_token_of(present: TensorType) -> int:
    """Elements one token takes in a present cache type [1, K, S, D]: K·D."""
    return present.shape[1] * present.shape[3]


def roofline(forms: list, contexts, devices=DEVICES) -> list:
    """Per device and context: each form's decode time max(bytes/B, FLOPs/F) and the fastest."""
    rows = []
    for device, bandwidth, compute in devices:
        for c in contexts:
            seconds = {f["form"]: max(f["bytes_per_token"][c] / bandwidth, f["flops_per_token"][c] / compute)
                       for f in forms}
            rows.append({"device": device, "bandwidth": bandwidth, "flops": compute, "context": c,
                         "seconds": seconds, "fastest": min(seconds, key=seconds.get)})
    return rows


def trade_lines(trade: dict) -> list[str]:
    """The trade as text: one table of the forms' numbers, one of the roofline picks."""
    contexts = trade["contexts"]
    header = ["form", "params", "param bytes"] + [f"FLOPs/tok @{c:,}" for c in contexts] + \
        [f"KV/tok ({trade['cache_dtype']})"] + [f"read/tok @{c:,}" for c in contexts] + \
        [f"FLOP/B @{c:,}" for c in contexts]
    rows = [[f["form"] + (" *" if f["form"] in trade["compiled"] else ""), f"{f['params']:,}",
             size(f["param_bytes"])] + [count(f["flops_per_token"][c]) for c in contexts]
            + [size(f["kv_bytes_per_token"])] + [size(f["bytes_per_token"][c]) for c in contexts]
            + [f"{f['flops_per_byte'][c]:.3g}" for c in contexts] for f in trade["forms"]]
    lines = ["MLA forms (* as compiled); read/tok = weights one token touches + the whole cache; a device",
             "whose FLOP/s per byte/s exceeds a form's FLOP/B decodes it bandwidth-bound:"]
    lines += _table(header, rows)
    names = [f["form"] for f in trade["forms"]]
    header = ["device", "context"] + [f"{n} /tok" for n in names] + ["fastest"]
    rows = [[r["device"], f"{r['context']:,}"] + [format_seconds(r["seconds"][n]) for n in names] + [r["fastest"]]
            for r in trade["roofline"]]
    lines += ["Decode roofline, batch 1: max(bytes / bandwidth, FLOPs / compute):"]
    return lines + _table(header, rows)


def count(n: int) -> str:
    """``110.2 G``: four significant digits with a decimal prefix."""
    scaled = in_unit(n, DECIMAL)
    return f"{scaled[0]:.4g} {scaled[1]}" if scaled else f"{n:,}"


def size(n: int) -> str:
    """``40.08 GiB``: four significant digits in the largest binary unit that fits."""
    scaled = in_unit(n, BINARY[1:])
    return f"{scaled[0]:.4g} {scaled[1]}" if scaled else f"{n:,} B"


def _table(header: list, rows: list) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    def line(cells):
        return "  " + "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header)] + [line(r) for r in rows]
