"""The model at a glance: the numbers behind the report's model section.

Architecture facts (layers, heads, which layers differ) come from the input graph, where
the model-level ops still carry their attributes; "as compiled" figures come from the
final graph. Every number is ``irc.analysis``'s, so the report and ``irc show`` agree.

Two FLOP accountings are shown side by side and never mixed:

- irc's forward accounting (``irc.analysis``): decoding one token at context S costs 2 FLOPs
  per matmul weight (LM head counted, embedding lookup not) plus 2·S·d for the scores and
  2·S·d for the weighted sum per layer, S capped by a sliding window.
- the seed's training accounting (``shared/seeds`` §5, after Kaplan et al.): 6N per token
  for the N parameters (active parameters for a mixture of experts) plus 6·L·S·d for
  attention, without causal halving or windows. For Llama-3-8B attention is about 6% of it
  at 4,096 tokens and 68% at 131,072.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from irc.analysis import MLA_OPS, analyze, cache_inputs, elements_per_token, layer_of
from irc.dtypes import DType
from irc.graph import Graph, Node

CONTEXTS = tuple(2 ** k for k in range(9, 18))       # 512 ... 131,072 keys
ATTENTION_OPS = ("attention", *MLA_OPS)


@dataclass
class LayerGroup:
    layers: list
    description: str


@dataclass
class Glance:
    summary: dict                                    # analyze(input graph) at the report's context
    compiled: dict                                   # analyze(final graph)
    groups: list                                     # LayerGroup, the first holds layer 0
    params: list                                     # (component, params, bytes)
    contexts: tuple
    kv: list = field(default_factory=list)           # (label, [bytes per context], dashed)
    flops: dict = field(default_factory=dict)        # see flop_curves


def glance(source: Graph, final: Graph, context: int = 4096, contexts: tuple = CONTEXTS) -> Glance:
    summary = analyze(source, context)
    compiled = analyze(final, context) if final is not source else summary
    contexts = tuple(sorted(set(contexts) | {context}))
    result = Glance(summary, compiled, layer_groups(source, summary), param_breakdown(final), contexts)
    result.kv = kv_curves(source, final, contexts)
    result.flops = flop_curves(source, summary, contexts)
    return result


# ---- layers ----------------------------------------------------------------------------

def _layer_ops(graph: Graph) -> dict[int, list]:
    """Per layer, its ops with attributes: what a layer is, names aside."""
    ops: dict[int, list] = {}
    for node in graph.nodes:
        i = layer_of(node.name)
        if i is not None:
            ops.setdefault(i, []).append((node.op, repr(sorted(node.attrs.items()))))
    return ops


def layer_groups(graph: Graph, summary: dict) -> list[LayerGroup]:
    """Layers alike (same ops, attributes, parameter count and cache) grouped, in order of
    their first layer, each described in words."""
    structure = _layer_ops(graph)
    groups: dict[tuple, list] = {}
    facts: dict[tuple, dict] = {}
    for layer in summary["layers"]:
        i = layer["index"]
        key = (layer["attention"], layer["window"], layer["mlp"], layer["params"],
               layer["kv_cache_elements_per_token"], tuple(structure.get(i, ())))
        groups.setdefault(key, []).append(i)
        facts.setdefault(key, layer)
    out = []
    for key, layers in groups.items():
        layer = facts[key]
        parts = [layer["attention"] or "no attention op"]
        parts.append(f"window {layer['window']:,}" if layer["window"] else "full attention")
        parts.append({"moe": "mixture-of-experts MLP", "dense": "dense MLP"}.get(layer["mlp"], "no MLP op"))
        parts.append(f"{layer['params']:,} parameters")
        if layer["kv_cache_elements_per_token"]:
            parts.append(f"{layer['kv_cache_elements_per_token']:,} cached elements per token")
        out.append(LayerGroup(layers, ", ".join(parts)))
    return out


# ---- parameters ------------------------------------------------------------------------

_COMPONENTS = (   # (component, pattern over the name with the layer prefix removed)
    ("embedding", r"(embed|embed_tokens|wte)(\.|$)"),
    ("LM head", r"lm_head(\.|$)"),
    ("MoE router", r"moe\.(router|gate)"),
    ("MoE shared experts", r"moe\.shared"),
    ("MoE routed experts", r"moe\."),
    ("norms", r"([a-z_]*norm)(\.|$)"),
    ("attention", r"(attn|attention|self_attn)\."),
    ("MLP", r"(mlp|ffn|feed_forward)\."),
)


def component_of(name: str) -> str:
    local = name.split(".", 2)[2] if layer_of(name) is not None and name.count(".") >= 2 else name
    for component, pattern in _COMPONENTS:
        if re.match(pattern, local):
            return component
    return "other"


def param_breakdown(graph: Graph) -> list[tuple]:
    """(component, parameters, bytes), largest first; a quantized weight's scales count
    with the weight they scale."""
    totals: dict[str, list] = {}
    for p in graph.params.values():
        entry = totals.setdefault(component_of(p.name), [0, 0])
        entry[0] += p.numel
        entry[1] += p.nbytes
    return sorted(((c, n, b) for c, (n, b) in totals.items()), key=lambda row: (-row[1], row[0]))


# ---- KV cache --------------------------------------------------------------------------

def _attention_nodes(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op in ATTENTION_OPS]


def kv_curves(source: Graph, final: Graph, contexts: tuple) -> list[tuple]:
    """KV-cache bytes against context: as compiled, and the MHA / GQA / MLA / int8-cache
    alternatives for the same layers (windows kept), in the model's dtype."""
    dtype = DType.parse(source.meta.get("dtype", "bf16"))
    curves = [("as compiled (" + str(dtype) + ")",
               [analyze(final, s)["kv_cache_bytes_at_context"] for s in contexts], False)]
    attn = _attention_nodes(source)
    if not attn:
        return curves

    def per_layer(elements_of) -> list[int]:
        out = []
        for s in contexts:
            total = 0
            for node in attn:
                window = node.attrs.get("window")
                total += elements_of(node) * (min(s, window) if window else s)
            out.append(dtype.nbytes(total))
        return out

    def head_dim(node):
        a = node.attrs
        return a["v_head_dim"] if node.op in MLA_OPS else a["head_dim"]

    def value_dim(node):
        a = node.attrs
        return a["v_head_dim"] if node.op in MLA_OPS else (a["v_head_dim"] or a["head_dim"])

    first = attn[0].attrs
    heads = first["heads"]
    kv_heads = first.get("kv_heads", heads) if attn[0].op == "attention" else heads
    curves.append((f"MHA, {heads} KV heads",
                   per_layer(lambda n: n.attrs["heads"] * (head_dim(n) + value_dim(n))), True))
    groups = kv_heads if 1 <= kv_heads < heads else max(1, heads // 8)
    own = " (this model)" if groups == kv_heads and kv_heads < heads else ""
    curves.append((f"GQA, {groups} KV heads{own}",
                   per_layer(lambda n: groups * (head_dim(n) + value_dim(n))), not own))
    if attn[0].op in MLA_OPS:
        latent = first["kv_lora_rank"] + first["qk_rope_head_dim"]
        curves.append((f"MLA latent d_c+d_rope = {latent} (this model, absorbed)", per_layer(lambda n: latent), False))
    else:
        d_h = first["head_dim"]
        curves.append((f"MLA-style latent {4 * d_h}+{d_h // 2} (DeepSeek-V2 proportions)",
                       per_layer(lambda n: 4 * n.attrs["head_dim"] + n.attrs["head_dim"] // 2), True))
    curves.append(("int8 cache of the compiled layout (+f32 scale per row)", _int8_bytes(final, contexts), True))
    return curves


def _int8_bytes(graph: Graph, contexts: tuple) -> list[int]:
    """The compiled caches as int8 codes plus one f32 scale per row (``quantize{kv_cache=true}``)."""
    out = []
    caches = [c for c in cache_inputs(graph) if not c.name.endswith("_scale")]
    for s in contexts:
        total = 0
        for cache in caches:
            n = elements_per_token(cache)
            rows = n // int(cache.shape[-1]) if isinstance(cache.shape[-1], int) and cache.shape[-1] else n
            window = next((u.attrs.get("window") for u in cache.uses if u.attrs.get("window")), None)
            keys = min(s, window) if window else s
            total += (n + 4 * rows) * keys
        out.append(total)
    return out


# ---- FLOPs -----------------------------------------------------------------------------

def flop_curves(graph: Graph, summary: dict, contexts: tuple) -> dict:
    """FLOPs per token against context, both accountings, with the attention share.

    irc forward: ``analyze``'s FLOPs per token; its context-free part (matmul weights) is
    2·f(1) − f(2), exact because the attention terms grow linearly in the keys below any
    window. Seed training: 6N + 6·L·S·d with N the active parameters."""
    flops = [analyze(graph, s)["flops_per_token"] for s in contexts]
    fixed = 2 * analyze(graph, 1)["flops_per_token"] - analyze(graph, 2)["flops_per_token"]
    forward_attention = [f - fixed for f in flops]
    n = summary["params_active"]
    layers = graph.meta.get("n_layers", summary["n_layers"])
    d = graph.meta.get("d_model", 0)
    train_attention = [6 * layers * s * d for s in contexts]
    train = [6 * n + a for a in train_attention]
    return {
        "forward": flops, "forward_fixed": fixed, "forward_attention": forward_attention,
        "forward_share": [a / f if f else 0.0 for a, f in zip(forward_attention, flops)],
        "train": train, "train_fixed": 6 * n, "train_attention": train_attention,
        "train_share": [a / t if t else 0.0 for a, t in zip(train_attention, train)],
        "n": n, "layers": layers, "d": d,
    }


def share_at(curves: dict, contexts: tuple, context: int, key: str) -> Optional[float]:
    return curves[key][contexts.index(context)] if context in contexts else None
