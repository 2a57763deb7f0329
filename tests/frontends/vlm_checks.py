"""The steps the vision and VLM twin modules share: the twin folder compiled for an ONNX
target and opened as ``irc run`` opens it (``folder_model``); the vision part's features and
the decoder's logits through the reference interpreter against transformers'
(``assert_features_and_logits_match``), and the same through the compiled folder
(``assert_folder_matches``: the last position's logits, as the folder's decoder gives them);
a vision tower's outputs as transformers gives them (``tower_outputs``) against irc's
(``assert_outputs_match``). No transformers needed to import."""
import numpy as np

from irc.check import relative_error
from irc.interpreter import run

TOLERANCE = 1e-4


def compile_folder(folder, out, target: str) -> str:
    """``irc compile`` of the twin's ``folder`` for ``target`` into ``out``: ``str(out)``."""
    from irc_cli import main

    assert main(["compile", str(folder), "--target", target, "-o", str(out / "model.onnx"), "--quiet"]) == 0
    return str(out)


def folder_model(folder, tmp_path, target: str):
    """The folder compiled into ``tmp_path/out``, as ``irc run`` opens it (``FolderModel``)."""
    from irc_cli.run_vlm import FolderModel

    return FolderModel(compile_folder(folder, tmp_path / "out", target))


def assert_features_and_logits_match(graph, vision_feeds: dict, decoder_feeds, want_features, want_logits) -> None:
    """The vision part on ``vision_feeds`` gives ``want_features``; the decoder on
    ``decoder_feeds(those features)`` gives ``want_logits``."""
    features = run(graph.parts["vision"], vision_feeds)["image_features"]
    assert relative_error(features, want_features) <= TOLERANCE
    logits = run(graph, decoder_feeds(features))["logits"]
    assert relative_error(logits, want_logits) <= TOLERANCE


def assert_folder_matches(vlm, graph, feeds, ids, features, want_features, want_logits, note=None) -> None:
    """The compiled folder's ``features`` are ``want_features``; its decoder step on the
    prompt (``feeds(graph, ids, features)`` less the features, which the step takes apart)
    gives the last position's ``want_logits``; ``note`` names the case in a failure."""
    assert relative_error(features, want_features) <= TOLERANCE, note
    step_feeds = {k: v for k, v in feeds(graph, ids, features).items() if k != "image_features"}
    logits = vlm.step(step_feeds, features)["logits"]  # the last position's (last-logits)
    assert relative_error(logits[:, -1], want_logits[:, -1]) <= TOLERANCE, note


def tower_outputs(out) -> dict:
    """A vision tower's output as numpy: last_hidden_state, and pooler_output where it has one."""
    found = {"last_hidden_state": out.last_hidden_state.numpy()}
    if out.pooler_output is not None:
        found["pooler_output"] = out.pooler_output.numpy()
    return found


def assert_outputs_match(got: dict, want: dict) -> None:
    """irc's outputs (numpy, or torch where a module gives them) against ``tower_outputs``."""
    assert sorted(name for name in got if name in ("last_hidden_state", "pooler_output")) == sorted(want)
    for name, expected in want.items():
        actual = got[name] if isinstance(got[name], np.ndarray) else got[name].cpu().float().numpy()
        assert relative_error(actual, expected) <= TOLERANCE, name
