"""Reading files irc did not write itself as data: text that must be UTF-8, JSON that must
parse. Every failure is one ``IRCError`` naming the file (and, for JSON, the line), never
a Python exception: unreadable files, bytes that are not UTF-8, broken JSON, integers of
thousands of digits, runaway nesting."""
from __future__ import annotations

import json
from typing import Any

from irc.errors import IRCError


def read_text(path: str, error=IRCError) -> str:
    """The UTF-8 text of ``path``; ``error`` (an IRCError subclass) for any failure."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise error(f"cannot read: {err.strerror}", location=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})", location=path) from None


def read_json(path: str, error=IRCError) -> Any:
    """The JSON document in ``path`` (``read_text``, then parsed)."""
    return parse_json(read_text(path, error), path, error)


def parse_json(text: str, path: str, error=IRCError) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"not JSON: {err.msg}", location=f"{path}:{err.lineno}:{err.colno}") from None
    except (ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(":")[0]
        raise error(f"not JSON: {reason}", location=path) from None
