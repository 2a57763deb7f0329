"""BLIP-2's Q-Former in the DSL: a fixed set of learned query tokens that read an image's
patch states through cross-attention and come out as that many visual tokens (the seeds'
compression of 257 patches into 32 queries).

    spec = QFormerSpec(layers=2, width=32, heads=4, d_ff=64, queries=8)
    queries = build_qformer(m, patches, spec)      # [B, 8, 32] from patches [B, N, d_vision]

As transformers' ``Blip2QFormerModel`` runs it on the queries alone (no text input): the
``@{p}query_tokens`` [Q, w] (p = ``prefix``) LayerNormed (``{p}layernorm``), then per layer i,
BERT's post-LayerNorm blocks: x = LN(x + dense(self_attention(x))) (``{p}layers.{i}.attn.*``,
``attn_out``, ``attn_norm``); where i % ``cross_every`` == 0, x = LN(x + dense(cross_attention(x,
patches))) (``cross.*``: keys and values from the patch states, ``d_vision`` wide;
``cross_out``, ``cross_norm``); x = LN(x + down(GELU(up(x)))) (``mlp.w_up`` ... ``mlp_norm``:
the query branch, ``intermediate_query`` / ``output_query``). Attention is unmasked and
bidirectional, q/k/v and output with biases, scaled by head_dim^-0.5, written as primitives
(matmul, softmax) so every target lowers it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from frontends.dsl_args import positive

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


@dataclass
class QFormerSpec:
    """A Q-Former of ``layers`` BERT layers, ``width`` wide, ``heads``, an MLP ``d_ff``,
    ``queries`` learned tokens, cross-attention in every ``cross_every``-th layer, LayerNorm
    ``eps``, GELU ``approximate`` ("none": exact)."""
    layers: int
    width: int
    heads: int
    d_ff: int
    queries: int = 32
    cross_every: int = 2
    eps: float = 1e-12
    approximate: str = "none"


def build_qformer(m: "Model", patches: "Tensor", spec: QFormerSpec, prefix: str = "qformer.") -> "Tensor":
    """The Q-Former's output [B, queries, width] for ``patches`` [B, N, d_vision]."""
    for arg in ("layers", "width", "heads", "d_ff", "queries", "cross_every"):
        positive(arg, getattr(spec, arg), m.origin())
    if spec.width % spec.heads:
        raise m.error("heads", f"{spec.width} features do not split into {spec.heads} heads")
    batch, w = patches.value.shape[0], spec.width
    tokens = m.emit("reshape", [m.param(f"{prefix}query_tokens", (spec.queries, w))], {"shape": [1, spec.queries, w]},
                    f"{prefix}query_row")[0]
    x = m.emit("expand", [tokens], {"shape": [batch, spec.queries, w]}, f"{prefix}queries")[0]
    x = m.layer_norm(x, f"{prefix}layernorm", spec.eps)
    for i in range(spec.layers):
        p = f"{prefix}layers.{i}."
        x = _residual_norm(m, x, _attend(m, x, x, spec, f"{p}attn"), f"{p}attn_out", f"{p}attn_norm", spec.eps)
        if i % spec.cross_every == 0:
            x = _residual_norm(m, x, _attend(m, x, patches, spec, f"{p}cross"), f"{p}cross_out", f"{p}cross_norm",
                               spec.eps)
        up = _linear(m, x, f"{p}mlp.w_up", f"{p}mlp.b_up", spec.d_ff)
        h = m.emit("gelu", [up], {"approximate": spec.approximate}, f"{p}mlp_act")[0]
        x = _residual_norm(m, x, h, f"{p}mlp.w_down", f"{p}mlp_norm", spec.eps, bias=f"{p}mlp.b_down")
    vision = m.meta.get("vision")
    if vision is not None:
        vision["tokens"] = spec.queries  # what reaches the text model per image
    return x


def _linear(m: "Model", x: "Tensor", weight: str, bias: str, rows: int) -> "Tensor":
    cols = m._features(x)
    return m.emit("linear", [x, m.param(weight, (rows, cols)), m.param(bias, (rows,))], None,
                  weight.replace(".", "_"))[0]


def _residual_norm(m: "Model", x: "Tensor", h: "Tensor", dense: str, norm: str, eps: float,
                   bias: str = "") -> "Tensor":
    """LayerNorm(x + dense(h)): BERT's output block (``dense`` and ``dense.bias``, or ``bias``)."""
    out = _linear(m, h, dense, bias or f"{dense}.bias", m._features(x))
    return m.layer_norm(m.add(x, out, f"{norm}_in"), norm, eps)


def _attend(m: "Model", x: "Tensor", source: "Tensor", spec: QFormerSpec, name: str) -> "Tensor":
    """softmax(q k^T / sqrt(d_h)) v over all of ``source``'s tokens, per head: q from x,
    k and v from ``source`` (x itself for self-attention); [B, T, width]."""
    heads, w = spec.heads, spec.width
    head_dim = w // heads
    batch, length = x.value.shape[0], x.value.shape[1]

    def split(t: "Tensor", role: str) -> "Tensor":  # [B, S, w] -> [B, H, S, head_dim]
        projected = _linear(m, t, f"{name}.w{role}", f"{name}.b{role}", w)
        rows = m.emit("reshape", [projected], {"shape": [t.value.shape[0], t.value.shape[1], heads, head_dim]},
                      f"{name}_{role}_heads")[0]
        return m.emit("transpose", [rows], {"perm": [0, 2, 1, 3]}, f"{name}_{role}_by_head")[0]

    q, k, v = split(x, "q"), split(source, "k"), split(source, "v")
    keys = m.emit("transpose", [k], {"perm": [0, 1, 3, 2]}, f"{name}_k_t")[0]
    scores = m.emit("matmul", [q, keys], None, f"{name}_scores")[0]
    scale = m.emit("constant", [], {"value": head_dim ** -0.5}, f"{name}_scale")[0]
    weights = m.emit("softmax", [m.emit("mul", [scores, scale], None, f"{name}_scaled")[0]], {"axis": -1},
                     f"{name}_weights")[0]
    out = m.emit("matmul", [weights, v], None, f"{name}_values")[0]
    out = m.emit("transpose", [out], {"perm": [0, 2, 1, 3]}, f"{name}_by_token")[0]
    return m.emit("reshape", [out], {"shape": [batch, length, w]}, f"{name}_out_rows")[0]
