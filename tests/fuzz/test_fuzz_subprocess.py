"""A few mutated specs through a real ``irc`` process (the in-process cases share one
interpreter): exit 0 or 2, one message, no traceback, no stray output, within the bound."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from irc.limits import ENVIRONMENT
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import EXAMPLES, LIMITS, SECONDS, check_outcome, fuzz_settings, listing, mutated_text, mutated_tree, workspace

pytestmark = pytest.mark.fuzz

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "tiny-llama3.yaml"


@settings(fuzz_settings, max_examples=max(3, EXAMPLES // 100))
@given(st.data())
def test_mutated_spec_in_a_real_process(data):
    text = SPEC.read_text()
    if data.draw(st.booleans()):
        mutated = yaml.safe_dump(data.draw(mutated_tree(yaml.safe_load(text))), sort_keys=False).encode()
    else:
        mutated = data.draw(mutated_text(text))
    with workspace() as (inputs, outputs):
        spec = inputs / "spec.yaml"
        spec.write_bytes(mutated)
        argv = ["compile", str(spec), "--target", "numpy", "-o", str(outputs / "model.py")]
        before = listing(outputs)
        environment = {**os.environ, **{ENVIRONMENT[k]: str(v) for k, v in LIMITS.items()}}
        done = subprocess.run([sys.executable, "-m", "irc_cli", *argv], cwd=ROOT, capture_output=True, text=True,
                              env=environment, timeout=SECONDS + 20)  # start-up on top of the bound
        check_outcome(done.returncode, done.stderr, outputs, before, argv)
