"""Progress of a long compile on a terminal: which pass runs, then tensors and bytes written.

``Progress.for_terminal(stream, quiet)`` shows bars (tqdm) only when ``stream`` is a
terminal and ``quiet`` is false; otherwise every call is a no-op, so logs, pipes and tests
see nothing. Updates may come from several threads (the weight writer's workers): counts
are kept under one lock.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO


class Progress:
    """Bars for the passes and the weights; ``enabled=False`` draws nothing."""

    def __init__(self, enabled: bool = False, stream: Optional[TextIO] = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._bar = None
        self._tensors = (0, 0)
        self._started = 0

    @classmethod
    def for_terminal(cls, stream: Optional[TextIO] = None, quiet: bool = False) -> "Progress":
        stream = stream if stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        return cls(enabled=not quiet and bool(isatty and isatty()), stream=stream)

    @contextmanager
    def passes(self, total: int) -> Iterator["Progress"]:
        """A bar over a pipeline of ``total`` passes; ``pass_started(name)`` moves it."""
        self._started = 0
        with self._open(total=total, desc="passes", unit="pass", unit_scale=False):
            yield self
            with self._lock:
                if self._bar is not None:
                    self._bar.update(self._bar.total - self._bar.n)

    def pass_started(self, name: str) -> None:
        """Pass ``name`` starts (the one before it has finished)."""
        with self._lock:
            if self._bar is None:
                return
            if self._started:
                self._bar.update(1)
            self._started += 1
            self._bar.set_postfix_str(name)

    @contextmanager
    def weights(self, total_bytes: int, tensors: int) -> Iterator["Progress"]:
        """A bar over ``total_bytes`` of weights in ``tensors`` tensors."""
        self._tensors = (0, tensors)
        with self._open(total=total_bytes, desc="weights", unit="B", unit_scale=True, unit_divisor=1024,
                        postfix=f"0/{tensors} tensors"):
            yield self

    def wrote(self, nbytes: int, tensor_done: bool = False) -> None:
        """``nbytes`` more written; ``tensor_done`` when they finished a tensor."""
        with self._lock:
            if self._bar is None:
                return
            if tensor_done:
                self._tensors = (self._tensors[0] + 1, self._tensors[1])
                self._show_tensors()
            self._bar.update(nbytes)

    def _show_tensors(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self._tensors[0]}/{self._tensors[1]} tensors", refresh=False)

    @contextmanager
    def _open(self, **options):
        if not self.enabled:
            yield
            return
        from tqdm import tqdm

        bar = tqdm(file=self.stream, leave=False, dynamic_ncols=True, **options)
        with self._lock:
            self._bar = bar
        try:
            yield
        finally:
            with self._lock:
                self._bar = None
            bar.close()


SILENT = Progress(enabled=False)
