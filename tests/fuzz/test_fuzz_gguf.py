"""Mutated GGUF files: hyperparameters deleted, retyped or extreme (written by the ``gguf``
package), and header bytes flipped, overwritten or cut (counts, string lengths, tensor
dims, types and offsets that lie). Every case ends with exit 0 or one message and exit 2,
in time, and no output unless it succeeded (``fuzzing``)."""
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontends"))  # the tests' GGUF writer

from fuzzing import check_irc, fuzz_settings, mutated_bytes, mutated_tree, workspace  # noqa: E402
from gguf_writer import write_file  # noqa: E402

pytestmark = pytest.mark.fuzz

D, HEADS, KV_HEADS, FF, VOCAB = 32, 4, 2, 64, 64
KEYS = {"llama.block_count": 1, "llama.context_length": 128, "llama.embedding_length": D,
        "llama.feed_forward_length": FF, "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0}
KV = D // HEADS * KV_HEADS
SHAPES = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,), "blk.0.attn_norm.weight": (D,),
          "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (KV, D), "blk.0.attn_v.weight": (KV, D),
          "blk.0.attn_output.weight": (D, D), "blk.0.ffn_norm.weight": (D,), "blk.0.ffn_gate.weight": (FF, D),
          "blk.0.ffn_up.weight": (FF, D), "blk.0.ffn_down.weight": (D, FF)}
TENSORS = {name: np.full(shape, 0.01, np.float32) for name, shape in SHAPES.items()}


def _file(keys: dict, tensors: dict) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "model.gguf")
        write_file(path, "llama", keys, tensors)
        return path.read_bytes()


GOOD = _file(KEYS, TENSORS)
HEADER = len(GOOD) - sum(t.nbytes for t in TENSORS.values())  # about where the tensor data begins


@st.composite
def mutated_gguf(draw) -> bytes:
    if draw(st.booleans()):
        return draw(mutated_bytes(GOOD, HEADER, max_mutations=4))
    keys = draw(mutated_tree(KEYS))
    try:  # values the gguf package cannot write (negative uint32, nested maps) are not GGUF files
        return _file(keys if isinstance(keys, dict) else {}, TENSORS)
    except Exception:  # noqa: BLE001  the writer's own refusals
        assume(False)


@fuzz_settings
@given(st.data())
def test_gguf_file(data):
    with workspace() as (inputs, outputs):
        spec = inputs / "model.gguf"
        spec.write_bytes(data.draw(mutated_gguf()))
        command = data.draw(st.sampled_from([["show", str(spec)],
                                             ["compile", str(spec), "--target", "numpy", "-o",
                                              str(outputs / "model.py")]]))
        check_irc(command, outputs)
