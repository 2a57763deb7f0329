"""Text in and out for ``irc run``: the model's tokenizer and chat template.

The tokenizer is ``tokenizer.json`` read with the ``tokenizers`` library (the ``text``
extra; transformers is never imported). Where it comes from depends on the input:

- a folder (a Hugging Face folder, or one ``irc compile`` wrote): its ``tokenizer.json``,
  ``tokenizer_config.json`` and ``chat_template.jinja``;
- a ``.gguf`` file: the tokenizer it carries, converted as ``irc compile`` writes it
  (``frontends.gguf.tokenizer_files``);
- a .yaml, .py or .ir spec: a ``tokenizer.json`` beside the spec, if there is one.

``--chat`` renders the chat template (``irc.chat``: ``chat_template.jinja``, else
``tokenizer_config.json``'s ``chat_template``, with jinja2 as transformers does) with one user
message and ``add_generation_prompt``. The rendered text is
tokenized without adding special tokens again (the template wrote them); a plain prompt is
tokenized with them (the tokenizer's post-processor decides, as ``tokenizer(text)`` does).
"""
from __future__ import annotations

import json
import os
from typing import Optional

from irc.chat import CHAT_TEMPLATE, TOKENIZER_CONFIG, read_config, render, template_of
from irc.errors import IRCError

TOKENIZER = "tokenizer.json"


class Text:
    """A tokenizer (``tokenizers.Tokenizer``), its tokenizer_config.json and chat template."""

    def __init__(self, tokenizer, config: dict, template: Optional[str], where: str):
        self.tokenizer, self.config, self.template, self.where = tokenizer, config, template, where

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat(self, prompt: str, system: Optional[str] = None) -> str:
        """The prompt as the chat template lays out one user turn, ready for the answer."""
        if not self.template:
            raise IRCError(f"--chat: the tokenizer in {self.where} has no chat template",
                           hint=f"add {CHAT_TEMPLATE} (or chat_template in {TOKENIZER_CONFIG}), or drop --chat")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return render(self.template, messages, self.config, True, self.where, "--chat")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise IRCError("a text prompt needs the tokenizers package to read the model's tokenizer.json",
                       hint="pip install 'irc[text]', or give token ids with --prompt-ids 1,2,3") from None
    return tokenizers


def folder_text(folder: str) -> Optional[Text]:
    """The tokenizer in ``folder``, or None when it has no tokenizer.json."""
    path = os.path.join(folder, TOKENIZER)
    if not os.path.isfile(path):
        return None
    try:
        tokenizer = _tokenizers().Tokenizer.from_file(path)
    except Exception as err:  # the tokenizers library raises plain Exceptions on a bad file
        raise IRCError(f"cannot read the tokenizer: {err}", location=path) from None
    config = read_config(os.path.join(folder, TOKENIZER_CONFIG))
    return Text(tokenizer, config, template_of(config, folder), folder)


def gguf_text(path: str) -> Optional[Text]:
    """The tokenizer a GGUF file carries, or None when it cannot be converted faithfully."""
    _tokenizers()
    from frontends.gguf import tokenizer_files

    files, _ = tokenizer_files(path)
    if TOKENIZER not in files:
        return None
    tokenizer = _tokenizers().Tokenizer.from_str(files[TOKENIZER])
    config = json.loads(files.get(TOKENIZER_CONFIG, "{}"))
    return Text(tokenizer, config, template_of(config, None), path)


def find_text(path: str) -> Optional[Text]:
    """The tokenizer for the input ``path`` (module docstring), or None."""
    if os.path.isdir(path):
        return folder_text(path)
    if path.lower().endswith(".gguf"):
        return gguf_text(path)
    return folder_text(os.path.dirname(os.path.abspath(path)))
