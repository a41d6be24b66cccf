"""docs/ARCHITECTURE.md and the packages' own docstrings name every module (issue 33): a module
that no map lists is a module no reader finds. Checked on the source tree, both ways: each
module of the five packages is listed in its package's ``__init__`` docstring and in
ARCHITECTURE §4, and every path §4 names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hrm", "solver", "runtime", "profiler", "hrm_cli")


def modules_by_package() -> dict[Path, list[Path]]:
    """Each package folder (one with an ``__init__.py``) -> its modules (not ``__init__`` or
    ``__main__``) and sub-packages."""
    found: dict[Path, list[Path]] = {}
    for top in PACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent
            members = [p for p in sorted(folder.glob("*.py")) if p.stem not in ("__init__", "__main__")]
            members += [d for d in sorted(folder.iterdir()) if (d / "__init__.py").is_file()]
            found[folder] = members
    return found


def listed_in(docstring: str, folder: Path, member: Path) -> bool:
    """``member`` is named in ``docstring``: its dotted name, ``name.py``, ``name/``, ```name```
    in backticks, or ``name (...)`` as in a run-on list."""
    name = member.stem if member.suffix == ".py" else member.name
    dotted = ".".join(member.relative_to(ROOT).with_suffix("").parts)
    patterns = (re.escape(dotted) + r"\b", rf"\b{name}\.py\b", rf"\b{name}/", rf"`{name}`", rf"\b{name}\s+\(")
    return any(re.search(p, docstring) for p in patterns)


def architecture_section_4() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    return text[text.index("## 4."):text.index("## 5.")]


def test_every_module_is_listed_in_its_package_docstring():
    missing = []
    for folder, members in modules_by_package().items():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        missing += [str(m.relative_to(ROOT)) for m in members if not listed_in(doc, folder, m)]
    assert not missing, f"not listed in their package's __init__ docstring: {missing}"


def test_every_module_is_in_architecture_section_4():
    section = architecture_section_4()
    modules = [m for members in modules_by_package().values() for m in members if m.suffix == ".py"]
    missing = [str(m.relative_to(ROOT)) for m in modules if f"{m.relative_to(ROOT).as_posix()}" not in section]
    assert not missing, f"docs/ARCHITECTURE.md §4 does not name: {missing}"


def test_every_path_architecture_section_4_names_exists():
    named = set(re.findall(r"`((?:hrm|solver|runtime|profiler|hrm_cli)/[\w/]*\.py)`", architecture_section_4()))
    assert named and not [p for p in sorted(named) if not (ROOT / p).is_file()]


def test_the_check_catches_a_missing_module(tmp_path):
    folder = ROOT / "hrm" / "cost"
    member = folder / "latency.py"
    assert listed_in(":mod:`hrm.cost.latency`: lanes", folder, member)
    assert listed_in("- ``latency.py``", folder, member)
    assert not listed_in("the latency of a layer", folder, member)
