"""load_spec: picks the frontend from the file."""
import pytest

from frontends import load_spec
from irc.errors import SpecError


def test_python_file_with_build(tmp_path):
    path = tmp_path / "m_dsl.py"
    path.write_text(
        "from frontends.dsl import Model\n"
        "def build():\n"
        "    m = Model('py', vocab=16, d_model=8)\n"
        "    x = m.embed(m.input_ids())\n"
        "    for layer in m.layers(1):\n"
        "        x = x + layer.swiglu(layer.rms_norm(x), d_ff=16)\n"
        "    m.logits(x)\n"
        "    return m.graph\n")
    graph = load_spec(path)
    assert graph.name == "py" and graph.nodes[-1].origin == "m_dsl.py:7"


def test_python_file_with_a_module_level_model(tmp_path):
    path = tmp_path / "m2.py"
    path.write_text("from frontends.dsl import Model\nmodel = Model('mod', vocab=16, d_model=8)\n"
                    "model.logits(model.embed(model.input_ids()), tied=True)\n")
    assert load_spec(path).name == "mod"


def test_python_file_without_a_model(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    with pytest.raises(SpecError, match="empty.py: a DSL file must define build"):
        load_spec(path)


def test_dsl_mistakes_in_a_file_name_the_line(tmp_path):
    path = tmp_path / "bad_dsl.py"
    path.write_text("from frontends.dsl import Model\nm = Model('b', vocab=16, d_model=8)\nx = m.embed(m.input_ids())\n"
                    "layer = next(m.layers(1))\nlayer.attention(x, heads=4, kv_heads=3)\n")
    with pytest.raises(SpecError, match=r"bad_dsl.py:5: kv_heads: 4 heads are not divisible by 3 kv heads"):
        load_spec(path)


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="unknown spec type '.toml'"):
        load_spec(tmp_path / "m.toml")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")


def test_python_syntax_errors_name_the_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def build(:\n")
    with pytest.raises(SpecError, match=r"broken.py:1:\d+: Python syntax error"):
        load_spec(path)
