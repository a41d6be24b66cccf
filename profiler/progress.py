"""Progress reporting for a profile run: a no-op reporter (API, tests) and a rich one (CLI).

The rich display goes to stderr so that ``hrm profile`` without ``--out`` can print clean
YAML on stdout.
"""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Receives the run's steps as they happen."""

    def start(self, total_steps: int) -> None: ...

    def step(self, label: str) -> None: ...

    def done(self) -> None: ...

    def note(self, message: str) -> None: ...


class NullReporter:
    """Reports nothing; keeps the notes it was given (handy in tests)."""

    def __init__(self) -> None:
        self.total_steps = 0
        self.labels: list[str] = []
        self.notes: list[str] = []

    def start(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def step(self, label: str) -> None:
        self.labels.append(label)

    def done(self) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


class RichReporter:
    """A rich progress bar on stderr: one task advancing per measurement step, with the
    current step's label and the elapsed time. Use as a context manager."""

    def __init__(self, console=None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]profile[/]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}", markup=False),
                                 console=self.console, transient=False)
        self.task = None

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start(self, total_steps: int) -> None:
        self.task = self.progress.add_task("starting", total=total_steps)

    def step(self, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=label)

    def done(self) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def note(self, message: str) -> None:
        from rich.markup import escape

        self.progress.console.print(f"[yellow]note:[/] {escape(message)}", highlight=False)
