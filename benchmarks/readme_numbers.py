"""The numbers and tables README.md quotes, regenerated from the commands that print them.

Every quoted output sits between two marker comments, inline or as a block:

    <!-- readme-numbers:NAME -->463.1<!-- /readme-numbers:NAME -->

and :data:`GENERATORS` maps each NAME to the command whose output it is; docs files that are
one command's whole output (:func:`generated_docs`, e.g. docs/engines_bench.md) are checked
table by table. ``--check`` re-runs
the commands and exits 1 with a unified diff when the README differs (CI runs it:
``tests/test_readme.py``); ``--write`` rewrites the blocks. ``--figures NAME,...`` (with
``--write``) also redraws README figures with exactly the command the README shows beside
them (:data:`FIGURES`). A marker without a generator, or a generator without its marker, is
an error: numbers cannot silently drop out of the check.

Run: python benchmarks/readme_numbers.py --check | --write [--figures compare_l4]
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GRID_EXAMPLE = ROOT / "examples" / "grid.yaml"
DOCS_ENGINES_BENCH = ROOT / "docs" / "engines_bench.md"
MARKER = re.compile(r"<!-- readme-numbers:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /readme-numbers:(?P=name) -->",
                    re.DOTALL)
#: the engine-table rows the README quotes (hardware, workload) of benchmarks/engines_bench.py --md
ENGINE_TABLE_ROWS = (("t4", "mtbench/128"), ("t4", "summarization/64"), ("l4", "mtbench/128"),
                     ("2xt4", "mtbench/128"), ("4xt4", "mtbench/128"))
#: the command line the README's import example shows (hrm import --from llama.cpp ...)
IMPORT_COMMAND = ["import", "--from", "llama.cpp",
                  "llama-server -m MODEL.gguf -ngl 99 -np 64 -c 40960 -ub 64 --n-cpu-moe 28",
                  "--hw", "l4", "--model", "mixtral"]
#: README figures: name -> the hrm command shown beside it (run from the repository root)
FIGURES = {
    "compare_l4": ["search", "--hw", "l4", "--model", "mixtral", "--compare", "--plot", "docs/figures/compare_l4.png"],
    "roofline_moe_ffn_l4": ["plot", "roofline", "--hw", "l4", "--model", "mixtral", "--op", "moe-ffn", "--out",
                            "docs/figures/roofline_moe_ffn_l4.png"],
    # the paper's Fig. 10 is the HRM model's map: engine ideal (the default engine is moe-lightning)
    "policy_map_fig10": ["plot", "policy-map", "--engine", "ideal", "--out", "docs/figures/policy_map_fig10.png", "--csv",
                         "docs/figures/policy_map_fig10.csv"],
    "cpu_memory_l4": ["plot", "cpu-memory", "--hw", "l4", "--model", "mixtral", "--cpu-mems",
                      "100,150,200,250,300,400", "--out", "docs/figures/cpu_memory_l4.png"],
    "timeline_cgopipe_l4": ["plot", "timeline", "--hw", "l4", "--model", "mixtral", "--out",
                            "docs/figures/timeline_cgopipe_l4.png"],
}


# --- running the commands ----------------------------------------------------------------
def hrm(args: list[str]) -> str:
    """stdout of ``hrm ARGS`` (this interpreter's package, run from the repository root);
    RuntimeError with its stderr when it fails."""
    done = subprocess.run([sys.executable, "-m", "hrm_cli", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"hrm {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def hrm_json(args: list[str]) -> dict:
    return json.loads(hrm([*args, "--json"]))


def tok_s(value: float) -> str:
    """Throughput as the CLI tables print it (one decimal, thousands separated)."""
    return f"{value:,.1f}"


# --- the README's numbers, by marker name ------------------------------------------------
def headline() -> dict[str, str]:
    """`hrm-search --hw l4 --model mixtral` (MoE-Lightning by default): its throughput, the
    server's own pick and the ideal machine's bound (`--engine ideal`)."""
    plan = hrm_json(["search", "--hw", "l4", "--model", "mixtral"])
    ideal = hrm_json(["search", "--hw", "l4", "--model", "mixtral", "--engine", "ideal"])
    return {"headline-engine": tok_s(plan["estimate"]["generation_throughput_tok_s"]),
            "headline-ideal": tok_s(ideal["estimate"]["generation_throughput_tok_s"]),
            "headline-server-pick": tok_s(plan["server_pick"]["generation_throughput_tok_s"])}


@functools.cache
def engines_bench_md() -> str:
    """stdout of `python benchmarks/engines_bench.py --md` (run once per process)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engines_bench.py"), "--md"], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"engines_bench.py --md: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


#: docs files that are a command's whole output: path -> that output (their tables are checked;
#: other lines, such as a timing, may differ)
def generated_docs() -> dict[Path, str]:
    return {DOCS_ENGINES_BENCH: engines_bench_md()}


def engine_table() -> dict[str, str]:
    """The header and the :data:`ENGINE_TABLE_ROWS` of `python benchmarks/engines_bench.py --md`."""
    lines = table_lines(engines_bench_md())
    header, rows = lines[:2], lines[2:]
    wanted = [line for key in ENGINE_TABLE_ROWS for line in rows
              if tuple(cell.strip() for cell in line.strip("|").split("|")[:2]) == key]
    return {"engine-table": "\n" + "\n".join(header + wanted) + "\n"}


def import_example() -> dict[str, str]:
    """`hrm import --from llama.cpp "..." --hw l4 --model mixtral`: throughput and GPU memory."""
    result = hrm_json(IMPORT_COMMAND)
    if not result["fits_physical_memory"]:
        raise RuntimeError("the README's import example no longer fits the L4: choose another command")
    estimate = result["estimate"]
    return {"import-tok-s": tok_s(estimate["generation_throughput_tok_s"]),
            "import-gpu-gib": f"{estimate['gpu_peak_bytes'] / 2**30:.1f}", "import-engine": result["engine"]}


def figure_numbers() -> dict[str, str]:
    """What the roofline and policy-map figure commands print or tabulate (drawn to a
    temporary folder: checking never touches docs/figures)."""
    import csv

    with tempfile.TemporaryDirectory() as tmp:
        roof = hrm(["plot", "roofline", "--hw", "l4", "--model", "mixtral", "--op", "moe-ffn", "--out",
                    f"{tmp}/roofline.png"])
        hrm(["plot", "policy-map", "--engine", "ideal", "--out", f"{tmp}/map.png", "--csv", f"{tmp}/map.csv"])
        with open(f"{tmp}/map.csv", newline="") as handle:
            rates = [float(row["generation_throughput_tok_s"]) for row in csv.DictReader(handle)
                     if row["status"] == "ok"]
    p1 = re.search(r"^P1: I = ([\d.]+)", roof, re.MULTILINE)
    p2 = re.search(r"^P2 .*: I = ([\d.]+)", roof, re.MULTILINE)
    if not (p1 and p2 and rates):
        raise RuntimeError(f"hrm plot roofline / policy-map: output changed shape:\n{roof}")
    return {"roofline-p1": f"{float(p1.group(1)):.0f}", "roofline-p2": f"{float(p2.group(1)):.0f}",
            "policy-map-range": f"{min(rates):,.0f} → {max(rates):,.0f}"}


def grid_example() -> dict[str, str]:
    """The shipped example grid, verbatim (examples/grid.yaml; the README names it)."""
    return {"grid-example": "\n```yaml\n" + GRID_EXAMPLE.read_text() + "```\n"}


def exit_codes() -> dict[str, str]:
    """The exit-code table: :data:`hrm_cli.parser.EXIT_CODES` (every --help epilog) as markdown."""
    return {"exit-codes": "\n" + exit_code_table() + "\n"}


def exit_code_rows(text: str | None = None) -> list[tuple[str, str]]:
    """(code, meaning) pairs of ``text`` (default :data:`hrm_cli.parser.EXIT_CODES`); indented
    lines continue the previous meaning."""
    if text is None:
        from hrm_cli.parser import EXIT_CODES

        text = EXIT_CODES
    rows: list[tuple[str, str]] = []
    for line in text.splitlines()[1:]:  # the first line is the title
        code, _, meaning = line.strip().partition(" ")
        if code.isdigit():
            rows.append((code, meaning.strip()))
        elif rows and line.strip():
            rows[-1] = (rows[-1][0], f"{rows[-1][1]} {line.strip()}")
    return rows


def exit_code_table() -> str:
    """:func:`exit_code_rows` as a markdown table (a ``|`` in a meaning escaped)."""
    escaped = [(code, meaning.replace("|", r"\|")) for code, meaning in exit_code_rows()]
    rows = [f"| {code} | {meaning} |" for code, meaning in escaped]
    return "\n".join(["| exit | meaning |", "|---|---|", *rows])


#: every generator; each returns {marker name: text between the markers}
GENERATORS = (headline, engine_table, import_example, figure_numbers, grid_example, exit_codes)


# --- the README --------------------------------------------------------------------------
def current_values() -> dict[str, str]:
    values: dict[str, str] = {}
    for generate in GENERATORS:
        values.update(generate())
    return values


def render(readme: str, values: dict[str, str]) -> str:
    """``readme`` with every marker's body replaced by its value; ValueError on a marker
    without a value or a value without a marker."""
    found = [m.group("name") for m in MARKER.finditer(readme)]
    unknown = sorted(set(found) - set(values))
    missing = sorted(set(values) - set(found))
    if unknown or missing:
        raise ValueError(f"README markers: without a generator {unknown or '-'}; generated but not in the README "
                         f"{missing or '-'}")
    return MARKER.sub(lambda m: f"<!-- readme-numbers:{m.group('name')} -->{values[m.group('name')]}"
                                f"<!-- /readme-numbers:{m.group('name')} -->", readme)


def diff(old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "README.md (now)",
                                        "README.md (what the commands print)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when the README is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the README's marked numbers")
    parser.add_argument("--figures", default="", metavar="NAME,...",
                        help=f"with --write: also redraw these figures ({', '.join(FIGURES)}, or all)")
    args = parser.parse_args(argv)
    figures = list(FIGURES) if args.figures == "all" else [f for f in args.figures.split(",") if f]
    unknown = [f for f in figures if f not in FIGURES]
    if unknown or (figures and not args.write):
        parser.error(f"--figures: unknown {unknown} (of {', '.join(FIGURES)})" if unknown else "--figures needs --write")
    old = README.read_text()
    new = render(old, current_values())
    stale_docs = {path: text for path, text in generated_docs().items()
                  if table_lines(path.read_text()) != table_lines(text)}
    if args.check:
        for path, text in stale_docs.items():
            print(diff(path.read_text(), text), end="")
        if new != old:
            print(diff(old, new), end="")
        if new != old or stale_docs:
            stale = ["README.md"] * (new != old) + [str(path.relative_to(ROOT)) for path in stale_docs]
            print(f"{', '.join(stale)} stale: python benchmarks/readme_numbers.py --write", file=sys.stderr)
            return 1
        print("README.md numbers and the generated docs match what the commands print")
        return 0
    for path, text in stale_docs.items():
        path.write_text(text)
        print(f"rewrote {path.relative_to(ROOT)}")
    for name in figures:
        hrm(FIGURES[name])
        print(f"redrew docs/figures/{name}.png")
    if new != old:
        README.write_text(new)
        print(diff(old, new), end="")
    print("README.md " + ("rewritten" if new != old else "already current"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
