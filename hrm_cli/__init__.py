"""Command line: ``hrm <subcommand>`` and ``hrm-search``. A thin layer over the API.

Errors the user can fix print one line and exit 2 (bad input) or 3 (infeasible); the
subcommands of other packages (profiler, runtime, solver) are imported lazily so that the
core needs none of them.

One module per subcommand: ``search.py`` (``hrm search``, ``hrm-search``), ``estimate.py``,
``show.py``, ``export.py``, ``import_flags.py`` (``hrm import`` of a pasted command),
``import_bench.py`` (``hrm import`` of llama-bench / llama-batched-bench commands), ``fit.py``,
``calibrate.py``, ``profile.py``, ``run.py``, ``validate.py``, ``sweep.py``, ``plot.py``,
``serve.py`` (the web planner, ``web/``); ``parser.py`` (the parser every subcommand uses, the
exit codes), ``common.py`` (argument groups they share), ``__main__.py`` (``python -m hrm_cli``).
"""

from __future__ import annotations

import errno
import os
import sys

from hrm.errors import HRMError

from .parser import EXIT_CODES, ArgumentParser  # noqa: F401  (the package's public names)

SUBCOMMANDS = {
    "estimate": ("hrm_cli.estimate", "predict time, memory and throughput of one policy"),
    "search": ("hrm_cli.search", "find the best policy (same as hrm-search)"),
    "show": ("hrm_cli.show", "re-print a plan file"),
    "profile": ("hrm_cli.profile", "measure this machine into a hardware profile"),
    "run": ("hrm_cli.run", "execute a plan in the reference runtime"),
    "validate": ("hrm_cli.validate", "measured vs predicted over several policies"),
    "plot": ("hrm_cli.plot", "roofline, policy-map, cpu-memory and timeline figures"),
    "ops": ("hrm_cli.estimate", "per-operator FLOPs, bytes and intensity of a model"),
    "export": ("hrm_cli.export", "a plan as another engine's command line (flexgen, llama.cpp, vllm, ...)"),
    "import": ("hrm_cli.import_flags", "another engine's command line as a policy, estimated"),
    "fit": ("hrm_cli.fit", "the fastest llama.cpp command for a machine, a model and a context"),
    "sweep": ("hrm_cli.sweep", "search every cell of a hardware x model x workload x engine x what-if grid (Parquet)"),
    "calibrate": ("hrm_cli.calibrate", "fit a profile's achieved rates to your own measured runs"),
    "serve": ("hrm_cli.serve", "the web planner: the planner in a browser and a JSON API (loopback by default)"),
}

#: the optional extra (pyproject.toml) that brings a package a subcommand may import
EXTRAS = {"torch": "runtime", "safetensors": "runtime", "ray": "ray", "highspy": "highs", "fastapi": "web",
          "uvicorn": "web", "jinja2": "web", "starlette": "web", "multipart": "web", "python_multipart": "web"}


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's final flush of what is
    still buffered cannot fail again (Python's documented recipe for SIGPIPE/EPIPE)."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (captured, closed)
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fileno)
        os.close(devnull)
    except OSError:
        pass


def _error(message: str, code: int) -> int:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


def missing_extra(exc: ImportError, command: str) -> str | None:
    """The one line for a package of an optional extra that is not installed (None when the
    missing module is one of this project's own: a real bug, left to raise)."""
    top = (exc.name or "").split(".")[0]
    if not top or top in ("hrm", "hrm_cli", "solver", "profiler", "runtime"):
        return None
    extra = EXTRAS.get(top, "runtime")
    return (f"'{command}' needs a missing package ({exc.name}); "
            f"install the extra: pip install 'hrm-moe[{extra}]'")


def run_guarded(func, argv, command: str = "hrm") -> int:
    """Run a subcommand's ``main(argv)`` and flush its output; the one place where failures
    become exit codes (:data:`EXIT_CODES`): HRMError → its one line and 2 or 3; a package of
    an optional extra not installed (imported lazily, e.g. torch by ``hrm run``) → one line
    naming the extra and 2; stdout closed by its reader (BrokenPipeError, ``| head``) → 0,
    quietly; any other OSError (a full disk, /dev/full
    as stdout, an unreadable file) or undecodable text → one line and 2; Ctrl-C → 130."""
    try:
        try:
            code = int(func(argv) or 0)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (2, its line printed)
            if isinstance(exc.__context__, BrokenPipeError):  # rich's Console.on_broken_pipe: SystemExit(1)
                raise exc.__context__ from None
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return code
    except HRMError as exc:
        return _error(exc, exc.exit_code)
    except ImportError as exc:
        line = missing_extra(exc, command)
        if line is None:
            raise
        return _error(line, 2)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except OSError as exc:
        if exc.filename is None:  # a write to stdout (print/rich) failed, e.g. ENOSPC on /dev/full
            _silence_stdout()
            return _error(f"cannot write the output ({exc.strerror or errno.errorcode.get(exc.errno, exc)})", 2)
        return _error(f"{exc.filename}: {exc.strerror or exc}", 2)
    except UnicodeError as exc:
        return _error(f"input is not valid text ({exc})", 2)
    except KeyboardInterrupt:
        return _error("interrupted", 130)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"  {name:<9} {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
        text = "usage: hrm <subcommand> [options]\n\nsubcommands:\n" + "\n".join(lines) + "\n\n" + EXIT_CODES
        if argv:  # asked for help: the usage on stdout, exit 0
            return run_guarded(lambda _: print(text), [])
        # no subcommand: one error line on stderr, exit 2, as every bad input (hrm --help: the usage)
        print("error: a subcommand is required (" + ", ".join(SUBCOMMANDS) + "; hrm --help lists them)",
              file=sys.stderr)
        return 2
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
        line = missing_extra(exc, f"hrm {name}")
        if line is None:
            raise
        return _error(line, 2)
    entry = getattr(module, "ops_main" if name == "ops" else "main")
    return run_guarded(entry, rest, f"hrm {name}")


def search_main(argv=None) -> int:
    """``hrm-search`` = ``hrm search``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return main(["search", *argv])
