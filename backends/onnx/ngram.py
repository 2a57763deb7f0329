"""Qwen4-Exp's hashed n-gram ids (``irc.ops.ngram.ngram_hash``) in ONNX, the same standard ops
for both targets: the call's padded tokens read as eos (Where over the mask's last T
columns), the history Concat(past tokens, tokens), each shift a Slice of it, the eos cut an
And of Not(Equal) over the shifts so far, then per order Mul / BitwiseXor (int64, wrapping as
torch's) and per head Mod (fmod 0: torch.remainder's sign) / Add. The present state is the
history's last C tokens + 1 as float (0 in the past state: no token, read as eos)."""
from __future__ import annotations

from onnx import TensorProto, helper

from irc.graph import Node
from irc.ops.ngram import OPERANDS
from irc.ops.registry import by_name

from backends.onnx.builder import INT64_MAX, Builder
from backends.onnx.ssm import _present, as_f32


def _tokens(b: Builder, o: dict, hint: str, eos: str) -> str:
    """The call's token ids [B, T] int64, padded ones as eos."""
    ids, mask = o["input_ids"], o["attention_mask"]
    x = b.value(ids)
    x = x if ids.dtype.text == "i64" else b.op("Cast", [x], f"{hint}/ids_i64", to=TensorProto.INT64)
    if mask is None:
        return x
    first = b.op("Sub", [b.dim(mask.shape[1]), b.dim(ids.shape[1])], f"{hint}/first_new_token")
    new = b.op("Slice", [b.value(mask), first, b.i64([INT64_MAX]), b.i64([1])], f"{hint}/new_tokens")
    real = b.op("Cast", [new], f"{hint}/real", to=TensorProto.BOOL)
    return b.op("Where", [real, x, eos], f"{hint}/ids_or_eos")


def _past(b: Builder, o: dict, hint: str, eos: str, eos_value: int, context: int) -> str:
    """The C tokens before the call [B, C] int64 (eos where none)."""
    if o["past_state"] is None:
        shape = b.shape((o["input_ids"].shape[0], context))
        return b.op("ConstantOfShape", [shape], f"{hint}/no_past",
                    value=helper.make_tensor("eos", TensorProto.INT64, [1], [eos_value]))
    stored = b.op("Cast", [b.op("Round", [as_f32(b, o["past_state"])], f"{hint}/past_round")], f"{hint}/past_i64",
                  to=TensorProto.INT64)
    some = b.op("Greater", [stored, b.i64(0, f"{hint}/zero")], f"{hint}/past_some")
    return b.op("Where", [some, b.op("Sub", [stored, b.i64(1, f"{hint}/one")], f"{hint}/past_ids"), eos],
                f"{hint}/past_or_eos")


def lower_ngram_hash(b: Builder, node: Node, outs: list[str]) -> None:
    """The ids [B, T, G] and the present state (module docstring)."""
    o, a, hint = by_name(OPERANDS, node.inputs), node.attrs, outs[0]
    context, heads = len(a["multipliers"]) - 1, a["heads_per_ngram"]
    eos = b.i64(a["eos"], f"{hint}/eos")
    history = b.op("Concat", [_past(b, o, hint, eos, a["eos"], context), _tokens(b, o, hint, eos)],
                   f"{hint}/history", axis=1)
    valid, mixed, parts = None, None, []
    for shift, multiplier in enumerate(a["multipliers"]):
        end = b.i64([-shift] if shift else [INT64_MAX])
        shifted = b.op("Slice", [history, b.i64([context - shift]), end, b.i64([1])], f"{hint}/shift{shift}")
        token = shifted
        if shift:
            kept = b.op("Not", [b.op("Equal", [shifted, eos], f"{hint}/eos{shift}")], f"{hint}/not_eos{shift}")
            valid = kept if valid is None else b.op("And", [valid, kept], f"{hint}/valid{shift}")
            token = b.op("Where", [valid, shifted, eos], f"{hint}/token{shift}")
        term = b.op("Mul", [token, b.i64(multiplier, f"{hint}/multiplier{shift}")], f"{hint}/term{shift}")
        mixed = term if mixed is None else b.op("BitwiseXor", [mixed, term], f"{hint}/mixed{shift}")
        if shift:
            heads_of = slice((shift - 1) * heads, shift * heads)
            wide = b.op("Unsqueeze", [mixed, b.i64([2])], f"{hint}/mixed_heads{shift}")
            rest = b.op("Mod", [wide, b.i64(list(a["primes"][heads_of]), f"{hint}/primes{shift}")],
                        f"{hint}/remainder{shift}", fmod=0)
            parts.append(b.op("Add", [rest, b.i64(list(a["offsets"][heads_of]), f"{hint}/offsets{shift}")],
                              f"{hint}/ids{shift}"))
    b.node("Concat", parts, [outs[0]], axis=2)
    if o["past_state"] is not None:
        last = b.op("Slice", [history, b.i64([-context]), b.i64([INT64_MAX]), b.i64([1])], f"{hint}/last_tokens")
        stored = b.op("Cast", [b.op("Add", [last, b.i64(1, f"{hint}/plus_one")], f"{hint}/stored_i64")],
                      f"{hint}/stored", to=TensorProto.FLOAT)
        _present(b, node, outs, stored)


LOWERINGS = {"ngram_hash": lower_ngram_hash}

__all__ = ["LOWERINGS", "lower_ngram_hash"]
