"""HTML reports of a pipeline run: ``irc compile ... --report FILE`` and ``irc report DUMP_DIR``.

``build_report`` assembles the page (``html``) from the dump directory's steps (``steps``),
the IR diffs (``diff``), graph pictures laid out in Python (``layout``, drawn by ``svg``),
the model-at-a-glance figures (``model``; a recurrent or hybrid stack's layer map and memory
against context in ``recurrent``), node provenance (``provenance``) and, where
there is one, an NPU plan (``npu``).
"""


def build_report(*args, **kwargs) -> str:
    """The report page (``irc.report.html.build_report``); imported on first use so that the
    CLI's start-up does not pay for it."""
    from irc.report.html import build_report as build
    return build(*args, **kwargs)


def npu_page(plan: dict) -> str:
    """An NPU plan alone as one self-contained page (``irc.report.html.npu_page``)."""
    from irc.report.html import npu_page as page
    return page(plan)


def load_steps(*args, **kwargs):
    """The pipeline's steps read from a dump directory (``irc.report.steps.load_steps``)."""
    from irc.report.steps import load_steps as load
    return load(*args, **kwargs)


__all__ = ["build_report", "load_steps", "npu_page"]
