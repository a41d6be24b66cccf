"""Package layering (SPEC §2, issue 11): ``hrm`` is the core and imports none of the others;
``solver`` imports only ``hrm``, ``profiler`` ``hrm`` and ``runtime``; ``runtime`` imports ``hrm`` but not
``solver``; the CLI modules live in ``hrm_cli``, a layer above all of them. Checked on
the source (every import statement, lazy ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hrm", "solver", "runtime", "profiler", "hrm_cli")
ALLOWED = {
    "hrm": {"hrm"},
    "solver": {"hrm", "solver"},
    "profiler": {"hrm", "profiler", "runtime"},  # measures dispatch and emulation with the runtime
    "runtime": {"hrm", "runtime"},
    "hrm_cli": set(PACKAGES),
}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_layers_below(package):
    bad = {str(p.relative_to(ROOT)): sorted(imported_packages(p) - ALLOWED[package])
           for p in sorted((ROOT / package).rglob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_cli_modules_outside_the_cli_layer():
    stray = [str(p.relative_to(ROOT)) for pkg in PACKAGES[:-1] for p in (ROOT / pkg).rglob("cli*.py")]
    assert stray == []
