"""The help texts every subcommand shares: what a SPEC may be, and one example each.

Each subcommand's parser is made with ``parser_options(name)``: its description, an
epilog listing the input kinds and an example, and ``RawDescriptionHelpFormatter`` so the
lists keep their lines.
"""
from __future__ import annotations

import argparse

SPEC_KINDS = """\
SPEC is one of:
  model.yaml     the architecture form (top key `model`) or the graph form (top key `graph`)
  model.py       a DSL file defining build() -> Graph or a module-level `model`;
                 a .py spec is a program: run only specs you trust
  model.ir       irc's own printed IR (irc compile --target ir)
  FOLDER/        a Hugging Face model folder: config.json, *.safetensors (weights, read
                 lazily), tokenizer files
  model.gguf     a llama.cpp GGUF file (or any part of a split set), weights and tokenizer inside"""

RUN_KINDS = SPEC_KINDS + """
  OUT/           a folder irc compile wrote for an ONNX target (model.onnx, genai_config.json,
                 tokenizer files): run with onnxruntime-genai when installed, else onnxruntime"""

WEIGHTS = """\
weights: a Hugging Face folder or GGUF file brings its own; one without weight files is an
error unless --weights seeded (random weights, on purpose) or --weights none (a shape-only
ONNX model). YAML, DSL and .ir specs get seeded random weights."""

COMMANDS = {
    "show": ("summary and analysis of a model", "Summary and analysis of a model: parameters, FLOPs per token, KV cache, and where the weights "
             "come from.", SPEC_KINDS, "irc show examples/tiny-llama3.yaml --context 8192"),
    "compile": ("run a pipeline and emit a target", "Run a pipeline of passes over a model and emit a target. Ends with one summary line: output, "
                "size on disk, dtype, parameters, KV bytes per token, wall time.",
                SPEC_KINDS + "\n\n" + WEIGHTS,
                "irc compile examples/tiny-llama3.yaml --target onnx -o out/model.onnx"),
    "run": ("generate text (or token ids) from a spec or a compiled folder", "Generate greedily from a text prompt (or token ids) and print the answer, token by token on a "
            "terminal. A spec runs in the reference interpreter; a compiled ONNX folder in "
            "onnxruntime-genai or onnxruntime. Text prompts need the model's tokenizer.json (the `text` extra: "
            "pip install 'irc[text]'); --chat needs jinja2 too.",
            RUN_KINDS + "\n\n" + WEIGHTS.replace(" or --weights none (a shape-only\nONNX model)", ""),
            "irc run out/ --prompt \"The capital of France is\" --max-new-tokens 16"),
    "passes": ("list the passes", "List the passes with a line each. Any SPEC kind takes them, through irc show/compile/run "
               "--passes.", SPEC_KINDS, "irc compile examples/tiny-llama3.yaml --passes dce,cse --check"),
    "report": ("a self-contained HTML report of a dump directory", "Render the dumps of `irc compile --dump-dir DIR` as one HTML page: the pipeline, each change as a "
               "diff with pictures, the model at a glance and, where there is one, the NPU plan. --spec takes "
               "the SPEC the dumps came from.", SPEC_KINDS,
               "irc compile examples/tiny-llama3.yaml --dump-dir dumps && irc report dumps -o report.html"),
    "tile": ("plan NPU tiling (prefill and decode, or an image): plan.json and an HTML report", "Plan a model on an NPU target (a decoder's prefill and decode, an image encoder's image): plan.json and an HTML report.", SPEC_KINDS,
             "irc tile examples/tiny-llama3.yaml --target-npu examples/targets/edge-npu.yaml -o plan.json"),
}

SPEC_HELP = "the model: .yaml, DSL .py, .ir, a Hugging Face folder or .gguf (see below)"


def parser_options(name: str) -> dict:
    """``add_parser`` keywords for the subcommand ``name``."""
    summary, description, kinds, example = COMMANDS[name]
    return {"help": summary, "description": description,
            "epilog": f"{kinds}\n\nexample:\n  {example}", "formatter_class": argparse.RawDescriptionHelpFormatter}
