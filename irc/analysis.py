"""Model analysis: parameters, FLOPs per token and KV-cache size, read off the graph.

Everything is computed from the ops' own cost rules and the graph's cache inputs, so the
numbers stay exact after every pass (an absorbed MLA cache or a quantized cache shows up
as soon as the graph says so).

Accounting (``../shared/seeds`` §5): a matmul costs 2 FLOPs per weight per token, the LM
head is counted and the embedding lookup is not; attention adds 2·S·d for the scores and
2·S·d for the weighted sum per layer, S being the keys a query sees (the context, capped
by a sliding window). FLOPs per token are those of decoding one token at context S:
B = 1, T = 1, P = S - 1. Elementwise work is reported apart (``other_flops_per_token``).

A cache input is a graph input whose shape holds the past-length symbol ``P``; its
elements per token are the product of its other dims, batch excluded. A recurrent-state
input (``past_key_values.{i}.conv_state`` / ``.recurrent_state``) has no P: its elements
per sequence are the product of its dims but the batch, the same at every context, and
they are counted at the state's own dtype (f32 unless a pass changes it: the recurrence is
kept in full precision). A hybrid's memory per sequence at context S is its KV cache at S
plus its states (``memory_against_context``).
"""
from __future__ import annotations

import re
from typing import Optional

from irc import dims, ops
from irc.dtypes import DType
from irc.graph import Graph, Node, Param, Value
from irc.ops.registry import Cost, TensorType

# multi-head latent attention, before and after ``mla-absorb``
MLA_OPS = ("mla_attention", "mla_absorbed_attention", "mla_latent_attention")
# the layer kind each mixer op makes (``analyze``'s per-layer ``mixer``)
MIXERS = {"attention": "attention", **{op: "attention" for op in MLA_OPS}, "selective_scan": "mamba",
          "ssd": "mamba2", "gated_delta_rule": "gated_delta", "rwkv4_wkv": "rwkv4",
          "rg_lru": "rg_lru", "mlstm": "mlstm"}


def mixer_kind(node) -> str:
    """The layer kind a mixer node makes: ``MIXERS``, the linear attentions of
    ``gated_delta_rule`` told apart by its attributes (Kimi's per-channel decay, MiniMax's
    gated rule)."""
    if node.op == "gated_delta_rule":
        if node.attrs.get("update_rule") == "gated":
            return "lightning_attention"
        if node.attrs.get("decay") == "channel":
            return "kimi_delta"
    return MIXERS[node.op]
MEMORY_CONTEXTS = (128, 1024, 4096, 8192, 32768, 131072)
_LAYER = re.compile(r"(?:past_key_values|layers)\.(\d+)\.")


def layer_of(name: str) -> Optional[int]:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


def cache_inputs(graph: Graph) -> list[Value]:
    """Graph inputs that hold a past cache: those with the past-length symbol P in their
    shape (the attention mask, [B, P+T], is not one)."""
    return [v for v in graph.inputs
            if v.name != "attention_mask" and any("P" in dims.symbols(d) for d in v.shape)]


CROSS = "V"  # the image tokens a cross-attention layer has cached (frontends.dsl_cross)
EMPTY = {"P": 0, CROSS: 0}  # the bindings of empty caches: no past tokens, no cached image


def cross_caches(graph: Graph) -> list[Value]:
    """``past_key_values.*`` inputs that cache image keys for cross-attention [B, K, V, D]:
    they grow with the images a sequence holds, not with its tokens."""
    return [v for v in graph.inputs if v.name.startswith("past_key_values.")
            and any(CROSS in dims.symbols(d) for d in v.shape)]


def cross_bindings(graph: Graph) -> dict:
    """A cross-attention decoder's step as costs count it: one image cached (``V`` its tokens,
    ``graph.meta["cross_attention"]["image_tokens"]``), none brought (``I`` = 0); {} for others."""
    cross = graph.meta.get("cross_attention")
    return {} if not cross else {CROSS: cross.get("image_tokens") or 0, "I": 0}


def past_inputs(graph: Graph) -> list[Value]:
    """Every input a decode step feeds back from the step before (``past_key_values.*``,
    each returned as ``present.*``): the KV caches and the recurrent states."""
    return [v for v in graph.inputs if v.name.startswith("past_key_values.")]


def state_inputs(graph: Graph) -> list[Value]:
    """Recurrent-state inputs: ``past_key_values.*`` inputs without the past length P (a
    conv state [B, C, K-1], a scan state [B, H, N, P_head]): fixed size per sequence."""
    return [v for v in past_inputs(graph) if not any(dims.symbols(d) & {"P", CROSS} for d in v.shape)]


def elements_per_sequence(value: Value) -> int:
    """Elements one sequence's state takes in ``value`` (every dim but the batch)."""
    n = 1
    for d in value.shape[1:]:
        if not isinstance(d, int):
            raise ValueError(f"state %{value.name} has a symbolic dim {d!r} beyond the batch")
        n *= d
    return n


def elements_per_token(value: Value) -> int:
    """Elements one cached token takes in ``value`` (dims other than batch and past)."""
    n = 1
    for d in value.shape:
        if isinstance(d, int):
            n *= d
        elif d not in ("B", "P", CROSS):
            raise ValueError(f"cache %{value.name} has an unexpected symbolic dim {d!r}")
    return n


def _window(node: Optional[Node]) -> Optional[int]:
    return node.attrs.get("window") if node is not None else None


def _operands(node: Node):
    """(operand name, value) pairs of a node."""
    opdef = ops.get_op(node.op)
    return zip(opdef.operand_names(len(node.inputs)), node.inputs)


def _fraction(node: Node, operand: str) -> float:
    opdef = ops.get_op(node.op)
    return opdef.active_fraction(node.attrs, operand) if opdef.active_fraction else 1.0


def _param_fractions(graph: Graph) -> dict[str, float]:
    """For each param, the largest fraction of it one token touches. A param read through
    a weight view (dequantize) gets the fraction its view's readers touch."""
    fractions: dict[str, float] = {}
    for node in graph.nodes:
        view = ops.get_op(node.op).weight_view
        if view:
            out = node.outputs[0]
            f = max((_fraction(user, name) for user in graph.users(out)
                     for name, v in _operands(user) if v is out), default=1.0)
        for name, value in _operands(node):
            if isinstance(value, Param):
                share = f if view else _fraction(node, name)
                fractions[value.name] = max(fractions.get(value.name, 0.0), share)
    return fractions


def logical_elements(graph: Graph) -> dict[str, int]:
    """Weights each param stands for: its element count, or what its reader's
    ``logical_elements`` rule says (packed int4 codes stand for N*K weights, scales for 0)."""
    counts = {name: p.numel for name, p in graph.params.items()}
    for node in graph.nodes:
        rule = ops.get_op(node.op).logical_elements
        if rule is None:
            continue
        for name, value in _operands(node):
            if isinstance(value, Param):
                n = rule(node.attrs, name, value.shape)
                if n is not None:
                    counts[value.name] = n
    return counts


def node_cost(node: Node, bindings: dict) -> Cost:
    opdef = ops.get_op(node.op)
    window = _window(node)
    if window is not None and "P" in bindings:  # a local layer sees at most `window` keys
        bindings = {**bindings, "P": min(bindings["P"], window - bindings.get("T", 1))}
        bindings["P"] = max(bindings["P"], 0)

    def concrete(v):
        return None if v is None else TensorType(v.dtype, dims.evaluate_shape(v.shape, bindings))

    ins = [concrete(v) for v in node.inputs]
    outs = [concrete(v) for v in node.outputs]
    if opdef.cost is None:
        return Cost(bytes_read=sum(t.nbytes for t in ins if t), bytes_written=sum(t.nbytes for t in outs))
    return opdef.cost(ins, outs, node.attrs)


def graph_cost(graph: Graph, bindings: dict) -> Cost:
    """The graph's cost at ``bindings``; a VLM decoder's image rows (``I``) count 0 unless
    bound: the cost of a text token."""
    bindings = {"I": 0, **bindings}
    total = Cost()
    for node in graph.nodes:
        total = total + node_cost(node, bindings)
    return total


def _layer_table(graph: Graph, elements: dict) -> dict[int, dict]:
    """Per layer: its params, its block kinds (attention op and window, MLP, mixers) and
    zeroed cache and state counts for ``analyze`` to fill."""
    convs: set = set()
    layers: dict[int, dict] = {}
    for index in sorted({layer_of(n) for n in graph.params} - {None}):
        layers[index] = {"index": index, "params": 0, "kv_cache_elements_per_token": 0, "window": None,
                         "attention": None, "mlp": None, "mixer": None, "state_elements": 0}
    for name, n in elements.items():
        i = layer_of(name)
        if i is not None:
            layers[i]["params"] += n
            # the block kind, from checkpoint-style names that survive lowering and quantizing
            if name.startswith(f"layers.{i}.moe."):
                layers[i]["mlp"] = "moe"
            elif name.startswith(f"layers.{i}.mlp.") and layers[i]["mlp"] is None:
                layers[i]["mlp"] = "dense"
    for node in graph.nodes:
        i = layer_of(node.name)
        if i is None:
            i = next((layer_of(v.name) for v in node.inputs if isinstance(v, Param) and layer_of(v.name) is not None),
                     None)
        if i is None or i not in layers:
            continue
        if node.op in ("attention", *MLA_OPS):
            layers[i]["attention"] = node.op
            layers[i]["window"] = node.attrs.get("window")
        if node.op in MIXERS:
            kinds = [k for k in (layers[i]["mixer"] or "").split("+") if k] + [mixer_kind(node)]
            layers[i]["mixer"] = "+".join(dict.fromkeys(kinds))
        elif node.op == "causal_conv1d":
            convs.add(i)
    for i in convs:  # a convolution with no scan after it is the mixer itself (LFM2's short conv)
        if layers[i]["mixer"] is None:
            layers[i]["mixer"] = "conv"
    return layers


def _state_counts(graph: Graph, layers: dict) -> tuple[int, int, dict]:
    """(elements, bytes, elements by kind) of one sequence's recurrent states; adds each
    layer's share to ``layers``."""
    state_elements = state_bytes = 0
    states = {}
    for state in state_inputs(graph):
        n = elements_per_sequence(state)
        state_elements += n
        state_bytes += state.dtype.nbytes(n)
        kind = state.name.rsplit(".", 1)[-1]
        states[kind] = states.get(kind, 0) + n
        i = layer_of(state.name)
        if i is not None and i in layers:
            layers[i]["state_elements"] += n
    return state_elements, state_bytes, states


def analyze(graph: Graph, context: int = 4096, cache_dtype: Optional[DType] = None) -> dict:
    """The summary ``irc show`` prints. ``context``: keys seen by the decoded token."""
    if cache_dtype is None:
        cache_dtype = DType.parse(graph.meta.get("dtype", "bf16"))
    fractions = _param_fractions(graph)
    elements = logical_elements(graph)
    params_total = sum(elements.values())
    params_active = round(sum(n * fractions.get(name, 1.0) for name, n in elements.items()))
    vision = graph.meta.get("vision") or {}
    # an image encoder's symbols other than B (Qwen-VL's visual tokens I and images N) bind to
    # one image at its reference size (``vision["bindings"]``)
    cost = graph_cost(graph, {"B": 1, "T": 1, "P": context - 1, **vision.get("bindings", {}), **cross_bindings(graph)})

    layers = _layer_table(graph, elements)
    kv_elements = kv_bytes = kv_bytes_at_context = 0
    for cache in cache_inputs(graph):
        n = elements_per_token(cache)
        kv_elements += n
        # a quantized cache (int8 codes) is stored at its own width; float caches and their
        # scales at the cache dtype asked for
        dtype = cache_dtype if cache.dtype.is_float else cache.dtype
        kv_bytes += dtype.nbytes(n)
        i = layer_of(cache.name)
        if i is not None and i in layers:
            layers[i]["kv_cache_elements_per_token"] += n
        window = next((_window(u) for u in cache.uses if _window(u) is not None), None)
        kv_bytes_at_context += dtype.nbytes(n * (min(context, window) if window else context))
    per_layer = sorted({v["kv_cache_elements_per_token"] for v in layers.values() if v["kv_cache_elements_per_token"]})
    state_elements, state_bytes, states = _state_counts(graph, layers)
    summary = {
        "name": graph.name,
        "params_total": params_total,
        "params_active": params_active,
        "param_bytes": sum(p.nbytes for p in graph.params.values()),
        "context": context,
        "flops_per_token": cost.flops,
        "other_flops_per_token": cost.other_flops,
        "cache_dtype": str(cache_dtype),
        "kv_cache_elements_per_token": kv_elements,
        "kv_cache_elements_per_token_per_layer": per_layer[-1] if per_layer else 0,
        "kv_cache_bytes_per_token": kv_bytes,
        "kv_cache_bytes_at_context": kv_bytes_at_context,
        "kv_cache_bytes_mha_equivalent_per_token": cache_dtype.nbytes(_mha_elements(graph)),
        "kv_cache_bytes_mha_equivalent_at_context": cache_dtype.nbytes(_mha_elements(graph, context)),
        "state_elements_per_sequence": state_elements,
        "state_elements_by_kind": states,
        "state_bytes_per_sequence": state_bytes,
        "memory_bytes_per_sequence_at_context": kv_bytes_at_context + state_bytes,
        "n_layers": len(layers),
        "nodes": len(graph.nodes),
        "layers": list(layers.values()),
    }
    if vision:  # an image encoder (frontends.dsl_vision): its graph has no T, so cost is per image
        summary["vision"] = {**vision, "flops_per_image": cost.flops, "other_flops_per_image": cost.other_flops}
    latent = _mla_latent_elements(graph)
    if latent:
        summary["kv_cache_latent_elements_per_token_per_layer"] = latent
        mla_layers = sum(1 for n in graph.nodes if n.op in MLA_OPS)
        summary["kv_cache_latent_bytes_per_token"] = cache_dtype.nbytes(latent * mla_layers)
    return summary


def memory_against_context(graph: Graph, contexts=MEMORY_CONTEXTS, cache_dtype: Optional[DType] = None) -> list:
    """Per-sequence memory at each context: rows of ``context``, ``kv_cache_bytes`` (grows,
    capped by windows), ``state_bytes`` (flat) and ``total_bytes``."""
    rows = []
    for context in contexts:
        s = analyze(graph, context=context, cache_dtype=cache_dtype)
        rows.append({"context": context, "kv_cache_bytes": s["kv_cache_bytes_at_context"],
                     "state_bytes": s["state_bytes_per_sequence"],
                     "total_bytes": s["memory_bytes_per_sequence_at_context"]})
    return rows


def _mha_elements(graph: Graph, context: int = 1) -> int:
    """Cache elements for ``context`` tokens if every attention layer kept one K and one V
    per query head (MHA-shaped), windows kept. For MLA this is 2·H·d_h with d_h =
    v_head_dim, the DeepSeek-V2 paper's comparison. A layer reading another layer's cache
    inputs (KV sharing: Gemma-3n) adds none, as it stores none."""
    total = 0
    past = {v.name for v in past_inputs(graph)}
    seen = set()
    for node in graph.nodes:
        a = node.attrs
        if node.op == "attention":
            per_token = a["heads"] * (a["head_dim"] + (a["v_head_dim"] or a["head_dim"]))
        elif node.op in MLA_OPS:
            per_token = 2 * a["heads"] * a["v_head_dim"]
        else:
            continue
        caches = tuple(v.name for v in node.inputs if v is not None and v.name in past)
        if caches and caches in seen:
            continue
        seen.add(caches)
        window = a.get("window")
        total += per_token * (min(context, window) if window else context)
    return total


def _mla_latent_elements(graph: Graph) -> int:
    """d_c + d_rope: what an absorbed MLA layer caches per token."""
    for node in graph.nodes:
        if node.op in MLA_OPS:
            return node.attrs["kv_lora_rank"] + node.attrs["qk_rope_head_dim"]
    return 0


def stats_line(graph: Graph, context: int = 4096) -> dict:
    """The per-pass stats the pass manager writes into dumps."""
    s = analyze(graph, context)
    return {k: s[k] for k in ("nodes", "params_total", "param_bytes", "flops_per_token",
                              "kv_cache_bytes_per_token", "context")}


VISUAL_PROMPTS = (20, 128, 1024, 4096)


def visual_token_costs(vision: dict, text: Graph, cache_dtype: Optional[DType] = None,
                       prompts=VISUAL_PROMPTS, tokens: Optional[int] = None) -> dict:
    """What an image costs a text model that prepends its tokens (LLaVA's bridge): the image
    encoder's ``patches`` (the projectors pass the patch tokens on; LLaVA drops the class
    token) each take the text model's KV bytes per token at every layer. Rows against prompt
    length (the image's share of the cache), and the tokens and bytes left by r x r pixel
    shuffle or pooling of the patch grid (Idefics3/SmolVLM's shuffle, Qwen's 2x2 merger,
    Gemma 3's pooling), for each r that divides the grid. ``tokens``: the image's tokens as the
    VLM's own projector gives them (its vision model's ``image_features`` rows), where known.
    A decoder that reads the image by cross-attention (``bridge`` "cross-attention",
    Llama-3.2-Vision's) caches its tokens' keys in its cross layers only: ``kv_bytes_per_token``
    is then those layers' bytes per image token, and the image's share is of the bytes."""
    summary = analyze(text, cache_dtype=cache_dtype)
    per_token = summary["kv_cache_bytes_per_token"]
    cross = cross_caches(text)  # a cross-attention decoder keeps the image's keys in its cross layers alone
    dtype = DType.parse(summary["cache_dtype"])
    image_per_token = sum(dtype.nbytes(elements_per_token(v)) for v in cross) if cross else per_token
    tokens = vision["patches"] if tokens is None else tokens
    height, width = vision["image_size"]
    rows, columns = height // vision["patch"], width // vision["patch"]
    image = tokens * image_per_token
    return {
        "text_model": text.name, "kv_bytes_per_token": image_per_token, "image_tokens": tokens,
        "bridge": "cross-attention" if cross else "prepended", "cross_layers": len(cross) // 2,
        "image_kv_bytes": image,
        "against_prompt": [{"prompt_tokens": p, "prompt_kv_bytes": p * per_token,
                            "image_share": round(image / (image + p * per_token), 4)} for p in prompts],
        "compression": [{"merge": f"{r}x{r}", "tokens": (rows // r) * (columns // r),
                         "kv_bytes": (rows // r) * (columns // r) * image_per_token}
                        for r in (2, 3, 4) if rows % r == 0 and columns % r == 0],
    }
