"""Progress of the steps that can take more than a moment (a branch and bound, a sweep, a
runtime run), on standard error so that standard output stays what ``--json`` prints.

A :class:`Progress` is silent for its first :data:`PROGRESS_DELAY_S` (a quick step shows
nothing), then reports at most every :data:`PROGRESS_EVERY_S`: on a terminal one line
rewritten in place (cleared at the end), elsewhere (a log, CI) a plain line per report.
Where it reports is decided once, by :func:`progress_enabled`.
"""

from __future__ import annotations

import os
import sys
import time

#: a step shorter than this shows no progress at all
PROGRESS_DELAY_S = 1.0
#: the most often a step reports (seconds between two reports)
PROGRESS_EVERY_S = 1.0
#: ``HRM_PROGRESS=1`` reports even when standard error is not a terminal (logs, CI),
#: ``HRM_PROGRESS=0`` never; unset: on a terminal only
PROGRESS_ENV = "HRM_PROGRESS"


def progress_enabled(stream=None) -> bool:
    """Whether progress is shown on ``stream`` (standard error): :data:`PROGRESS_ENV`, else
    whether it is a terminal."""
    setting = os.environ.get(PROGRESS_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False


class Progress:
    """``with Progress("Klotski branch and bound", total=n) as step: step(done, "best 412 tok/s")``."""

    def __init__(self, description: str, total: int | None = None, stream=None, enabled: bool | None = None):
        self.description = description
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(self.stream) if enabled is None else enabled
        self.live = self.enabled and _isatty(self.stream)
        self.started = time.perf_counter()
        self.last_report = self.started - PROGRESS_EVERY_S
        self.shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.shown and self.live:
            self._write("\r\x1b[2K")

    def __call__(self, done: int | None = None, note: str = "") -> None:
        """Report ``done`` (of ``total``) and a short note, when it is time to."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.started < PROGRESS_DELAY_S or now - self.last_report < PROGRESS_EVERY_S:
            return
        self.last_report, self.shown = now, True
        count = "" if done is None else (f" {done:,}/{self.total:,}" if self.total else f" {done:,}")
        line = f"{self.description}:{count} {now - self.started:.0f} s{'; ' + note if note else ''} (Ctrl-C stops)"
        self._write(f"\r\x1b[2K{line}" if self.live else line + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # progress never fails the step it reports on
            self.enabled = False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
