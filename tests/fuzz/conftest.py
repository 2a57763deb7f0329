"""The fuzz suite's summary: how many mutated inputs each test ran, by exit code."""
from fuzzing import EXAMPLES, OUTCOMES


def pytest_terminal_summary(terminalreporter):
    if not OUTCOMES:
        return
    terminalreporter.section(f"fuzz cases (up to {EXAMPLES} per test; exit 0 = accepted, 2 = refused)")
    for test in sorted({t for t, _ in OUTCOMES}):
        counts = {code: n for (t, code), n in OUTCOMES.items() if t == test}
        total = sum(counts.values())
        terminalreporter.write_line(f"{test:<28} {total:>6} cases  " +
                                    "  ".join(f"exit {code}: {n}" for code, n in sorted(counts.items())))
