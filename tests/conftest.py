import os

# n xdist workers on n cores: each worker's OpenMP/BLAS pool (torch, numpy) would start n threads,
# n x n threads spinning on n cores. One thread per worker halved the runtime tests' time under
# xdist on this 2-core VM (tests/test_runtime.py + test_routing_runtime.py: 47 s -> 22 s). Set
# before numpy or torch is imported; a value the caller set stands.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

from hrm.machine.hardware import load_hardware, parse_hardware  # noqa: E402
from hrm.model.spec import load_model  # noqa: E402


@pytest.fixture
def tiny():
    return load_model("tiny-mixtral")


@pytest.fixture
def l4():
    return load_hardware("l4")


def two_level_machine(**over):
    """A hand-made two-level machine: GPU 100 TFLOP/s, 1000 GB/s; CPU 1 TFLOP/s, 100 GB/s; link 10 GB/s."""
    data = {
        "name": "hand",
        "gpu": {"name": "g", "memory_gib": 16, "memory_bandwidth_gbps": 1000, "tflops": {"fp32": 100, "fp16": 100}},
        "cpu": {"name": "c", "cores": 8, "memory_gib": 128, "memory_bandwidth_gbps": 100, "tflops": {"fp32": 1}},
        "link": {"h2d_gbps": 10, "d2h_gbps": 10},
    }
    data.update(over)
    return parse_hardware(data)


def call(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``hrm ARGS`` run in-process (argparse exits caught)."""
    from hrm_cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def benchmark_module(relative: str):
    """A script of benchmarks/ (``relative`` to the repository root) imported as a module, once
    (its dataclasses look their module up in sys.modules)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative
    name = path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def interrupt_klotski_schedule(monkeypatch, nth: int) -> list:
    """Make Klotski's branch and bound raise KeyboardInterrupt (a Ctrl-C) on its ``nth``
    schedule; returns the list that grows by one per schedule."""
    import solver.expert_level as klotski_search

    real, calls = klotski_search.klotski_times, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(klotski_search, "klotski_times", interrupted)
    return calls


#: the files with the longest tests (pytest --durations on this 2-core VM, 2026-11-27: every
#: example 127 s, the bad-input corpus 88 s, the notebooks 65 s, the solver's and the exact
#: search's cross-checks, the latency limits, README numbers, Klotski, the web). xdist hands out
#: whole files (--dist loadfile) in collection order (--no-loadscope-reorder): these go first,
#: so no worker is left alone with a two-minute test at the end.
HEAVY_FIRST = ("test_examples.py", "test_corpus.py", "test_notebooks.py", "test_solver.py", "test_search_exact.py",
               "test_latency_limits.py", "test_readme.py", "test_klotski_engine.py", "test_web_browser.py",
               "test_web.py", "test_export.py", "test_printing.py", "test_ground_truth_llamacpp.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))  # stable: file order kept otherwise
