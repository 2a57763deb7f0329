"""SigLIP's attention-pooling head in the DSL (``Model.attention_pool``): one learned probe
attends over an image's tokens, then a LayerNorm and a residual MLP.

    pooled = m.attention_pool(h, heads=4, d_ff=48, eps=1e-6)           # [B, N, d] -> [B, d]
    pooled = m.attention_pool(h, 4, 48, 1e-6, mask=pixel_attention_mask)  # padding tokens unread

It is ``torch.nn.MultiheadAttention`` as SigLIP's and SigLIP 2's
``MultiheadAttentionPoolingHead`` call it: q from the probe, k and v from the tokens through the
packed in-projection (irc's params ``{name}.attention.w{q,k,v}`` [d, d] and ``b{q,k,v}`` are its
rows), softmax(q·kᵀ / sqrt(head_dim)) per head, ``out_proj``; then h + mlp(layer_norm(h))
(``{name}.layernorm``, ``{name}.mlp.fc1`` / ``fc2``, GELU tanh). With ``mask`` (i64 [B, N], 1
for a real token, 0 for padding: SigLIP 2's ``pixel_attention_mask``, torch's
``key_padding_mask``) a padding token's score gets -1e30 added, so its softmax weight is exactly
0, as with torch's -inf (given one real token in the row, which the processor always leaves).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import positive

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor

PADDING_SCORE = 1e30  # subtracted from a padding token's score: exp() of it is 0 in float32


def attention_pool(m: "Model", x: "Tensor", heads: int, d_ff: int, eps: float, name: str = "head",
                   mask: Optional["Tensor"] = None) -> "Tensor":
    """[B, N, d] -> [B, d]: the pooling head (the module docstring) built into ``m``."""
    d = m._features(x)
    positive("heads", heads, m.origin())
    if d % heads:
        raise m.error("heads", f"d_model {d} is not divisible by {heads} heads")
    head_dim, batch, tokens = d // heads, x.shape[0], x.shape[1]
    probe = m.emit("expand", [m._added_param(f"{name}.probe", (1, 1, d))], {"shape": [batch, 1, d]},
                   f"{name}_probe")[0]

    def project(t: "Tensor", which: str) -> "Tensor":
        w = m.param(f"{name}.attention.w{which}", (d, d))
        b = m.param(f"{name}.attention.b{which}", (d,))
        return m.emit("linear", [t, w, b], None, f"{name}_{which}")[0]

    def heads_first(t: "Tensor", length, which: str) -> "Tensor":
        split = m.emit("reshape", [t], {"shape": [batch, length, heads, head_dim]}, f"{name}_{which}_heads")[0]
        return m.emit("transpose", [split], {"perm": [0, 2, 1, 3]}, f"{name}_{which}_bhtd")[0]

    q = heads_first(project(probe, "q"), 1, "q")
    k = heads_first(project(x, "k"), tokens, "k")
    v = heads_first(project(x, "v"), tokens, "v")
    k_t = m.emit("transpose", [k], {"perm": [0, 1, 3, 2]}, f"{name}_k_t")[0]
    scores = m.scale(m.emit("matmul", [q, k_t], None, f"{name}_scores")[0], head_dim ** -0.5,
                     f"{name}_scores_scaled")
    if mask is not None:
        scores = m.add(scores, _padding_scores(m, mask, batch, tokens, name), f"{name}_scores_masked")
    weights = m.emit("softmax", [scores], {"axis": -1}, f"{name}_weights")[0]
    attended = m.emit("matmul", [weights, v], None, f"{name}_attended")[0]
    merged = m.emit("reshape", [m.emit("transpose", [attended], {"perm": [0, 2, 1, 3]}, f"{name}_attended_bthd")[0]],
                    {"shape": [batch, 1, d]}, f"{name}_merged")[0]
    out = m.emit("linear", [merged, m.param(f"{name}.attention.out_proj.weight", (d, d)),
                            m.param(f"{name}.attention.out_proj.bias", (d,))], None, f"{name}_attn_out")[0]
    normed = m.norm(out, f"{name}.layernorm", "layer", eps)
    up = m.emit("linear", [normed, m.param(f"{name}.mlp.fc1.weight", (d_ff, d)),
                           m.param(f"{name}.mlp.fc1.bias", (d_ff,))], None, f"{name}_mlp_up")[0]
    act = m.emit("gelu", [up], {"approximate": "tanh"}, f"{name}_mlp_act")[0]
    down = m.emit("linear", [act, m.param(f"{name}.mlp.fc2.weight", (d, d_ff)),
                             m.param(f"{name}.mlp.fc2.bias", (d,))], None, f"{name}_mlp_out")[0]
    return m.token(m.add(out, down, f"{name}_out"), 0, f"{name}_pooled")


def _padding_scores(m: "Model", mask: "Tensor", batch, tokens, name: str) -> "Tensor":
    """[B, 1, 1, N] f32: 0 for a real token (mask 1), -1e30 for padding (mask 0)."""
    if mask.shape != (batch, tokens) or mask.dtype.is_float:
        raise m.error("mask", f"expected an integer mask [{batch}, {tokens}], got {mask.dtype}{list(mask.shape)}")
    real = m.emit("cast", [mask], {"to": "f32"}, f"{name}_mask_f32")[0]
    one = m.emit("constant", [], {"value": 1.0}, f"{name}_one")[0]
    offset = m.scale(m.emit("sub", [real, one], None, f"{name}_mask_less_one")[0], PADDING_SCORE,
                     f"{name}_padding_scores")
    return m.emit("reshape", [offset], {"shape": [batch, 1, 1, tokens]}, f"{name}_padding_columns")[0]
