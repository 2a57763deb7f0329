"""Gemma-3n's decoder for the DSL: AltUp streams, LAuReL, per-layer embeddings, KV-sharing
attention and the activation-sparse GeGLU, written with the model-level ops irc has
(``embedding``, ``rms_norm``, ``linear``, ``rope``, ``attention``, ``geglu``) and primitives;
Gemma-3n needs no op of its own. ``gemma3n_graph`` builds the whole decoder
(``frontends.hf.families_gemma3n`` calls it); each function follows transformers 5.24's
``modeling_gemma3n.py`` step for step in float32, so the graph computes what it does up to
rounding.

- AltUp's ``n`` streams are one tensor [B, T, d, n] (stream j is ``[..., j]``). The first is
  the scaled embedding; stream j > 0 is ``altup_projections.{j-1}`` of it, rescaled to the
  embedding's root-mean-square (the divisor floored at sqrt(1e-5)). Each layer predicts
  (streams + streams @ C, C [B, T, n, n] from ``altup.prediction_coefs`` of the router's
  tanh modalities of the active stream), runs the layer on the active prediction, corrects
  (predictions + innovation x (1 + ``altup.correction_coefs`` of the modalities of the
  layer's output)), and adds the per-layer input branch to streams 1..n-1. After the last
  layer streams j > 0 go through ``altup_unembed_projections.{j-1}``, are rescaled to
  stream 0's magnitude, and the n streams are averaged.
- LAuReL: x + rms_norm(right(left(x))) beside the attention; the two joined / sqrt(2).
- Per-layer inputs [B, T, L, P]: ``frontends.dsl_gemma_shared.per_layer_inputs`` (ids at or
  past ``per_layer_vocab`` read row 0); layer i reads [:, :, i]: gelu(``per_layer.gate`` of the
  corrected active stream) times it, projected back (``per_layer.projection``) and RMS-normed.
- Attention: ``frontends.dsl_gemma_shared.attention`` (q, k RMS-normed per head, v per head
  without a weight, RoPE on q and k, scale 1, the layer's window). A KV-sharing layer
  (``kv_source``, through ``KVSharing``) makes only its query and attends over the source
  layer's new keys and values and past cache inputs; only layers that compute K/V have
  ``past_key_values.{i}.*`` and ``present.{i}.*``, which is what the analysis counts as the
  KV cache.
- The MLP of a layer with sparsity p > 0 keeps gate - (mean + std·icdf(p)) above zero
  before the GELU (mean and population std over the features); ``sparsity`` holds the
  multiplier icdf(p), computed when the config is read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from frontends.dsl import ACTIVATION, Model, Tensor
from frontends.dsl_args import ArgError
from frontends.dsl_gemma_shared import KVSharing, attention, per_layer_inputs


@dataclass
class Gemma3nSpec:
    """What Gemma-3n adds to an ``Arch``: AltUp's stream count (``altup_num_inputs``), the
    active stream, whether the corrected active stream is scaled
    (``altup.correct_output_scale``) before the per-layer branch, LAuReL's rank, the
    per-layer input width and table rows, and per layer its MLP width, its sparsity
    multiplier (None: dense) and the earlier layer whose K/V it reuses (None: its own)."""
    streams: int
    active: int
    correct_scale: bool
    laurel_rank: int
    per_layer_dim: int
    per_layer_vocab: int
    d_ff: list
    sparsity: list
    kv_source: list
    approximate: str = "tanh"


def gemma3n_graph(s: Gemma3nSpec, arch, origin: str):
    """The decoder of the module docstring for ``arch`` (an ``frontends.hf.config.Arch``)."""
    n = arch.n_layers
    for arg, values in (("intermediate_size", s.d_ff), ("activation_sparsity_pattern", s.sparsity),
                        ("num_kv_shared_layers", s.kv_source)):
        if len(values) != n:
            raise ArgError(arg, f"{len(values)} entries for {n} layers", origin)
    if not 0 <= s.active < s.streams:
        raise ArgError("altup_active_idx", f"{s.active} is not one of the {s.streams} streams", origin)
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        ids = m.input_ids()
        x = m.embed(ids, scale=arch.embedding_scale)
        per_layer = per_layer_inputs(m, ids, x, n, s.per_layer_dim, s.per_layer_vocab, eps)
        streams = altup_streams(m, x, s.streams)
        sharing = KVSharing(s.kv_source)
        for layer, spec in zip(m.layers(n), arch.layers):
            i = layer.index
            layer_input = _reshape(m, m.emit("slice", [per_layer], {"axis": 2, "start": i, "end": i + 1},
                                              f"layers.{i}.per_layer_input_slice")[0],
                                   tuple(x.shape[:-1]) + (s.per_layer_dim,), f"layers.{i}.per_layer_input")
            streams = decoder_layer(layer, spec, arch, s, streams, layer_input, sharing)
        x = altup_unembed(m, streams, s.streams)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


def decoder_layer(layer, spec, arch, s: Gemma3nSpec, streams: Tensor, layer_input: Tensor,
                  sharing: KVSharing) -> Tensor:
    """One Gemma3nTextDecoderLayer on the streams [B, T, d, n]."""
    m, p, i, eps = layer.model, layer.prefix, layer.index, arch.norm_eps
    altup = AltUp(layer, s.streams, eps)
    predictions = altup.predict(streams, s.active)
    active = stream(m, predictions, s.active, f"{p}active")
    normed = layer.rms_norm(active, "attn_norm", eps)
    augmented = laurel(layer, normed, s.laurel_rank, eps)
    from frontends.hf.config import dsl_rope  # not at the top: frontends.hf imports this module

    a, rope = arch.attention, dsl_rope(spec.rope)
    attn = attention(layer, normed, a.heads, a.kv_heads, a.head_dim, rope, spec.window, eps, sharing)
    attn = layer.rms_norm(attn, "post_attn_norm", eps)
    x = m.add(active, attn, f"{p}attn_residual")
    x = _divide(m, m.add(x, augmented, f"{p}attn_laurel_sum"), math.sqrt(2), f"{p}attn_laurel")
    h = layer.rms_norm(x, "mlp_norm", eps)
    h = sparse_geglu(layer, h, s.d_ff[i], s.sparsity[i], s.approximate)
    h = layer.rms_norm(h, "post_mlp_norm", eps)
    x = m.add(x, h, f"{p}x")
    corrected = altup.correct(predictions, x, s.active)
    return per_layer_branch(layer, corrected, layer_input, s, eps)


# ---- small arithmetic ------------------------------------------------------------------

def _constant(m: Model, value, name: str, dtype: str = "f32") -> Tensor:
    return m.emit("constant", [], {"value": value, "dtype": dtype}, name)[0]


def _reshape(m: Model, x: Tensor, shape: tuple, name: str) -> Tensor:
    return m.emit("reshape", [x], {"shape": list(shape)}, name)[0]


def _divide(m: Model, x: Tensor, by: float, name: str) -> Tensor:
    return m.emit("div", [x, _constant(m, float(by), f"{name}_divisor")], None, name)[0]


def _mean_square(m: Model, x: Tensor, name: str) -> Tensor:
    square = m.emit("mul", [x, x], None, f"{name}_square")[0]
    return m.emit("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{name}_mean_square")[0]


def match_magnitude(m: Model, x: Tensor, target: Tensor, name: str) -> Tensor:
    """x · target / sqrt(max(mean(x²), 1e-5)): x rescaled to ``target``'s RMS [..., 1]."""
    floored = m.emit("maximum", [_mean_square(m, x, name), _constant(m, 1e-5, f"{name}_floor")], None,
                     f"{name}_floored")[0]
    magnitude = m.emit("sqrt", [floored], None, f"{name}_magnitude")[0]
    scaled = m.emit("mul", [x, target], None, f"{name}_times_target")[0]
    return m.emit("div", [scaled, magnitude], None, name)[0]


def rms(m: Model, x: Tensor, name: str) -> Tensor:
    """sqrt(mean(x²)) over the last axis, kept [..., 1]."""
    return m.emit("sqrt", [_mean_square(m, x, name)], None, f"{name}_rms")[0]


# ---- AltUp -----------------------------------------------------------------------------

def stack(m: Model, parts: list, name: str) -> Tensor:
    """[B, T, d] tensors -> [B, T, d, n]."""
    columns = [_reshape(m, t, tuple(t.shape) + (1,), f"{name}_{j}") for j, t in enumerate(parts)]
    return columns[0] if len(columns) == 1 else m.emit("concat", columns, {"axis": -1}, name)[0]


def stream(m: Model, streams: Tensor, j: int, name: str) -> Tensor:
    """Stream j [B, T, d] of [B, T, d, n]."""
    column = m.emit("slice", [streams], {"axis": -1, "start": j, "end": j + 1}, f"{name}_column")[0]
    return _reshape(m, column, tuple(streams.shape[:-1]), name)


def altup_streams(m: Model, x: Tensor, n: int) -> Tensor:
    """The n streams from the scaled embedding x (``altup_projections.{j}`` [d, d])."""
    d = m._features(x)
    target = rms(m, x, "altup_target")
    parts = [x]
    for j in range(1, n):
        projected = m.emit("linear", [x, m.param(f"altup_projections.{j - 1}", (d, d))], None,
                           f"altup_projected_{j}")[0]
        parts.append(match_magnitude(m, projected, target, f"altup_stream_{j}"))
    return stack(m, parts, "altup_streams")


def altup_unembed(m: Model, streams: Tensor, n: int) -> Tensor:
    """The streams back to one [B, T, d]: streams j > 0 through
    ``altup_unembed_projections.{j-1}`` at stream 0's magnitude, then their mean."""
    first = stream(m, streams, 0, "unembed_stream_0")
    d = m._features(first)
    target = rms(m, first, "unembed_target")
    parts = [first]
    for j in range(1, n):
        weight = m.param(f"altup_unembed_projections.{j - 1}", (d, d))
        projected = m.emit("linear", [stream(m, streams, j, f"unembed_stream_{j}"), weight], None,
                           f"unembed_projected_{j}")[0]
        parts.append(match_magnitude(m, projected, target, f"unembed_matched_{j}"))
    if n == 1:
        return first
    return m.emit("reduce_mean", [stack(m, parts, "unembed_streams")], {"axes": [-1], "keepdims": False},
                  "unembedded")[0]


class AltUp:
    """One layer's AltUp weights (``layers.{i}.altup.*``) and its predict / correct steps."""

    def __init__(self, layer, n: int, eps: float):
        m, p = layer.model, layer.prefix
        d = m.d_model
        self.model, self.prefix, self.n, self.eps = m, p, n, eps
        self.router_norm = m.param(f"{p}altup.router_norm", (d,))
        self.router = m.param(f"{p}altup.modality_router", (n, d))
        self.prediction_coefs = m.param(f"{p}altup.prediction_coefs", (n * n, n))
        self.correction_coefs = m.param(f"{p}altup.correction_coefs", (n, n))

    def modalities(self, x: Tensor, name: str) -> Tensor:
        """tanh(router(router_norm(x) / d)) [B, T, n]."""
        m = self.model
        normed = m.emit("rms_norm", [x, self.router_norm], {"eps": self.eps, "offset": 0.0}, f"{name}_normed")[0]
        scaled = m.scale(normed, 1.0 / m.d_model, f"{name}_scaled")
        routed = m.emit("linear", [scaled, self.router], None, f"{name}_routed")[0]
        return m.emit("tanh", [routed], None, name)[0]

    def predict(self, streams: Tensor, active: int) -> Tensor:
        """streams + streams @ C, C[b, t, k, j] = prediction_coefs(modalities)[b, t, j·n + k]."""
        m, p, n = self.model, self.prefix, self.n
        lead = tuple(streams.shape[:2])
        modalities = self.modalities(stream(m, streams, active, f"{p}altup_router_in"), f"{p}altup_modalities")
        coefs = m.emit("linear", [modalities, self.prediction_coefs], None, f"{p}altup_prediction_coefs")[0]
        square = _reshape(m, coefs, lead + (n, n), f"{p}altup_prediction_square")
        transposed = m.emit("transpose", [square], {"perm": [0, 1, 3, 2]}, f"{p}altup_prediction_map")[0]
        mixed = m.emit("matmul", [streams, transposed], None, f"{p}altup_mixed")[0]
        return m.emit("add", [mixed, streams], None, f"{p}altup_predictions")[0]

    def correct(self, predictions: Tensor, activated: Tensor, active: int) -> Tensor:
        """predictions + (activated - predictions[active]) · (1 + correction_coefs(modalities))."""
        m, p, n = self.model, self.prefix, self.n
        lead = tuple(activated.shape[:2])
        modalities = self.modalities(activated, f"{p}altup_correct_modalities")
        coefs = m.emit("linear", [modalities, self.correction_coefs], None, f"{p}altup_correction_linear")[0]
        coefs = m.emit("add", [coefs, _constant(m, 1.0, f"{p}altup_one")], None, f"{p}altup_correction_coefs")[0]
        innovation = m.emit("sub", [activated, stream(m, predictions, active, f"{p}altup_predicted")], None,
                            f"{p}altup_innovation")[0]
        column = _reshape(m, innovation, tuple(innovation.shape) + (1,), f"{p}altup_innovation_column")
        row = _reshape(m, coefs, lead + (1, n), f"{p}altup_correction_row")
        spread = m.emit("mul", [column, row], None, f"{p}altup_correction")[0]
        return m.emit("add", [spread, predictions], None, f"{p}altup_corrected")[0]


# ---- the layer's branches --------------------------------------------------------------

def laurel(layer, x: Tensor, rank: int, eps: float) -> Tensor:
    """x + post_laurel_norm(right(left(x))): ``laurel.left`` [r, d], ``laurel.right`` [d, r]."""
    m, p = layer.model, layer.prefix
    d = m._features(x)
    low = m.emit("linear", [x, m.param(f"{p}laurel.left", (rank, d))], None, f"{p}laurel_low")[0]
    high = m.emit("linear", [low, m.param(f"{p}laurel.right", (d, rank))], None, f"{p}laurel_high")[0]
    return m.add(x, layer.rms_norm(high, "laurel.norm", eps), f"{p}laurel_out")


def per_layer_branch(layer, corrected: Tensor, layer_input: Tensor, s: Gemma3nSpec, eps: float) -> Tensor:
    """Streams 1..n-1 plus norm(projection(gelu(gate(active · scale)) · layer_input))."""
    m, p = layer.model, layer.prefix
    d = m.d_model
    first = stream(m, corrected, s.active, f"{p}corrected_active")
    if s.correct_scale:
        scale = m.param(f"{p}altup.correct_output_scale", (d,))
        if m.dtype != ACTIVATION:
            scale = m.emit("cast", [scale], {"to": str(ACTIVATION)}, f"{p}correct_output_scale_f32")[0]
        first = m.emit("mul", [first, scale], None, f"{p}corrected_scaled")[0]
    gate = m.emit("linear", [first, m.param(f"{p}per_layer.gate", (s.per_layer_dim, d))], None,
                  f"{p}per_layer_gate")[0]
    gate = m.emit("gelu", [gate], {"approximate": s.approximate}, f"{p}per_layer_act")[0]
    gated = m.emit("mul", [gate, layer_input], None, f"{p}per_layer_gated")[0]
    projected = m.emit("linear", [gated, m.param(f"{p}per_layer.projection", (d, s.per_layer_dim))], None,
                       f"{p}per_layer_projected")[0]
    projected = layer.rms_norm(projected, "per_layer.norm", eps)
    if s.streams == 1:
        return corrected
    head = m.emit("slice", [corrected], {"axis": -1, "start": 0, "end": 1}, f"{p}streams_head")[0]
    rest = m.emit("slice", [corrected], {"axis": -1, "start": 1, "end": s.streams}, f"{p}streams_rest")[0]
    column = _reshape(m, projected, tuple(projected.shape) + (1,), f"{p}per_layer_column")
    rest = m.emit("add", [rest, column], None, f"{p}streams_updated")[0]
    return m.emit("concat", [head, rest], {"axis": -1}, f"{p}streams")[0]


def sparse_geglu(layer, x: Tensor, d_ff: int, multiplier: Optional[float], approximate: str) -> Tensor:
    """down(gelu(sparse(gate(x))) · up(x)), sparse(g) = max(g - (mean(g) + std(g)·multiplier), 0);
    without a multiplier the ``geglu`` op."""
    if multiplier is None:
        return layer.geglu(x, d_ff=d_ff, approximate=approximate)
    m, p = layer.model, layer.prefix
    d = m._features(x)
    w_gate, w_up = m.param(f"{p}mlp.w_gate", (d_ff, d)), m.param(f"{p}mlp.w_up", (d_ff, d))
    w_down = m.param(f"{p}mlp.w_down", (d, d_ff))
    layer._note_mlp("geglu", d_ff)
    gate = m.emit("linear", [x, w_gate], None, f"{p}mlp_gate")[0]
    mean = m.emit("reduce_mean", [gate], {"axes": [-1], "keepdims": True}, f"{p}mlp_gate_mean")[0]
    centred = m.emit("sub", [gate, mean], None, f"{p}mlp_gate_centred")[0]
    std = m.emit("sqrt", [_mean_square(m, centred, f"{p}mlp_gate_centred")], None, f"{p}mlp_gate_std")[0]
    spread = m.emit("mul", [std, _constant(m, float(multiplier), f"{p}mlp_std_multiplier")], None,
                    f"{p}mlp_gate_spread")[0]
    cutoff = m.emit("add", [mean, spread], None, f"{p}mlp_gate_cutoff")[0]
    above = m.emit("sub", [gate, cutoff], None, f"{p}mlp_gate_above")[0]
    sparse = m.emit("maximum", [above, _constant(m, 0.0, f"{p}mlp_zero")], None, f"{p}mlp_gate_sparse")[0]
    act = m.emit("gelu", [sparse], {"approximate": approximate}, f"{p}mlp_act")[0]
    up = m.emit("linear", [x, w_up], None, f"{p}mlp_up")[0]
    return m.emit("linear", [m.emit("mul", [act, up], None, f"{p}mlp_gated")[0], w_down], None, f"{p}mlp_out")[0]
