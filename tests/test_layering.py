"""Package layering (issue 11): ``hrm`` is the core and imports none of the others;
``solver`` imports only ``hrm``, ``profiler`` ``hrm`` and ``runtime``; ``runtime`` imports ``hrm`` but not
``solver``; the CLI modules live in ``hrm_cli``, a layer above all of them. Checked on
the source: every import statement (function-local ones included, relative ones resolved)
and every import string (``importlib.import_module("x.y")``, ``"solver.search:search_lanes"``).
The module-level import graph of the five packages has no cycle."""

from __future__ import annotations

import ast
import re
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
#: a string naming a module of ours: ``pkg.mod``, ``pkg.mod:attr`` or ``pkg:attr``
IMPORT_STRING = re.compile(rf"({'|'.join(PACKAGES)})(\.\w+)*(:\w+)?")
#: calls whose first argument is a module name, whatever it looks like
IMPORT_CALLS = {"import_module", "__import__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    """``hrm/plan.py`` -> ``hrm.plan``; ``hrm/__init__.py`` -> ``hrm``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the five packages, by dotted name."""
    return {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_string_target(text: str) -> str | None:
    """The module a string names (``"solver.search:search_lanes"`` -> ``solver.search``), or None."""
    return text.partition(":")[0] if IMPORT_STRING.fullmatch(text) and ("." in text or ":" in text) else None


def _is_import_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in IMPORT_CALLS


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, str]]:
    """(dotted name, how) for every import in ``tree``: ``import a.b`` gives ``a.b``, ``from a
    import b`` gives ``a.b`` (a submodule, or a name in ``a``), import strings give the module
    they name. ``how`` is ``import`` or ``string``."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, "import") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            found += [(f"{base}.{alias.name}", "import") for alias in node.names]
        elif _is_import_call(node) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.args[0].value.partition(":")[0], "string"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and import_string_target(node.value):
            found.append((import_string_target(node.value), "string"))
    return found


def known_module(name: str, modules) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (None if none is)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def imports_of(modules: dict[str, Path]) -> dict[str, list[tuple[str, str]]]:
    """Per module of ours: :func:`imported_names` of its source."""
    return {name: imported_names(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py")
            for name, path in modules.items()}


def module_graph(imports: dict[str, list[tuple[str, str]]]) -> dict[str, set[str]]:
    """Per module of ours: the modules of ours it imports (``from a import b``: ``a.b`` when
    that is a module, else ``a``; a package's ``__init__`` is not implied by its submodules)."""
    graph = {}
    for name, found in imports.items():
        targets = {known_module(target, imports) for target, _ in found}
        graph[name] = targets - {None, name}
    return graph


def package_imports(imports: dict[str, list[tuple[str, str]]]) -> dict[str, set[tuple[str, str]]]:
    """Per module: the (top-level package of ours, how) of every import naming one, whether
    or not the module it names exists."""
    return {name: {(target.split(".")[0], how) for target, how in found if target.split(".")[0] in PACKAGES}
            for name, found in imports.items()}


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, sorted (Tarjan's
    algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles (``[a, b, ..., a]``): per strongly connected component, the shortest
    cycle through each of its modules, each cycle once."""
    seen, out = set(), []
    for component in components(graph):
        for start in component:
            cycle = cycle_through(graph, component, start)
            key = frozenset(zip(cycle, cycle[1:]))
            if key not in seen:
                seen.add(key)
                out.append(cycle)
    return out


def cycle_through(graph: dict[str, set[str]], component: list[str], start: str) -> list[str]:
    """A shortest cycle through ``start`` within its strongly connected ``component``."""
    members = set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1] + [start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


IMPORTS = imports_of(source_modules())
PACKAGE_IMPORTS = package_imports(IMPORTS)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_layers_below(package):
    bad = {f"{name} ({how})": sorted({pkg for pkg, h in found if h == how} - ALLOWED[package])
           for name, found in PACKAGE_IMPORTS.items() if name.split(".")[0] == package
           for how in ("import", "string")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_hrm_imports_no_other_layer_even_lazily_or_through_strings():
    others = set(PACKAGES) - {"hrm"}
    bad = sorted(f"{name} imports {pkg} ({how})" for name, found in PACKAGE_IMPORTS.items()
                 if name.split(".")[0] == "hrm" for pkg, how in found if pkg in others)
    assert bad == []


def test_module_import_graph_has_no_cycle():
    found = [" -> ".join(cycle) for cycle in cycles(module_graph(IMPORTS))]
    assert not found, "import cycles:\n  " + "\n  ".join(found)


def test_no_cli_modules_outside_the_cli_layer():
    stray = [str(p.relative_to(ROOT)) for pkg in PACKAGES[:-1] for p in (ROOT / pkg).rglob("cli*.py")]
    assert stray == []


# --- the checker itself -------------------------------------------------------------------

def test_relative_imports_resolve_from_modules_and_packages():
    assert resolve_relative("hrm.plan", False, 1, "placement") == "hrm.placement"
    assert resolve_relative("hrm.plots.timeline", False, 2, "cost.latency") == "hrm.cost.latency"
    assert resolve_relative("hrm.plots", True, 1, None) == "hrm.plots"
    assert resolve_relative("hrm", True, 1, "plan") == "hrm.plan"


def test_imports_found_include_lazy_ones_and_import_strings():
    source = '''
import importlib
from . import bounds
def f():
    from .placement import moe_layers
    importlib.import_module("runtime.executor")
    return "solver.search:search_lanes", "hrm", "a sentence about solver.search"
'''
    found = imported_names(ast.parse(source), "hrm.plan", False)
    assert sorted(set(found)) == [("hrm.bounds", "import"), ("hrm.placement.moe_layers", "import"),
                             ("importlib", "import"), ("runtime.executor", "string"), ("solver.search", "string")]
    modules = dict.fromkeys(["hrm", "hrm.bounds", "hrm.placement", "hrm.plan", "runtime.executor", "solver.search"])
    assert module_graph({"hrm.plan": found, **{m: [] for m in modules if m != "hrm.plan"}})["hrm.plan"] == {
        "hrm.bounds", "hrm.placement", "runtime.executor", "solver.search"}


def test_cycles_are_named_by_their_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"], ["c", "a", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: the core's layers, bottom up (docs/ARCHITECTURE.md §4): a wing (a sub-package of ``hrm``) or a
#: top-level module imports only what comes before it; the foundation modules (units, bounds,
#: errors, progress, workload, policy) come first
HRM_LAYERS = ("units", "errors", "bounds", "progress", "workload", "policy", "model/", "machine/", "engines/",
              "cost/", "problem", "pipelines/", "estimate", "plan", "placement", "export/", "analysis/", "plots/")


def hrm_layer(module: str) -> str | None:
    """The layer of an ``hrm`` module: its wing (``hrm.cost.latency.ops`` -> ``cost/``) or its name."""
    parts = module.split(".")
    if parts[0] != "hrm" or len(parts) < 2:
        return None
    return parts[1] + "/" if (ROOT / "hrm" / parts[1]).is_dir() else parts[1]


def test_hrm_wings_import_only_layers_below():
    """The walk of any parameter through the core never climbs back: every import between two
    layers of ``hrm`` goes down HRM_LAYERS, and every module of ``hrm`` has a layer."""
    modules = {m for m in IMPORTS if m.split(".")[0] == "hrm" and m != "hrm"}
    assert {hrm_layer(m) for m in modules} == set(HRM_LAYERS)
    rank = {layer: i for i, layer in enumerate(HRM_LAYERS)}
    up = sorted(f"{a} -> {b}" for a, targets in module_graph(IMPORTS).items() if a in modules
                for b in targets if b in modules and rank[hrm_layer(b)] > rank[hrm_layer(a)])
    assert up == []


def test_hrm_layer_names_a_module_by_its_wing():
    assert hrm_layer("hrm.cost.latency.ops") == "cost/" and hrm_layer("hrm.plan") == "plan"
    assert hrm_layer("solver.search") is None and hrm_layer("hrm") is None
