"""What checking a draft costs against k, on twins with a multi-token-prediction head at real
widths (random weights: the time of a call does not depend on them), compiled by irc to
onnx-ort folders with ``--logits all --mtp`` and run in onnxruntime (2 threads):

- verify: one decoder call over 1 + k new tokens after a past of P tokens, against a plain
  one-token step (the ratio is what a draft of k must beat: a kept draft of a tokens yields
  a + 1 tokens for that call);
- rerun: a hybrid's fixed-size states (DeltaNet, convolutions) took the rejected tokens in, so
  a cut draft runs the kept ones again (``irc_cli.speculative``): that second call's cost;
- head: the MTP head's catch-up call (a + 1 positions) and one chained step.

    python benchmarks/verify_cost.py [--rounds 7] [--past 256] [--k 1,2,4,8] [--cases qwen3.5,deepseek]

Medians of interleaved rounds; milliseconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from common import seconds  # noqa: E402

import numpy as np  # noqa: E402

WIDE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
            num_key_value_heads=4, head_dim=64, max_position_embeddings=4096)
CASES = {  # name: (twin case of tests.frontends.mtp_twins, settings at real widths, form)
    "qwen3.5": ("Qwen3_5TextConfig", dict(WIDE, num_hidden_layers=8, linear_num_key_heads=8,
                                          linear_num_value_heads=16, linear_key_head_dim=64,
                                          linear_value_head_dim=64,
                                          layer_types=["linear_attention"] * 3 + ["full_attention"]
                                          + ["linear_attention"] * 3 + ["full_attention"],
                                          mtp_layer_types=["full_attention"]), "qwen"),
    "deepseek": ("DeepseekV3Config", dict(WIDE, num_hidden_layers=8, num_key_value_heads=16, q_lora_rank=384,
                                          kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                                          v_head_dim=64, n_routed_experts=16, num_experts_per_tok=4,
                                          moe_intermediate_size=512, first_k_dense_replace=1, n_group=1,
                                          topk_group=1), "deepseek"),
}


def compile_twin(name: str, root: str) -> str:
    from irc_cli import main as irc
    from tests.frontends import mtp_twins

    mtp_twins.CASES[name] = CASES[name]
    folder = os.path.join(root, name)
    mtp_twins.build_mtp_twin(name, folder)
    out = os.path.join(root, name + "-onnx")
    assert irc(["compile", folder, "--target", "onnx-ort", "--logits", "all", "--mtp", "-o",
                os.path.join(out, "model.onnx"), "--quiet"]) == 0
    return out


def sessions(folder: str):
    from backends.onnx.runtime import ort_session
    from irc_cli.engines import session_caches, session_step

    found = {}
    for role, file in (("decoder", "model.onnx"), ("head", "mtp.onnx")):
        session = ort_session(os.path.join(folder, file), threads=2)
        found[role] = (session_step(session), session_caches(session, folder))
    return found


def grown(step, caches: dict, past: int, d: int, head: bool) -> dict:
    """The caches after a prefill of ``past`` tokens (states after them)."""
    feeds = inputs(list(range(1, past + 1)), 0, caches, d, head)
    out = step(feeds)
    return {name: out["present." + name[len("past_key_values."):]] for name in caches}


def inputs(ids: list, past: int, caches: dict, d: int, head: bool) -> dict:
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, past + len(ids)), np.int64),
             "position_ids": np.arange(past, past + len(ids), dtype=np.int64)[None], **caches}
    if head:
        feeds["hidden_states"] = np.random.default_rng(0).standard_normal((1, len(ids), d)).astype(np.float32)
    return feeds


def timed(step, feeds) -> float:
    """Milliseconds of one call."""
    return seconds(lambda: step(feeds)) * 1e3


def measure(folder: str, d: int, past: int, ks: list, rounds: int) -> dict:
    found = sessions(folder)
    decoder, head = found["decoder"], found["head"]
    decoder_past = grown(*decoder, past, d, False)
    head_past = grown(*head, past - 1, d, True)
    cells = {("step", 0): [], ("head step", 0): []}
    cells.update({(kind, k): [] for k in ks for kind in ("verify", "rerun", "head catch-up")})
    for _ in range(rounds):  # interleaved: every cell once a round
        cells[("step", 0)].append(timed(decoder[0], inputs([7], past, decoder_past, d, False)))
        cells[("head step", 0)].append(timed(head[0], inputs([7], past - 1, head_past, d, True)))
        for k in ks:
            cells[("verify", k)].append(timed(decoder[0], inputs([7] * (k + 1), past, decoder_past, d, False)))
            cells[("rerun", k)].append(timed(decoder[0], inputs([7] * k, past, decoder_past, d, False)))
            cells[("head catch-up", k)].append(timed(head[0], inputs([7] * (k + 1), past - 1, head_past, d, True)))
    return {key: statistics.median(values) for key, values in cells.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--past", type=int, default=256)
    parser.add_argument("--k", default="1,2,4,8")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    print(f"decoder call over 1 + k tokens after {args.past} past tokens, against a one-token step; the MTP "
          f"head's catch-up over k + 1 positions and its chained step (ms, medians of {args.rounds} rounds, "
          "onnxruntime, 2 threads)")
    print(f"{'model':<10} {'k':>3} {'step':>8} {'verify':>8} {'verify/step':>11} {'rerun (hybrid)':>14} "
          f"{'head step':>9} {'head catch-up':>13}")
    with tempfile.TemporaryDirectory() as root:
        for name in args.cases.split(","):
            folder = compile_twin(name, root)
            hybrid = "linear_attention" in str(CASES[name][1].get("layer_types", ""))
            times = measure(folder, CASES[name][1]["hidden_size"], args.past, ks, args.rounds)
            step = times[("step", 0)]
            for k in ks:
                verify = times[("verify", k)]
                rerun = f"{times[('rerun', k)]:.2f}" if hybrid else "-"
                print(f"{name:<10} {k:>3} {step:>8.2f} {verify:>8.2f} {verify / step:>11.2f} {rerun:>14} "
                      f"{times[('head step', 0)]:>9.2f} {times[('head catch-up', k)]:>13.2f}")
    print("rerun: a cut draft on a hybrid runs the kept tokens again, at most a k-token call (shown: the call over "
          "k tokens); attention-only models cut their caches and rerun nothing.")


if __name__ == "__main__":
    main()
