"""The triton target runs quantize{embeddings=true}'s ``dequant_embedding`` (a torch
fallback that dequantizes the looked-up rows only) and matches the reference interpreter."""
from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from irc.check import relative_error  # noqa: E402
from irc.interpreter import Interpreter, random_feeds  # noqa: E402
from test_triton_models import BATCH, PROMPT, TOLERANCE, as_numpy, compile_example  # noqa: E402


def test_quantized_tied_table_with_scale(tmp_path):
    graph, module = compile_example("gemma2-9b", tmp_path, "quantize{bits=4,group=32,embeddings=true,symmetric=false}")
    assert any(n.op == "dequant_embedding" for n in graph.nodes)
    feeds = random_feeds(graph, batch=BATCH, tokens=PROMPT, seed=2)
    expected = Interpreter(graph).run(feeds)
    actual = module.forward(module.load_weights(), **feeds)
    assert relative_error(as_numpy(actual["logits"]), expected["logits"]) <= TOLERANCE
