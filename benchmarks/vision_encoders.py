"""Image encoders: irc against transformers, exactness on tiny twins and time per image at the
checkpoint's size. Prints two tables; asserts nothing.

1. Exactness: every tiny twin of ``tests/frontends/test_hf_vision.py`` compiled by irc
   (``--target onnx`` and ``onnx-ort``) and run in ONNX Runtime, against transformers' base
   model on the same two images: ``exact`` (last_hidden_state and pooler_output within 1e-4
   relative), ``wrong (error)`` or ``refused: <error>``.
2. Time per image (batch 1, float32, 2 threads, median of interleaved rounds): the full-size
   examples (``examples/hf/clip-vit-large-patch14-336``, ``siglip-so400m-patch14-384``,
   ``dinov2-large``) with random weights, irc's onnx-ort model in ONNX Runtime against
   PyTorch eager (transformers' model), beside the patches, FLOPs per image and the KV-cache
   bytes the image's tokens would add per text layer of a Llama-3-8B-shaped decoder (8 KV
   heads of 128, bf16: 4 KiB a token a layer), the cost of prepending them.

    python benchmarks/vision_encoders.py [--rounds 5] [--layers N] [--only NAME]

``--layers N`` keeps N of each tower's layers (a quick run; FLOPs shrink with them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from common import ROOT, interleaved, seconds

sys.path.insert(0, os.path.join(ROOT, "tests", "frontends"))

EXAMPLES = {"clip-vit-large-patch14-336": "CLIPVisionModel", "siglip-so400m-patch14-384": "SiglipVisionModel",
            "dinov2-large": "Dinov2Model"}
KV_BYTES_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # K and V, 8 heads of 128, bf16


def compile_folder(folder: str, target: str, out: str) -> str:
    path = os.path.join(out, "model.onnx")
    done = subprocess.run([sys.executable, "-m", "irc_cli", "compile", folder, "--target", target, "-o", path],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
    return path


def session(path: str):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 2
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def exactness() -> None:
    import test_hf_vision as twins
    from irc.check import relative_error

    print(f"\n{'twin':<30}  {'onnx':<24}  {'onnx-ort':<24}")
    for name in sorted(twins.CASES):
        with tempfile.TemporaryDirectory() as folder:
            model, _ = twins.build(name, folder)
            pixels = twins.images(model.config)
            want = twins.hf_outputs(model, pixels)
            cells = []
            for target in ("onnx", "onnx-ort"):
                try:
                    runner = session(compile_folder(folder, target, os.path.join(folder, target)))
                    got = dict(zip([o.name for o in runner.get_outputs()],
                                   runner.run(None, {"pixel_values": pixels})))
                    error = max(relative_error(got[k], v) for k, v in want.items())
                    cells.append("exact" if error <= twins.TOLERANCE else f"wrong ({error:.1e})")
                except RuntimeError as err:
                    cells.append(f"refused: {err}"[:24])
        print(f"{name:<30}  {cells[0]:<24}  {cells[1]:<24}")


def timing(rounds: int, layers: int, only: str) -> None:
    import torch
    import transformers
    from frontends import load_spec
    from irc.analysis import analyze

    torch.set_num_threads(2)
    print(f"\n{'model':<28} {'layers':>6} {'patches':>7} {'GFLOP/img':>9} {'visual KV/layer':>15} "
          f"{'irc ORT ms':>10} {'torch ms':>9} {'torch/irc':>9}")
    for name, class_name in EXAMPLES.items():
        if only and name not in only.split(","):
            continue
        config = json.load(open(os.path.join(ROOT, "examples", "hf", name, "config.json")))
        if layers:
            config["num_hidden_layers"] = layers
        with tempfile.TemporaryDirectory() as folder:
            hf_config = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(hf_config).eval().float()
            model.save_pretrained(folder)
            summary = analyze(load_spec(folder))["vision"]
            ort_session = session(compile_folder(folder, "onnx-ort", os.path.join(folder, "out")))
            size = config["image_size"]
            pixels = np.random.default_rng(0).standard_normal((1, config["num_channels"], size, size)).astype(np.float32)
            runs = {"irc": lambda: ort_session.run(None, {"pixel_values": pixels}),
                    "torch": lambda: model(pixel_values=torch.from_numpy(pixels))}
            with torch.no_grad():
                for run in runs.values():  # warm-up
                    run()
                # interleaved: the second core's speed drifts
                times = interleaved({name: lambda run=run: seconds(run) for name, run in runs.items()}, rounds)
        irc_ms, torch_ms = 1e3 * statistics.median(times["irc"]), 1e3 * statistics.median(times["torch"])
        kv = summary["tokens"] * KV_BYTES_PER_TOKEN_LAYER
        print(f"{name:<28} {config['num_hidden_layers']:>6} {summary['patches']:>7} "
              f"{summary['flops_per_image'] / 1e9:>9.1f} {kv / 2**20:>12.2f} MiB {irc_ms:>10.0f} {torch_ms:>9.0f} "
              f"{torch_ms / irc_ms:>9.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=0, help="keep this many layers of each tower (quick run)")
    parser.add_argument("--only", default="", help="comma-separated example names for the timing table")
    parser.add_argument("--skip-twins", action="store_true", help="only the timing table")
    args = parser.parse_args()
    if not args.skip_twins:
        exactness()
    timing(args.rounds, args.layers, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
