"""The locating safe loader and typed field access."""
import pytest
import yaml

from irc import yamlloc
from irc.yamlloc import Fields, LocatingSafeLoader, positive_int
from irc.errors import SpecError


def test_loader_is_a_safe_loader():
    assert issubclass(LocatingSafeLoader, yaml.SafeLoader)
    assert "SafeLoader" in LocatingSafeLoader.__name__


def test_keys_values_and_items_carry_file_line_column():
    data = yamlloc.loads("model:\n  name: x\n  sizes: [1, 2]\n", "spec.yaml")
    model = data["model"]
    assert str(model.key_locs["sizes"]) == "spec.yaml:3:3"
    assert str(model.value_locs["sizes"]) == "spec.yaml:3:10"
    assert str(model["sizes"].item_locs[1]) == "spec.yaml:3:14"
    assert model.loc.short == "spec.yaml:2"


def test_exponent_without_dot_is_a_float():
    assert yamlloc.loads("eps: 1e-5\nbig: 5E+5\n") == {"eps": 1e-5, "big": 5e5}


def test_duplicate_keys_are_refused():
    with pytest.raises(SpecError, match=r"s.yaml:3:1: duplicate key 'a' \(first at line 1\)"):
        yamlloc.loads("a: 1\nb: 2\na: 3\n", "s.yaml")


def test_syntax_errors_name_file_line_column():
    with pytest.raises(SpecError) as err:
        yamlloc.loads("model:\n  a: [1, 2\n  b: 3\n", "bad.yaml")
    assert str(err.value).startswith("bad.yaml:3:")
    assert "YAML syntax error" in str(err.value)


def test_python_tags_are_refused():
    with pytest.raises(SpecError, match="evil.yaml:1:4"):
        yamlloc.loads("x: !!python/object/apply:os.system ['true']\n", "evil.yaml")


def test_fields_refuse_unknown_keys_with_a_suggestion():
    data = yamlloc.loads("attention:\n  n_head: 4\n", "f.yaml")
    with pytest.raises(SpecError) as err:
        Fields(data["attention"], "model.attention", ("n_heads", "kind"))
    assert str(err.value).startswith("f.yaml:2:3: model.attention.n_head: unknown key")
    assert "did you mean 'n_heads'?" in str(err.value)


def test_fields_check_kinds_at_the_key():
    data = yamlloc.loads("m:\n  n: -2\n", "f.yaml")
    fields = Fields(data["m"], "m", ("n",))
    with pytest.raises(SpecError, match=r"f.yaml:2:3: m.n: expected a positive integer, got -2"):
        fields.get("n", positive_int)
    with pytest.raises(SpecError, match=r"m.k: missing required key"):
        fields.get("k", positive_int)
