"""The fuzzing harness: mutations of valid inputs, and one check every mutated input must pass.

A case runs ``irc`` in-process (``irc_cli.main``) on a mutated file and must end, within
``SECONDS``, with exit 0, or with exit 2 and exactly one ``irc: error:`` message and no
traceback; when it fails, the output folder holds nothing new, and when it succeeds, no
temporary file is left there. A Python exception escaping ``main`` (a crash), or the time
bound passing (a hang), fails the test; hypothesis then shrinks the input.

Budget: ``EXAMPLES`` cases per test, 100 by default, the same ones each run (the whole suite
about 30 s here), ``IRC_FUZZ_EXAMPLES=2000`` for a long run of fresh cases. ``pytest -m fuzz --hypothesis-seed=N`` replays
one run; a failure prints the seed and the reproduction blob.

Mutations (``mutated_tree`` for parsed JSON/YAML, ``mutated_text`` and ``mutated_bytes``
for the file itself): deleted keys and items, wrong types, extreme numbers (0, -1, 2^40,
2^64, NaN, inf), huge strings, renamed and duplicated keys, deep nesting, binary garbage,
truncation.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import io
import math
import os
import signal
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from irc import limits
from irc_cli import main

EXAMPLES = int(os.environ.get("IRC_FUZZ_EXAMPLES", "100"))
SECONDS = 10.0  # per case; a tiny spec takes about 0.05 s
# Cases run under lower size limits than irc's defaults (irc.limits): a mutation that turns
# 2 layers into 4,000 makes a valid spec that takes seconds to build, not a hang; a
# refusal is reached the same way (tests/test_limits.py holds the defaults).
LIMITS = {"layers": 256, "nodes": 20_000}
TEMPORARY_PREFIXES = (".irc-tmp-", ".tmp-")

# The default budget draws the same cases every run (derandomized), so the suite cannot fail on
# a new draw that has nothing to do with the change under test; a long run (IRC_FUZZ_EXAMPLES)
# draws fresh cases, replayed with --hypothesis-seed.
fuzz_settings = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                         derandomize="IRC_FUZZ_EXAMPLES" not in os.environ,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.filter_too_much, HealthCheck.large_base_example])

HUGE = 2 ** 40
EXTREMES = [0, -1, 1, 2, 3, HUGE, -HUGE, 2 ** 63, 2 ** 64 + 1, 10 ** 30, -2.5, 0.5, 1e308, 1e-308,
            math.nan, math.inf, -math.inf, "", "x" * 100_000, "\x00\x7f", "1e5", "not-a-value", True, False,
            None, [], {}, [0], [-1, HUGE], {"x": 1}, {"": None}]
GARBAGE = [b"\x00", b"\xff\xfe", b"\x80\x81\x82", b"{", b"[", b"]", b"}", b":", b"- ", b"\t", b"'", b'"', b"&a",
           b"*a", b"!!python/object:os.system", b"%", b"@", b"\n  ", b"\r", b"\\u0000", b"#", b"<<: *a"]


# (test, exit code) -> cases, printed at the end of the run (tests/fuzz/conftest.py)
OUTCOMES: collections.Counter = collections.Counter()


class Hang(BaseException):
    """The time bound passed (a BaseException, so no ``except Exception`` in irc hides it)."""


# ---- running one case -------------------------------------------------------------------------

def _alarm(signum, frame):
    raise Hang(f"no answer within {SECONDS} s")


def run_irc(argv: list[str], seconds: float = SECONDS) -> tuple[int, str, str]:
    """``irc argv`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), limits.applied(**LIMITS):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


def check_outcome(code, err: str, folder, before: list[str], argv) -> None:
    """The contract every mutated input is held to (module docstring)."""
    assert code in (0, 2), f"exit {code} for {argv}: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    after = listing(folder)
    if code == 2:
        assert err.startswith("irc: error: ") and err.count("irc: error:") == 1, err[-2000:]
        assert after == before, f"a failed run left {sorted(set(after) - set(before))}"
    leftovers = [name for name in after if name.startswith(TEMPORARY_PREFIXES)]
    assert not leftovers, f"temporary files left: {leftovers}"


def check_irc(argv: list[str], folder) -> tuple[int, str]:
    """Run ``irc argv`` (its outputs go to ``folder``) and hold it to the contract."""
    before = listing(folder)
    code, out, err = run_irc(argv)
    check_outcome(code, err, folder, before, argv)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("::")[-1].split("[")[0]
    OUTCOMES[test, code] += 1
    return code, err


@contextlib.contextmanager
def workspace():
    """A fresh folder for one case's inputs (``in/``) and outputs (``out/``)."""
    with tempfile.TemporaryDirectory(prefix="irc-fuzz-") as root:
        inputs, outputs = Path(root, "in"), Path(root, "out")
        inputs.mkdir()
        outputs.mkdir()
        yield inputs, outputs


# ---- mutations ----------------------------------------------------------------------------------

def _paths(tree, prefix=()):
    """Every place in a JSON-like tree: (path to the container, key or index)."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _container(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


def deep(depth: int, leaf=1):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


values = st.one_of(st.sampled_from(EXTREMES), st.integers(), st.floats(), st.text(max_size=12),
                   st.integers(2, 300).map(deep))


@st.composite
def mutated_tree(draw, tree, max_mutations: int = 3):
    """``tree`` (a parsed JSON or YAML document) with one to three mutations."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, max_mutations))):
        places = list(_paths(tree))
        if not places:
            return copy.deepcopy(draw(values))
        path = draw(st.sampled_from(places))
        parent, key = _container(tree, path), path[-1]
        action = draw(st.sampled_from(["delete", "replace", "replace", "replace", "wrap", "rename", "scale"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":  # a copy: a later mutation must not change the shared extremes
            parent[key] = copy.deepcopy(draw(values))
        elif action == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}, [parent[key]] * 2]))
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from([str(key).upper(), f"{key}_", "", "?", "1"]))] = parent.pop(key)
        elif action == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * draw(st.sampled_from([0, -1, 2, 1000, HUGE, 0.5, math.nan]))
    return tree


@st.composite
def mutated_text(draw, text: str, max_mutations: int = 3):
    """``text`` with one to three line- or byte-level mutations (duplicated lines give
    duplicated keys; garbage and truncation give broken syntax)."""
    data = text.encode()
    for _ in range(draw(st.integers(1, max_mutations))):
        lines = data.split(b"\n")
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        action = draw(st.sampled_from(["duplicate", "delete", "garbage", "truncate", "number", "nest", "swap"]))
        if action == "duplicate":
            lines.insert(at, lines[at])
        elif action == "delete":
            del lines[at]
        elif action == "swap" and len(lines) > 1:
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif action == "number":
            lines[at] = _replace_number(draw, lines[at])
        if action in ("duplicate", "delete", "swap", "number"):
            data = b"\n".join(lines)
            continue
        pos = draw(st.integers(0, len(data)))
        if action == "garbage":
            junk = draw(st.one_of(st.sampled_from(GARBAGE), st.binary(min_size=1, max_size=16)))
            data = data[:pos] + junk + data[pos:]
        elif action == "truncate":
            data = data[:pos]
        else:
            depth = draw(st.sampled_from([50, 500, 5000, 50_000]))
            data = data[:pos] + b"[" * depth + b"]" * depth + data[pos:]
    return data


def _replace_number(draw, line: bytes) -> bytes:
    digits = [i for i, c in enumerate(line) if chr(c).isdigit()]
    if not digits:
        return line
    start = end = draw(st.sampled_from(digits))
    while start > 0 and chr(line[start - 1]).isdigit():
        start -= 1
    while end < len(line) and chr(line[end]).isdigit():
        end += 1
    new = draw(st.sampled_from(["0", "-1", str(HUGE), str(2 ** 64 + 1), "1e400", ".nan", "NaN", "-2.5", "9" * 400, "9" * 5000]))
    return line[:start] + new.encode() + line[end:]


@st.composite
def mutated_bytes(draw, data: bytes, region: int, max_mutations: int = 3):
    """``data`` with one to three byte-level mutations, most inside its first ``region``
    bytes (a header): flipped and overwritten bytes, inserted garbage, truncation."""
    for _ in range(draw(st.integers(1, max_mutations))):
        action = draw(st.sampled_from(["flip", "overwrite", "insert", "truncate"]))
        limit = len(data) if draw(st.integers(0, 4)) == 0 else min(region, len(data))
        pos = draw(st.integers(0, max(limit - 1, 0)))
        if action == "flip" and data:
            data = data[:pos] + bytes([data[pos] ^ draw(st.integers(1, 255))]) + data[pos + 1:]
        elif action == "overwrite":
            word = draw(st.sampled_from([b"\xff" * 8, b"\x00" * 8, (2 ** 40).to_bytes(8, "little"),
                                         (2 ** 63).to_bytes(8, "little"), b"\x7f\xff\xff\xff"]))
            data = data[:pos] + word + data[pos + len(word):]
        elif action == "insert":
            data = data[:pos] + draw(st.binary(min_size=1, max_size=16)) + data[pos:]
        else:
            data = data[:pos]
    return data
