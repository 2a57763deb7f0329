"""The ``irc`` command line: the only package that imports frontends, passes and backends.

``main`` parses and dispatches (``irc_cli.commands``); ``spec.load`` reads a spec through the
frontends; ``tile`` and ``report`` are the ``irc tile`` and ``irc report`` commands. The
targets ``irc compile`` emits come from ``backends.TARGETS``.
"""
from irc_cli.commands import main

__all__ = ["main"]
