"""``scan-chunk``: recurrent layers computed in chunks (the state-space duality)."""
from __future__ import annotations

from irc.errors import PassError
from irc.graph import Graph
from irc.passmanager import Pass, register_pass

CHUNKABLE = ("ssd", "gated_delta_rule")   # ops with a matmul chunked form (irc.ops.ssm, irc.ops.delta)
STEP_ONLY = ("selective_scan",)            # no such form: their decay is per (channel, state)


@register_pass
class ScanChunk(Pass):
    """Compute every ``ssd`` and ``gated_delta_rule`` prefill in chunks of ``size`` tokens.

    A recurrent layer's sequential form runs one state update per token; its chunked form
    (the state-space duality) runs each chunk as decay-masked matmuls and passes the state
    once a chunk: Mamba-2's structured masked attention (``irc.ops.ssm.chunked_ssd``:
    Y = (C Bᵀ ⊙ L)(Δ·x) with L = exp(segsum(Δ·A)), plus the carried state read by C), and
    the chunked delta rule with its triangular solve per chunk
    (``irc.ops.delta.chunked_gated_delta_rule``, every update rule and decay). A prefill
    then is matmul-bound instead of a chain of T small updates.

    The IR stays one node per layer: the pass sets the op attribute ``chunk = size`` on
    every such node (overwriting another size), and the op's meaning is unchanged. The
    reference interpreter then computes those nodes in chunks (float64 inside), the ONNX
    targets build their chunked lowerings from the attribute (``backends.onnx.ssm``,
    ``backends.onnx.delta``), and a Triton backend may read it for chunked kernels. One
    token (decode) takes the step form whatever the attribute says.

    ``selective_scan`` (Mamba-1) is left in its step form, with a note: its decay differs
    per (channel, state), so a chunk has no decay-masked matmul form. ``size`` must be a
    power of two (the portable ONNX delta lowering inverts its triangular system by
    doubling blocks; Triton's block sizes are powers of two).

    Guarantees: outputs and present states equal the sequential form's up to rounding
    (held by the interpreter at 1e-5 relative on prefills of any length, over non-zero
    states, with padding); the graph's structure, names and types are untouched;
    ``changed`` is False when no node gets a new ``chunk`` (idempotent).
    """

    name = "scan-chunk"
    options = {"size": 64}

    def __init__(self, **options):
        super().__init__(**options)
        size = self.config["size"]
        if not (isinstance(size, int) and not isinstance(size, bool) and size > 0 and size & (size - 1) == 0):
            raise PassError(f"pass scan-chunk: size must be a power of two, got {size!r}",
                            hint="scan-chunk{size=64} (transformers' and fla's chunk)")

    def run(self, graph: Graph) -> bool:
        size, changed, notes = self.config["size"], False, []
        for node in graph.nodes:
            if node.op in CHUNKABLE and node.attrs.get("chunk") != size:
                node.attrs["chunk"] = size
                changed = True
            elif node.op in STEP_ONLY:
                notes.append(f"scan-chunk: %{node.name} ({node.op}, Mamba-1) keeps its step form: its decay is "
                             "per (channel, state), so a chunk has no matmul form")
        self.notes = notes
        return changed

    def report(self, graph: Graph) -> dict:
        """Nodes per form after the run: chunked (by op) and step-only."""
        chunked = {op: sum(n.op == op and n.attrs.get("chunk") is not None for n in graph.nodes) for op in CHUNKABLE}
        return {"chunk": self.config["size"], "chunked": {op: n for op, n in chunked.items() if n},
                "step_only": sum(n.op in STEP_ONLY for n in graph.nodes)}
