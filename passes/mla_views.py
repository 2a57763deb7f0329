"""W^UK and W^UV as params whose data are views of the checkpoint's ``kv_b`` (``mla-absorb``'s
default, run-time absorption): no new weights, no arithmetic, ``kv_b``'s elements once."""
from __future__ import annotations

import numpy as np

from irc.graph import Graph, Param
from irc.ops.mla_latent import kv_b_views
from irc.weights import Derived, data_rows


class KvBView:
    """One per-head block of ``kv_b`` [H*(nope+v), d_c]: ``part`` "uk" gives W^UK
    [H, nope, d_c], "uv" gives W^UV [H, v, d_c]. Reads by heads (rows of the result are
    heads) through ``kv_b``'s own data, so a checkpoint slice is read, not copied whole."""

    def __init__(self, kv_b: Param, part: str, heads: int, nope: int, v_dim: int):
        self.kv_b, self.part, self.heads, self.nope, self.v_dim = kv_b, part, heads, nope, v_dim
        self.row_elements = (nope if part == "uk" else v_dim) * kv_b.shape[1]

    def __call__(self) -> np.ndarray:
        return self.rows(0, self.heads)

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.kv_b.data is None:
            raise ValueError(f"param @{self.kv_b.name} has no data (shape-only compile)")
        per_head = self.nope + self.v_dim
        block = np.asarray(data_rows(self.kv_b.data, start * per_head, stop * per_head))
        uk, uv = kv_b_views(block, heads=stop - start, qk_nope_head_dim=self.nope)
        return uk if self.part == "uk" else uv


def kv_b_view_params(graph: Graph, kv_b: Param, heads: int, nope: int, v_dim: int) -> tuple[Param, Param]:
    """Params ``<kv_b>.uk`` [H, nope, d_c] and ``<kv_b>.uv`` [H, v, d_c] viewing ``kv_b``
    (reused when another node already made them)."""
    made = []
    for part, width in (("uk", nope), ("uv", v_dim)):
        name = f"{kv_b.name}.{part}"
        existing = graph.params.get(name)
        if existing is not None and isinstance(existing.data, Derived) \
                and isinstance(existing.data.compute, KvBView) and existing.data.compute.kv_b is kv_b:
            made.append(existing)
            continue
        n = 0
        while name in graph.params:
            n += 1
            name = f"{kv_b.name}.{part}_{n}"
        param = graph.add_param(name, kv_b.dtype, (heads, width, kv_b.shape[1]))
        param.data = Derived(KvBView(kv_b, part, heads, nope, v_dim), f"view of @{kv_b.name} ({part})")
        made.append(param)
    return made[0], made[1]
