"""The steps the YAML test modules share: a YAML example held against the graph the HF
frontend builds from the matching config.json (``assert_hf_builds``: the same graph but for
its meta, which carries generation settings), and a YAML mistake as the frontend reports it
(``assert_mistake``: one SpecError at the file's line, naming the key and what is wrong;
``assert_missing_section``: at line 1, naming the layer that needs it; ``show_error``:
``irc show`` exits 2; ``assert_refused_and_not_compiled``: ``irc compile`` exits 2 and
writes nothing)."""
import json

import numpy as np
import pytest

from frontends import load_spec, yaml_spec
from frontends.hf import load_hf
from irc.errors import SpecError
from irc.interpreter import generate, random_feeds, run
from irc.printer import print_graph


def without_meta(graph) -> str:
    return "\n".join(line for line in print_graph(graph).splitlines() if not line.lstrip().startswith("meta "))


def hf_graph(tmp_path, config: dict, name: str):
    """The graph the HF frontend builds (no weights) from ``config`` written as
    ``tmp_path/name/config.json``."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return load_hf(folder, weights=False)


def assert_hf_builds(tmp_path, config: dict, graph) -> None:
    """``config`` through the HF frontend is ``graph`` but for its meta."""
    assert without_meta(hf_graph(tmp_path, config, graph.name)) == without_meta(graph)


def assert_tiny_example(tmp_path, path, config: dict) -> None:
    """The tiny example at ``path`` is ``config``'s HF graph, and generates 4 tokens of its
    256-token vocabulary."""
    from_yaml = load_spec(path)
    assert_hf_builds(tmp_path, config, from_yaml)
    tokens, _ = generate(from_yaml, [1, 2, 3], 4)
    assert len(tokens) == 4 and all(0 <= t < 256 for t in tokens)


def assert_prefills_and_generates(graph) -> None:
    """A prefill of a random batch of 2 x 3 tokens from zero states and empty caches gives
    finite logits over the 256-token vocabulary; 4 greedy tokens generate."""
    feeds = random_feeds(graph, batch=2, tokens=3)
    for value in graph.inputs:  # zero states and empty caches: a prefill
        if value.name.startswith("past_key_values."):
            feeds[value.name] = np.zeros_like(feeds[value.name])
    logits = run(graph, feeds)["logits"]
    assert logits.shape == (2, 3, 256) and np.isfinite(logits).all()
    tokens, last = generate(graph, [1, 2, 3], 4)
    assert len(tokens) == 4 and all(0 <= t < 256 for t in tokens) and np.isfinite(last).all()


def build(text: str):
    return yaml_spec.loads(text, "spec.yaml")


def spec_error(tmp_path, text: str, name: str = "bad.yaml") -> str:
    """``text`` written as ``tmp_path/name`` and loaded: the SpecError's message."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return str(err.value)


def edited(base: str, old: str, new: str, count: int = -1) -> str:
    assert old in base, old
    return base.replace(old, new, count)


def assert_mistake(tmp_path, text: str, line: int, key: str, words: str, name: str = "bad.yaml",
                   after: str = ": ") -> None:
    """``text`` refused with a message starting at ``name``'s ``line``, naming ``key`` (then
    ``after``) and holding ``words``."""
    message = spec_error(tmp_path, text, name)
    assert message.startswith(f"{tmp_path / name}:{line}:"), message
    assert f"{key}{after}" in message and words in message, message


def assert_refused_and_not_compiled(tmp_path, text: str, message: str) -> None:
    """One SpecError matching ``message`` at the key's file:line; ``irc compile`` exits 2 and
    writes nothing."""
    from irc_cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError, match=message) as err:
        load_spec(spec)
    assert f"{spec}:" in str(err.value)
    out = tmp_path / "out"
    assert main(["compile", str(spec), "--target", "onnx", "-o", str(out / "model.onnx")]) == 2
    assert not out.exists()


def assert_missing_section(text: str, section: str, kind: str) -> None:
    """``text`` (as ``build`` names it) refused at 1:1 for the missing ``model.section``, its
    hint the first layer of ``kind``."""
    with pytest.raises(SpecError) as err:
        build(text)
    assert str(err.value).startswith(f"spec.yaml:1:1: model.{section}: missing required key")
    assert err.value.hint == f"layer 0 is {kind}"


def show_error(tmp_path, capsys, text: str):
    """``irc show`` on ``text`` written as ``tmp_path/bad.yaml`` exits 2: (that path, stderr)."""
    from irc_cli.commands import main

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["show", str(path)]) == 2
    return path, capsys.readouterr().err
