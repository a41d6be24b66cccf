"""Command line: ``hrm <subcommand>`` and ``hrm-search``. A thin layer over the API.

Errors the user can fix print one line and exit 2 (bad input) or 3 (infeasible); the
subcommands of other packages (profiler, runtime, solver) are imported lazily so that the
core needs none of them.
"""

from __future__ import annotations

import argparse
import sys

from hrm.errors import HRMError

SUBCOMMANDS = {
    "estimate": ("hrm_cli.estimate", "predict time, memory and throughput of one policy"),
    "search": ("hrm_cli.search", "find the best policy (same as hrm-search)"),
    "show": ("hrm_cli.show", "re-print a plan file"),
    "profile": ("hrm_cli.profile", "measure this machine into a hardware profile"),
    "run": ("hrm_cli.run", "execute a plan in the reference runtime"),
    "validate": ("hrm_cli.validate", "measured vs predicted over several policies"),
    "plot": ("hrm_cli.plot", "roofline, policy-map, cpu-memory and timeline figures"),
    "ops": ("hrm_cli.estimate", "per-operator FLOPs, bytes and intensity of a model"),
}


def run_guarded(func, argv) -> int:
    """Run a subcommand's ``main(argv)``; turn HRMError into one line + exit code."""
    try:
        return int(func(argv) or 0)
    except HRMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"  {name:<9} {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
        print("usage: hrm <subcommand> [options]\n\nsubcommands:\n" + "\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, list(SUBCOMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"error: unknown subcommand '{name}' (one of {', '.join(SUBCOMMANDS)}){hint}", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("hrm", "hrm_cli", "solver", "profiler", "runtime"):
            raise
        print(f"error: 'hrm {name}' needs a missing package ({exc.name}); "
              f"install the extra, e.g. pip install -e '.[runtime]'", file=sys.stderr)
        return 2
    entry = getattr(module, "ops_main" if name == "ops" else "main")
    return run_guarded(entry, rest)


def search_main(argv=None) -> int:
    """``hrm-search`` = ``hrm search``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return main(["search", *argv])


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2 (no usage dump)."""

    def error(self, message):
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


