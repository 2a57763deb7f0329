"""The real SmolLM2-135M-Instruct, as a user runs it: a Hugging Face folder (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with the chat template,
generation_config.json) compiled by ``irc compile --target onnx-ort`` and answered by
``irc run OUT --prompt TEXT --chat`` through onnxruntime-genai, both in a subprocess. The
answer stops at the model's eos (``<|im_end|>``, id 2, which genai_config.json now names)
and is token for token, and so text for text, what transformers' greedy ``generate``
answers from the same folder.

The folder is made once per module from the session's GGUF (``smollm2_gguf`` in conftest):
irc's GGUF frontend dequantizes every tensor to float32 (the numbers transformers' own
GGUF loader computes) and writes them under their Hugging Face names, with the tokenizer
the GGUF carries; transformers then loads it as any checkpoint (no GGUF loader, ~20 s
saved)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from frontends.gguf import build
from frontends.gguf.families import describe
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tokenizer import tokenizer_files
from frontends.hf.families import checkpoint_source

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")
pytest.importorskip("jinja2")

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "What is the capital of France?"
NEW_TOKENS = 24


def hf_config(gguf: GGUFFile, arch) -> dict:
    attention = arch.attention
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": arch.vocab_size,
            "hidden_size": arch.d_model, "intermediate_size": arch.mlp["d_ff"], "num_hidden_layers": arch.n_layers,
            "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads,
            "head_dim": attention.head_dim, "rms_norm_eps": arch.norm_eps, "tie_word_embeddings": arch.tied,
            "max_position_embeddings": gguf.get(gguf.arch_key("context_length"), int),
            "rope_parameters": {"rope_type": "default", "rope_theta": arch.layers[0].rope.base},
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "float32"}


@pytest.fixture(scope="module")
def folder(smollm2_gguf, tmp_path_factory) -> Path:
    gguf = GGUFFile.open(smollm2_gguf)
    arch = describe(gguf, "SmolLM2-135M-Instruct")
    graph = build(gguf, weights="float")
    path = tmp_path_factory.mktemp("smollm2-hf") / "SmolLM2-135M-Instruct"
    path.mkdir()
    save_file({checkpoint_source(arch, p.name).names()[0]: p.array() for p in graph.params.values()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf_config(gguf, arch), indent=2))
    files, note = tokenizer_files(gguf)
    assert "tokenizer.json" in files, note
    for name, text in files.items():
        (path / name).write_text(text)
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                             "pad_token_id": 2}))
    return path


@pytest.fixture(scope="module")
def reference(folder) -> dict:
    """transformers' chat prompt and greedy answer (stopping at the generation config's eos)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False)
    tokens = out[0, len(prompt):].tolist()
    return {"prompt": prompt, "tokens": tokens, "text": tokenizer.decode(tokens, skip_special_tokens=True)}


def irc(*argv) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "irc_cli", *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def test_a_compiled_folder_answers_a_chat_prompt_as_transformers_does(folder, reference, tmp_path):
    out = tmp_path / "out"
    irc("compile", folder, "--target", "onnx-ort", "--quiet", "-o", out / "model.onnx")
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["eos_token_id"] == 2 and config["pad_token_id"] == 2 and config["context_length"] == 4096
    answer = json.loads(irc("run", out, "--prompt", PROMPT, "--chat", "--max-new-tokens", NEW_TOKENS,
                            "--json").stdout)
    assert answer["engine"] == "onnxruntime-genai" and answer["prompt_tokens"] == reference["prompt"]
    assert answer["stopped"] == "eos" and answer["tokens"][-1] == 2 and len(answer["tokens"]) < NEW_TOKENS
    assert reference["tokens"][-1] == 2  # transformers stops at the same eos
    assert answer["tokens"] == reference["tokens"] and answer["text"] == reference["text"]
    assert "Paris" in answer["text"]
