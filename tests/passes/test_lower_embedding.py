"""lower-embedding: embedding -> gather (times a constant scale)."""
import math

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import assert_pass, assert_unchanged
from irc.weights import seed_absent
from passes.lower_embedding import LowerEmbedding

F32 = DType.f32


def embeddings_graph() -> Graph:
    """ids[B,T] through a plain embedding and a Gemma-style scaled one (sqrt(d))."""
    g = Graph("embeddings")
    g.meta = {"vocab_size": 16}
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    plain = emit1(g, "embedding", [ids, g.add_param("embed", F32, (16, 8))], None, "plain")
    scaled = emit1(g, "embedding", [ids, g.add_param("embed_scaled", F32, (16, 8))], {"scale": math.sqrt(8)},
                   "scaled")
    g.outputs = [emit1(g, "add", [plain, scaled], None, "x"), scaled]
    seed_absent(g)
    return g


def test_lower_embedding():
    assert assert_pass(LowerEmbedding(), embeddings_graph(), golden="lower-embedding")


def test_lower_embedding_without_embeddings():
    g = Graph("none")
    x = g.add_input("x", F32, ("B", 8))
    g.outputs = [emit1(g, "tanh", [x], name="y")]
    assert_unchanged(LowerEmbedding(), g)
