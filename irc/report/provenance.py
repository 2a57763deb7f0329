"""Where each node came from: the spec line that asked for it (``Node.origin``) and the
pass that introduced or rewrote it.

Origins are read from the graphs that still carry them (the input graph, and the final
graph for nodes a pass emitted with its model-level node's origin). A node a pass adds
without an origin inherits the origin of the first node its region removed, so a lowered
``matmul`` still points at the ``mlp:`` line of the spec, and is marked as introduced by
that pass. The spec files the origins name are embedded in the report with one anchor
per line, so each node's link lands on its line without leaving the page.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from html import escape
from typing import Optional, Sequence

from irc.graph import Graph
from irc.report.diff import line_name

_ORIGIN = re.compile(r"(.+?):(\d+)(?::\d+)?\Z")
MAX_SOURCE_BYTES = 512 * 1024


@dataclass
class Provenance:
    origins: dict = field(default_factory=dict)       # node name -> "file:line"
    introduced: dict = field(default_factory=dict)    # node name -> "NN pass"
    rewritten: dict = field(default_factory=dict)     # node name -> ["NN pass", ...]
    sources: list = field(default_factory=list)       # (path as the origins spell it, text)
    _anchor: dict = field(default_factory=dict)       # path -> index into sources

    def href(self, name: str) -> Optional[str]:
        origin = self.origins.get(name)
        match = _ORIGIN.match(origin) if origin else None
        if match and match.group(1) in self._anchor:
            return f"#src{self._anchor[match.group(1)]}-L{match.group(2)}"
        return None

    def describe(self, name: str) -> str:
        parts = [f"%{name}"]
        if name in self.origins:
            parts.append(f"from {self.origins[name]}")
        if name in self.introduced:
            parts.append(f"introduced by {self.introduced[name]}")
        if self.rewritten.get(name):
            parts.append("rewritten by " + ", ".join(self.rewritten[name]))
        return " · ".join(parts)

    def link(self, node) -> tuple:
        """(href, title) for a graph picture's box."""
        return self.href(node.name), self.describe(node.name) + f"\n{node.op} " + \
            ", ".join(v.type_str() for v in node.outputs)

    def origin_html(self, name: str) -> str:
        origin = self.origins.get(name)
        if not origin:
            return ""
        href = self.href(name)
        text = escape(os.path.basename(origin))
        return f'<a class="origin" href="{href}">{text}</a>' if href else f'<span class="origin">{text}</span>'


def _names(text: str) -> set:
    return {n for n in (line_name(line) for line in text.splitlines()) if n and not n.startswith("@")}


def build(steps: Sequence, regions_by_step: dict, graphs: Sequence[Graph], search: Sequence[str] = ()) -> Provenance:
    """``regions_by_step``: step index -> the ``diff.Region``s of that step; ``graphs``: the
    graphs carrying origins, most trusted first; ``search``: folders where relative origin
    paths may also be found (the spec's folder)."""
    prov = Provenance()
    for graph in graphs:
        for node in graph.nodes:
            if node.origin:
                prov.origins.setdefault(node.name, node.origin)
    for step in steps[1:]:
        found = regions_by_step.get(step.index)
        if not found:
            continue
        present = _names(steps[step.index - 1].text) if step.index - 1 < len(steps) else set()
        label = f"{step.index:02d} {step.label}"
        for region in found:
            donor = next((prov.origins[n] for n in region.removed if n in prov.origins), None)
            for name in region.added:
                if name.startswith("@"):
                    continue
                if name in present:
                    history = prov.rewritten.setdefault(name, [])
                    if label not in history:
                        history.append(label)
                else:
                    prov.introduced.setdefault(name, label)
                if donor and name not in prov.origins:
                    prov.origins[name] = donor
    _embed_sources(prov, search)
    return prov


def _embed_sources(prov: Provenance, search: Sequence[str]) -> None:
    paths = sorted({m.group(1) for m in (_ORIGIN.match(o) for o in prov.origins.values()) if m})
    for path in paths:
        for candidate in [path] + [os.path.join(folder, path) for folder in search] + \
                [os.path.join(folder, os.path.basename(path)) for folder in search]:
            if os.path.isfile(candidate) and os.path.getsize(candidate) <= MAX_SOURCE_BYTES:
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    prov._anchor[path] = len(prov.sources)
                    prov.sources.append((path, f.read()))
                break


def sources_html(prov: Provenance) -> str:
    """The embedded spec files, one anchor per line (``#src0-L12``)."""
    parts = []
    for index, (path, text) in enumerate(prov.sources):
        parts.append(f'<h3 id="src{index}">{escape(path)}</h3><pre class="src">')
        for number, line in enumerate(text.splitlines(), start=1):
            parts.append(f'<span class="line" id="src{index}-L{number}"><span class="ln">{number}</span>'
                         f"{escape(line)}</span>\n")
        parts.append("</pre>")
    return "".join(parts)
