"""User-facing errors.

Every mistake a user can make (a bad spec, a broken graph, an unknown pass) raises an
``IRCError`` carrying a location and, where we can offer one, a hint. The CLI prints
``str(error)`` and exits with code 2; nothing else is shown unless ``--debug``.
"""
from __future__ import annotations


class IRCError(Exception):
    """Base class for errors caused by the user's input."""

    def __init__(self, message: str, *, location: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class SpecError(IRCError):
    """A model spec (YAML, DSL call, config.json) is malformed or inconsistent."""


class ParseError(IRCError):
    """The IR text form could not be parsed."""


class VerifyError(IRCError):
    """A graph breaks an IR invariant; ``location`` names the node."""


class ShapeError(IRCError):
    """An op's operands do not fit its inference rule (raised without a location;
    the verifier or builder adds the node)."""


class PassError(IRCError):
    """A pass was misused, failed its preconditions, or broke the numeric check."""


class BackendError(IRCError):
    """A backend cannot express the graph it was given."""
