"""Mutated inputs of ``irc report``: a --dump-dir folder (printed IR and stats JSON per pass)
and an NPU plan.json, both files irc writes but a user may hand back edited or damaged.
Every case ends with exit 0 or one message and exit 2, in time, and no report unless it
succeeded (``fuzzing``)."""
import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import check_irc, fuzz_settings, mutated_text, mutated_tree, workspace
from irc_cli import main

pytestmark = pytest.mark.fuzz

SPEC = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama3.yaml"


def _outputs() -> tuple[dict, str]:
    """The dump folder's files of a small compile, and the plan of ``irc tile``."""
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stderr(io.StringIO()), \
            contextlib.redirect_stdout(io.StringIO()):
        dumps, plan = Path(folder, "dumps"), Path(folder, "plan.json")
        assert main(["compile", str(SPEC), "--target", "numpy", "--passes", "dce,cse", "--dump-dir", str(dumps)]) == 0
        assert main(["tile", str(SPEC), "--target-npu", str(SPEC.parent / "targets" / "edge-npu.yaml"),
                     "--tokens", "8", "--past", "16", "-o", str(plan)]) == 0
        return {p.name: p.read_text() for p in sorted(dumps.iterdir())}, plan.read_text()


DUMPS, PLAN = _outputs()


@st.composite
def mutated(draw, name: str, text: str) -> bytes:
    if name.endswith(".json") and draw(st.booleans()):
        return json.dumps(draw(mutated_tree(json.loads(text)))).encode()
    return draw(mutated_text(text))


@fuzz_settings
@given(st.data(), st.sampled_from(sorted(DUMPS) + ["plan.json"]))
def test_report_inputs(data, name):
    with workspace() as (inputs, outputs):
        dumps = inputs / "dumps"
        dumps.mkdir()
        for file, text in DUMPS.items():
            dumps.joinpath(file).write_bytes(data.draw(mutated(file, text)) if file == name else text.encode())
        plan = inputs / "plan.json"
        plan.write_bytes(data.draw(mutated(name, PLAN)) if name == "plan.json" else PLAN.encode())
        check_irc(["report", str(dumps), "-o", str(outputs / "report.html"), "--npu-plan", str(plan)], outputs)
