"""HTML reports of a pipeline run: ``irc compile ... --report FILE`` and ``irc report DUMP_DIR``.

``build_report`` assembles the page (``html``) from the dump directory's steps (``steps``),
the IR diffs (``diff``), graph pictures laid out in Python (``layout``, drawn by ``svg``),
the model-at-a-glance figures (``model``), node provenance (``provenance``) and, where
there is one, an NPU plan (``npu``).
"""
from irc.report.html import build_report
from irc.report.steps import Step, load_steps

__all__ = ["build_report", "load_steps", "Step"]
