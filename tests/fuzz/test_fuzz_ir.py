"""Mutated IR text (``.ir``, the printer's form, read by ``irc.parser``): every case ends with
exit 0 or one message and exit 2, in time, and no output unless it succeeded (``fuzzing``)."""
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontends import load_spec
from fuzzing import check_irc, fuzz_settings, mutated_text, workspace
from irc.printer import print_graph

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXTS = {name: print_graph(load_spec(EXAMPLES / name)) for name in ("tiny-llama3.yaml", "tiny-deepseek-v3.yaml")}


@fuzz_settings
@given(st.data(), st.sampled_from(sorted(TEXTS)))
def test_ir_text(data, name):
    with workspace() as (inputs, outputs):
        spec = inputs / "model.ir"
        spec.write_bytes(data.draw(mutated_text(TEXTS[name], max_mutations=4)))
        command = data.draw(st.sampled_from([["show", str(spec)],
                                             ["compile", str(spec), "--target", "ir", "-o", str(outputs / "out.ir")],
                                             ["compile", str(spec), "--target", "numpy", "-o",
                                              str(outputs / "model.py")]]))
        check_irc(command, outputs)
