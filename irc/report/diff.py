"""What a pass changed, as regions of the printed IR, grouped when layers repeat.

The regions are the pass manager's own ``region_diff`` (the ``--print-after-change``
text), cut where the layer changes, so that a rewrite applied to every layer yields one
region per layer. Regions that differ only in names (the layer index, the residual input
of layer 0 against that of layer 5) fall into one ``RegionGroup``: the report shows the
first and names the layers of the rest.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from irc.passmanager import region_diff

_NODE = re.compile(r"\s*%([A-Za-z0-9_.\-]+)(?:, %[A-Za-z0-9_.\-]+)* = ([A-Za-z0-9_]+)")
_PARAM = re.compile(r"\s*param @([A-Za-z0-9_.\-]+):")
_OPERAND = re.compile(r"[%@][A-Za-z0-9_.\-]+")
_LAYER_INDEX = re.compile(r"\b(layers|past_key_values|present)\.\d+\b")
_LAYER_NAME = re.compile(r"(?:layers|past_key_values|present)\.(\d+)\.")


def layer_index(name: str) -> Optional[int]:
    """The layer a value or weight belongs to by its name: ``layers.N.*``, and the caches
    ``past_key_values.N.*`` and ``present.N.*``."""
    match = _LAYER_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass
class Region:
    lines: list                       # (tag, text): tag " " context, "-" before only, "+" after only
    layer: Optional[int] = None
    removed: list = field(default_factory=list)   # names of node lines leaving (params as @name)
    added: list = field(default_factory=list)


@dataclass
class RegionGroup:
    regions: list                     # the first is shown; the rest differ only in names

    @property
    def first(self) -> Region:
        return self.regions[0]

    def layers(self) -> list[int]:
        return sorted({r.layer for r in self.regions if r.layer is not None})


def line_name(text: str) -> Optional[str]:
    """The node (its first output) or ``@param`` a printed line declares, if any."""
    match = _NODE.match(text)
    if match:
        return match.group(1)
    match = _PARAM.match(text)
    return "@" + match.group(1) if match else None


def _line_layer(text: str) -> Optional[int]:
    name = line_name(text)
    return layer_index(name.lstrip("@")) if name else None


def regions(before: str, after: str, context: int = 2) -> list[Region]:
    """The changed regions between two printed graphs, one per layer at most."""
    hunks: list[list] = []
    for line in region_diff(before, after, context).splitlines():
        if line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in (" ", "-", "+"):
            hunks[-1].append((line[0], line[1:]))
    out = []
    for hunk in hunks:
        out.extend(_split_by_layer(hunk))
    for region in out:
        for tag, text in region.lines:
            name = line_name(text)
            if name and tag == "-":
                region.removed.append(name)
            elif name and tag == "+":
                region.added.append(name)
    return out


def _split_by_layer(hunk: list) -> list[Region]:
    layers = [_line_layer(text) if tag != " " else None for tag, text in hunk]
    pieces: list[Region] = []
    current: Optional[Region] = None
    pending: list = []          # context lines not yet placed
    for (tag, text), layer in zip(hunk, layers):
        if tag == " ":
            pending.append((tag, text))
            continue
        if current is None or (layer is not None and current.layer is not None and layer != current.layer):
            lead = [c for c in pending if current is None or _line_layer(c[1]) == layer]
            if current is not None:
                current.lines.extend(c for c in pending if c not in lead)
            current = Region(list(lead), layer)
            pieces.append(current)
        else:
            current.lines.extend(pending)
            if current.layer is None:
                current.layer = layer
        pending = []
        current.lines.append((tag, text))
    if current is not None:
        current.lines.extend(pending)
    return pieces


def _shape_of_line(text: str) -> str:
    """A line with operand names and layer indices blanked: what a rewrite did, not where."""
    match = _NODE.match(text)
    if match:
        lhs, _, rest = text.partition(" = ")
        return _LAYER_INDEX.sub(r"\1.N", lhs.strip()) + " = " + _OPERAND.sub("%", rest)
    return _LAYER_INDEX.sub(r"\1.N", text.strip())


def group_regions(found: list[Region]) -> list[RegionGroup]:
    """Regions alike up to names, in order of first appearance."""
    groups: dict[tuple, RegionGroup] = {}
    for region in found:
        key = tuple((tag, _shape_of_line(text)) for tag, text in region.lines if tag != " ")
        if key in groups:
            groups[key].regions.append(region)
        else:
            groups[key] = RegionGroup([region])
    return list(groups.values())


def compact_ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 9, 11]`` -> ``"0–2, 5–11 step 2"``: ranges, and strides of three or more."""
    values = sorted(set(values))
    parts, i = [], 0
    while i < len(values):
        j = i
        step = values[i + 1] - values[i] if i + 1 < len(values) else 1
        while j + 1 < len(values) and values[j + 1] - values[j] == step:
            j += 1
        count = j - i + 1
        if count >= 3 or (count == 2 and step == 1):
            parts.append(f"{values[i]}–{values[j]}" + (f" step {step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(values[i]))
            i += 1
    return ", ".join(parts)
