"""DSL pieces for layers that are more than one mixer: Falcon-H1's attention ‖ Mamba-2 pair
with µP multipliers (its Mamba-2 is ``Layer.mamba2`` with ``in_scale``), and Zamba2's shared
transformer block (one set of weights used at
several layers, with per-use low-rank adapters). Functions over a ``frontends.dsl.Layer``;
each builds from the ops of the registry (``linear``, ``mul``, ``constant``, ``expand``,
``concat``, ``silu``, ``gelu``, ``attention``, ``causal_conv1d``, ``ssd``, ...).

    a = shared_attention(layer, h, weights, heads=4, kv_heads=4, head_dim=16, scale=...,
                         adapters={"q": (a, b), ...})                  # Zamba2's block

A multiplier is a ``mul`` by a ``constant`` in the graph (left out when it is 1), never a
change to a weight. Shared weights are ``Param`` objects made once (``Model.param``) and
read by every use; ``scope`` nests a layer's own weights as its checkpoint does.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Optional, Sequence

from frontends.dsl_args import one_of, positive, positive_float
from frontends.dsl_rope import emit_rope

if TYPE_CHECKING:
    from frontends.dsl import Layer, Model, Tensor
    from frontends.dsl_rope import Rope
    from irc.graph import Param

GATES = ("silu", "gelu", "gelu_tanh")


@contextmanager
def scope(layer: "Layer", name: str):
    """Weights and values made inside are ``layers.{i}.{name}.*`` (a sub-module of the
    layer, as the checkpoint nests it); states and caches stay the layer's."""
    saved = layer.prefix
    layer.prefix = f"{saved}{name}."
    try:
        yield layer
    finally:
        layer.prefix = saved


def scaled(m: "Model", x: "Tensor", factor: Optional[float], name: str) -> "Tensor":
    """``m.scale(x, factor)``: a ``mul`` by a scalar ``constant``; x itself when factor is None or 1."""
    return x if factor is None or factor == 1.0 else m.scale(x, factor, name)


def norm_with(m: "Model", x: "Tensor", weight: "Param", eps: float, name: str) -> "Tensor":
    """RMS norm of x by an existing weight (a shared block's norm)."""
    return m.emit("rms_norm", [x, weight], {"eps": float(eps), "offset": 0.0}, name)[0]


def low_rank(m: "Model", x: "Tensor", down: "Param", up: "Param", name: str) -> "Tensor":
    """up(down(x)): a LoRA-style adapter (two linears, no bias)."""
    inner = m.emit("linear", [x, down, None], None, f"{name}_low")[0]
    return m.emit("linear", [inner, up, None], None, name)[0]


def _activation(m: "Model", x: "Tensor", gate: str, name: str) -> "Tensor":
    if gate == "silu":
        return m.emit("silu", [x], None, name)[0]
    return m.emit("gelu", [x], {"approximate": "tanh" if gate == "gelu_tanh" else "none"}, name)[0]


def glu(layer: "Layer", gate_in: "Tensor", up_in: "Tensor", w_down: "Param", b_down=None, gate: str = "silu",
        gate_scale: Optional[float] = None, out_scale: Optional[float] = None) -> "Tensor":
    """down(act(gate_in [* gate_scale]) * up_in) [* out_scale]: a gated MLP after its gate and
    up projections, written out where the fused ops cannot say it (Falcon-H1's
    ``mlp_multipliers``, Zamba2's adapter added to gate|up)."""
    m, p = layer.model, layer.prefix
    one_of("gate", gate, GATES, m.origin())
    g = _activation(m, scaled(m, gate_in, gate_scale, f"{p}mlp_gate_scaled"), gate, f"{p}mlp_act")
    y = m.emit("mul", [g, up_in], None, f"{p}mlp_hidden")[0]
    y = m.emit("linear", [y, w_down, b_down], None, f"{p}mlp_out")[0]
    layer._note_mlp("swiglu" if gate == "silu" else "geglu", gate_in.shape[-1])
    return scaled(m, y, out_scale, f"{p}mlp_scaled")


def shared_attention(layer: "Layer", x: "Tensor", weights: dict, heads: int, kv_heads: int, head_dim: int,
                     rope: Optional["Rope"] = None, scale: Optional[float] = None,
                     adapters: Optional[dict] = None) -> "Tensor":
    """Attention over the layer's own KV cache (``past_key_values.{i}.key/.value``) with
    projections ``weights["wq" | "wk" | "wv" | "wo"]`` made elsewhere (a block shared by
    several layers); ``adapters["q" | "k" | "v"] = (down, up)`` adds up(down(x)) to that
    projection before RoPE (Zamba2's per-use adapters)."""
    m, p, i = layer.model, layer.prefix, layer.index
    where = m.origin()
    for arg, value in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        positive(arg, value, where)
    if heads % kv_heads:
        raise m.error("kv_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    layer._check_rope(rope, head_dim, "head_dim")
    scale = positive_float("scale", scale, where)
    projected = {}
    for which in "qkv":
        t = m.emit("linear", [x, weights[f"w{which}"], None], None, f"{p}{which}")[0]
        if adapters and which in adapters:
            down, up = adapters[which]
            t = m.emit("add", [t, low_rank(m, x, down, up, f"{p}{which}_adapter")], None, f"{p}{which}_adapted")[0]
        projected[which] = t
    q, k, v = projected["q"], projected["k"], projected["v"]
    mask, positions = m._context()
    if rope is not None:
        q = emit_rope(m, q, positions, rope, heads, head_dim, f"{p}q_rope")
        k = emit_rope(m, k, positions, rope, kv_heads, head_dim, f"{p}k_rope")
    past_key, past_value = m._past(i, kv_heads, head_dim, head_dim)
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": None, "causal": True,
             "window": None, "softcap": None, "scale": scale}
    out, present_key, present_value = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs,
                                             [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present_key.value, present_value.value]
    kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    layer._note_attention(kind, heads, kv_heads, head_dim, head_dim, None, None, scale, rope)
    return m.emit("linear", [out, weights["wo"], None], None, f"{p}attn_out")[0]


__all__ = ["scope", "scaled", "norm_with", "low_rank", "glu", "shared_attention"]
