"""Multi-token-prediction heads (``frontends.hf.mtp``) against transformers 5.25's ``MtpModel``
on tiny random twins (``tests.frontends.mtp_twins``): the head's logits and the hidden state it
hands the next draft step, from the decoder's own last hidden states, in one call and a token
at a time over its cache; and the checkpoints that declare a head they do not hold."""
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from irc import dims
from irc.interpreter import Interpreter

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.frontends.mtp_twins import CASES, hf_head, hf_hidden, twins_fixture  # noqa: E402,F401 (the twins fixture)
from tests.frontends.test_hf_models import TOLERANCE, relative_error  # noqa: E402



def empty_caches(graph, batch: int = 1) -> dict:
    return {v.name: np.zeros(dims.evaluate_shape(v.shape, {"B": batch, "P": 0}), np.float32)
            for v in graph.inputs if v.name.startswith("past_key_values.")}


def head_feeds(ids, positions, hidden, past: int, caches: dict) -> dict:
    return {"input_ids": ids, "attention_mask": np.ones((1, past + ids.shape[1]), np.int64),
            "position_ids": positions, "hidden_states": hidden, **caches}


def tokens(n: int = 10) -> np.ndarray:
    return np.random.default_rng(3).integers(1, 128, (1, n))


@pytest.mark.parametrize("name", sorted(CASES))
def test_head_matches_transformers(twins, name):
    """t_1..t_T at positions 1..T with the decoder's h_0..h_{T-1}: every row's logits and next
    hidden state equal MtpModel's; the decoder's own outputs are what they were."""
    model, mtp, folder = twins(name)
    graph = load_spec(folder)
    head = graph.parts["mtp"]
    assert [v.name for v in graph.outputs if v.name == "hidden_states"] == []  # the decoder unchanged
    toks = tokens()
    hidden = hf_hidden(model, toks[:, :-1])
    ids, positions = toks[:, 1:], np.arange(1, toks.shape[1])[None]
    want, want_next = hf_head(mtp, ids, hidden, positions)
    out = Interpreter(head).run(head_feeds(ids, positions, hidden, 0, empty_caches(head)))
    assert relative_error(out["logits"], want) <= TOLERANCE
    assert relative_error(out["hidden_states_out"], want_next) <= TOLERANCE


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3.5-moe", "mellum", "ernie4.5-moe-sparse-block"])
def test_head_over_its_cache_matches_one_call(twins, name):
    """Five positions, then the rest a token at a time, each fed the presents before: the same
    logits as the one call (the head's KV cache grows as the decoder's does)."""
    model, mtp, folder = twins(name)
    head = load_spec(folder).parts["mtp"]
    toks = tokens()
    hidden = hf_hidden(model, toks[:, :-1])
    ids, positions = toks[:, 1:], np.arange(1, toks.shape[1])[None]
    want, _ = hf_head(mtp, ids, hidden, positions)
    caches, rows = empty_caches(head), []
    for start, stop in [(0, 5)] + [(i, i + 1) for i in range(5, ids.shape[1])]:
        out = Interpreter(head).run(head_feeds(ids[:, start:stop], positions[:, start:stop],
                                               hidden[:, start:stop], start, caches))
        caches = {name: out["present." + name[len("past_key_values."):]] for name in caches}
        rows.append(out["logits"])
    assert relative_error(np.concatenate(rows, axis=1), want) <= TOLERANCE


def test_a_declared_head_the_checkpoint_lacks_is_no_head(twins, tmp_path):
    """config.json says num_nextn_predict_layers 1, the safetensors hold the decoder alone (as
    transformers' save_pretrained writes it): the graph has no MTP part and loads cleanly."""
    _, _, folder = twins("deepseek-v3")
    for name in os.listdir(folder):
        if name != "mtp.safetensors" and os.path.isfile(os.path.join(folder, name)):
            os.symlink(os.path.join(folder, name), tmp_path / name)
    assert json.loads((tmp_path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    graph = load_spec(str(tmp_path))
    assert "mtp" not in graph.parts
    assert "mtp" in load_spec(folder).parts


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3.5-dense", "param2moe", "ernie4.5-moe-dense-block"])
def test_show_counts_the_head_apart(twins, name, capsys):
    """``irc show --json``: the head's own parameters (MtpModel's, the router's score bias
    among them) apart from the decoder's, and its KV cache per token."""
    from irc_cli import main

    model, mtp, folder = twins(name)
    assert main(["show", str(folder), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    own = sum(p.numel() for n, p in [*mtp.named_parameters(), *mtp.named_buffers()]
              if n.startswith("layers.") and not n.endswith("inv_freq"))
    assert shown["mtp_head"]["params_own"] == own
    assert shown["params_total"] == sum(p.numel() for n, p in [*model.named_parameters(), *model.named_buffers()]
                                        if not n.endswith("inv_freq"))
    assert shown["mtp_head"]["kv_cache_bytes_per_token"] > 0
