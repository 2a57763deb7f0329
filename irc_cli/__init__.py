"""The ``irc`` command line: the only package that imports frontends, passes and backends.

``main`` parses and dispatches (``irc_cli.commands``); ``spec.load`` reads a spec through the
frontends; ``tile`` and ``report`` are the ``irc tile`` and ``irc report`` commands; ``run``
is ``irc run`` (text in and out: ``text`` for the tokenizer and chat template, ``engines``
for what generates, one table from a compiled folder's marker file to its runner);
``weights`` says where weights come from and refuses silent random ones; ``help`` holds the
input kinds and examples every subcommand's help shows. The targets ``irc compile`` emits
come from ``backends.TARGETS``.
"""
from irc_cli.commands import main

__all__ = ["main"]
