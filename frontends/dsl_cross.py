"""Gated cross-attention to image states (the seeds' Flamingo form, Llama-3.2-Vision's
``MllamaCrossAttentionDecoderLayer``), written as primitives every target lowers.

    image = cross_inputs(m, width=4096)   # after m.input_ids()
    x = cross_block(m, layer, x, image, heads=32, kv_heads=8, head_dim=128, eps=1e-5, d_ff=14336)

Inputs ``cross_inputs`` declares:

- ``image_features`` f32 [B, I, d]: the projected image states a step brings to each
  sequence (the vision model's output: its images' tiles' tokens in order; I = 0 on a step
  without a new image).
- ``cross_attention_mask`` i64 [B, T, V+I]: may text token t see cached image token j (the
  processor's [B, T, images, tiles] with each tile repeated over its tokens, as
  ``_prepare_cross_attention_mask`` repeats it; ``irc_cli.images_mllama``).

The image KV cache: each cross layer's ``past_key_values.{i}.key`` / ``.value`` [B, K, V, D]
(``V``, ``irc.analysis.CROSS``: the image tokens cached) is returned as ``present.{i}.*`` with
the step's new keys appended, so an image's keys are projected once, on the step that brings
it, and later steps read the cache (transformers' cross-attention cache). Per layer:

    q = q_norm(x·Wq) per head;  k = k_norm(features·Wk), v = features·Wv  (appended to the cache)
    visible[t, j] = mask[t, j]; a row that sees no key sees every key
    a = softmax(q k^T / sqrt(D) - inf·(1 - visible)) v · Wo          (GQA: head h reads kv head h / (H/K))
    x = x + tanh(attn_gate) · a
    x = x + tanh(mlp_gate) · row · mlp(mlp_norm(x))    row = 1 where the token sees some key

As transformers computes it: a row with nothing visible attends uniformly to the cache
(``_prepare_cross_attention_mask`` zeroes its mask row) and only its MLP is masked out; with no
image cached at all (V = 0) the layer adds nothing, as transformers skips it. ``-inf`` is
float32's lowest value, as transformers adds ``torch.finfo.min``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from frontends.dsl_args import positive
from irc import dims
from irc.analysis import CROSS
from irc.dtypes import DType
from irc.ops.vision import CROSS_MASK as MASK, FEATURES
from frontends.dsl_vision import IMAGE_ROWS

if TYPE_CHECKING:
    from frontends.dsl import Layer, Model, Tensor

LOWEST = float(np.finfo(np.float32).min)


@dataclass
class CrossInputs:
    """What every cross layer reads: the step's image states [B, I, d], the additive bias of
    each cached key (f32 [B, 1, 1, T, V+I]) and the rows that see some key (f32 [B, T, 1])."""
    states: "Tensor"
    bias: "Tensor"
    row: "Tensor"


KEYS = dims.add(CROSS, IMAGE_ROWS)  # the image keys a cross layer attends over: its cache and the step's


def cross_inputs(m: "Model", width: int) -> CrossInputs:
    """Declare ``image_features`` [B, N, ``width``] and ``cross_attention_mask`` [B, T, V+I]
    (the module docstring) and compute what the cross layers share."""
    from frontends.dsl import ACTIVATION, Tensor
    if m.encoder or m._ids is None:
        raise m.error("x", "cross-attention reads a decoder's tokens: call m.input_ids() first")
    if any(v.name == FEATURES for v in m._graph.inputs):
        raise m.error("x", "the image features are already an input")
    positive("width", width, m.origin())
    g = m._graph
    states = Tensor(m, g.add_input(FEATURES, ACTIVATION, ("B", IMAGE_ROWS, width)))
    mask = Tensor(m, g.add_input(MASK, DType.i64, ("B", "T", KEYS)))
    m.meta["cross_attention"] = {"image_tokens": None}  # per image, where known (irc.analysis.cross_bindings)
    allowed = m.emit("cast", [mask], {"to": "f32"}, "cross_visible")[0]
    seen = m.emit("reduce_sum", [allowed], {"axes": [-1], "keepdims": True}, "cross_row_count")[0]
    zero = m.emit("constant", [], {"value": 0.0}, "cross_zero")[0]
    sees = m.emit("less", [zero, seen], None, "cross_row_sees")[0]
    one = m.emit("constant", [], {"value": 1.0}, "cross_one")[0]
    visible = m.emit("where", [sees, allowed, one], None, "cross_visible_or_all")[0]
    lowest = m.emit("constant", [], {"value": -LOWEST}, "cross_lowest")[0]
    bias = m.emit("mul", [m.emit("sub", [visible, one], None, "cross_hidden")[0], lowest], None, "cross_bias")[0]
    bias = m.emit("reshape", [bias], {"shape": ["B", 1, 1, "T", KEYS]}, "cross_bias_heads")[0]
    row = m.emit("cast", [sees], {"to": "f32"}, "cross_row")[0]
    return CrossInputs(states, bias, row)


def cross_attention(m: "Model", layer: "Layer", x: "Tensor", image: CrossInputs, heads: int, kv_heads: int,
                    head_dim: int, eps: float) -> "Tensor":
    """The layer's cross-attention output [B, T, d] (before its gate), its image KV cache
    appended to (``cross.wq/wk/wv/wo``, ``cross.q_norm`` / ``k_norm`` [D])."""
    p, i = layer.prefix, layer.index
    d = m._features(x)
    if heads % kv_heads:
        raise m.error("kv_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    group = heads // kv_heads

    def project(t: "Tensor", which: str, rows: int, norm: bool) -> "Tensor":
        w = m.param(f"{p}cross.w{which}", (rows * head_dim, m._features(t)))
        out = m.emit("linear", [t, w, None], None, f"{p}cross_{which}")[0]
        length = "T" if which == "q" else IMAGE_ROWS
        out = m.emit("reshape", [out], {"shape": ["B", length, rows, head_dim]}, f"{p}cross_{which}_heads")[0]
        if norm:
            out = m.emit("rms_norm", [out, m.param(f"{p}cross.{which}_norm", (head_dim,))], {"eps": eps, "offset": 0.0},
                         f"{p}cross_{which}_normed")[0]
        return m.emit("transpose", [out], {"perm": [0, 2, 1, 3]}, f"{p}cross_{which}_by_head")[0]

    q = project(x, "q", heads, True)  # [B, H, T, D]
    caches = []
    for past, (which, norm, kind) in zip(m._past(i, kv_heads, head_dim, head_dim, length=CROSS),
                                         (("k", True, "key"), ("v", False, "value"))):
        new = project(image.states, which, kv_heads, norm)  # [B, K, I, D]
        caches.append(m.emit("concat", [past, new], {"axis": 2}, f"present.{i}.{kind}")[0])
    m._presents += [present.value for present in caches]
    keys, values = caches
    rows = dims.mul(group, "T")
    q = m.emit("reshape", [q], {"shape": ["B", kv_heads, rows, head_dim]}, f"{p}cross_q_rows")[0]  # [B, K, G·T, D]
    keys_t = m.emit("transpose", [keys], {"perm": [0, 1, 3, 2]}, f"{p}cross_k_t")[0]
    scores = m.emit("matmul", [q, keys_t], None, f"{p}cross_scores")[0]
    scale = m.emit("constant", [], {"value": head_dim ** -0.5}, f"{p}cross_scale")[0]
    scores = m.emit("mul", [scores, scale], None, f"{p}cross_scaled")[0]
    scores = m.emit("reshape", [scores], {"shape": ["B", kv_heads, group, "T", KEYS]}, f"{p}cross_scores_rows")[0]
    scores = m.emit("add", [scores, image.bias], None, f"{p}cross_masked")[0]
    weights = m.emit("softmax", [scores], {"axis": -1}, f"{p}cross_weights")[0]
    weights = m.emit("reshape", [weights], {"shape": ["B", kv_heads, rows, KEYS]}, f"{p}cross_weight_rows")[0]
    out = m.emit("matmul", [weights, values], None, f"{p}cross_values")[0]  # [B, K, G·T, D]
    out = m.emit("reshape", [out], {"shape": ["B", heads, "T", head_dim]}, f"{p}cross_by_head")[0]
    out = m.emit("transpose", [out], {"perm": [0, 2, 1, 3]}, f"{p}cross_by_token")[0]
    out = m.emit("reshape", [out], {"shape": ["B", "T", heads * head_dim]}, f"{p}cross_rows")[0]
    wo = m.param(f"{p}cross.wo", (d, heads * head_dim))
    return m.emit("linear", [out, wo, None], None, f"{p}cross_out")[0]


def gate_tanh(m: "Model", gate: str) -> "Tensor":
    """tanh(``@{gate}``), a learned scalar [1] in float32 (``Model._added_param``): the
    Flamingo gates, the tower's too (``frontends.dsl_mllama``)."""
    return m.emit("tanh", [m._added_param(gate, (1,))], None, f"{gate}_tanh")[0]


def gate(m: "Model", layer: "Layer", branch: "Tensor", name: str) -> "Tensor":
    """tanh(``@{name}``) · branch, the gate a learned scalar [1]."""
    return m.emit("mul", [branch, gate_tanh(m, f"{layer.prefix}{name}")], None,
                  f"{layer.prefix}{name.replace('.', '_')}_gated")[0]


def cross_block(m: "Model", layer: "Layer", x: "Tensor", image: CrossInputs, heads: int, kv_heads: int,
                head_dim: int, eps: float, d_ff: int) -> "Tensor":
    """One gated cross-attention decoder layer (the module docstring): ``attn_norm``,
    cross-attention, ``cross.attn_gate``; ``mlp_norm``, SwiGLU (``mlp.*``), the row mask,
    ``cross.mlp_gate``."""
    a = cross_attention(m, layer, layer.rms_norm(x, "attn_norm", eps), image, heads, kv_heads, head_dim, eps)
    x = x + gate(m, layer, a, "cross.attn_gate")
    f = layer.swiglu(layer.rms_norm(x, "mlp_norm", eps), d_ff=d_ff)
    f = m.emit("mul", [f, image.row], None, f"{layer.prefix}cross_mlp_rows")[0]
    return x + gate(m, layer, f, "cross.mlp_gate")


__all__ = ["MASK", "CrossInputs", "cross_inputs", "cross_attention", "cross_block"]
