"""``irc run`` on state-space models: the reference interpreter and a compiled folder
(plain onnxruntime, irc's loop; onnxruntime-genai when installed) give the same tokens with
the conv and recurrent states fed back, and a state that comes back in another shape than
its input is one error naming both."""
import json

import numpy as np
import pytest

from irc.errors import IRCError
from irc.interpreter import generate
from frontends import load_spec
from irc_cli import engines, main

SPECS = ["examples/tiny-mamba2-2.7b.yaml", "examples/tiny-jamba-1.5-mini.yaml"]
PROMPT = [3, 17, 42, 5, 9]


def run_json(capsys, *argv) -> dict:
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("spec", SPECS)
def test_folder_and_interpreter_generate_the_same_tokens(spec, tmp_path, capsys):
    want, _ = generate(load_spec(spec), PROMPT, 8)
    ids = ",".join(map(str, PROMPT))
    assert run_json(capsys, "run", spec, "--prompt-ids", ids, "--max-new-tokens", 8, "--json")["tokens"] == want
    folder = tmp_path / "out"
    assert main(["compile", spec, "--target", "onnx-ort", "-o", str(folder / "model.onnx"), "--quiet"]) == 0
    capsys.readouterr()
    for engine in ("ort", "genai") if engines._has_genai() else ("ort",):
        got = run_json(capsys, "run", folder, "--prompt-ids", ids, "--max-new-tokens", 8, "--json", "--engine", engine)
        assert got["tokens"] == want, engine


class Clock:
    def start(self):
        pass

    def token(self, token):
        pass


def test_a_state_returned_in_another_shape_is_refused():
    states = {"past_key_values.0.conv_state": np.zeros((1, 8, 3), np.float32),
              "past_key_values.1.key": np.zeros((1, 2, 0, 4), np.float32)}

    def step(feeds):
        past = feeds["past_key_values.1.key"].shape[2]
        return {"logits": np.zeros((1, feeds["input_ids"].shape[1], 16), np.float32),
                "present.0.conv_state": np.zeros((1, 8, 4), np.float32),  # K columns, not K-1
                "present.1.key": np.zeros((1, 2, past + feeds["input_ids"].shape[1], 4), np.float32)}

    with pytest.raises(IRCError, match=r"state input past_key_values\.0\.conv_state takes \[1, 8, 3\], but the "
                                       r"model returned \[1, 8, 4\] as present\.0\.conv_state"):
        engines.greedy_loop(step, states, [1, 2], 4, set(), Clock())


def test_a_growing_kv_cache_is_not_a_state():
    caches = {"past_key_values.0.key": np.zeros((1, 2, 0, 4), np.float32)}

    def step(feeds):
        past = feeds["past_key_values.0.key"].shape[2]
        return {"logits": np.zeros((1, feeds["input_ids"].shape[1], 16), np.float32),
                "present.0.key": np.zeros((1, 2, past + feeds["input_ids"].shape[1], 4), np.float32)}

    tokens, _ = engines.greedy_loop(step, caches, [1, 2], 3, set(), Clock())
    assert tokens == [0, 0, 0]
