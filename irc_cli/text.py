"""Text in and out for ``irc run``: the model's tokenizer and chat template.

The tokenizer is ``tokenizer.json`` read with the ``tokenizers`` library (the ``text``
extra; transformers is never imported). Where it comes from depends on the input:

- a folder (a Hugging Face folder, or one ``irc compile`` wrote): its ``tokenizer.json``,
  ``tokenizer_config.json`` and ``chat_template.jinja``;
- a ``.gguf`` file: the tokenizer it carries, converted as ``irc compile`` writes it
  (``frontends.gguf.tokenizer_files``);
- a .yaml, .py or .ir spec: a ``tokenizer.json`` beside the spec, if there is one.

``--chat`` renders the chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s
``chat_template``) with jinja2 as transformers does: a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` and ``strftime_now``, the
special tokens by name, one user message and ``add_generation_prompt``. The rendered text is
tokenized without adding special tokens again (the template wrote them); a plain prompt is
tokenized with them (the tokenizer's post-processor decides, as ``tokenizer(text)`` does).
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Optional

from irc.errors import IRCError
from irc.inputs import read_json

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


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
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise IRCError("--chat needs the jinja2 package to render the chat template",
                           hint="pip install 'irc[text]' (or pip install jinja2)") from None

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        try:
            return env.from_string(self.template).render(messages=messages, add_generation_prompt=True,
                                                         **self.special_tokens())
        except jinja2.exceptions.TemplateError as err:
            raise IRCError(f"--chat: the chat template fails: {err}", location=self.where) from None

    def special_tokens(self) -> dict:
        tokens = {}
        for name in SPECIAL_TOKENS:
            value = self.config.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                tokens[name] = value
        return tokens


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise IRCError("a text prompt needs the tokenizers package to read the model's tokenizer.json",
                       hint="pip install 'irc[text]', or give token ids with --prompt-ids 1,2,3") from None
    return tokenizers


def _template(config: dict, folder: Optional[str]) -> Optional[str]:
    path = os.path.join(folder, CHAT_TEMPLATE) if folder else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else None


def _read_config(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    data = read_json(path)  # unreadable, not UTF-8, not JSON: one IRCError naming the file
    return data if isinstance(data, dict) else {}


def folder_text(folder: str) -> Optional[Text]:
    """The tokenizer in ``folder``, or None when it has no tokenizer.json."""
    path = os.path.join(folder, TOKENIZER)
    if not os.path.isfile(path):
        return None
    try:
        tokenizer = _tokenizers().Tokenizer.from_file(path)
    except Exception as err:  # the tokenizers library raises plain Exceptions on a bad file
        raise IRCError(f"cannot read the tokenizer: {err}", location=path) from None
    config = _read_config(os.path.join(folder, TOKENIZER_CONFIG))
    return Text(tokenizer, config, _template(config, folder), folder)


def gguf_text(path: str) -> Optional[Text]:
    """The tokenizer a GGUF file carries, or None when it cannot be converted faithfully."""
    _tokenizers()
    from frontends.gguf import tokenizer_files

    files, _ = tokenizer_files(path)
    if TOKENIZER not in files:
        return None
    tokenizer = _tokenizers().Tokenizer.from_str(files[TOKENIZER])
    config = json.loads(files.get(TOKENIZER_CONFIG, "{}"))
    return Text(tokenizer, config, _template(config, None), path)


def find_text(path: str) -> Optional[Text]:
    """The tokenizer for the input ``path`` (module docstring), or None."""
    if os.path.isdir(path):
        return folder_text(path)
    if path.lower().endswith(".gguf"):
        return gguf_text(path)
    return folder_text(os.path.dirname(os.path.abspath(path)))
