"""``ngram_hash``: Qwen4-Exp's hashed n-gram ids (transformers' ``Qwen4ExpTextNGramEmbedding``
before its embedding lookup), with the last tokens carried across calls.

    ngram_hash(input_ids [B, T] int, attention_mask? [B, P+T], past_state? [B, C] float)
        -> (ids [B, T, G] i64, present [B, C] float)

with n = len(``multipliers``) (``ngram_size``), C = n - 1 and G = (n - 1) · ``heads_per_ngram``.
A padded token (``attention_mask`` 0 among the last T columns) reads as ``eos``. The history
is the C tokens before the call (``past_state``: token id + 1 as a float, 0 for none, read as
``eos``: zeros are the empty state) then the call's tokens. For shift s < n, token t's
s-shifted token is the history's s places back, read as ``eos`` where an eos lies in the s
places before t (transformers' ``_shift_right_ignore_eos``: n-grams stop at a document's
end). For order k = 2..n, mixed = XOR_{s<k} (shifted_s · multipliers[s]) in int64 (wrapping
as torch's does), and head j of that order (g = (k - 2) · heads_per_ngram + j) is
mixed mod ``primes[g]`` + ``offsets[g]``. The present is the history's last C tokens, + 1.

The arithmetic is int64 throughout; token ids ride the state as float32, exact below 2^24.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.primitives import elementwise_cost
from irc.ops.registry import REQUIRED, OpDef, TensorType, by_name, expect, register, same_dims
from irc.ops.ssm import new_token_mask

OP = "ngram_hash"
OPERANDS = ("input_ids", "attention_mask?", "past_state?")
ATTRS = {"eos": REQUIRED, "multipliers": REQUIRED, "primes": REQUIRED, "offsets": REQUIRED,
         "heads_per_ngram": REQUIRED}


def ngram_hash(input_ids, attention_mask=None, past_state=None, *, eos: int, multipliers, primes, offsets,
               heads_per_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, T, G] i64, present [B, C] f32) as the module docstring says."""
    ids = np.asarray(input_ids).astype(np.int64)
    batch, seq = ids.shape
    context = len(multipliers) - 1
    ids = np.where(new_token_mask(attention_mask, batch, seq), ids, np.int64(eos))
    if past_state is None:
        past = np.full((batch, context), eos, np.int64)
    else:
        stored = np.rint(np.asarray(past_state, np.float32)).astype(np.int64)
        past = np.where(stored > 0, stored - 1, np.int64(eos))
    history = np.concatenate([past, ids], axis=1)
    valid = np.ones((batch, seq), bool)
    mixed, out = np.zeros((batch, seq), np.int64), []
    with np.errstate(over="ignore"):
        for shift, multiplier in enumerate(multipliers):
            shifted = history[:, context - shift:context - shift + seq]
            valid = valid & (shifted != eos) if shift else valid
            token = np.where(valid, shifted, np.int64(eos))
            mixed = mixed ^ (token * np.int64(multiplier))
            if shift:
                for head in range((shift - 1) * heads_per_ngram, shift * heads_per_ngram):
                    out.append(np.remainder(mixed, np.int64(primes[head])) + np.int64(offsets[head]))
    present = (history[:, history.shape[1] - context:] + 1).astype(np.float32)
    return np.stack(out, axis=-1), present


def _infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    ids, mask, past = ops["input_ids"], ops["attention_mask"], ops["past_state"]
    multipliers, heads = attrs["multipliers"], attrs["heads_per_ngram"]
    expect(isinstance(multipliers, (list, tuple)) and len(multipliers) >= 2
           and all(isinstance(v, int) for v in multipliers), f"{OP}: multipliers must be two or more ints")
    expect(isinstance(heads, int) and heads > 0, f"{OP}: heads_per_ngram must be a positive int, got {heads!r}")
    groups = (len(multipliers) - 1) * heads
    for name in ("primes", "offsets"):
        values = attrs[name]
        expect(isinstance(values, (list, tuple)) and len(values) == groups and all(isinstance(v, int) for v in values),
               f"{OP}: {name} must be {groups} ints, one a head")
    expect(all(p > 0 for p in attrs["primes"]), f"{OP}: primes must be positive")
    expect(ids.rank == 2 and not ids.dtype.is_float, f"{OP}: input_ids must be integer [B, T], got "
                                                     f"{ids.dtype} {dims.format_shape(ids.shape)}")
    if mask is not None:
        expect(mask.rank == 2 and same_dims(mask.shape[0], ids.shape[0]),
               f"{OP}: attention_mask must be [B, P+T], got {dims.format_shape(mask.shape)}")
    out = [TensorType(DType.i64, (ids.shape[0], ids.shape[1], groups))]
    if past is not None:
        want = (ids.shape[0], len(multipliers) - 1)
        expect(past.dtype.is_float and past.rank == 2 and same_dims(past.shape[0], want[0])
               and past.shape[1] == want[1],
               f"{OP}: past_state must be float [B, {want[1]}], got {past.dtype} {dims.format_shape(past.shape)}")
        out.append(TensorType(past.dtype, want))
    return out


def _reference(inputs, attrs):
    """The hashed ids and, with a past state, the present one (module docstring)."""
    ops = by_name(OPERANDS, inputs)
    ids, present = ngram_hash(**ops, **attrs)
    return [ids] + ([] if ops["past_state"] is None else [present.astype(ops["past_state"].dtype)])


register(OpDef(OP, OPERANDS, ATTRS, _infer, _reference, elementwise_cost))

__all__ = ["OP", "OPERANDS", "ngram_hash"]
