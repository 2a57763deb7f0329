"""Qwen4-Exp's per-layer embeddings (PLE: ``Qwen4ExpTextPLELayer``), for
``frontends.hf.families_qwen4``: on each layer of ``ple_layer_ids`` (one-indexed, linear
layers), before the layer's blocks, the streams gain

    e     = ngram_embedding(ngram_hash(input_ids))       [B, T, G · h] (``irc.ops.ngram``)
    key   = norm_key(key_proj(e))  per stream            [B, T, N, d]
    gate  = Σ_d key · norm_query(streams) / sqrt(d);  gate = sign(gate) · sqrt(max(|gate|, 1e-6))
    v     = sigmoid(gate) · value_proj(e)                [B, T, N, d]
    out   = v + silu(conv(norm_conv(v)))

each norm a (1 + w) RMS norm per stream, ``conv`` depthwise over the N · d channels with
``ple_conv_kernel_size`` taps dilated by ``ngram_size``: irc's ``causal_conv1d`` with the taps
spread over (K - 1) · ngram_size + 1 (zeros between), its state the last (K - 1) ·
ngram_size inputs (``past_key_values.{i}.ple_conv_state``); the hash carries the last
ngram_size - 1 tokens (``past_key_values.{i}.ple_ids``, f32: id + 1). The hash's
multipliers, primes and offsets are transformers' (``_build_layer_multipliers``,
``_find_nth_prime_after``), derived here from ``seed``, ``ngram_vocab_size_base`` and the
layer's place in ``ple_layer_ids``. The table is read whole (``ngram_embedding.weight``) or
from its shards (``ngram_embedding.shard_{k}.weight``, as save_pretrained writes them)."""
from __future__ import annotations

import math

import numpy as np

from frontends.hf.config import Arch, Config, int_list
from frontends.hf.weights import Checkpoint, Source
from irc.dtypes import DType
from irc.errors import SpecError
from irc.yamlloc import non_negative_int, positive_int

_MASK64, _GAMMA, _M1, _M2, _PRIME_1 = (1 << 64) - 1, 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 10007
BUFFERS = tuple(f"ple.ple_embedding.{b}" for b in ("layer_multipliers", "ngram_heads_vocab_sizes",
                                                    "ngram_heads_offsets"))


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _M1) & _MASK64
    value = ((value ^ (value >> 27)) * _M2) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def _is_prime(value: int) -> bool:
    if value < 2 or value % 2 == 0:
        return value == 2
    return all(value % divisor for divisor in range(3, math.isqrt(value) + 1, 2))


def _primes_after(start: int, count: int) -> list[int]:
    """The ``count`` primes after ``start``."""
    found, prime = [], start
    while len(found) < count:
        prime += 1
        if _is_prime(prime):
            found.append(prime)
    return found


def read_ple(cfg: Config, n: int, kinds: list, linear: str) -> dict:
    """PLE's settings (module docstring), checked as Qwen4ExpTextConfig.validate_architecture does;
    {} where ``ple_layer_ids`` is empty."""
    ids = sorted(set(cfg.get("ple_layer_ids", int_list, None) or []))
    if not ids:
        return {}
    bad = [i for i in ids if not 1 <= i <= n or kinds[i - 1] != linear]
    if bad:
        raise cfg.error("ple_layer_ids", f"{bad}: PLE layers are one-indexed linear_attention layers of {n}")
    order, per = cfg.get("ngram_size", positive_int), cfg.get("heads_per_ngram", positive_int)
    heads = (order - 1) * per
    width = cfg.get("ple_embed_dim", positive_int, None) or cfg.get("hidden_size", positive_int)
    if heads <= 0 or width % heads:
        raise cfg.error("ple_embed_dim", f"{width} does not split into {heads} n-gram heads "
                                         "((ngram_size - 1) · heads_per_ngram)")
    eos = cfg.data.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise cfg.error("eos_token_id", "PLE cuts n-grams at eos: give eos_token_id")
    vocab, seed = cfg.get("vocab_size", positive_int), cfg.get("seed", non_negative_int)
    base, divisor = cfg.get("ngram_vocab_size_base", positive_int), cfg.get("make_ngram_vocab_size_divisible_by",
                                                                            positive_int)
    primes = _primes_after(base - 1, len(ids) * heads)
    half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
    layers = {}
    for index, layer in enumerate(ids):
        mine = primes[index * heads:(index + 1) * heads]
        start = seed + _PRIME_1 * index
        multipliers = [2 * (_splitmix64((start + _GAMMA * (s + 1)) & _MASK64) % half) + 1 for s in range(order)]
        offsets = [sum(mine[:j]) for j in range(heads)]
        layers[layer - 1] = {"eos": eos, "multipliers": multipliers, "primes": mine, "offsets": offsets,
                             "heads_per_ngram": per, "rows": math.ceil(sum(mine) / divisor) * divisor}
    return {"layers": layers, "width": width, "head_width": width // heads,
            "kernel": cfg.get("ple_conv_kernel_size", positive_int), "dilation": order}


class Shards(Source):
    """A table stored in row shards (``...shard_{k}.weight``), read as one."""

    def __init__(self, names: list[str]):
        self.parts = names

    def names(self) -> list[str]:
        return list(self.parts)

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        shapes = [list(checkpoint.info(name)[1]) for name in self.parts]
        if any(len(s) != 2 or s[1] != shapes[0][1] for s in shapes):
            raise SpecError(f"the shards of {self.parts[0]} are not [rows, {shapes[0][-1]}] each: {shapes}",
                            location=checkpoint.file(self.parts[0]))
        return [sum(s[0] for s in shapes), shapes[0][1]]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the shards one after another, reading only those."""
        pieces, first = [], 0
        for name in self.parts:
            count = checkpoint.info(name)[1][0]
            low, high = max(start, first), min(stop, first + count)
            if low < high:
                pieces.append(checkpoint.read(name, low - first, high - first))
            first += count
        return np.concatenate(pieces) if pieces else checkpoint.read(self.parts[0], 0, 0)


def table_source(arch: Arch, param: str, checkpoint: Checkpoint, prefix: str):
    """``layers.{i}.ple.table``: the whole table, else its shards; None for other params."""
    layer, _, suffix = param.partition(".")[2].partition(".")
    if suffix != "ple.table":
        return None
    base = f"{prefix}{layer}.ple.ple_embedding.ngram_embedding."
    if base + "weight" in checkpoint.files:
        return None
    shards = sorted((name for name in checkpoint.files if name.startswith(base + "shard_")),
                    key=lambda name: int(name[len(base) + 6:].split(".")[0]))
    return Shards(shards) if shards else None


def _grouped_norm(o, x, weight, streams: int, d: int, eps: float, name: str):
    """x [B, T, N, d] RMS-normed per stream times (1 + weight [N · d])."""
    mean = o("reduce_mean", [o("mul", [x, x], None, f"{name}_square")], {"axes": [-1], "keepdims": True},
             f"{name}_mean_square")
    inv = o("rsqrt", [o("add", [mean, o.const(eps, f"{name}_eps")], None, f"{name}_var")], None, f"{name}_inv")
    scale = o("add", [o.view(weight, (streams, d), f"{name}_weight"), o.const(1.0, f"{name}_one")], None,
              f"{name}_scale")
    return o("mul", [o("mul", [x, inv], None, f"{name}_rms"), scale], None, name)


def ple_streams(m, o, layer, streams, ple: dict, eps: float):
    """The streams [B, T, N, d] plus this layer's PLE output (module docstring)."""
    i, p = layer.index, layer.prefix + "ple."
    hash_attrs = {k: v for k, v in ple["layers"][i].items() if k != "rows"}
    batch, seq, n, d = streams.shape
    width, context = ple["width"], len(hash_attrs["multipliers"]) - 1
    mask, _ = m._context()
    past = m._graph.add_input(f"past_key_values.{i}.ple_ids", DType.f32, ("B", context))
    ids, present = m.emit("ngram_hash", [m.input_ids(), mask, past], hash_attrs,
                          [f"{p}ngram_ids", f"present.{i}.ple_ids"])
    m._presents.append(present.value)
    table = m.param(f"{p}table", (ple["layers"][i]["rows"], ple["head_width"]))
    e = o.view(o("embedding", [ids, table], {"scale": None}, "ple_rows"), (batch, seq, width), "ple_e")
    key = o.view(o.linear(e, m.param(f"{p}key_proj", (n * d, width)), "ple_key"), (batch, seq, n, d), "ple_key4")
    key = _grouped_norm(o, key, m.param(f"{p}norm_key", (n * d,)), n, d, eps, "ple_key_normed")
    query = _grouped_norm(o, streams, m.param(f"{p}norm_query", (n * d,)), n, d, eps, "ple_query")
    gate = o("mul", [o("reduce_sum", [o("mul", [key, query], None, "ple_kq")], {"axes": [-1], "keepdims": True},
                       "ple_dot"), o.const(d ** -0.5, "ple_scale")], None, "ple_gate")
    root = o("sqrt", [o("maximum", [o("maximum", [gate, o("neg", [gate], None, "ple_neg")], None, "ple_abs"),
                                    o.const(1e-6, "ple_floor")], None, "ple_clamped")], None, "ple_root")
    zero = o.const(0.0, "ple_zero")
    signed = o("where", [o("less", [gate, zero], None, "ple_negative"), o("neg", [root], None, "ple_neg_root"),
                         o("where", [o("equal", [gate, zero], None, "ple_is_zero"), zero, root], None, "ple_pos")],
               None, "ple_signed")
    value = o.view(o.linear(e, m.param(f"{p}value_proj", (d, width)), "ple_value"), (batch, seq, 1, d), "ple_v4")
    gated = o("mul", [o("sigmoid", [signed], None, "ple_sigmoid"), value], None, "ple_gated")
    normed = _grouped_norm(o, gated, m.param(f"{p}norm_conv", (n * d,)), n, d, eps, "ple_conv_in")
    conv = o.view(_dilated_conv(m, o, i, p, o.view(normed, (batch, seq, n * d), "ple_conv_flat"), ple, n * d, mask),
                  (batch, seq, n, d), "ple_conv4")
    return o("add", [streams, o("add", [gated, conv], None, "ple_out")], None, "ple_streams")


def _dilated_conv(m, o, i: int, p: str, x, ple: dict, channels: int, mask):
    """silu(depthwise conv of x [B, T, C], ``ple_conv_kernel_size`` taps dilated by
    ngram_size) over the carried inputs: ``causal_conv1d`` with zeros between the taps."""
    taps, dilation = ple["kernel"], ple["dilation"]
    weight = m.param(f"{p}conv", (channels, 1, taps))
    pieces = []
    for k in range(taps):
        if k:
            pieces.append(o("expand", [o.const(0.0, "ple_conv_zero")], {"shape": [channels, 1, dilation - 1]},
                            f"ple_conv_gap{k}"))
        pieces.append(o("slice", [weight], {"axis": 2, "start": k, "end": k + 1}, f"ple_conv_tap{k}"))
    spread = o("concat", pieces, {"axis": 2}, "ple_conv_weight") if len(pieces) > 1 else pieces[0]
    past = m._state(i, "ple_conv_state", (channels, (taps - 1) * dilation))
    out, present = m.emit("causal_conv1d", [x, spread, None, past, mask], {"activation": "silu"},
                          [f"{p}conv_out", f"present.{i}.ple_conv_state"])
    m._presents.append(present.value)
    return out


__all__ = ["BUFFERS", "read_ple", "ple_streams", "table_source"]
