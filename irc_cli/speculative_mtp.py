"""``irc run --speculative mtp[=K]``: the checkpoint's multi-token-prediction head drafts
(``frontends.hf.mtp``: a folder compiled with ``--mtp`` holds it as ``mtp.onnx``; a spec, as
its graph's ``parts["mtp"]``).

The head's call at position j takes the token there, t_j, and the decoder's last hidden state
at j - 1, h_{j-1}, and its logits choose the token after t_j; its own KV cache holds one entry
per position from 1 on. The decoder has run positions 0..p-1 (``observe`` hands the drafter the
hidden states of every position the decoder keeps) and chosen t_p:

- catch up: the positions whose t_j and h_{j-1} are both known and not yet in the head's
  cache (c+1..p, c the entries it holds) go in one call, and the last row's argmax is d_{p+1};
- chain: d_{i+1} comes from d_i at position p+i with the head's own next hidden state
  (``hidden_states_out``) for h: k - 1 calls of one token.

Before the next draft the chained entries, made of drafts and the head's hidden states rather
than the decoder's, are cut off (the cache is only KV caches: a head with a recurrent state is
refused), and the catch-up feeds the tokens the decoder has kept since with its hidden states.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from irc.errors import IRCError
from irc_cli.speculative import cut, growing_axes, keep_first

MTP_FILE = "mtp.onnx"  # the head's file beside the decoder: backends.onnx.mtp.MTP_FILE (not imported: onnx)
HIDDEN, NEXT_HIDDEN = "hidden_states", "hidden_states_out"


class MtpDrafter:
    """The head's drafting loop (module docstring) over ``step(feeds) -> outputs`` and its empty
    ``caches``."""

    def __init__(self, step: Callable, caches: dict):
        self.step, self.caches = step, dict(caches)
        self.growing = growing_axes(caches)
        if len(self.growing) < len(caches):
            raise IRCError("--speculative mtp: this head keeps a recurrent state, which its drafts cannot roll back")
        self.held = 0  # cache entries made of kept tokens and the decoder's hidden states: positions 1..held
        self.hidden = []  # the decoder's hidden states at positions held.., not yet fed
        self.seen = 0  # positions the decoder has run and kept

    def observe(self, outputs: dict, kept: int) -> None:
        """The decoder's call kept its first ``kept`` positions: their hidden states."""
        if HIDDEN not in outputs:
            raise IRCError("--speculative mtp: the decoder does not return its hidden states",
                           hint="compile the folder with --mtp (it writes mtp.onnx and the decoder's hidden_states)")
        self.hidden.extend(np.asarray(outputs[HIDDEN])[0, :kept])
        self.seen += kept

    def __call__(self, sequence: list, k: int) -> list:
        past = self.seen
        assert len(sequence) == past + 1, "the decoder has chosen the token after the positions it ran"
        self.caches = keep_first(self.caches, self.growing, self.held)
        ids = sequence[self.held + 1:past + 1]
        outputs = self._call(ids, np.stack(self.hidden)[None], self.held)
        self.held, self.hidden = past, []
        draft = []
        for i in range(k):
            draft.append(int(np.argmax(outputs["logits"][0, -1])))
            if i + 1 < k:
                outputs = self._call([draft[-1]], np.asarray(outputs[NEXT_HIDDEN])[:, -1:], past + i)
        return draft

    def _call(self, ids: list, hidden: np.ndarray, past: int) -> dict:
        outputs = self.step({"input_ids": np.asarray([ids], np.int64),
                             "attention_mask": np.ones((1, past + len(ids)), np.int64),
                             "position_ids": np.arange(past + 1, past + 1 + len(ids), dtype=np.int64)[None, :],
                             HIDDEN: hidden, **self.caches})
        self.caches = cut(self.caches, outputs, self.growing, past + len(ids))
        return outputs


def keep_head(graph, wanted: bool, target: str, where: str) -> list:
    """``irc compile --mtp``: keep the head (``parts["mtp"]``) and make the decoder return its
    hidden states; without it, leave the head out (and say so). Lines for the compile's report."""
    from frontends.hf.mtp import PART, drop_head, return_hidden
    from irc.analysis import analyze

    if PART not in graph.parts:
        if wanted:
            raise IRCError("--mtp: this model has no multi-token-prediction head", location=where,
                           hint="config.json declares none, or its checkpoint does not hold it")
        return []
    if not wanted:
        params = analyze(graph.parts[PART])["params_total"]
        drop_head(graph)
        return [f"the checkpoint's multi-token-prediction head ({params:,} parameters) is not written: --mtp writes "
                f"it beside the decoder for irc run --speculative mtp"]
    if target not in ("onnx", "onnx-ort", "ir"):
        raise IRCError(f"--mtp writes a second model, {MTP_FILE}, and --target {target} writes one",
                       hint="use --target onnx or onnx-ort")
    return_hidden(graph)
    return []


def mtp_summary(head, context: int, cache_dtype) -> dict:
    """``irc show``'s account of an MTP head: ``irc.analysis.analyze`` of its graph, and
    ``params_own``, its parameters less the embedding and LM head it shares with the decoder."""
    from irc.analysis import analyze

    summary = analyze(head, context=context, cache_dtype=cache_dtype)
    shared = sum(p.numel for name, p in head.params.items() if name in ("embed", "lm_head"))
    return {**summary, "params_own": summary["params_total"] - shared}


def prepare_graph(graph, where: str) -> None:
    """A spec run with ``--speculative mtp``: the decoder returns its hidden states; one
    message where the model has no head."""
    from frontends.hf.mtp import PART, return_hidden

    if PART not in graph.parts:
        raise IRCError("--speculative mtp: this model has no multi-token-prediction head", location=where,
                       hint="config.json declares none, or its checkpoint does not hold it: draft with "
                            "--speculative ngram or draft=PATH")
    return_hidden(graph)


__all__ = ["MTP_FILE", "MtpDrafter", "keep_head", "mtp_summary", "prepare_graph"]
