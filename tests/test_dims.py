import pytest

from irc import dims


def test_canonical_sorts_and_merges_terms():
    assert dims.canonical("T+P") == "P+T"
    assert dims.canonical("P+P") == "2*P"
    assert dims.canonical("T*B") == "B*T"
    assert dims.canonical("3+P") == "P+3"
    assert dims.canonical(7) == 7


def test_add_and_mul():
    assert dims.add("P", "T") == "P+T"
    assert dims.add("P", 0) == "P"
    assert dims.add(3, 4) == 7
    assert dims.mul("B", "T") == "B*T"
    assert dims.mul(2, "T") == "2*T"
    assert dims.product(["B", "T", 64]) == "64*B*T"
    assert dims.product([2, 3]) == 6


def test_evaluate():
    assert dims.evaluate("P+T", {"P": 3, "T": 5}) == 8
    assert dims.evaluate("64*B*T", {"B": 2, "T": 5}) == 640
    with pytest.raises(KeyError, match="'T'"):
        dims.evaluate("P+T", {"P": 1})


@pytest.mark.parametrize("bad", [-1, "", "P-T", "2x", True])
def test_rejects_malformed(bad):
    with pytest.raises(ValueError):
        dims.canonical(bad)


class _Input:
    def __init__(self, name, shape):
        self.name, self.shape = name, tuple(dims.canonical(d) for d in shape)


def test_binding_plan_reads_plain_symbols_first_then_a_compound_one():
    plan = dims.binding_plan([_Input("ids", ["B", "T"]), _Input("mask", ["B", "P+T"])])
    assert plan == [("B", "ids", 0, 0, 1), ("T", "ids", 1, 0, 1), ("P", "mask", 1, "T", 1)]
    assert dims.subtract_text("T") == " - T" and dims.subtract_text("T+1") == " - (T+1)"


def test_binding_plan_divides_by_a_symbols_coefficient():
    """Qwen-VL's patches [4*I, K]: I = rows // 4 (and 2*P+T: P = (rows - T) // 2)."""
    assert dims.binding_plan([_Input("pixels", ["4*I", 1176])]) == [("I", "pixels", 0, 0, 4)]
    assert dims.binding_plan([_Input("x", ["2*P+T"]), _Input("y", ["T"])]) == [("T", "y", 0, 0, 1),
                                                                              ("P", "x", 0, "T", 2)]
    assert dims.solve_text("x.shape[0]", "T", 2) == "(x.shape[0] - T) // 2"
    assert dims.solve_text("x.shape[0]", 0, 1) == "x.shape[0]"


def test_binding_plan_leaves_a_symbol_it_cannot_read_off():
    assert dims.binding_plan([_Input("x", ["P*T+T"]), _Input("y", ["T"])]) == [("T", "y", 0, 0, 1)]
