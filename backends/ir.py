"""``--target ir``: the printed IR, the text form ``irc.parser`` reads back."""
from __future__ import annotations

from irc.graph import Graph
from irc.output import write_atomic
from irc.printer import print_graph


def emit_target(graph: Graph, path: str, options) -> list[str]:
    write_atomic(path, print_graph(graph))
    return [f"wrote {path} (the printed IR)"]
