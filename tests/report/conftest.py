"""Session fixtures for the report tests (the runs themselves live in report_runs)."""
from __future__ import annotations

import pytest

from report_runs import BIG_PIPELINE, BIG_SPEC, TINY_PIPELINE, TINY_SPEC, Run, run_pipeline  # noqa: F401


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Run:
    return run_pipeline(TINY_SPEC, TINY_PIPELINE, tmp_path_factory.mktemp("tiny-dump"), check=True)


@pytest.fixture(scope="session")
def big_run(tmp_path_factory) -> Run:
    return run_pipeline(BIG_SPEC, BIG_PIPELINE, tmp_path_factory.mktemp("big-dump"), check=False)
