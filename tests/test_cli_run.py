"""``irc run`` and the folders ``irc compile`` writes, driven as a user drives them: the CLI
in a real subprocess.

- The main job with only the core installed: torch, transformers, triton, tokenizers,
  jinja2 and onnxruntime-genai made unimportable, a bundled YAML example compiles to ONNX
  and its folder runs (plain onnxruntime, irc's greedy loop) to the reference
  interpreter's tokens; a text prompt without a tokenizer is one error with a hint.
- A small Hugging Face folder with a tokenizer, a chat template and generation_config.json:
  the compiled folder gets the tokenizer files and a genai_config.json with the folder's
  eos (a list), pad, context length and search defaults; a text prompt, with --chat, runs
  the same in the interpreter, onnxruntime-genai and onnxruntime, and stops at the eos.
- No silent random weights: a folder without weight files is refused, naming it.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from irc.interpreter import generate
from frontends import load_spec
from irc_cli import main
from irc_cli.commands import build_parser

ROOT = Path(__file__).resolve().parent.parent
TINY = "examples/tiny-llama3.yaml"
CORE_ONLY = ("torch", "transformers", "triton", "tokenizers", "jinja2", "onnxruntime_genai")
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "max_position_embeddings": 96, "bos_token_id": 1,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False}
WORDS = ["<unk>", "<s>", "</s>", "user", "assistant", "system"] + [f"w{i}" for i in range(58)]
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant{% endif %}")


def in_process(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def irc(*argv, block=(), check=True):
    """``irc ARGV`` in a fresh interpreter, with the modules in ``block`` unimportable."""
    code = (f"import sys\nfor name in {list(block)!r}:\n    sys.modules[name] = None\n"
            "from irc_cli import main\nsys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if check and done.returncode:
        raise AssertionError(f"irc {' '.join(map(str, argv))} exited {done.returncode}:\n{done.stderr}")
    return done


def test_the_main_job_needs_only_the_core(tmp_path):
    out = tmp_path / "out"
    done = irc("compile", TINY, "--target", "onnx", "-o", out / "model.onnx", block=CORE_ONLY)
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"compiled tiny-llama3 -> {out / 'model.onnx'} (") and "on disk): f32, " in summary
    assert "params, KV 512 bytes/token, " in summary and summary.endswith(" s")
    done = irc("run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--json", block=CORE_ONLY)
    result = json.loads(done.stdout)
    assert result["tokens"] == generate(load_spec(TINY), [1, 2, 3], 6)[0]
    assert result["engine"] == "onnxruntime" and result["timing"]["new_tokens"] == 6
    assert "logits_last" not in result and "tokens/s" in done.stderr
    plain = irc("run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--quiet", block=CORE_ONLY)
    assert plain.stdout.split() == [str(t) for t in result["tokens"]] and plain.stderr == ""
    refused = irc("run", out, "--prompt", "hello", block=CORE_ONLY, check=False)
    assert refused.returncode == 2 and "no tokenizer.json" in refused.stderr and "--prompt-ids" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small Llama folder (no weight files) with a word-level tokenizer, a chat template
    and a generation_config.json whose eos is filled in by ``with_eos``."""
    tokenizers = pytest.importorskip("tokenizers")
    path = tmp_path_factory.mktemp("hf") / "tiny-chat"
    path.mkdir()
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, "<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (path / "chat_template.jinja").write_text(TEMPLATE)
    (path / "config.json").write_text(json.dumps(LLAMA))
    return path


def with_eos(folder: Path, eos) -> None:
    generation = {"eos_token_id": eos, "do_sample": True, "temperature": 0.7}
    (folder / "generation_config.json").write_text(json.dumps(generation))


def test_a_folder_without_weights_is_refused_by_name(folder, tmp_path, capsys):
    for argv in (["compile", folder, "--target", "onnx", "-o", tmp_path / "m.onnx"],
                 ["run", folder, "--prompt-ids", "1,2"]):
        code, _, err = in_process(capsys, *argv)
        assert code == 2 and f"{folder}: this folder has no weight files" in err
        assert "--weights seeded" in err and "Traceback" not in err
    assert not (tmp_path / "m.onnx").exists()
    assert f"weights: none ({folder} has no *.safetensors files)" in in_process(capsys, "show", folder)[1]
    assert "weights: seeded (random)" in in_process(capsys, "show", TINY)[1]


def test_a_chat_prompt_runs_alike_everywhere_and_stops_at_eos(folder, tmp_path):
    pytest.importorskip("jinja2")
    prompt = ["--prompt", "w7 w8 w9", "--chat", "--max-new-tokens", "12", "--json", "--weights", "seeded"]
    with_eos(folder, [])  # and config.json has none: no eos, 12 tokens
    free = json.loads(irc("run", folder, *prompt).stdout)
    assert free["prompt_tokens"] == [1, 3, 13, 14, 15, 2, 1, 4]  # <s>user w7 w8 w9</s><s>assistant
    assert len(free["tokens"]) == 12 and free["stopped"] == "max_new_tokens"
    stop = next(t for i, t in enumerate(free["tokens"]) if i >= 2 and t not in free["tokens"][:i])
    eos = [stop, 63 if stop != 63 else 62]  # two eos ids: a list in genai_config.json
    with_eos(folder, eos)
    want = free["tokens"][:free["tokens"].index(stop) + 1]

    out = tmp_path / "out"
    irc("compile", folder, "--target", "onnx-ort", "--weights", "seeded", "--context", "4096", "-o", out / "model.onnx")
    names = {p.name for p in out.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"} <= names
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["eos_token_id"] == eos
    assert config["model"]["pad_token_id"] == stop and config["model"]["bos_token_id"] == 1
    assert config["model"]["context_length"] == 96 and config["search"]["max_length"] == 96  # capped by the model
    assert config["search"]["do_sample"] is True and config["search"]["top_k"] == 50
    assert config["search"]["temperature"] == 0.7

    prompt = prompt[:-2]  # the compiled folder has its weights
    engines = {"reference interpreter": [folder, "--weights", "seeded"], "onnxruntime": [out, "--engine", "ort"]}
    if _has("onnxruntime_genai"):
        engines["onnxruntime-genai"] = [out, "--engine", "genai"]
    for engine, where in engines.items():
        result = json.loads(irc("run", where[0], *prompt, *where[1:]).stdout)
        assert result["engine"] == engine and result["tokens"] == want, engine
        assert result["stopped"] == "eos" and result["text"] == " ".join(WORDS[t] for t in want), engine


def test_token_ids_come_from_generation_config_then_config(tmp_path):
    from frontends.hf.generation import generation_meta

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6], "top_p": 0.9}))
    meta = generation_meta(str(tmp_path), {"eos_token_id": 2, "bos_token_id": 1, "max_position_embeddings": 512})
    assert meta == {"eos_token_id": [5, 6], "bos_token_id": 1, "pad_token_id": 5, "max_positions": 512,
                    "generation": {"top_p": 0.9}}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7], "pad_token_id": 0}))
    assert generation_meta(str(tmp_path), {"eos_token_id": 2}) == {"eos_token_id": 7, "pad_token_id": 0}
    (tmp_path / "generation_config.json").unlink()
    assert generation_meta(str(tmp_path), {"eos_token_id": 2, "pad_token_id": None}) == {"eos_token_id": 2,
                                                                                         "pad_token_id": 2}
    # a multimodal config (Qwen3.5): the text model's ids and trained length, so genai's context is capped
    multimodal = {"model_type": "qwen3_5", "text_config": {"eos_token_id": 4, "max_position_embeddings": 256}}
    assert generation_meta(str(tmp_path), multimodal) == {"eos_token_id": 4, "pad_token_id": 4, "max_positions": 256}


def test_run_refuses_clearly(folder, capsys):
    cases = [(["run", TINY, "--prompt-ids", "1,x"], "expected comma-separated token ids"),
             (["run", TINY, "--prompt-ids", "1,999"], "token ids must be in [0, 256)"),
             (["run", TINY, "--prompt-ids", "1", "--engine", "genai"], "runs a compiled ONNX folder"),
             (["run", TINY, "--prompt-ids", "1", "--chat"], "--chat lays out a text prompt"),
             (["run", folder, "--prompt", "w1", "--weights", "seeded", "--max-new-tokens", "200"],
              "exceed the model's context of 96 tokens")]
    for argv, message in cases:
        code, _, err = in_process(capsys, *argv)
        assert code == 2 and message in err and "Traceback" not in err, argv


def test_chat_without_jinja2_names_the_extra(folder):
    done = irc("run", folder, "--prompt", "w1", "--chat", "--weights", "seeded", block=("jinja2",), check=False)
    assert done.returncode == 2 and "--chat needs the jinja2 package" in done.stderr and "irc[text]" in done.stderr


def test_help_lists_every_input_kind_and_an_example():
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert set(commands) == {"show", "compile", "run", "passes", "report", "tile"}
    for command, parser in commands.items():
        text = parser.format_help()
        for kind in (".yaml", ".py", "run only specs you trust", ".ir", "Hugging Face model folder", ".gguf",
                     "example:\n  irc "):
            assert kind in text, (command, kind)
    assert "a folder irc compile wrote for an ONNX target" in commands["run"].format_help()


def test_npu_folders_go_to_the_npu_host_loop(tmp_path):
    (tmp_path / "irc_npu.json").write_text("{}")
    (tmp_path / "model.onnx").write_bytes(b"")
    from irc_cli import engines

    folder, runner = engines.compiled_folder(str(tmp_path))
    assert runner is engines.npu_host
    if not _has("backends.onnx_npu.host"):
        done = irc("run", tmp_path, "--prompt-ids", "1,2", check=False)
        assert done.returncode == 2 and "backends.onnx_npu.host" in done.stderr


def _has(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False





def test_the_answer_streams_token_by_token_on_a_terminal(folder):
    import io
    from irc_cli.run import Stream
    from irc_cli.text import folder_text

    text = folder_text(str(folder))
    out = io.StringIO()
    stream = Stream(text, out, live=True)
    seen = []
    for token in (13, 14, 15):
        stream.add(token)
        seen.append(out.getvalue())
    assert seen == ["w7", "w7 w8", "w7 w8 w9"]  # each token's text as it arrives
    assert stream.finish() == "w7 w8 w9" and out.getvalue() == "w7 w8 w9\n"
    quiet = io.StringIO()
    piped = Stream(text, quiet, live=False)  # not a terminal: the whole answer at the end
    for token in (13, 14):
        piped.add(token)
    assert quiet.getvalue() == "" and piped.finish() == "w7 w8" and quiet.getvalue() == "w7 w8\n"


def test_a_gguf_without_tensors_is_refused_by_name(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "vocab-only.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 1, "context_length": 128, "embedding_length": 32, "feed_forward_length": 64,
                       "attention.head_count": 4, "attention.head_count_kv": 2, "vocab_size": 64}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "weights: none (vocab-only.gguf holds no tensors)" in in_process(capsys, "show", path)[1]
    code, _, err = in_process(capsys, "compile", path, "--target", "onnx", "-o", tmp_path / "out" / "m.onnx")
    assert code == 2 and f"{path}: this file holds no tensors" in err and "--weights none" in err
    assert not (tmp_path / "out").exists()
    code, _, err = in_process(capsys, "compile", path, "--target", "onnx", "--weights", "none", "-o",
                              tmp_path / "out" / "m.onnx")
    assert code == 0 and "on disk): f32, " in err.splitlines()[-1]
