"""Issue 35: every example of the README, the docs and the --help texts runs as written
(benchmarks/examples_table.py finds them; docs/examples_table.md is its last run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_examples():
    spec = importlib.util.spec_from_file_location("examples_table", ROOT / "benchmarks" / "examples_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("examples_table", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_examples_are_found_and_each_is_run_or_says_why():
    module = load_examples()
    examples = module.all_examples()
    commands = {e.command for e in examples}
    # examples the README shows as commands to type, found where they are written
    for command in ("hrm-search --hw l4 --model mixtral --engine flexgen --out plan.json",
                    "hrm sweep examples/grid.yaml --out results.parquet",
                    "hrm profile --quick --out my-box.yaml",
                    "hrm-search --hw l4 --model mixtral --compare --plot docs/figures/compare_l4.png"):
        assert command in commands and not next(e for e in examples if e.command == command).reason, command
    # the engine's flags in quotes are not placeholders of a synopsis; a synopsis is not run
    assert any(e.command.startswith("hrm import --from llama.cpp \"llama-server -m MODEL.gguf") and not e.reason
               for e in examples)
    assert all(e.reason for e in examples if "[--json]" in e.command or " PLAN " in f"{e.command} ")
    # every reason given is for an example still written somewhere (no stale entries)
    assert set(module.NOT_RUN) <= commands, set(module.NOT_RUN) - commands
    assert sum(not e.reason for e in examples) >= 25


def test_the_help_examples_are_the_help_texts_own():
    module = load_examples()
    for where, value, command in module.HELP:
        assert "".join(value.split()) in "".join(module.help_text(where).split()), (where, value)  # wrapped
        if "GRID.yaml" not in value:  # the grid is a file (help-grid.yaml, test_the_help_grid_is_a_grid)
            assert value.strip("'\"").split()[-1] in command


def test_a_file_is_written_before_it_is_read():
    module = load_examples()
    Example = module.Example
    show, write = Example("a:1", "hrm show plan.json"), Example("a:9", "hrm-search --hw l4 --model mixtral --out plan.json")
    assert module.in_order([show, Example("a:5", "hrm ops --model mixtral"), write])[:2] == [write, show]


def test_the_help_grid_is_a_grid(tmp_path, capsys):
    """The GRID.yaml of hrm sweep --help reads as a grid (its example values are valid)."""
    from solver.grid import read_grid

    path = tmp_path / "g.yaml"
    path.write_text(load_examples().help_grid())
    grid = read_grid(path)
    assert grid.hardware == ["l4", "t4", "a100-80g"] and grid.what_if.h2d_gbps == [16, 32, 64]


@pytest.mark.slow
def test_every_example_runs(tmp_path):
    module = load_examples()
    outcomes = module.run_all(module.all_examples())
    failed = [f"{o.example.where}: {o.example.command} -> exit {o.code}\n{o.tail}" for o in outcomes
              if o.code is not None and o.code != module.EXPECTED.get(o.example.command, 0)]
    assert not failed, "\n\n".join(failed)
