"""The state-space and hybrid families, tool by tool, on the same tiny random twins. Prints one
table; asserts nothing.

Each twin is a transformers model built from a tiny config (the tests' ``CASES``:
``tests/frontends/test_hf_{ssm,hybrid,lfm2,delta}.py``), random
weights, saved with ``save_pretrained``. Every tool gets the folder and is held to
transformers on the same left-padded batch of two prompts (each row against transformers
running it alone: a padded position must change nothing) and then, one prompt, 16 greedy
tokens:

- irc: the reference interpreter; ``--target onnx`` and ``--target onnx-ort`` in ONNX Runtime;
  onnxruntime-genai 0.18 running irc's ``onnx-ort`` folder (greedy tokens only: genai pads a
  batch on the right);
- mobius-onnx 0.1.0: ``mobius build --config DIR --dtype f32 --runtime ort-genai``, its model
  run in ONNX Runtime with empty caches (prefill logits);
- onnxruntime-genai's builder 0.18: ``-p fp32 -e cpu`` (it needs tokenizer files; the twin
  has none, so a refusal for that reason is reported as such).

A cell says ``exact`` (max relative logits error <= 1e-4 and the same tokens), ``wrong
(error)``, or ``refused: <the last line of its error>``.

    python benchmarks/ssm_families.py [--only NAME,NAME]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import markdown_table, verdict

NEW = 16


def cases() -> dict:
    """name -> (the test module that builds it, its name there): every recurrent family's twins."""
    import importlib
    found = {}
    for module in ("test_hf_ssm", "test_hf_hybrid", "test_hf_lfm2", "test_hf_delta"):
        tests = importlib.import_module(f"tests.frontends.{module}")
        found.update({name: (tests, name) for name in tests.CASES})
    return found


def last_line(text: str) -> str:
    """The last line that names an error (else the last line), cut to fit a table cell."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "not supported" in line or "not currently" in line]
    return ((errors or lines or ["?"])[-1])[:90].replace("|", "/")


def hf_reference(model, torch):
    from tests.frontends.test_hf_models import prompts
    from tests.frontends.test_hf_ssm import unpadded_logits
    ids, mask, positions = prompts()
    want = unpadded_logits(model, ids, mask)
    prompt = torch.from_numpy(ids[0][None, :])
    with torch.no_grad():
        tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                                do_sample=False)[0, ids.shape[1]:].tolist()
    return ids, mask, positions, want, tokens


def irc_row(folder, ids, mask, positions, want, tokens, tmp) -> list:
    from backends.onnx import emit, runtime
    from frontends import load_spec
    from irc.interpreter import generate
    from tests.frontends.test_hf_models import irc_logits, relative_error

    real = mask.astype(bool)
    cells = []
    try:
        graph = load_spec(folder)
    except Exception as err:  # noqa: BLE001 (a refusal is a result here)
        return [f"refused: {last_line(str(err))}"] * 4
    got = irc_logits(graph, ids, mask, positions)
    cells.append(verdict(relative_error(got[real], want[real]), generate(graph, ids[0].tolist(), NEW)[0] == tokens))
    for target in ("onnx", "onnx-ort"):
        path = os.path.join(tmp, target, "model.onnx")
        try:
            emitted = emit.emit_model(graph, path, target=target, context=64)
        except Exception as err:  # noqa: BLE001 (a refusal is a result here)
            cells += [f"refused: {last_line(str(err))}"] * (2 if target == "onnx-ort" else 1)
            continue
        result = runtime.greedy(runtime.ort_engine(path), graph, [ids[0].tolist()], NEW)
        padded = runtime.greedy(runtime.ort_engine(path), graph, [ids[0].tolist(), ids[1][real[1]].tolist()], 1)
        error = relative_error(padded["prefill"]["logits"][real], want[real])
        cells.append(verdict(error, result["tokens"][0].tolist() == tokens))
        if target == "onnx-ort":
            cells.append(genai_cell(os.path.dirname(path), emitted, ids[0], tokens))
    return cells


def genai_cell(folder, emitted, prompt, tokens) -> str:
    if not emitted.genai_config:
        return f"no config: {emitted.genai_note}"
    try:
        import onnxruntime_genai as og
    except ImportError:
        return "genai not installed"
    import json
    try:
        model = og.Model(folder)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + NEW, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt[None, :].astype(np.int32))
        while not generator.is_done():
            generator.generate_next_token()
    except Exception as err:  # noqa: BLE001 (genai refusing the folder is a result here)
        return f"fails: {last_line(str(err))}"
    got = list(generator.get_sequence(0))[len(prompt):]
    eos = json.load(open(os.path.join(folder, "genai_config.json")))["model"]["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    want = tokens[:next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]
    return "exact" if [int(t) for t in got] == want else "wrong (tokens)"


def peer_cell(command: list, out: str, ids, mask, want) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        return f"refused: {last_line(done.stderr + done.stdout)}"
    import onnxruntime as ort
    from tests.frontends.test_hf_models import relative_error
    path = next((os.path.join(out, f) for f in sorted(os.listdir(out)) if f.endswith(".onnx")), None)
    if path is None:
        return "refused: no .onnx written"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {}
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = ids
        elif value.name == "attention_mask":
            feeds[value.name] = mask
        elif value.name == "position_ids":
            feeds[value.name] = positions
        else:
            shape = [len(ids) if i == 0 else (0 if not isinstance(d, int) else d) for i, d in enumerate(value.shape)]
            feeds[value.name] = np.zeros(shape, np.float32)
    try:
        logits = session.run(["logits"], feeds)[0]
    except Exception as err:  # noqa: BLE001
        return f"fails to run: {last_line(str(err))}"
    real = mask.astype(bool)
    if logits.shape[:2] != ids.shape:
        return f"logits shape {list(logits.shape)}"
    return verdict(relative_error(logits[real], want[real]))


def table(found: dict, only: str = "") -> None:
    """Every twin of ``found`` (name -> (module with ``build_case``, its name there)) through
    irc, mobius-onnx and the builder; prints the table."""
    import torch
    import transformers  # noqa: F401

    bin_dir = os.path.dirname(sys.executable)
    rows = []
    for name, (module, key) in sorted(found.items()):
        if only and name not in only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model, folder = module.build_case(key, Path(tmp) / "hf")
            folder = str(folder)
            ids, mask, positions, want, tokens = hf_reference(model, torch)
            cells = irc_row(folder, ids, mask, positions, want, tokens, tmp)
            mobius = peer_cell([os.path.join(bin_dir, "mobius"), "build", "--config", folder, "--dtype", "f32",
                                "--runtime", "ort-genai", os.path.join(tmp, "mobius")], os.path.join(tmp, "mobius"),
                               ids, mask, want)
            builder = peer_cell([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o",
                                 os.path.join(tmp, "builder"), "-p", "fp32", "-e", "cpu"],
                                os.path.join(tmp, "builder"), ids, mask, want)
            rows.append((name, model.config.model_type, *cells, mobius, builder))
            print(f"  {name} done", file=sys.stderr)
    print()
    markdown_table(("twin", "model_type", "irc interpreter", "irc onnx", "irc onnx-ort", "genai (irc onnx-ort folder)",
                    "mobius-onnx 0.1.0", "genai builder 0.18"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated twin names")
    table(cases(), parser.parse_args().only)


if __name__ == "__main__":
    main()
