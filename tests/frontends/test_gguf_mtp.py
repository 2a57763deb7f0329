"""A GGUF file's multi-token-prediction head (``frontends.gguf.mtp``) against transformers 5.25's
``MtpModel``: GLM-4.5's twin of ``tests.frontends.mtp_twins`` written as llama.cpp's
``Glm4MoeModel`` writes a released checkpoint (``gguf_convert_2026`` for the decoder, the head's
block as block n with the ``nextn.*`` tensors and the embedding / LM head copies), read back
with ``load_gguf``: the head's logits and next hidden state equal MtpModel's (float weights;
Q8_0 blocks within the block format's error), and ``irc run FILE --speculative mtp`` gives
plain greedy's tokens."""
import copy
import json

import gguf
import numpy as np
import pytest

from frontends.gguf import load_gguf
from irc.interpreter import Interpreter

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gguf_convert_2026 import converted, converter_keys  # noqa: E402
from gguf_writer import _quantizable, write_file  # noqa: E402
from tests.frontends.mtp_twins import build_mtp_twin, hf_head, hf_hidden  # noqa: E402
from tests.frontends.test_hf_models import TOLERANCE, relative_error  # noqa: E402
from tests.frontends.test_hf_mtp import empty_caches, head_feeds, tokens  # noqa: E402

Q8_TOLERANCE = 2e-2  # Q8_0 (8-bit codes, one scale per 32): the format's error, not irc's (measured 1.2e-2)
OWN = {"eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
       "post_norm": "nextn.shared_head_norm"}  # MtpModel's layer attribute -> the converter's name in block n


def head_tensors(model, mtp) -> dict:
    """Block n as ``Glm4MoeModel`` writes it: the MTP block's tensors converted as a decoder
    layer's, the head's own as ``nextn.*``, and the copies of the embedding and LM head."""
    n = model.config.num_hidden_layers
    deeper = copy.deepcopy(model.config)
    deeper.num_hidden_layers = n + 1
    host = type(model)(deeper).eval()
    host.model.layers[n].load_state_dict(mtp.layers[0].mtp_block.state_dict())
    block = f"blk.{n}."
    out = {name: data for name, data in converted(host, "glm4moe").items() if name.startswith(block)}
    layer = mtp.layers[0]
    for part, name in OWN.items():
        out[f"{block}{name}.weight"] = getattr(layer, part).weight.detach().float().numpy().copy()
    out[block + "nextn.embed_tokens.weight"] = model.model.embed_tokens.weight.detach().float().numpy().copy()
    out[block + "nextn.shared_head_head.weight"] = model.lm_head.weight.detach().float().numpy().copy()
    return out


def write_with_head(path, model, mtp, qtype=None) -> str:
    tensors = {**converted(model, "glm4moe"), **head_tensors(model, mtp)}
    tensors = {name: (gguf.quants.quantize(data, qtype), qtype) if _quantizable(name, data, qtype) else data
               for name, data in tensors.items()}
    return write_file(path, "glm4moe", converter_keys(model.config, "glm4moe", mtp=1), tensors)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm4-moe")
    model, mtp, _ = build_mtp_twin("glm4-moe", folder)
    return model, mtp, write_with_head(folder / "glm4-moe-mtp.gguf", model, mtp)


def head_error(head, model, mtp) -> tuple:
    """(logits error, next hidden state error) of ``head`` against MtpModel: t_1..t_T at
    positions 1..T with the decoder's h_0..h_{T-1}."""
    toks = tokens()
    hidden = hf_hidden(model, toks[:, :-1])
    ids, positions = toks[:, 1:], np.arange(1, toks.shape[1])[None]
    want, want_next = hf_head(mtp, ids, hidden, positions)
    out = Interpreter(head).run(head_feeds(ids, positions, hidden, 0, empty_caches(head)))
    return relative_error(out["logits"], want), relative_error(out["hidden_states_out"], want_next)


def test_head_matches_transformers(twin):
    model, mtp, path = twin
    graph = load_gguf(path, weights="float")
    assert [v.name for v in graph.outputs if v.name == "hidden_states"] == []  # the decoder unchanged
    head = graph.parts["mtp"]
    assert head.meta["mtp"] == {"layers": 1, "hidden_first": False}
    logits, hidden = head_error(head, model, mtp)
    assert logits <= TOLERANCE and hidden <= TOLERANCE


def test_q8_blocks_hold_the_head(twin, tmp_path):
    """Q8_0 blocks: the head's projections read the file's codes (``dequant_linear``), its
    logits MtpModel's within ``Q8_TOLERANCE`` (measured 1.2e-2, as the float graph of the same
    file: the 8-bit weights' own error), and ``exact``'s the float graph's."""
    model, mtp, _ = twin
    path = write_with_head(tmp_path / "q8.gguf", model, mtp, qtype=gguf.GGMLQuantizationType.Q8_0)
    blocks = load_gguf(path).parts["mtp"]
    assert any(n.op == "dequant_linear" and n.inputs[0].name.startswith("mtp.") for n in blocks.nodes)
    assert max(head_error(blocks, model, mtp)) <= Q8_TOLERANCE
    exact, floats = (load_gguf(path, weights=w).parts["mtp"] for w in ("exact", "float"))
    feeds = head_feeds(tokens()[:, 1:], np.arange(1, 10)[None], hf_hidden(model, tokens()[:, :-1]), 0,
                       empty_caches(exact))
    assert relative_error(Interpreter(exact).run(feeds)["logits"], Interpreter(floats).run(feeds)["logits"]) <= 1e-5


def test_a_file_without_the_nextn_block_has_no_head(twin, tmp_path):
    """``nextn_predict_layers`` 0 and the decoder's blocks alone (``--no-mtp``): no MTP part."""
    model, _, _ = twin
    path = write_file(tmp_path / "plain.gguf", "glm4moe", converter_keys(model.config, "glm4moe", mtp=0),
                      converted(model, "glm4moe"))
    assert "mtp" not in load_gguf(path).parts


def test_speculative_mtp_run_gives_plain_greedy(twin, capsys):
    from irc_cli import main

    _, _, path = twin
    argv = ["run", str(path), "--prompt-ids", "5,6,7,8,9,5,6", "--max-new-tokens", "18", "--json"]
    assert main(argv) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(argv + ["--speculative", "mtp=2"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == want["tokens"]
    assert got["speculative"]["drafter"] == "mtp" and got["speculative"]["proposed"] > 0
