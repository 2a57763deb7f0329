"""Speculative decoding against plain greedy decoding on one compiled folder, in the same run:
median decode tokens/s over interleaved rounds, the ratio, the drafter's acceptance and calls,
and a check that every run gives the same tokens.

    python benchmarks/speculative.py FOLDER [--rounds 5] [--new 96] [--k 4,8]

FOLDER is an ``irc compile ... --logits all`` folder with its tokenizer (a draft is checked
with every position's logits). The prompts are input-grounded tasks, where prompt lookup
has text to copy (editing code, repeating a passage); the chat template lays them out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPTS = {
    "rename": "Rewrite this code with the variable x renamed to count, and nothing else changed:\n"
              "def total(x):\n    x = x + 1\n    x = x * 2\n    if x > 10:\n        x = x - 10\n    return x + x\n",
    "repeat": "Repeat this passage word for word: The committee met on Tuesday to review the budget. The budget "
              "was approved after a long discussion about the costs of the new library and the repairs to the "
              "old school building.",
}


class Clock:
    speculation = None

    def __init__(self):
        self.stamps = []

    def start(self):
        import time
        self.started = time.perf_counter()

    def token(self, token):
        import time
        self.stamps.append(time.perf_counter())


def run_once(folder, prompt, new, eos, speculative):
    from irc_cli import engines

    clock = Clock()
    result = engines.onnxruntime(folder, prompt, new, eos, clock, speculative=speculative)
    decode = clock.stamps[-1] - clock.stamps[0] if len(clock.stamps) > 1 else float("nan")
    return result.tokens, (len(clock.stamps) - 1) / decode, clock.speculation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--k", default="4,8")
    args = parser.parse_args()
    from irc_cli import engines
    from irc_cli.text import find_text

    text = find_text(args.folder)
    eos, _ = engines.folder_limits(args.folder)
    modes = [None] + [("ngram", int(k)) for k in args.k.split(",")]
    print("| prompt | mode | new tokens | median tok/s | vs plain | acceptance | calls | reruns | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, task in PROMPTS.items():
        prompt = text.encode(text.chat(task), special=False)
        rates, reports, answers = {m: [] for m in modes}, {}, {}
        for _ in range(args.rounds):
            for mode in modes:  # interleaved rounds: the machine's drift falls on every mode alike
                tokens, rate, report = run_once(args.folder, prompt, args.new, eos, mode)
                rates[mode].append(rate)
                reports[mode] = report
                answers.setdefault(mode, tokens)
                assert tokens == answers[mode], "a mode gave different tokens on another round"
        plain = statistics.median(rates[None])
        for mode in modes:
            report = reports[mode] or {}
            label = "plain" if mode is None else f"{mode[0]}={mode[1]}"
            median = statistics.median(rates[mode])
            print(f"| {name} | {label} | {len(answers[mode])} | {median:.1f} | {median / plain:.2f}x | "
                  f"{report.get('acceptance_rate', '')} | {report.get('model_calls', '')} | "
                  f"{report.get('reruns', '')} | {answers[mode] == answers[None]} |")


if __name__ == "__main__":
    main()
