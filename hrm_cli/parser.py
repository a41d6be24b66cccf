"""The argument parser every subcommand uses, and the exit codes every --help ends with."""

from __future__ import annotations

import argparse
import sys

#: the exit codes of every command (each --help ends with them)
EXIT_CODES = """exit codes:
  0    success, also when standard output is closed early by its reader (e.g. | head): the
       rest is dropped quietly
  2    bad input: a file, a field, a flag or an output target (one line on stderr: error: ...)
  3    infeasible: the inputs admit no policy (a memory limit binds)
  130  interrupted (Ctrl-C) before an answer; a search stopped by Ctrl-C once it has one
       prints it, marked not proven optimal, and exits 0"""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2 (no usage dump), and
    ends every --help with the exit codes (:data:`EXIT_CODES`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


