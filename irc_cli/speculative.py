"""Speculative greedy decoding for ``irc run --speculative``: a drafter proposes up to k
tokens, one call of the model checks them all, and the answer is token for token the plain
greedy one.

Each step feeds the last chosen token and the draft d_1..d_k (k + 1 positions past the
cache). The model's greedy choices g_0..g_k at those positions decide: the draft is kept
while d_i = g_{i-1}; after the a kept tokens comes g_a, the model's own next token, so every
step yields a + 1 tokens for one call, and each of them is the token plain greedy decoding
would have chosen there (causal attention: a position's logits never see the positions after
it).

The model must return every position's logits: a folder compiled with ``--logits all`` (the
default ``last`` keeps the last row only, and is refused here with that hint).

Rollback: the cache then holds k + 1 new positions of which a + 1 were kept. A growing cache
(an input whose past axis was empty at the start: KV caches, MLA latents, index keys) is cut
back along that axis. A fixed-size recurrent state (Mamba, DeltaNet, short convolutions,
RWKV, ...) has taken the rejected tokens in and cannot be cut: the step runs again from the
caches and states it started from, over the kept a + 1 tokens only (one more call, only on a
step whose draft was not kept whole).

Drafters:

- ``ngram`` (prompt lookup, no weights, any model): the tokens that followed the most recent
  earlier occurrence of the sequence's last n tokens, n = 3, then 2, then 1; no occurrence,
  no draft (the step is a plain greedy step).
- ``mtp``: the checkpoint's multi-token-prediction head (``irc_cli.speculative_mtp``), fed the
  decoder's hidden states of the positions it keeps (``observe``).
- ``draft=PATH``: a smaller model with the same tokenizer (a spec in the reference
  interpreter or a compiled folder in onnxruntime) drafts greedily with its own caches
  (``DraftModel``), rolled back the same way.

k adapts: it starts at ``k`` (the most a draft may hold), falls to the kept length + 1 after a
rejection and doubles after a draft kept whole, so a drafter that keeps missing costs little
more than plain decoding.

The report (``Result.speculation``): the drafter, the most tokens a draft held, tokens
proposed and kept, the acceptance rate, a histogram of kept lengths per checking call, the
model calls and the reruns.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import numpy as np

from irc.errors import IRCError

DRAFTERS = ("ngram", "draft", "mtp")
DEFAULT_K = 4
MAX_K = 16
NGRAM_SIZES = (3, 2, 1)


def parse(text: str) -> tuple:
    """``ngram[=K]``, ``mtp[=K]`` or ``draft=PATH`` -> (drafter, k, draft model path or None)."""
    name, _, k = text.partition("=")
    if name not in DRAFTERS:
        raise IRCError(f"--speculative {text!r}: the drafters are ngram (ngram=K: at most K tokens a draft), "
                       "mtp (the checkpoint's multi-token-prediction head; mtp=K) and draft=PATH (a smaller "
                       "model with the same tokenizer: a spec or a compiled folder)",
                       hint="--speculative ngram, --speculative mtp=2 or --speculative draft=small/")
    if name == "draft":
        if not k:
            raise IRCError("--speculative draft=PATH: name the draft model (a spec or a folder irc compile wrote)")
        return name, DEFAULT_K, k
    if not k:
        return name, DEFAULT_K, None
    if not k.isdigit() or not 1 <= int(k) <= MAX_K:
        raise IRCError(f"--speculative {text!r}: K must be a whole number from 1 to {MAX_K}")
    return name, int(k), None


def ngram_draft(sequence: list, k: int, sizes: tuple = NGRAM_SIZES) -> list:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the last n
    tokens of ``sequence`` (n from ``sizes``, longest first); [] where none occurs."""
    for n in sizes:
        if len(sequence) <= n:
            continue
        tail = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):
            if sequence[start:start + n] == tail:
                return list(sequence[start + n:start + n + k])
    return []


class DraftModel:
    """A smaller model drafting greedily with its own caches (``step(feeds) -> outputs`` and
    its empty ``caches``). It remembers the tokens its caches hold; before each draft it keeps
    the longest prefix the answer still shares (growing caches cut back; fixed-size states
    restored to the start of the last draft, whose tokens the answer holds) and feeds the rest."""

    def __init__(self, step: Callable, caches: dict):
        self.step, self.caches, self.tokens = step, dict(caches), []
        self.growing = growing_axes(caches)
        self.states = len(self.growing) < len(caches)
        self.saved = (self.caches, self.tokens)

    def __call__(self, sequence: list, k: int) -> list:
        shared = next((i for i, (a, b) in enumerate(zip(self.tokens, sequence)) if a != b),
                      min(len(self.tokens), len(sequence)))
        if shared < len(self.tokens):
            if self.states:
                self.caches, self.tokens = self.saved
            else:
                self.caches = keep_first(self.caches, self.growing, shared)
                self.tokens = self.tokens[:shared]
        self.saved = (self.caches, self.tokens)
        draft, feed = [], list(sequence[len(self.tokens):])
        for _ in range(k):
            past = len(self.tokens)
            outputs = self.step({"input_ids": np.asarray([feed], np.int64),
                                 "attention_mask": np.ones((1, past + len(feed)), np.int64),
                                 "position_ids": np.arange(past, past + len(feed), dtype=np.int64)[None, :],
                                 **self.caches})
            self.caches = cut(self.caches, outputs, self.growing, past + len(feed))
            self.tokens = self.tokens + feed
            feed = [int(np.argmax(outputs["logits"][0, -1]))]
            draft.append(feed[0])
        return draft


def growing_axes(caches: dict) -> dict:
    """name -> past axis of each cache that is empty at the start (KV caches, latents); the
    others are fixed-size states."""
    return {name: list(array.shape).index(0) for name, array in caches.items() if 0 in array.shape}


def keep_first(caches: dict, growing: dict, keep: int) -> dict:
    """The growing caches cut to their first ``keep`` positions, the states as they are."""
    return {name: array if name not in growing else np.take(array, np.arange(keep), axis=growing[name])
            for name, array in caches.items()}


def cut(caches: dict, outputs: dict, growing: dict, keep: int) -> dict:
    """Each ``present.*`` fed back as its ``past_key_values.*``, a growing cache cut to
    ``keep`` positions along its past axis (``growing``: name -> axis)."""
    fed = {}
    for name in caches:
        present = outputs["present." + name[len("past_key_values."):]]
        axis = growing.get(name)
        fed[name] = present if axis is None else np.take(present, np.arange(keep), axis=axis)
    return fed


def speculative_loop(step: Callable, caches: dict, prompt: list, max_new_tokens: int, eos: set, clock,
                     drafter: str = "ngram", k: int = DEFAULT_K, draft_model: Optional[DraftModel] = None,
                     positions: Optional[Callable] = None) -> tuple:
    """Greedy decoding through ``step(feeds) -> outputs`` with drafts checked a call at a time
    (module docstring): (tokens, last logits, report)."""
    if positions is not None:
        raise IRCError("--speculative: this model computes its own position ids (a multimodal decoder)",
                       hint="run it without --speculative")
    growing = growing_axes(caches)
    states = [name for name in caches if name not in growing]
    report = {"drafter": drafter, "k": k, "proposed": 0, "accepted": 0, "model_calls": 0, "reruns": 0}
    kept_lengths: Counter = Counter()

    def call(ids: list, past: int, fed: dict) -> dict:
        report["model_calls"] += 1
        feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, past + len(ids)), np.int64),
                 "position_ids": np.arange(past, past + len(ids), dtype=np.int64)[None, :], **fed}
        return step(feeds)

    clock.start()
    outputs = call(list(prompt), 0, caches)
    if len(prompt) > 1 and outputs["logits"].shape[1] != len(prompt):
        raise IRCError("--speculative checks a draft with the logits of every position it feeds, but this model "
                       "returns the last position's only (the last-logits pass of a compiled folder)",
                       hint="compile the folder with --logits all")
    past, tokens, budget = len(prompt), [], k
    caches = cut(caches, outputs, growing, past)
    observe = getattr(draft_model, "observe", None)  # an MTP head reads the decoder's hidden states
    if observe:
        observe(outputs, past)
    last = outputs["logits"][0, -1]
    token = int(np.argmax(last))
    while True:
        tokens.append(token)
        clock.token(token)
        if token in eos or len(tokens) >= max_new_tokens:
            break
        propose = ngram_draft if draft_model is None else draft_model
        draft = propose(list(prompt) + tokens, min(budget, max_new_tokens - len(tokens)))
        outputs = call([token] + draft, past, caches)
        choices = [int(c) for c in np.argmax(outputs["logits"][0], axis=-1)]
        kept = next((i for i, (d, c) in enumerate(zip(draft, choices)) if d != c), len(draft))
        if draft:
            report["proposed"] += len(draft)
            report["accepted"] += kept
            kept_lengths[kept] += 1
            budget = min(k, 2 * budget) if kept == len(draft) else max(1, kept + 1)
        if kept < len(draft) and states:  # the states took the rejected tokens in: run the kept ones again
            report["reruns"] += 1
            outputs = call([token] + draft[:kept], past, caches)
        caches = cut(caches, outputs, growing, past + kept + 1)
        past += kept + 1
        if observe:
            observe(outputs, kept + 1)
        for position, accepted in enumerate(draft[:kept]):  # position j's logits chose draft[j]
            tokens.append(accepted)
            clock.token(accepted)
            if accepted in eos or len(tokens) >= max_new_tokens:
                return tokens, outputs["logits"][0, position], _finish(report, kept_lengths)
        token, last = choices[kept], outputs["logits"][0, kept]
    return tokens, last, _finish(report, kept_lengths)


def _finish(report: dict, kept_lengths: Counter) -> dict:
    report["acceptance_rate"] = round(report["accepted"] / report["proposed"], 4) if report["proposed"] else None
    report["kept_lengths"] = {str(n): kept_lengths[n] for n in sorted(kept_lengths)}
    return report


__all__ = ["DEFAULT_K", "DRAFTERS", "DraftModel", "MAX_K", "cut", "growing_axes", "keep_first", "ngram_draft", "parse",
           "speculative_loop"]
