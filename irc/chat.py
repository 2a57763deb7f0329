"""A model's chat template: a conversation laid out as the model reads one.

The template is ``chat_template.jinja`` in the tokenizer's folder, else ``tokenizer_config.json``'s
``chat_template`` (a list of named templates: the ``default`` one). ``renderer`` compiles it with
jinja2 (the ``text`` extra) as transformers does: a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` and ``strftime_now``, and the
special tokens by name. Two readers:

- ``irc run --chat`` (``irc_cli.text``): one user turn and the generation prompt;
- ``quantize{calibration_chat=true}``: ``chat_text`` lays a calibration text out as
  conversations, so the calibration sees the template's own tokens (role markers, a default
  system prompt, turn ends) as the model meets them in a chat. Its paragraphs (blocks
  between blank lines; a text without blank lines, its lines) pair up in order, each pair one
  conversation of a user turn and the assistant's answer, rendered without a generation
  prompt and joined; an odd last paragraph is left out. A template that prints today's date
  (``strftime_now``) prints ``FIXED_DATE``, so the same text calibrates to the same codes on
  any day.

Errors are ``ChatError`` (an ``IRCError``: one message naming the file, exit 2 through the CLI).
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import Optional

from irc.errors import IRCError
from irc.inputs import read_json

TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
FIXED_DATE = datetime(2026, 1, 1)  # what a template's strftime_now prints in a calibration text
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatError(IRCError):
    """A chat template that is missing, cannot be rendered, or has nothing to render."""


def read_config(path: str) -> dict:
    """``tokenizer_config.json`` at ``path`` as a dict ({} when absent or not an object)."""
    if not os.path.isfile(path):
        return {}
    data = read_json(path)  # unreadable, not UTF-8, not JSON: one IRCError naming the file
    return data if isinstance(data, dict) else {}


def template_of(config: dict, folder: Optional[str]) -> Optional[str]:
    """The chat template: ``folder``/chat_template.jinja, else the config's (module docstring)."""
    path = os.path.join(folder, CHAT_TEMPLATE) if folder else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else None


def special_tokens(config: dict) -> dict:
    """The special tokens a template names (``bos_token``, ...), from tokenizer_config.json."""
    tokens = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def renderer(template: str, config: dict, where: str, what: str, now: Optional[datetime] = None):
    """``template`` compiled once: a function from ``messages`` ([{"role", "content"}]) and
    ``generation_prompt`` to the text. ``what`` names the caller in errors (``--chat``,
    ``calibration_chat``); ``now``: the time ``strftime_now`` formats (None: the clock)."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatError(f"{what} needs the jinja2 package to render the chat template",
                        hint="pip install 'irc[text]' (or pip install jinja2)") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def failed(err):
        return ChatError(f"{what}: the chat template fails: {err}", location=where)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: (now or datetime.now()).strftime(f))
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateError as err:
        raise failed(err) from None
    tokens = special_tokens(config)

    def render_messages(messages: list, generation_prompt: bool) -> str:
        try:
            return compiled.render(messages=messages, add_generation_prompt=generation_prompt, **tokens)
        except jinja2.exceptions.TemplateError as err:
            raise failed(err) from None
    return render_messages


def render(template: str, messages: list, config: dict, generation_prompt: bool, where: str, what: str) -> str:
    """``messages`` laid out by ``template`` (``renderer``, for one conversation)."""
    return renderer(template, config, where, what)(messages, generation_prompt)


def paragraphs(text: str) -> list[str]:
    """The text's paragraphs (blocks between blank lines), else its lines; stripped, none empty."""
    blocks = [p.strip() for p in re.split(r"\n\s*\n", text)]
    if sum(1 for p in blocks if p) < 2:
        blocks = [line.strip() for line in text.splitlines()]
    return [p for p in blocks if p]


def chat_text(text: str, folder: str, where: str) -> str:
    """``text`` as conversations (module docstring) under the chat template of the tokenizer
    in ``folder``; ``where``: the text file, for errors."""
    config = read_config(os.path.join(folder, TOKENIZER_CONFIG))
    template = template_of(config, folder)
    if not template:
        raise ChatError(f"calibration_chat: the tokenizer in {folder} has no chat template", location=where,
                        hint=f"add {CHAT_TEMPLATE} (or chat_template in {TOKENIZER_CONFIG}), or drop calibration_chat")
    parts = paragraphs(text)
    if len(parts) < 2:
        raise ChatError("calibration_chat: the text has fewer than 2 paragraphs, so no user turn with an answer",
                        location=where, hint="separate paragraphs with blank lines")
    turns = [[{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
             for user, answer in zip(parts[0::2], parts[1::2])]
    conversation = renderer(template, config, where, "calibration_chat", FIXED_DATE)
    return "".join(conversation(messages, False) for messages in turns)


__all__ = ["ChatError", "read_config", "template_of", "special_tokens", "renderer", "render", "paragraphs", "chat_text",
           "TOKENIZER_CONFIG", "CHAT_TEMPLATE"]
