"""The DSL pieces Gemma-3n (``frontends.dsl_gemma3n``) and Gemma-4 (``frontends.dsl_gemma4``)
share, written once; each follows transformers 5.24 (``modeling_gemma3n`` / ``modeling_gemma4``,
which compute these steps alike) in float32:

- ``plain_rms_norm``: x · rsqrt(mean(x²) + eps) over the last axis, no weight, as primitives;
- ``per_layer_inputs``: the per-layer embeddings (PLE) every layer reads a slice of,
  [B, T, L, P] = (rms_norm(x @ W_proj.T · d^-0.5) + embed_per_layer(ids') · sqrt(P)) · 2^-0.5,
  with ``@embed_per_layer`` [V_ple, L·P], ``@per_layer_projection`` [L·P, d] and
  ``@per_layer_projection_norm`` [P]; ids' is the ids where V_ple covers the vocabulary, else
  the ids with those at or past V_ple replaced by 0 (Gemma-3n's rule; Gemma-4's tables cover
  its vocabulary);
- ``KVSharing`` and ``attention``: the one KV-sharing mechanism. ``attention`` projects q (and,
  for a layer that computes its own, k and v), RMS-norms q and k per head with weights [D]
  (``attn.q_norm`` / ``attn.k_norm``) and v per head without a weight, applies RoPE to q and k,
  and runs the ``attention`` op at scale 1 with the layer's window. A layer whose
  ``KVSharing`` source is another layer j makes only its query and attends over layer j's new
  keys and values and layer j's past cache inputs: it has no k/v weights, no
  ``past_key_values.{i}.*`` input and no ``present.{i}.*`` output (the op's present outputs
  are layer j's present again, left unused). So the graph's cache inputs are exactly the
  layers that store one: what ``irc.analysis`` counts as the KV cache and what
  ``backends.onnx.genai`` counts as ``num_hidden_layers``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_rope import Rope, emit_rope

if TYPE_CHECKING:
    from frontends.dsl import Layer, Model, Tensor


def plain_rms_norm(m: Model, x: Tensor, name: str, eps: float) -> Tensor:
    """x · rsqrt(mean(x², last axis) + eps): an RMS norm without weight (transformers'
    ``with_scale=False``: both Gemmas' v norm, Gemma-4's router norm); output ``{name}_out``."""
    square = m.emit("mul", [x, x], None, f"{name}_square")[0]
    mean = m.emit("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{name}_mean")[0]
    shifted = m.emit("add", [mean, m.emit("constant", [], {"value": float(eps)}, f"{name}_eps")[0]], None,
                     f"{name}_mean_eps")[0]
    inverse = m.emit("rsqrt", [shifted], None, f"{name}_inv_rms")[0]
    return m.emit("mul", [x, inverse], None, f"{name}_out")[0]


def _ids_inside(m: Model, ids: Tensor, rows: int) -> Tensor:
    """The ids with those at or past ``rows`` replaced by 0 (ids are non-negative), in integer
    arithmetic every target lowers: a = max(rows - id, 0) is >= 1 exactly inside, and
    a - max(a - 1, 0) is min(a, 1), the 0/1 factor."""
    def constant(value: int, name: str) -> Tensor:
        return m.emit("constant", [], {"value": value, "dtype": "i64"}, name)[0]

    one, zero = constant(1, "per_layer_one"), constant(0, "per_layer_zero")
    room = m.emit("sub", [constant(rows, "per_layer_vocab"), ids], None, "per_layer_room")[0]
    room = m.emit("maximum", [room, zero], None, "per_layer_room_clipped")[0]
    beyond = m.emit("maximum", [m.emit("sub", [room, one], None, "per_layer_room_less_one")[0], zero], None,
                    "per_layer_room_beyond_one")[0]
    inside = m.emit("sub", [room, beyond], None, "per_layer_ids_inside")[0]
    return m.emit("mul", [ids, inside], None, "per_layer_ids")[0]


def per_layer_inputs(m: Model, ids: Tensor, x: Tensor, n_layers: int, width: int, vocab: int,
                     eps: float) -> Tensor:
    """The PLE tensor [B, T, L, P] (module docstring); ``x`` is the scaled token embedding,
    ``vocab`` the rows of ``@embed_per_layer``."""
    batch, seq = ids.shape
    d = m._features(x)
    looked_up = _ids_inside(m, ids, vocab) if vocab < m.vocab else ids
    table = m.param("embed_per_layer", (vocab, n_layers * width))
    tokens = m.emit("embedding", [looked_up, table], {"scale": float(width) ** 0.5}, "per_layer_tokens")[0]
    if tokens.dtype != x.dtype:
        tokens = m.emit("cast", [tokens], {"to": str(x.dtype)}, "per_layer_tokens_f32")[0]
    projection = m.param("per_layer_projection", (n_layers * width, d))
    projected = m.emit("linear", [x, projection], None, "per_layer_projected")[0]
    projected = m.scale(projected, d ** -0.5, "per_layer_projected_scaled")
    shape = [batch, seq, n_layers, width]
    projected = m.emit("reshape", [projected], {"shape": shape}, "per_layer_projected_split")[0]
    normed = m.norm(projected, "per_layer_projection_norm", "rms", eps)
    tokens = m.emit("reshape", [tokens], {"shape": shape}, "per_layer_tokens_split")[0]
    return m.scale(m.add(normed, tokens, "per_layer_sum"), 2.0 ** -0.5, "per_layer_inputs")


class KVSharing:
    """Per layer the earlier layer whose keys and values it attends over (None: its own), and
    the (k, v, past key, past value) of each layer that computed them, filled as ``attention``
    builds the layers in order. A source must be a layer built before, computing its own K/V;
    otherwise ``shared`` raises a ``num_kv_shared_layers`` error at the model's origin."""

    def __init__(self, sources: list):
        self.sources = list(sources)
        self._computed: dict = {}

    def source(self, layer: int) -> Optional[int]:
        return self.sources[layer]

    def record(self, layer: int, kv: tuple) -> None:
        self._computed[layer] = kv

    def shared(self, m: Model, layer: int) -> tuple:
        """The (k, v, past key, past value) layer ``layer`` reuses."""
        source = self.sources[layer]
        if source not in self._computed:
            raise m.error("num_kv_shared_layers", f"layer {layer} reuses the K/V of layer {source}, which computes "
                                                  "none")
        return self._computed[source]


def _heads(m: Model, t: Tensor, heads: int, head_dim: int, name: str) -> Tensor:
    return m.emit("reshape", [t], {"shape": list(t.shape[:-1]) + [heads, head_dim]}, name)[0]


def _flat(m: Model, t: Tensor, name: str) -> Tensor:
    return m.emit("reshape", [t], {"shape": list(t.shape[:-2]) + [t.shape[-2] * t.shape[-1]]}, name)[0]


def attention(layer: Layer, x: Tensor, heads: int, kv_heads: int, head_dim: int, rope: Rope,
              window: Optional[int], eps: float, sharing: KVSharing, k_eq_v: bool = False) -> Tensor:
    """The Gemma attention of the module docstring, output [B, T, d]: weights ``attn.wq``,
    ``attn.wk``, ``attn.wv`` (none with ``k_eq_v``: the values are the key projection, taken
    before its norm and RoPE), ``attn.q_norm``, ``attn.k_norm``, ``attn.wo``; a layer with a
    ``sharing`` source has only ``attn.wq``, ``attn.q_norm`` and ``attn.wo``."""
    m, p, i = layer.model, layer.prefix, layer.index
    d = m._features(x)
    layer._check_rope(rope, head_dim, "head_dim")
    q = m.emit("linear", [x, m.param(f"{p}attn.wq", (heads * head_dim, d))], None, f"{p}q")[0]
    q = layer._head_norm(q, "q", heads, head_dim, eps, 0.0)
    mask, positions = m._context()
    q = emit_rope(m, q, positions, rope, heads, head_dim, f"{p}q_rope")
    if sharing.source(i) is None:
        kv_dim = kv_heads * head_dim
        k = m.emit("linear", [x, m.param(f"{p}attn.wk", (kv_dim, d))], None, f"{p}k")[0]
        v = k if k_eq_v else m.emit("linear", [x, m.param(f"{p}attn.wv", (kv_dim, d))], None, f"{p}v")[0]
        k = emit_rope(m, layer._head_norm(k, "k", kv_heads, head_dim, eps, 0.0), positions, rope, kv_heads,
                      head_dim, f"{p}k_rope")
        v = _flat(m, plain_rms_norm(m, _heads(m, v, kv_heads, head_dim, f"{p}v_heads"), f"{p}v_norm", eps),
                  f"{p}v_normed")
        past_key, past_value = m._past(i, kv_heads, head_dim, head_dim)
        sharing.record(i, (k, v, past_key, past_value))
        names = [f"{p}attn", f"present.{i}.key", f"present.{i}.value"]
    else:
        k, v, past_key, past_value = sharing.shared(m, i)
        names = [f"{p}attn", f"{p}shared_key", f"{p}shared_value"]  # the source's present again
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": None, "causal": True,
             "window": window, "softcap": None, "scale": 1.0}
    out, present_key, present_value = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs, names)
    if sharing.source(i) is None:
        m._presents += [present_key.value, present_value.value]
    kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    layer._note_attention(kind, heads, kv_heads, head_dim, head_dim, window, None, 1.0, rope, qkv_bias=False,
                          qk_norm=True)
    return m.emit("linear", [out, m.param(f"{p}attn.wo", (d, heads * head_dim))], None, f"{p}attn_out")[0]
