"""Every type of transformers' causal-LM mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), one
line each: whether irc registers it (a family row: ``frontends.hf.families.FAMILIES``, or a VLM
row: ``frontends.hf.vlm.FAMILY``), the tiny twins that hold it against transformers (the
``CASES`` of ``tests/frontends/test_hf_*.py``; ``benchmarks/breadth.py`` runs them with the
peers), or the first line of irc's refusal of a one-key config.json (``{"model_type": T}``);
encoder-only and encoder-decoder types are out of the issue's scope and say which group.
Prints a table and the counts; asserts nothing.

    python benchmarks/breadth.py --census
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWIN_MODULES = ("test_hf_models", "test_hf_ssm", "test_hf_vlm", "test_hf_qwen_vl", "test_hf_gemma4", "test_hf_gemma3n",
                "test_hf_phimoe", "test_hf_delta", "test_hf_hybrid", "test_hf_kimi", "test_hf_lfm2", "test_hf_minimax",
                "test_hf_gpt_oss", "test_hf_mllama", "test_hf_mistral3", "test_hf_llava_next", "test_hf_llama4",
                "test_hf_rwkv", "test_hf_recurrent_gemma", "test_hf_hybrid2", "test_hf_xlstm", "test_hf_loops",
                "test_hf_qwen4", "test_hf_dsa", "test_hf_deepseek_v32", "test_hf_kolibri",
                "test_hf_deepseek_v4")
MODULE_TYPES = {  # twin modules whose CASES do not name a config class: the types they build
    "test_hf_gpt_oss": ("gpt_oss",), "test_hf_gemma3n": ("gemma3n", "gemma3n_text"), "test_hf_kimi": ("kimi_linear",),
    "test_hf_minimax": ("minimax",), "test_hf_phimoe": ("phimoe",), "test_hf_mllama": ("mllama",),
    "test_hf_llama4": ("llama4",), "test_hf_deepseek_v32": ("deepseek_v32",), "test_hf_rwkv": ("rwkv",), "test_hf_recurrent_gemma": ("recurrent_gemma",),
    "test_hf_xlstm": ("xlstm",),
    "test_hf_gemma4": ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"),
    "test_hf_qwen_vl": ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"),
}
OUT_OF_SCOPE = {  # the "not in this issue" groups
    "encoder with a causal head": ("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra",
                                   "ernie", "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert",
                                   "roformer", "xlm", "xlm-roberta", "xlm-roberta-xl", "xlnet", "xmod", "reformer"),
    "encoder-decoder": ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                        "pegasus", "plbart", "prophetnet", "trocr", "whisper", "musicgen", "musicgen_melody"),
    "multimodal composite": ("fuyu", "git", "got_ocr2", "emu3", "phi4_multimodal", "moshi", "moss_transcribe_diarize",
                             "dots3_note"),
}


def twins() -> dict:
    """model_type -> the twin names that build it (a CASES entry's config class's type)."""
    import transformers

    sys.path.insert(0, str(ROOT / "tests" / "frontends"))
    found: dict = {}
    for module_name in TWIN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cases = getattr(module, "CASES", {})
        for model_type in MODULE_TYPES.get(module_name, ()):
            found.setdefault(model_type, []).extend([f"{module_name}:{name}" for name in cases] or [module_name])
        if module_name in MODULE_TYPES:
            continue
        for name, entry in cases.items():
            strings = [part for part in entry if isinstance(part, str)] if isinstance(entry, tuple) else []
            class_name = next((part for part in strings if part.endswith("Config")), None)
            config_class = getattr(transformers, class_name, None) if class_name else None
            model_type = getattr(config_class, "model_type", None) or getattr(entry, "model_type", None)
            if model_type:
                found.setdefault(model_type, []).append(name)
    return found


def refusal(model_type: str) -> str:
    """The first line of irc's error on a config.json holding only this model_type."""
    from frontends import load_spec

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "config.json").write_text(json.dumps({"model_type": model_type}))
        try:
            load_spec(folder)
        except Exception as err:  # noqa: BLE001 (a census: any refusal is reported as it reads)
            lines = str(err).replace(folder + os.sep, "").replace(folder, "").splitlines()
            why = next((line.strip()[len("hint: "):] for line in lines if line.strip().startswith("hint: ")
                        and "supported model types" not in line), None)
            return lines[0] + (f" ({why})" if why else "")
    return "(builds from the defaults alone)"


def census() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as MAPPING

    from frontends.hf.families import FAMILIES
    from frontends.hf.vlm import FAMILY as VLM

    from frontends.hf.index import module_of

    by_type, scope = twins(), {t: group for group, types in OUT_OF_SCOPE.items() for t in types}
    where = {**module_of(), **{t: "vlm" for t in VLM}}
    counts = {"irc registers it": 0, "refused": 0, "not in scope": 0}
    print("| model_type | irc | twins held against transformers |")
    print("|---|---|---|")
    for model_type in sorted(MAPPING):
        names = by_type.get(model_type, [])
        if model_type in FAMILIES or model_type in VLM:
            status, key = f"registers it ({where.get(model_type, 'families')}" + (")" if names else "; no twin)"), \
                "irc registers it"
        elif model_type in scope:
            status, key = f"not in scope: {scope[model_type]}", "not in scope"
        else:
            status, key = f"refused: {refusal(model_type)}", "refused"
        counts[key] += 1
        print(f"| {model_type} | {status} | {', '.join(sorted(names)[:3])}{' ...' if len(names) > 3 else ''} |")
    print(f"\n{len(MAPPING)} types: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
