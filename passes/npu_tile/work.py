"""One unit of planned NPU work (a GEMM, an attention core or a recurrent scan), as
``passes.npu_tile.workloads`` and its recurrent rules extract it from the graph."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from irc.npu.cost import AttentionShape, GemmShape


@dataclass
class Work:
    name: str
    node: str
    op: str
    role: str
    shape: object                  # GemmShape | AttentionShape
    count: int = 1                 # identical instances (KV heads x batch, experts, batch dims)
    layer: Optional[int] = None
    fused: list = field(default_factory=list)       # names of the fused elementwise nodes
    epilogue: list = field(default_factory=list)    # the epilogue steps, for the executor
    attention: Optional[dict] = None                # group, tokens, past, causal, scale
    scan: Optional[dict] = None                     # a recurrent layer: op, attrs, operand names

    @property
    def kind(self) -> str:
        if isinstance(self.shape, GemmShape):
            return "gemm"
        return "attention" if isinstance(self.shape, AttentionShape) else "scan"
