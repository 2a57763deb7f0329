"""``--target ir``: the printed IR, the text form ``irc.parser`` reads back. A VLM's vision
model (``graph.parts``) is printed after its decoder, each a graph of its own."""
from __future__ import annotations

from irc.graph import Graph
from irc.output import write_atomic
from irc.printer import print_graph


def printed(graph: Graph) -> str:
    """The graph's text, then each of its parts' (a VLM's vision model)."""
    return "\n".join([print_graph(graph)] + [print_graph(part) for part in graph.parts.values()])


def emit_target(graph: Graph, path: str, options) -> list[str]:
    write_atomic(path, printed(graph))
    return [f"wrote {path} (the printed IR)"]
