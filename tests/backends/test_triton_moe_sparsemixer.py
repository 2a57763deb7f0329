"""The Triton target on a sparsemixer MoE (Phi-3.5-MoE's routing): moe-sort leaves
``moe_route`` with ``scoring="sparsemixer"``, the torch fallback routes it, and the grouped
GEMM kernels (Triton's interpreter on CPU) give the reference's output, ties included."""
from tests.backends.test_triton_kernels import check, new_graph  # noqa: I001  (sets TRITON_INTERPRET first)

import numpy as np
import pytest

from irc.build import emit1
from irc.dtypes import DType

pytest.importorskip("triton")

D, F, E = 32, 24, 4


def sparsemixer_graph(eps: float):
    """router = [I | 0] on the first E features, so a token's logits are its first E values."""
    g = new_graph(f"moe_sparsemixer_{eps}")
    x = g.add_input("x", DType.f32, ("B", "T", D))
    router = np.zeros((E, D), np.float32)
    router[:, :E] = np.eye(E)
    params = [g.add_param("router", DType.f32, (E, D), router), g.add_param("w_gate", DType.f32, (E, F, D)),
              g.add_param("w_up", DType.f32, (E, F, D)), g.add_param("w_down", DType.f32, (E, D, F))]
    g.outputs = [emit1(g, "moe", [x, *params], {"experts": E, "top_k": 2, "scoring": "sparsemixer",
                                                "norm_topk_prob": False, "jitter_eps": eps}, "out")]
    return g


@pytest.mark.parametrize("eps", [0.125, 1.0])
def test_sorted_sparsemixer_moe_matches_the_reference(tmp_path, eps):
    rows = np.array([[1.0, 3.0, 3.0, 2.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.75, 0.5, -4.0],
                     [5.0, 0.5, -0.45, -10.0]], np.float32)
    x = np.random.default_rng(0).standard_normal((2, 5, D)).astype(np.float32)
    x[0, :, :E] = rows
    module = check(sparsemixer_graph(eps), tmp_path, {"x": x}, DType.f32, "moe-sort")
    assert "moe_route(" in open(module.__file__).read() and {"moe_glu_gemm", "moe_down_gemm"} <= set(
        module.KERNEL_SPECS)
