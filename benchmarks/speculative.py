"""Speculative decoding against plain greedy decoding on one compiled folder, in the same run:
median decode tokens/s over interleaved rounds, the ratio, the drafter's acceptance and calls,
and a check that every run gives the same tokens.

    python benchmarks/speculative.py FOLDER [--rounds 5] [--new 96] [--k 4,8]

FOLDER is an ``irc compile ... --logits all`` folder with its tokenizer (a draft is checked
with every position's logits). Two prompts are input-grounded tasks, where prompt lookup has
text to copy (editing code, repeating a passage), two are open questions, where it has
little; the chat template lays them out. Beside irc's loop over onnxruntime (plain, and
``ngram=K``), onnxruntime-genai 0.18 on the same folder: its plain greedy generator and its
own n-gram drafting (``set_speculative_options(ngram_size=3, max_draft_tokens=K)``), with
genai's statistics; genai stops at the folder's eos, so its token counts can differ.
"""
from __future__ import annotations

import argparse
import statistics

import common  # noqa: E402,F401  (puts the repository on sys.path)

OPEN = {"story": "Write a short story about a robot who learns to paint.",
        "explain": "Explain in a few sentences why the sky is blue."}
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


def run_genai(folder, prompt, new, k):
    """genai's greedy loop on the folder, n-gram drafting up to ``k`` tokens (None: plain)."""
    import time

    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new, do_sample=False)
    if k is not None:
        params.set_speculative_options(ngram_size=3, max_draft_tokens=k)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, np.int32))
    stamps = []
    while not generator.is_done() and len(stamps) < new:
        generator.generate_next_token()
        stamps += [time.perf_counter()] * (len(generator.get_sequence(0)) - len(prompt) - len(stamps))
    tokens = [int(t) for t in generator.get_sequence(0)[len(prompt):]]
    stats = generator.get_speculative_stats() if k is not None else {}
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else float("nan")
    accepted, proposed = stats.get("draft_tokens_accepted"), stats.get("draft_tokens_proposed")
    report = {"acceptance_rate": round(accepted / proposed, 4) if proposed else None,
              "model_calls": stats.get("target_forward_passes")} if stats else None
    return tokens, rate, report


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
    ks = [int(k) for k in args.k.split(",")]
    modes = [None] + [("ngram", k) for k in ks] + [("genai", None)] + [("genai ngram", k) for k in ks]
    print("| prompt | mode | new tokens | median tok/s | vs plain | acceptance | calls | reruns | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, task in {**PROMPTS, **OPEN}.items():
        prompt = text.encode(text.chat(task), special=False)
        rates, reports, answers = {m: [] for m in modes}, {}, {}
        for _ in range(args.rounds):
            for mode in modes:  # interleaved rounds: the machine's drift falls on every mode alike
                if mode is not None and mode[0].startswith("genai"):
                    tokens, rate, report = run_genai(args.folder, prompt, args.new, mode[1])
                else:
                    tokens, rate, report = run_once(args.folder, prompt, args.new, eos, mode)
                rates[mode].append(rate)
                reports[mode] = report
                answers.setdefault(mode, tokens)
                assert tokens == answers[mode], "a mode gave different tokens on another round"
        plain = statistics.median(rates[None])
        for mode in modes:
            report = reports[mode] or {}
            label = "plain" if mode is None else mode[0] if mode[1] is None else f"{mode[0]}={mode[1]}"
            median = statistics.median(rates[mode])
            same = answers[mode] == answers[None][:len(answers[mode])]  # genai may stop earlier, at eos
            print(f"| {name}{' (open)' if name in OPEN else ''} | {label} | {len(answers[mode])} | {median:.1f} | {median / plain:.2f}x | "
                  f"{report.get('acceptance_rate', '')} | {report.get('model_calls', '')} | "
                  f"{report.get('reruns', '')} | {same} |")


if __name__ == "__main__":
    main()
