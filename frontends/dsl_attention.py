"""The DSL's attention layers (part of ``frontends.dsl.Layer``): multi-head attention with its
variants (GQA/MQA, biases, per-head or full-width q/k norms, the output gate, RoPE or none,
windows, soft-caps) and DeepSeek's multi-head latent attention."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from frontends.dsl_args import positive, positive_float
from frontends.dsl_delta import gated_output, query_and_gate
from frontends.dsl_rope import Rope, emit_rope

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor

AFTER_ROPE = "head_after_rope"  # "head" norms applied after RoPE (Hunyuan's)
QK_NORMS = (False, True, "head", "full", "layer", "plain", AFTER_ROPE)  # True is "head"


def llama4_query_scale(m: Model, beta: float, original: int, positions: int, shift: int = 0) -> Optional[Tensor]:
    """[B, T, 1] float32: 1 + beta·log(1 + floor((position + shift) / original)), Llama-4's
    (shift 1: its attention temperature on NoPE layers) and Ministral-3's query scale, made
    once a graph as a sum of steps — each threshold j·original − shift (j < (positions +
    shift) / original) a position has reached adds beta·log((j + 1) / j) — from ops every
    target has (cast, less_equal, mul, reduce_sum); None where no position reaches a step."""
    key = ("llama4_query_scale", float(beta), int(original), int(positions), int(shift))
    if key in m._rope_tables:
        return m._rope_tables[key]
    steps = range(1, max(1, -(-(positions + shift) // original)))
    if not steps:  # no position reaches the first threshold: the scale is 1
        return None
    _, position_ids = m._context()
    as_float = m.emit("cast", [position_ids], {"to": "f32"}, "query_scale_positions")[0]
    column = m.emit("reshape", [as_float], {"shape": list(position_ids.shape) + [1]}, "query_scale_column")[0]
    thresholds = m.emit("constant", [], {"value": [float(j * original - shift) for j in steps]},
                        "query_scale_thresholds")[0]
    reached = m.emit("cast", [m.emit("less_equal", [thresholds, column], None, "query_scale_reached")[0]],
                     {"to": "f32"}, "query_scale_steps")[0]
    increments = m.emit("constant", [], {"value": [beta * math.log((j + 1) / j) for j in steps]},
                        "query_scale_increments")[0]
    total = m.emit("reduce_sum", [m.emit("mul", [reached, increments], None, "query_scale_terms")[0]],
                   {"axes": [-1], "keepdims": True}, "query_scale_sum")[0]
    scale = m.emit("add", [total, m.emit("constant", [], {"value": 1.0}, "query_scale_one")[0]], None,
                   "query_scale")[0]
    m._rope_tables[key] = scale
    return scale


class AttentionLayer:
    """Mixin: needs the layer's ``model``, ``prefix`` and ``index``."""

    model: Model
    prefix: str
    index: int

    def _check_rope(self, rope: Optional[Rope], head_dim: int, arg: str) -> None:
        m = self.model
        if rope is None:
            return
        if not isinstance(rope, Rope):
            raise m.error("rope", f"expected Rope(...), got {rope!r}")
        rotary = rope.rotary_dim or head_dim
        if rope.rotary_dim is not None and rotary > head_dim:
            raise m.error("rope.rotary_dim", f"rotary_dim {rotary} exceeds head_dim {head_dim}")
        if rotary % 2:
            which = "rope.rotary_dim" if rope.rotary_dim is not None else arg
            raise m.error(which, f"RoPE rotates pairs: needs an even dimension, got {rotary}")

    def _note_attention(self, kind: str, heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
                        window, softcap, scale, rope: Optional[Rope], **extra) -> None:
        m = self.model
        m._windows[self.index] = window
        m._kinds.setdefault(self.index, []).append("attention")
        if m.meta["attention"] is None:
            m.meta.update({"attention": kind, "n_heads": heads, "n_kv_heads": kv_heads, "head_dim": head_dim,
                           "v_head_dim": v_head_dim, "attn_softcap": softcap, "attn_scale": scale,
                           "rope": rope.meta() if rope else None, **extra})

    def attention(self, x: Tensor, heads: int, kv_heads: Optional[int] = None, head_dim: Optional[int] = None,
                  rope: Optional[Rope] = None, window: Optional[int] = None, softcap: Optional[float] = None,
                  scale: Optional[float] = None, qkv_bias: bool = False, qk_norm: Union[bool, str] = False,
                  qk_norm_eps: float = 1e-6, qk_norm_offset: float = 0.0, causal: bool = True,
                  output_gate: bool = False, out_bias: bool = False, sinks: bool = False,
                  clip_qkv: Optional[float] = None, query_scale: Optional[tuple] = None,
                  blocks: Optional[Tensor] = None, alibi: Optional[Sequence[float]] = None,
                  chunk: Optional[int] = None, out_norm: Optional[float] = None,
                  out_gate: Optional[Callable] = None) -> Tensor:
        """Multi-head attention (MHA; GQA when kv_heads < heads; MQA when kv_heads == 1):
        q/k/v projections (``attn.wq/wk/wv``, biases ``bq/bk/bv`` with qkv_bias), RMS norms
        ``q_norm``/``k_norm`` with qk_norm (True or "head": per head, weights [D]; "full":
        over all of q's and k's features, weights [H·D] and [K·D], OLMo-2's; "layer": a
        LayerNorm without bias per head, weights [H, D] and [K, D], Cohere's; "plain": an RMS norm
        per head without weight, Llama-4's; "head_after_rope": "head" after RoPE, Hunyuan's),
        RoPE on q and k,
        the attention op over the layer's past cache, and the output projection ``attn.wo``
        (bias ``attn.bo`` with out_bias; with ``output_gate``, of the output times
        sigmoid(gate), the gate read from ``attn.wq``: ``frontends.dsl_delta``); with
        ``sinks``, a learned logit per query head (``attn.sinks`` [H], GPT-OSS's) joins each
        softmax denominator (``irc.ops.attention``); ``blocks``: ``_blocks``; ``alibi``: ``_alibi_slopes``;
        ``chunk``: Llama-4's chunked attention, each query within its chunk of that many tokens;
        ``out_norm`` (an eps): the heads' output RMS-normed (``attn.out_norm`` [H·D]) before ``attn.wo`` (BitNet's);
        ``out_gate(out) -> out``: a gate on the heads' output [B, T, H·D] before ``attn.wo`` (Laguna's softplus)."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d, kv_heads, head_dim = self._heads(x, heads, kv_heads, head_dim)
        if qk_norm not in QK_NORMS:
            raise m.error("qk_norm", f"expected one of {', '.join(map(repr, QK_NORMS))}, got {qk_norm!r}")
        self._check_rope(rope, head_dim, "head_dim")
        window = None if window is None else positive("window", window, where)
        chunk = None if chunk is None else positive("chunk", chunk, where)
        softcap = positive_float("softcap", softcap, where)
        scale = positive_float("scale", scale, where)
        q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
        wq = m.param(f"{p}attn.wq", ((2 if output_gate else 1) * q_dim, d))
        wk = m.param(f"{p}attn.wk", (kv_dim, d))
        wv = m.param(f"{p}attn.wv", (kv_dim, d))
        bq = bk = bv = None
        if qkv_bias:
            bq, bk, bv = (m.param(f"{p}attn.{b}", (n,))
                          for b, n in (("bq", wq.shape[0]), ("bk", kv_dim), ("bv", kv_dim)))
        q = m.emit("linear", [x, wq, bq], None, f"{p}q")[0]
        if output_gate:
            q, gate = query_and_gate(self, q, heads, head_dim)
        k = m.emit("linear", [x, wk, bk], None, f"{p}k")[0]
        v = m.emit("linear", [x, wv, bv], None, f"{p}v")[0]
        sizes = (heads, kv_heads, head_dim)
        if qk_norm and qk_norm != AFTER_ROPE:
            q, k = self._qk_norms(q, k, qk_norm, sizes, qk_norm_eps, qk_norm_offset)
        if clip_qkv is not None:  # OLMo's clamp of q, k and v to [-c, c], after any q/k norms
            c = positive_float("clip_qkv", clip_qkv, where)
            q, k, v = (self._clip(t, c, which) for t, which in ((q, "q"), (k, "k"), (v, "v")))
        q, k = self._rotate(q, k, rope, sizes)
        if qk_norm == AFTER_ROPE:  # Hunyuan's: per head, with weights, on the rotated q and k
            q, k = self._qk_norms(q, k, "head", sizes, qk_norm_eps, qk_norm_offset)
        slopes = None if alibi is None else self._alibi_slopes(alibi, heads, rope)
        if query_scale is not None:  # (beta, original, max positions[, shift]): Llama-4's, after RoPE
            factor = llama4_query_scale(m, *query_scale)
            q = q if factor is None else m.emit("mul", [q, factor], None, f"{p}q_scaled")[0]
        mask, _ = m._context()
        past_key, past_value = (None, None) if m.encoder else m._past(i, kv_heads, head_dim, head_dim)
        attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": None,
                 "causal": bool(causal), "window": window, "softcap": softcap, "scale": scale,
                 **({"chunk": chunk} if chunk else {})}
        sink = m.param(f"{p}attn.sinks", (heads,)) if sinks else None
        blocks = self._blocks(blocks, causal)
        out, *presents = m.emit("attention", [q, k, v, mask, past_key, past_value, sink, blocks, slopes], attrs,
                                [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
        m._presents += [present.value for present in presents]  # none in an encoder
        out = gated_output(self, out, gate) if output_gate else out
        out = out if out_norm is None else m.norm(out, f"{p}attn.out_norm", "rms", out_norm)
        out = out if out_gate is None else out_gate(out)
        wo = m.param(f"{p}attn.wo", (d, q_dim))
        bo = m.param(f"{p}attn.bo", (d,)) if out_bias else None
        kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
        self._note_attention(kind, heads, kv_heads, head_dim, head_dim, window, softcap, scale, rope,
                             qkv_bias=bool(qkv_bias), qk_norm=qk_norm if qk_norm in QK_NORMS[3:] else bool(qk_norm),
                             **({"attn_sinks": True} if sinks else {}), **({"alibi": True} if alibi is not None else {}))
        return m.emit("linear", [out, wo, bo], None, f"{p}attn_out")[0]

    def _rotate(self, q: Tensor, k: Tensor, rope: Optional[Rope], sizes: tuple) -> tuple:
        """q and k with RoPE at the model's positions (unchanged without ``rope``)."""
        if rope is None:
            return q, k
        m, p = self.model, self.prefix
        heads, kv_heads, head_dim = sizes
        _, positions = m._context()
        if positions is None:
            raise m.error("rope", "a vision encoder's tokens have learned positions here, not RoPE")
        return (emit_rope(m, q, positions, rope, heads, head_dim, f"{p}q_rope"),
                emit_rope(m, k, positions, rope, kv_heads, head_dim, f"{p}k_rope"))

    def _heads(self, x: Tensor, heads: int, kv_heads: Optional[int], head_dim: Optional[int]) -> tuple:
        """(d_model, kv heads, head width), checked (kv heads default to heads, the width to
        d_model / heads)."""
        m, where = self.model, self.model.origin()
        d = m._features(x)
        positive("heads", heads, where)
        kv_heads = heads if kv_heads is None else positive("kv_heads", kv_heads, where)
        if heads % kv_heads:
            raise m.error("kv_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
        if head_dim is None:
            if d % heads:
                raise m.error("heads", f"d_model {d} is not divisible by {heads} heads", hint="give head_dim")
            head_dim = d // heads
        return d, kv_heads, positive("head_dim", head_dim, where)

    def _alibi_slopes(self, slopes, heads: int, rope) -> Tensor:
        """ALiBi's per-head slopes [H] (``irc.ops.alibi``: ``bloom_slopes``, ``mpt_slopes``) as one
        f32 constant every layer with the same slopes shares; the attention op adds each times
        key minus query index to the scores."""
        m = self.model
        if rope is not None:
            raise m.error("alibi", "ALiBi and RoPE are two position encodings: give one of them")
        values = tuple(float(s) for s in slopes)
        if len(values) != heads or not all(math.isfinite(s) for s in values):
            raise m.error("alibi", f"expected {heads} finite slopes, one a query head; got {len(values)}")
        if values not in m._alibi:
            name = "alibi_slopes" if not m._alibi else f"alibi_slopes_{len(m._alibi)}"
            m._alibi[values] = m.emit("constant", [], {"value": list(values), "dtype": "f32"}, name)[0]
        return m._alibi[values]

    def _blocks(self, blocks: Optional[Tensor], causal: bool) -> Optional[Tensor]:
        """The attention's ``blocks`` operand: given ([B, T] integer), a bidirectional
        attention's blocks, each token seeing its own block only (Qwen-VL's vision windows and
        frames); in a causal one, the VLM's image tokens that see each other
        (``merge_image_features``)."""
        m = self.model
        if blocks is not None and causal:
            raise m.error("blocks", "blocks make a bidirectional attention block-diagonal: give causal=False",
                          hint="a VLM decoder's image blocks come from m.merge_image_features(bidirectional=...)")
        return m._blocks if causal else blocks

    def _clip(self, t: Tensor, c: float, which: str) -> Tensor:
        """t clamped to [-c, c] as primitives: -max(-max(t, -c), -c)."""
        m, p = self.model, self.prefix
        low = m.emit("constant", [], {"value": -c}, f"{p}{which}_clip_low")[0]
        above = m.emit("maximum", [t, low], None, f"{p}{which}_clip_above")[0]
        flipped = m.emit("neg", [above], None, f"{p}{which}_clip_flipped")[0]
        return m.emit("neg", [m.emit("maximum", [flipped, low], None, f"{p}{which}_clip_below")[0]], None,
                      f"{p}{which}_clipped")[0]

    def _head_norm(self, t: Tensor, which: str, heads: int, head_dim: int, eps, offset) -> Tensor:
        """RMS-normalise each head of ``t`` [B,T,N*D] with ``@attn.{which}_norm`` [D]."""
        m, p = self.model, self.prefix
        lead = tuple(t.shape[:-1])
        split = m.emit("reshape", [t], {"shape": list(lead + (heads, head_dim))}, f"{p}{which}_heads")[0]
        normed = m.norm(split, f"{p}attn.{which}_norm", "rms", eps, offset)
        return m.emit("reshape", [normed], {"shape": list(lead + (heads * head_dim,))}, f"{p}{which}_normed")[0]

    def _qk_norms(self, q: Tensor, k: Tensor, kind, dims: tuple, eps, offset) -> tuple:
        """q and k normalised as ``kind`` says (``attention``'s qk_norm)."""
        m, p = self.model, self.prefix
        heads, kv_heads, head_dim = dims
        if kind == "full":
            return (m.norm(q, f"{p}attn.q_norm", "rms", eps, offset), m.norm(k, f"{p}attn.k_norm", "rms", eps, offset))
        if kind == "layer":
            return (self._head_layer_norm(q, "q", heads, head_dim, eps),
                    self._head_layer_norm(k, "k", kv_heads, head_dim, eps))
        if kind == "plain":  # no weight (Llama-4's): per head, so RoPE before or after gives the same
            return tuple(self._plain_head_norm(t, which, count, head_dim, eps)
                         for t, which, count in ((q, "q", heads), (k, "k", kv_heads)))
        return (self._head_norm(q, "q", heads, head_dim, eps, offset),
                self._head_norm(k, "k", kv_heads, head_dim, eps, offset))

    def _plain_head_norm(self, t: Tensor, which: str, heads: int, head_dim: int, eps) -> Tensor:
        """Each head of ``t`` [B,T,N*D] RMS-normalised without a weight."""
        m, p = self.model, self.prefix
        lead = tuple(t.shape[:-1])
        split = m.emit("reshape", [t], {"shape": list(lead + (heads, head_dim))}, f"{p}{which}_heads")[0]
        normed = m.plain_rms_norm(split, f"{p}{which}_norm", eps)
        return m.emit("reshape", [normed], {"shape": list(lead + (heads * head_dim,))}, f"{p}{which}_normed")[0]

    def _head_layer_norm(self, t: Tensor, which: str, heads: int, head_dim: int, eps) -> Tensor:
        """Cohere's q/k norm: each head of ``t`` [B,T,N*D] LayerNorm-ed over its D features
        (no bias, as primitives) and scaled by its own row of ``@attn.{which}_norm`` [N, D]."""
        m, p = self.model, self.prefix
        lead = tuple(t.shape[:-1])
        split = m.emit("reshape", [t], {"shape": list(lead + (heads, head_dim))}, f"{p}{which}_heads")[0]
        normed = m.plain_layer_norm(split, f"{p}{which}_norm", eps)
        weight = m.param(f"{p}attn.{which}_norm", (heads, head_dim))
        scaled = m.emit("mul", [normed, weight], None, f"{p}{which}_norm_scaled")[0]
        return m.emit("reshape", [scaled], {"shape": list(lead + (heads * head_dim,))}, f"{p}{which}_normed")[0]

    def mla_attention(self, x: Tensor, heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                      qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: Optional[int] = None,
                      rope: Union[Rope, bool, None] = None, eps: float = 1e-6, scale: Optional[float] = None,
                      causal: bool = True) -> Tensor:
        """DeepSeek multi-head latent attention: queries direct (``attn.wq``) or low-rank
        (``q_a``, ``q_a_norm``, ``q_b``), the joint KV latent (``kv_a`` -> ``kv_a_norm`` ->
        ``kv_b``) plus a decoupled RoPE key, output ``attn.wo``. The cache is per head
        (K [B,H,P,nope+rope], V [B,H,P,v]); ``mla-absorb`` turns it into the latent.
        ``rope`` defaults to DeepSeek's (base 10000, interleaved); ``rope=False`` rotates
        nothing (Kimi-Linear's NoPE MLA: the qk_rope_head_dim columns stay a plain key part
        shared by the heads) and the op reads no ``position_ids``."""
        m, p, i = self.model, self.prefix, self.index
        where = m.origin()
        d = m._features(x)
        for arg, value in (("heads", heads), ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
                           ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)):
            positive(arg, value, where)
        if q_lora_rank is not None:
            positive("q_lora_rank", q_lora_rank, where)
        if rope is not False and rope is not None and not isinstance(rope, Rope):
            raise m.error("rope", f"expected Rope(...), None (DeepSeek's) or False (no rotation), got {rope!r}")
        rope = Rope(convention="interleaved") if rope is None else rope
        if isinstance(rope, Rope) and rope.rotary_dim is not None:
            raise m.error("rope.rotary_dim", "MLA rotates exactly qk_rope_head_dim; leave rotary_dim unset")
        if isinstance(rope, Rope) and rope.decomposed:
            raise m.error("rope.decomposed", "mla_attention applies its RoPE inside the op; decomposed RoPE is "
                                             "for attention")
        rope = rope or None  # False: no rotation
        self._check_rope(rope, qk_rope_head_dim, "qk_rope_head_dim")
        scale = positive_float("scale", scale, where)
        qk_dim = qk_nope_head_dim + qk_rope_head_dim
        wq = q_a = q_a_norm = q_b = None
        if q_lora_rank is None:
            wq = m.param(f"{p}attn.wq", (heads * qk_dim, d))
        else:
            q_a = m.param(f"{p}attn.q_a", (q_lora_rank, d))
            q_a_norm = m.param(f"{p}attn.q_a_norm", (q_lora_rank,))
            q_b = m.param(f"{p}attn.q_b", (heads * qk_dim, q_lora_rank))
        kv_a = m.param(f"{p}attn.kv_a", (kv_lora_rank + qk_rope_head_dim, d))
        kv_a_norm = m.param(f"{p}attn.kv_a_norm", (kv_lora_rank,))
        kv_b = m.param(f"{p}attn.kv_b", (heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank))
        wo = m.param(f"{p}attn.wo", (d, heads * v_head_dim))
        mask, positions = m._context()
        past_key, past_value = m._past(i, heads, qk_dim, v_head_dim)
        attrs = {"heads": heads, "q_lora_rank": q_lora_rank, "kv_lora_rank": kv_lora_rank,
                 "qk_nope_head_dim": qk_nope_head_dim, "qk_rope_head_dim": qk_rope_head_dim,
                 "v_head_dim": v_head_dim, "eps": positive_float("eps", eps, where),
                 "rope": rope.mla_attrs() if rope else None, "scale": scale, "causal": bool(causal)}
        out, present_key, present_value = m.emit(
            "mla_attention", [x, positions if rope else None, mask, past_key, past_value, wq, q_a, q_a_norm, q_b,
                              kv_a, kv_a_norm, kv_b, wo], attrs, [f"{p}attn_out", f"present.{i}.key", f"present.{i}.value"])
        m._presents += [present_key.value, present_value.value]
        mla = {"q_lora_rank": q_lora_rank, "kv_lora_rank": kv_lora_rank, "qk_nope_head_dim": qk_nope_head_dim,
               "qk_rope_head_dim": qk_rope_head_dim, "v_head_dim": v_head_dim}
        self._note_attention("mla", heads, heads, qk_dim, v_head_dim, None, None, scale, rope, mla=mla)
        return out
