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

from irc.analysis import (MEMORY_CONTEXTS, MLA_OPS, analyze, cache_inputs, elements_per_sequence, elements_per_token,
                          layer_of, memory_against_context, state_inputs)
from irc.dtypes import DType
from irc.graph import Graph, Node

CONTEXTS = tuple(2 ** k for k in range(9, 18))       # 512 ... 131,072 keys
ATTENTION_OPS = ("attention", *MLA_OPS)
# a layer kind (the graph's ``meta["layer_kinds"]``, else ``analyze``'s per-layer mixer; a
# parallel hybrid joins two with "+") -> (words, the CSS category its pictures use)
KINDS = {"attention": ("attention", "attn"), "mamba": ("Mamba selective scan", "scan"),
         "mamba2": ("Mamba-2 SSD", "scan"), "gated_delta": ("gated DeltaNet", "delta"),
         "kimi_delta": ("Kimi delta attention", "delta"), "lightning_attention": ("lightning attention", "delta"),
         "short_conv": ("short conv", "conv"), "conv": ("short conv", "conv"), "none": ("MLP only", "mlp")}


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
    kinds: dict = field(default_factory=dict)        # layer index -> kind (see layer_kinds)
    memory: list = field(default_factory=list)       # memory_against_context(final) at memory_contexts
    memory_table: list = field(default_factory=list)  # the same at MEMORY_CONTEXTS (``irc show``'s rows)
    state_bytes: dict = field(default_factory=dict)  # layer index -> state bytes per sequence (final graph)

    @property
    def recurrent(self) -> bool:
        """True when some layer keeps a recurrent state (a state-space or hybrid model)."""
        return self.compiled["state_elements_per_sequence"] > 0


def glance(source: Graph, final: Graph, context: int = 4096, contexts: tuple = CONTEXTS) -> Glance:
    summary = analyze(source, context)
    compiled = analyze(final, context) if final is not source else summary
    contexts = tuple(sorted(set(contexts) | {context}))
    kinds = layer_kinds(source, summary)
    result = Glance(summary, compiled, layer_groups(source, summary, kinds), param_breakdown(final), contexts)
    result.kinds = kinds
    result.kv = kv_curves(source, final, contexts)
    result.flops = flop_curves(source, summary, contexts)
    if compiled["state_elements_per_sequence"]:
        result.memory = memory_against_context(final, memory_contexts(compiled))
        result.memory_table = memory_against_context(final, MEMORY_CONTEXTS)
        result.state_bytes = state_bytes_by_layer(final)
    return result


# ---- layer kinds -------------------------------------------------------------------------

def layer_kinds(graph: Graph, summary: dict) -> dict[int, str]:
    """Per layer index, its kind: the frontend's ``meta["layer_kinds"]`` where it names every
    layer (a dump keeps the meta), else the mixer ``analyze`` read off the ops ("none" for
    a layer without one)."""
    meta = graph.meta.get("layer_kinds")
    indices = [layer["index"] for layer in summary["layers"]]
    if isinstance(meta, list) and len(meta) == len(indices) and all(isinstance(k, str) for k in meta):
        return dict(zip(indices, meta))
    return {layer["index"]: layer["mixer"] or "none" for layer in summary["layers"]}


def kind_words(kind: str) -> str:
    """``mamba2+attention`` -> ``Mamba-2 SSD + attention``; an unknown kind as it is."""
    return " + ".join(KINDS.get(part, (part, ""))[0] for part in kind.split("+"))


def kind_category(kind: str) -> str:
    """The CSS category of a kind's first mixer (``scan``, ``delta``, ``conv``, ``attn``, ``mlp``)."""
    return KINDS.get(kind.split("+")[0], ("", "op"))[1]


def is_attention(kind: str) -> bool:
    return "attention" in kind.split("+")


def memory_contexts(summary: dict, points: int = 8) -> tuple:
    """Contexts for the linear memory chart: ``points`` even steps up to a power of two at
    least four times the crossover (where the KV cache outgrows the state), 1,024 to 131,072."""
    per_token = summary["kv_cache_bytes_per_token"]
    cross = -(-summary["state_bytes_per_sequence"] // per_token) if per_token else 1024
    top = 1024
    while top < 4 * cross and top < 131072:
        top *= 2
    return tuple(top // points * k for k in range(1, points + 1))


def state_bytes_by_layer(graph: Graph) -> dict[int, int]:
    """Bytes of recurrent state one sequence holds per layer, each state at its own dtype
    (the per-layer split of ``analyze``'s ``state_bytes_per_sequence``)."""
    out: dict[int, int] = {}
    for state in state_inputs(graph):
        i = layer_of(state.name)
        if i is not None:
            out[i] = out.get(i, 0) + state.dtype.nbytes(elements_per_sequence(state))
    return out


# ---- layers ----------------------------------------------------------------------------

def _layer_ops(graph: Graph) -> dict[int, list]:
    """Per layer, its ops with attributes: what a layer is, names aside."""
    ops: dict[int, list] = {}
    for node in graph.nodes:
        i = layer_of(node.name)
        if i is not None:
            ops.setdefault(i, []).append((node.op, repr(sorted(node.attrs.items()))))
    return ops


def layer_groups(graph: Graph, summary: dict, kinds: Optional[dict] = None) -> list[LayerGroup]:
    """Layers alike (same kind, ops, attributes, parameter count, cache and state) grouped, in
    order of their first layer, each described in words. A layer whose kind is not
    attention-only is described by its mixer and its state per sequence."""
    kinds = kinds if kinds is not None else layer_kinds(graph, summary)
    structure = _layer_ops(graph)
    groups: dict[tuple, list] = {}
    facts: dict[tuple, dict] = {}
    for layer in summary["layers"]:
        i = layer["index"]
        key = (kinds.get(i), layer["attention"], layer["window"], layer["mlp"], layer["params"],
               layer["kv_cache_elements_per_token"], layer["state_elements"], tuple(structure.get(i, ())))
        groups.setdefault(key, []).append(i)
        facts.setdefault(key, layer)
    return [LayerGroup(layers, _describe(facts[key], key[0])) for key, layers in groups.items()]


def _describe(layer: dict, kind: Optional[str]) -> str:
    recurrent = kind is not None and kind != "attention" and kind != "none"
    parts = []
    if recurrent:
        parts.append(f"{kind_words(kind)} mixer")
    if layer["attention"]:
        parts.append(layer["attention"])
        parts.append(f"window {layer['window']:,}" if layer["window"] else "full attention")
    elif not recurrent:
        parts.append("no attention op")
    parts.append({"moe": "mixture-of-experts MLP", "dense": "dense MLP"}.get(layer["mlp"], "no MLP op"))
    parts.append(f"{layer['params']:,} parameters")
    if layer["kv_cache_elements_per_token"]:
        parts.append(f"{layer['kv_cache_elements_per_token']:,} cached elements per token")
    if layer["state_elements"]:
        parts.append(f"{layer['state_elements']:,} state elements per sequence")
    return ", ".join(parts)


# ---- parameters ------------------------------------------------------------------------

_COMPONENTS = (   # (component, pattern over the name with the layer prefix removed)
    ("embedding", r"(embed|embed_tokens|wte)(\.|$)"),
    ("LM head", r"lm_head(\.|$)"),
    ("MoE router", r"moe\.(router|gate)"),
    ("MoE shared experts", r"moe\.shared"),
    ("MoE routed experts", r"moe\."),
    ("norms", r"([a-z_]*norm)(\.|$)"),
    ("recurrent mixers", r"(ssm|mamba|linear_attn)\."),
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
    mixers = [layer["mixer"] for layer in summary["layers"] if layer["mixer"]]
    if any(not is_attention(m) for m in mixers):  # a hybrid: only attention layers grow with S
        layers = sum(1 for m in mixers if is_attention(m))
    d = graph.meta.get("d_model", 0)
    train_attention = [6 * layers * s * d for s in contexts]
    train = [6 * n + a for a in train_attention]
    return {
        "forward": flops, "forward_fixed": fixed, "forward_attention": forward_attention,
        "forward_share": [a / f if f else 0.0 for a, f in zip(forward_attention, flops)],
        "train": train, "train_fixed": 6 * n, "train_attention": train_attention,
        "train_share": [a / t if t else 0.0 for a, t in zip(train_attention, train)],
        "n": n, "layers": layers, "all_layers": summary["n_layers"], "d": d,
    }


def share_at(curves: dict, contexts: tuple, context: int, key: str) -> Optional[float]:
    return curves[key][contexts.index(context)] if context in contexts else None
