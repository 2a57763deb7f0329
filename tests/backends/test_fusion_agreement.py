"""The Triton planner and the NPU planner fuse the same epilogues on the tiny examples.

Both call ``irc.rewrite.epilogue``; they are handed the same graph here (the Triton target's
default pipeline). For every linear the Triton planner runs as a matmul kernel, its fused
chain equals the NPU plan's cut before the first operand that is another activation tile,
the one capability in which the two epilogues differ (``EPILOGUE_OPERANDS``: Triton's
residual add runs in the row kernel of the norm after it, and it fuses no product with
another activation, such as Kimi's and MiniMax's gate times the normed output, which the NPU
plan keeps in the epilogue). A decomposed GLU (MoE shared experts after ``moe-sort``) is
one dual GEMM for Triton and two GEMMs for the NPU plan; those linears are exactly the ones
``glu_match`` finds, and are pinned as such.
"""
import glob
import io

import pytest

from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.rewrite.epilogue import glu_match

from backends import TARGETS
from backends.triton.plan import Planner
from backends.triton.plan_gemm import EPILOGUE_OPERANDS as TRITON_OPERANDS, LINEAR_OPS
from passes.npu_tile import workloads
from irc.testing import one_graph  # noqa: E402

TINY = sorted(p for p in glob.glob("examples/tiny*.yaml") if one_graph(p))  # VLMs: ONNX only


def _triton_chains(planner: Planner) -> dict:
    """linear name -> the nodes its kernel computes after it, for every planned linear."""
    return {step.nodes[0].name: step.nodes[1:] for step in planner.steps
            if step.nodes and step.nodes[0].op in LINEAR_OPS}


@pytest.mark.parametrize("spec", TINY)
def test_triton_and_npu_fuse_the_same_epilogues(spec):
    graph = load_spec(spec)
    PassManager(parse_pipeline(TARGETS["triton"].pipeline({})), out=io.StringIO()).run(graph)
    triton = _triton_chains(Planner(graph).run())
    works, _ = workloads.extract(graph, {"B": 1, "T": 4, "P": 4})
    npu = {w.node: w for w in works if w.op == "linear"}
    glu = {n.name for mul in graph.nodes for n in (glu_match(graph, mul, LINEAR_OPS) or ())[::2]}
    assert set(npu) == set(triton) | glu and glu <= set(triton) | set(npu)
    compared = 0
    for name, work in npu.items():
        if name in glu:
            assert [n.op for n in triton.get(name, [])] in ([], ["silu", "linear", "mul"]), name
            continue
        kinds = [step.get("operand") for step in work.epilogue if step.get("node") != name]   # the bias is not fused
        cut = kinds.index("tile") if "tile" in kinds else len(kinds)
        assert [n.name for n in triton[name]] == work.fused[:cut], name
        assert all(step.get("operand") == "tile" and step["op"] in ("add", "mul")
                   for step in work.epilogue[len(work.epilogue) - len(kinds) + cut:]), name   # with activation tiles
        compared += 1
    assert compared and "tile" not in TRITON_OPERANDS
