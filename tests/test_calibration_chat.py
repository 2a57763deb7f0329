"""quantize{calibration_chat=true}: a calibration text laid out as conversations by the model's
chat template (``irc.chat``), tokenized with the template's own special tokens; the option
changes what GPTQ calibrates on, and each way it can fail is one message naming the file."""
import json
import os

import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from irc.chat import ChatError, chat_text, paragraphs
from irc.errors import PassError
from irc.evaluate import text_tokens
from irc.printer import print_graph
from irc.testing import apply_pass
from passes.quantize import Quantize

from tests.passes.test_quantize_methods import example

WORDS = "the cat sat on mat and dog log while a bird sang in tree saw user assistant".split()
SPECIAL = ("<s>", "<|im_start|>", "<|im_end|>")
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PARAGRAPHS = ["the cat sat on the mat", "and the dog sat on the log", "while a bird sang in the tree",
              "and the cat saw the bird", "and the dog saw the cat"]


def tokenizer_folder(path, template=TEMPLATE):
    """A word-level tokenizer that adds <s> to a plain text, its config naming <s>, and (when
    given) a chat template in tokenizer_config.json."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(["<unk>", *SPECIAL, *WORDS])}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in SPECIAL])
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(path, exist_ok=True)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    config = {"bos_token": "<s>"} | ({"chat_template": template} if template else {})
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return vocab


@pytest.fixture
def chat_files(tmp_path):
    """(text file, tokenizer.json, vocab): the text is PARAGRAPHS between blank lines, repeated."""
    pytest.importorskip("jinja2")
    vocab = tokenizer_folder(str(tmp_path / "model"))
    text = tmp_path / "calibration.txt"
    text.write_text("\n\n".join(PARAGRAPHS * 12) + "\n")
    return str(text), str(tmp_path / "model" / "tokenizer.json"), vocab


def test_paragraphs_are_blocks_between_blank_lines_else_lines():
    assert paragraphs("a b\nc\n\n  \n\nd e\n\n") == ["a b\nc", "d e"]
    assert paragraphs("one line\nanother line\n") == ["one line", "another line"]
    assert paragraphs("\n \n") == []


def test_the_text_becomes_user_and_assistant_turns_in_the_template(chat_files):
    text, tokenizer, _ = chat_files
    laid = chat_text("\n\n".join(PARAGRAPHS), os.path.dirname(tokenizer), text)
    expected = "".join(f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
                       for u, a in ((PARAGRAPHS[0], PARAGRAPHS[1]), (PARAGRAPHS[2], PARAGRAPHS[3])))
    assert laid == expected  # no generation prompt; the odd last paragraph left out


def test_a_template_that_prints_the_date_prints_a_fixed_one(chat_files):
    """Compiles are deterministic: a calibration text renders the same on any day."""
    text, tokenizer, _ = chat_files
    folder = os.path.dirname(tokenizer)
    dated = tmp_template(folder, "{{ strftime_now('%Y-%m-%d') }}" + TEMPLATE)
    laid = chat_text("\n\n".join(PARAGRAPHS[:2]), dated, text)
    assert laid.startswith("2026-01-01<|im_start|>user\n")


def tmp_template(folder, template):
    """A copy of the tokenizer folder whose chat_template.jinja is ``template``."""
    import shutil

    copy = folder + "-dated"
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    with open(os.path.join(copy, "chat_template.jinja"), "w") as f:
        f.write(template)
    return copy


def test_chat_tokens_carry_the_templates_special_tokens_and_no_added_bos(chat_files):
    text, tokenizer, vocab = chat_files
    plain = text_tokens(text, tokenizer, 64)
    chat = text_tokens(text, tokenizer, 64, chat=True)
    assert plain[0] == vocab["<s>"] and vocab["<|im_start|>"] not in plain
    assert chat[:3] == [vocab["<|im_start|>"], vocab["user"], vocab["the"]]
    assert vocab["<s>"] not in chat and chat.count(vocab["<|im_end|>"]) >= 4
    assert chat[3:8] == [vocab[w] for w in PARAGRAPHS[0].split()[1:6]]


def test_a_missing_template_or_a_single_paragraph_is_one_error_naming_the_file(tmp_path):
    pytest.importorskip("jinja2")
    tokenizer_folder(str(tmp_path / "plain"), template=None)
    text = tmp_path / "calibration.txt"
    text.write_text("\n\n".join(PARAGRAPHS))
    with pytest.raises(ChatError, match="has no chat template") as err:
        text_tokens(str(text), str(tmp_path / "plain" / "tokenizer.json"), chat=True)
    assert err.value.location == str(text) and "chat_template.jinja" in err.value.hint
    tokenizer_folder(str(tmp_path / "chat"))
    text.write_text(PARAGRAPHS[0])
    with pytest.raises(ChatError, match="fewer than 2 paragraphs"):
        text_tokens(str(text), str(tmp_path / "chat" / "tokenizer.json"), chat=True)
    tokenizer_folder(str(tmp_path / "broken"), template="{{ raise_exception('no system role') }}")
    text.write_text("\n\n".join(PARAGRAPHS))
    with pytest.raises(ChatError, match="calibration_chat: the chat template fails: no system role"):
        text_tokens(str(text), str(tmp_path / "broken" / "tokenizer.json"), chat=True)


def test_the_option_is_a_boolean_for_calibrated_methods(chat_files):
    text, tokenizer, _ = chat_files
    with pytest.raises(PassError, match="method=ort reads none"):
        Quantize(method="ort", calibration_chat=True)
    with pytest.raises(PassError, match="calibration_chat must be true or false"):
        Quantize(method="gptq", calibration=text, tokenizer=tokenizer, calibration_chat="yes")


def test_gptq_calibrated_on_chat_turns_runs_and_differs_from_the_plain_text(chat_files):
    text, tokenizer, _ = chat_files
    codes = {}
    for chat in (False, True):
        q = Quantize(method="gptq", calibration=text, tokenizer=tokenizer, calibration_tokens=128, bits=4, group=32,
                     calibration_chat=chat)
        out, changed = apply_pass(q, example("tiny-llama3"))
        assert changed and q.run(out) is False
        codes[chat] = out.params["layers.0.attn.wq.qweight"].array()
    assert not np.array_equal(codes[False], codes[True])


def test_the_cli_names_the_calibration_file_when_the_template_is_missing(tmp_path, capsys):
    pytest.importorskip("jinja2")
    from tests.test_cli_run import in_process

    tokenizer_folder(str(tmp_path / "plain"), template=None)
    text = tmp_path / "calibration.txt"
    text.write_text("\n\n".join(PARAGRAPHS * 12))
    out = tmp_path / "out" / "model.onnx"
    passes_ = (f"quantize{{method=gptq,calibration={text},tokenizer={tmp_path / 'plain' / 'tokenizer.json'},"
               f"calibration_tokens=128,calibration_chat=true}}")
    code, _, err = in_process(capsys, "compile", "examples/tiny-llama3.yaml", "--target", "onnx", "--passes", passes_,
                              "-o", out)
    assert code == 2 and "has no chat template" in err and str(text) in err and "Traceback" not in err
    assert not out.exists()


def test_a_graph_is_unchanged_when_the_chat_text_fails(tmp_path):
    pytest.importorskip("jinja2")
    tokenizer_folder(str(tmp_path / "plain"), template=None)
    text = tmp_path / "calibration.txt"
    text.write_text("\n\n".join(PARAGRAPHS * 12))
    g = example("tiny-llama3")
    before = print_graph(g)
    with pytest.raises(ChatError):
        Quantize(method="gptq", calibration=str(text), tokenizer=str(tmp_path / "plain" / "tokenizer.json"),
                 calibration_tokens=128, calibration_chat=True).run(g)
    assert print_graph(g) == before
