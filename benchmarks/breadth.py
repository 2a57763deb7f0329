"""Breadth: every decoder family, tool by tool, on the same tiny random twins. Prints one
table; asserts nothing.

The attention families' twins are ``tests/frontends/test_hf_models.py``'s ``CASES`` (one per
model_type unless ``--all``), and ``REFUSED`` adds a twin of each family irc does not build
yet, so that every peer's result shows beside irc's refusal. Each tool is held to
transformers as ``benchmarks/ssm_families.py`` holds it (that script's ``table``: the
reference interpreter, both ONNX targets, genai on irc's folder, mobius-onnx 0.1.0 and the
genai builder 0.18 on a left-padded batch of two and 16 greedy tokens); a cell says ``exact``,
``wrong (error)`` or ``refused: <its error>``. The recurrent families are
``benchmarks/ssm_families.py``'s own table.

    python benchmarks/breadth.py [--only NAME,NAME] [--all]
    python benchmarks/breadth.py --census    # every type of the mapping, one line each
                                              # (benchmarks/breadth_census.py)
"""
from __future__ import annotations

import argparse
import os
import sys

from common import ROOT
sys.path.insert(0, os.path.join(ROOT, "tests", "frontends"))

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
REFUSED = {  # families irc does not build yet: name -> (config class, overrides of SMALL)
}


class Refused:
    """``build_case`` for the ``REFUSED`` twins, as the tests build theirs."""

    @staticmethod
    def build_case(name: str, folder):
        import transformers
        from test_hf_models import randomize

        class_name, overrides = REFUSED[name]
        config = getattr(transformers, class_name)(**{**SMALL, **overrides})
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        randomize(model, seed=sorted(REFUSED).index(name), norm_centre=1.0)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        model.save_pretrained(folder)
        return model, folder


def cases(everything: bool) -> dict:
    """name -> (module with ``build_case``, the name there)."""
    import test_hf_models

    found, seen = {}, set()
    for name, (class_name, _) in sorted(test_hf_models.CASES.items()):
        if everything or class_name not in seen:
            found[name] = (test_hf_models, name)
            seen.add(class_name)
    found.update({name: (Refused, name) for name in REFUSED})
    import test_hf_gemma4  # Gemma-4's twins (its own module: per-layer shapes, the multimodal layout)

    for name in sorted(test_hf_gemma4.CASES) if everything else ["gemma4-ple-kv-shared-wide"]:
        found[name] = (test_hf_gemma4, name)
    import test_hf_gemma3n  # Gemma-3n's twins (AltUp, LAuReL, per-layer inputs, KV sharing, sparsity)

    for name in sorted(test_hf_gemma3n.CASES) if everything else ["gemma3n-shared-sparse"]:
        found[name] = (test_hf_gemma3n, name)
    import test_hf_phimoe  # Phi-3.5-MoE's twins (sparsemixer routing, biases, Phi-MoE's LongRoPE)

    for name in sorted(test_hf_phimoe.CASES) if everything else ["phimoe-biases-window-wide-mixer"]:
        found[name] = (test_hf_phimoe, name)
    return found


def main() -> None:
    from benchmarks.ssm_families import table

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated twin names")
    parser.add_argument("--all", action="store_true", help="every twin, not one per model_type")
    parser.add_argument("--census", action="store_true",
                        help="every type of transformers' causal-LM mapping: registered, refused or out of scope")
    args = parser.parse_args()
    if args.census:
        from benchmarks.breadth_census import census
        census()
        return
    table(cases(args.all), args.only)


if __name__ == "__main__":
    main()
