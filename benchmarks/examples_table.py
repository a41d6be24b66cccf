"""Every example command of the README, the docs and the ``--help`` texts, run as written.

An example is a command of this project (``hrm``, ``hrm-search``, ``python benchmarks/...``)
in a fenced code block or in inline code of ``README.md`` or ``docs/**/*.md``, or an example
value a ``--help`` text gives (a policy, an engine's flags, a grid), made into a command.
Usage synopses (``hrm show PLAN``, ``[--json]``, ``...``) and a flag named in prose
(``hrm-search --compare``) are not examples: :data:`NOT_RUN` says why each is left, and so
does every example that cannot run here (a GPU, a server that does not stop).

The rest run in document order in one scratch folder (the README's ``--out plan.json`` is
what its ``hrm show plan.json`` reads), with ``hrm``/``hrm-search`` on PATH as this checkout's
and copies of ``examples/``, ``docs/calibrate/`` and ``docs/validation/runs/``::

    python benchmarks/examples_table.py            # run them, print the table
    python benchmarks/examples_table.py --md       # also write docs/examples_table.md
    python benchmarks/examples_table.py --list     # list them, run nothing

``tests/test_examples.py`` checks that every example found is run or has its reason, and
(marked slow) runs them.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hrm_cli import SUBCOMMANDS as _CLI_SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
#: files that record a past session's exact commands (absolute paths of that host), not examples
RECORDS = ("docs/validation/", "docs/examples_table.md")
#: the first words of a command of this project
PROJECT = re.compile(r"^(hrm|hrm-search|python3? benchmarks/\S+\.py)(\s|$)")
#: every subcommand the CLI registers (a new one's examples are found without a second list)
SUBCOMMANDS = tuple(_CLI_SUBCOMMANDS)
#: a usage synopsis, not an example: a placeholder in capitals, an optional part, alternatives, an ellipsis
SYNOPSIS = re.compile(r"\[|\.\.\.|…|\\\||\|(?!\s*head)|(?<![\w.:/-])(?:[A-Z][A-Z0-9_]+|M|P|S|K|N)(?:\.\w+)?(?![\w=-])")

#: examples that cannot run here, and why (the table lists them with the reason)
NOT_RUN = {
    "hrm serve": "a server that runs until stopped: tests/test_web.py and tests/test_web_browser.py start it on a "
                 "free port and drive it",
    "hrm profile --device cuda": "needs a CUDA GPU (docs/validation/gpu.md ran it on a lent H200)",
    "hrm validate --hw mine.yaml --model small-mixtral --runs-out runs.yaml":
        "needs a profile of your own machine (mine.yaml) and minutes of runtime; the validate -> calibrate chain is "
        "tests/test_calibrate_runtime.py",
    "hrm calibrate runs.yaml --out mine-calibrated.yaml":
        "reads the runs.yaml the hrm validate line above it writes (not run: see there)",
    "hrm run --plan plan.json": "prose: runs the reader's own plan (the README's routing example runs "
                                "hrm run --plan p.json)",
    "python benchmarks/web_latency.py": "a benchmark: 200 requests to a server (minutes); its table is in the README",
    "hrm profile --quick": "prose: names the step benchmarks/validate_bench.py runs; the README's own example "
                           "hrm profile --quick --out my-box.yaml runs the same profile (README.md:70)",
    "python benchmarks/klotski_catalog_bench.py --cpu-mem 512": "a benchmark: the 16 catalog searches (30 s); "
                                                                "its table is docs/klotski_bench.md §4",
    "python benchmarks/web_screenshots.py": "a benchmark: drives Chromium and rewrites docs/figures/web_*.png",
    "python benchmarks/engines_bench.py --md": "a benchmark that rewrites docs/engines_bench.md",
    "python benchmarks/engines_bench_delta.py BEFORE.md AFTER.md": "a synopsis (BEFORE.md, AFTER.md)",
    "python benchmarks/engines_by_batch.py": "a benchmark that rewrites docs/engines_by_batch.md",
    "python benchmarks/export_table.py --md": "a benchmark: prints docs/engines/targets.md (minutes of searches)",
    "python benchmarks/import_table.py > docs/engines/imports.md": "a benchmark that rewrites docs/engines/imports.md",
    "python benchmarks/klotski_bench.py": "a benchmark that rewrites docs/klotski_bench.md (minutes)",
    "python benchmarks/klotski_catalog_bench.py --hw l4,rtx3090":
        "a benchmark: 16 Klotski searches of up to 10 s each (minutes)",
    "python benchmarks/search_bench.py --verify": "a benchmark: --verify over the catalog (minutes)",
    "python benchmarks/sweep_bench.py --workers 2": "a benchmark: starts Ray (minutes)",
    "python benchmarks/calibrate_example.py": "rewrites the shipped docs/calibrate/noisy.yaml (the same file: seeded)",
}
#: exit codes other than 0 that an example is written to show
EXPECTED = {}
#: seconds one example may take before it counts as failed
TIMEOUT_S = 300


@dataclass(frozen=True)
class Example:
    where: str       # README.md:66, or "hrm import --help"
    command: str     # as written (continuation lines joined, the prompt and the comment removed)
    cwd: str = ""    # a folder of the scratch copy to run it in (a "cd" before it in the same block)

    @property
    def reason(self) -> str | None:
        """Why it is not run, or None."""
        if self.command in NOT_RUN:
            return NOT_RUN[self.command]
        if SYNOPSIS.search(re.sub(r'"[^"]*"', '""', self.command)):  # an engine's flags in quotes are its own
            return "a usage synopsis (placeholders or optional parts)"
        return None


def _clean(line: str) -> str:
    line = line.strip()
    line = re.sub(r"^\$\s+", "", line)
    line = re.sub(r"\s+#.*$", "", line)                 # a shell comment
    line = re.sub(r"\s{2,}\(.*\)$", "", line)           # a diagram's note: "hrm-search ...   (console script ...)"
    if " && " in line and not PROJECT.match(line):       # "pip install ... && hrm serve": the project's part
        line = line.split(" && ")[-1]
    return re.sub(r"^\.venv/bin/", "", line).strip()


def _is_command(text: str) -> bool:
    if not PROJECT.match(text):
        return False
    words = text.split()
    if words[0] == "hrm":
        return len(words) > 1 and words[1] in SUBCOMMANDS
    if words[0] == "hrm-search":
        return len(words) > 1 and words[1].startswith("-")
    return True


def _complete(text: str) -> bool:
    """An inline mention is an example when it is a whole command: it names its inputs."""
    words = text.split()
    if words[0].startswith("python"):
        return True
    if words[0] == "hrm-search" or words[1] in ("estimate", "search", "ops", "import", "validate"):
        return "--model" in words
    if words[1] == "plot":
        return "--out" in words
    if words[1] in ("show", "export", "calibrate", "sweep"):
        return len(words) > 2 and not words[2].startswith("-") and (words[1] == "show" or "--out" in words
                                                                    or "--to" in words)
    if words[1] == "run":
        return "--plan" in words and len(words) > 3
    if words[1] == "fit":
        return "--context" in words
    if words[1] == "profile":
        return len(words) > 2
    return words[1] == "serve"


def doc_examples() -> list[Example]:
    found: list[Example] = []
    for name in DOCS:
        if name.startswith(RECORDS):
            continue
        lines = (ROOT / name).read_text().splitlines()
        fenced, cwd, i = False, "", 0
        prose: list[tuple[int, str]] = []  # the paragraph so far: inline code may wrap a line
        while i < len(lines):
            line, number = lines[i], i + 1
            i += 1
            if fenced or line.startswith("```") or not line.strip():
                found.extend(_inline(name, prose))
                prose = []
            if line.startswith("```"):
                fenced, cwd = not fenced, ""
                continue
            if fenced:
                text = line
                while text.rstrip().endswith("\\") and i < len(lines):
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                    i += 1
                text = _clean(text)
                if re.match(r"^cd\s+\S+$", text):
                    cwd = text.split()[1]
                elif _is_command(text):
                    found.append(Example(f"{name}:{number}", text, cwd or DOC_CWD.get(name, "")))
                continue
            if line.strip():
                prose.append((number, line))
        found.extend(_inline(name, prose))
    return found


def _inline(name: str, paragraph: list[tuple[int, str]]) -> list[Example]:
    """The whole commands in a paragraph's inline code (a code span may wrap a line)."""
    if not paragraph:
        return []
    text = "\n".join(line for _, line in paragraph)
    found = []
    for match in re.finditer(r"`([^`]+)`", text):
        command = _clean(" ".join(match.group(1).split()))
        if _is_command(command) and _complete(command):
            number = paragraph[0][0] + text.count("\n", 0, match.start())
            found.append(Example(f"{name}:{number}", command, DOC_CWD.get(name, "")))
    return found


#: the example values of the --help texts, as whole commands (the value as the help writes it)
HELP = [
    ("hrm estimate --help", "N=1152,mu=36,attn=cpu,ffn=gpu,rw=0,rc=0",
     "hrm estimate --hw l4 --model mixtral --policy N=1152,mu=36,attn=cpu,ffn=gpu,rw=0,rc=0"),
    ("hrm import --help", '"-ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28"',
     'hrm import --from llama.cpp --hw l4 --model mixtral "-ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28"'),
    ("hrm import --help", "-- -ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28 -nkvo",
     "hrm import --from llama.cpp --hw l4 --model mixtral -- -ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28 -nkvo"),
    ("hrm import --help", '"--n-cpu-moe=28"', 'hrm import --from llama.cpp --hw l4 --model mixtral "--n-cpu-moe=28"'),
    ("hrm plot timeline --help", "'N=2496,mu=192,rw=0.11'",
     "hrm plot timeline --hw l4 --model mixtral --policy 'N=2496,mu=192,rw=0.11' --out timeline.png"),
    ("hrm sweep --help", "GRID.yaml (every combination", "hrm sweep help-grid.yaml --out help-grid.parquet --dry-run"),
]
#: examples run in a folder of the scratch copy: a doc whose examples name files beside it
DOC_CWD = {"docs/calibrate.md": "docs/calibrate"}


def help_grid() -> str:
    """The GRID.yaml of ``hrm sweep --help``, as a file."""
    from hrm_cli.sweep import GRID_HELP

    block = GRID_HELP.split("\n\n")[0].splitlines()[1:]
    return "\n".join(block) + "\n"


def help_text(where: str) -> str:
    """The ``--help`` text that ``where`` ("hrm import --help") names, on one line."""
    import contextlib
    import io

    from hrm_cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(where.split()[1:])
    return " ".join(out.getvalue().split())


def help_examples() -> list[Example]:
    return [Example(where, command) for where, _, command in HELP]


def all_examples() -> list[Example]:
    return doc_examples() + help_examples()


def scratch() -> Path:
    """A folder with copies of the shipped inputs the examples name and ``hrm``/``hrm-search``
    of this checkout on PATH (``bin/``)."""
    folder = Path(tempfile.mkdtemp(prefix="hrm-examples-"))
    shutil.copytree(ROOT / "examples", folder / "examples")
    shutil.copytree(ROOT / "docs" / "calibrate", folder / "docs" / "calibrate")
    # the committed real runs, profile and tensor tables the llama.cpp examples read
    shutil.copytree(ROOT / "docs" / "validation" / "runs", folder / "docs" / "validation" / "runs")
    # the ground-truth models' config.json files (a llama-server example's --model; the runs name them)
    shutil.copytree(ROOT / "benchmarks" / "ground_truth" / "configs", folder / "benchmarks" / "ground_truth" / "configs")
    (folder / "docs" / "figures").mkdir(parents=True)
    (folder / "help-grid.yaml").write_text(help_grid())
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, code in (("hrm", "from hrm_cli import main"), ("hrm-search", "from hrm_cli import search_main as main")):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
                          f"{shlex.quote(code + '; raise SystemExit(main())')} \"$@\"\n")
        script.chmod(0o755)
    return folder


@dataclass(frozen=True)
class Outcome:
    example: Example
    code: int | None      # None: not run
    seconds: float
    tail: str


def run_example(example: Example, folder: Path) -> Outcome:
    env = {**os.environ, "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "HRM_PROGRESS": "0", "COLUMNS": "100"}
    command = example.command.replace("python benchmarks/", f"{shlex.quote(sys.executable)} {ROOT}/benchmarks/")
    start = time.perf_counter()
    process = subprocess.Popen(["bash", "-c", command], cwd=folder / example.cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=TIMEOUT_S)
        code, tail = process.returncode, out[-1500:]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the command and whatever it started (a sweep's workers)
        process.communicate()
        code, tail = 124, f"timed out after {TIMEOUT_S} s"
    return Outcome(example, code, time.perf_counter() - start, tail)


#: flags whose value is a file a command writes
WRITES = ("--out", "--runs-out", "--routing-trace", "--csv")


def written(command: str) -> set[str]:
    words = shlex.split(command)
    return {words[i + 1] for i, w in enumerate(words[:-1]) if w in WRITES} | \
        {w.split("=", 1)[1] for w in words if w.split("=", 1)[0] in WRITES and "=" in w}


def in_order(examples: list[Example]) -> list[Example]:
    """Document order, except that an example that reads a file a later example writes (the
    README's CLI table shows hrm show plan.json before the hrm-search that writes it) runs
    after that writer."""
    todo, ordered, seen = list(examples), [], set()

    def place(example: Example, depth: int = 0) -> None:
        if id(example) in seen:
            return
        seen.add(id(example))
        words = set(shlex.split(example.command)[1:])
        for later in todo:
            if later is not example and id(later) not in seen and not later.reason and depth < 3 and \
                    (written(later.command) & words) - written(example.command):
                place(later, depth + 1)
        ordered.append(example)

    for example in todo:
        place(example)
    return ordered


def run_all(examples: list[Example], folder: Path | None = None, report=None) -> list[Outcome]:
    folder = folder or scratch()
    outcomes = []
    for example in in_order(examples):
        if example.reason:
            outcome = Outcome(example, None, 0.0, example.reason)
        else:
            outcome = run_example(example, folder)
        outcomes.append(outcome)
        if report:
            report(outcome)
    return outcomes


def previous_outcomes(path: Path) -> dict[str, Outcome]:
    """The rows of an earlier table (``--md``), by command: kept for the examples ``--only`` skips."""
    found = {}
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        match = re.match(r"^\| (?P<where>[^|]+) \| `(?P<command>.*)` \| (?P<code>-?\d+) \| (?P<s>[\d.]+) s \|$", line)
        if match:
            command = re.sub(r"^\(in [^)]*\) ", "", match["command"]).replace(r"\|", "|")
            found[command] = Outcome(Example(match["where"].strip(), command), int(match["code"]),
                                     float(match["s"]), "")
    return found


def markdown(outcomes: list[Outcome], seconds: float, conditions: str = "") -> str:
    ran = [o for o in outcomes if o.code is not None]
    ok = sum(o.code == EXPECTED.get(o.example.command, 0) for o in ran)
    lines = [
        "# Every example, run as written",
        "",
        "Every command of this project in `README.md`, `docs/**/*.md` (fenced or inline, not the usage synopses) and "
        "the example values of the `--help` texts, run in document order in one scratch folder by "
        "`python benchmarks/examples_table.py --md` (`tests/test_examples.py` runs the same list, marked slow). "
        f"Measured on {platform.node() or 'this host'}: {os.cpu_count()} cores, CPU only"
        f"{'; ' + conditions if conditions else ''}; {len(ran)} run, {ok} with the exit code they are written to "
        f"show, {seconds:.0f} s in all; "
        f"{len(outcomes) - len(ran)} not run, each with its reason.",
        "",
        "| where | command | exit | time |",
        "|---|---|---:|---:|",
    ]
    for o in outcomes:
        command = o.example.command.replace("|", r"\|")
        if o.example.cwd:
            command = f"(in {o.example.cwd}) {command}"
        if o.code is None:
            lines.append(f"| {o.example.where} | `{command}` | not run: {o.example.reason} | |")
        else:
            lines.append(f"| {o.example.where} | `{command}` | {o.code} | {o.seconds:.1f} s |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--md", action="store_true", help="write docs/examples_table.md")
    parser.add_argument("--list", action="store_true", help="list the examples and why any is not run")
    parser.add_argument("--conditions", default="", help="what else ran on the machine, for the table's header")
    parser.add_argument("--only", metavar="WHERE,...",
                        help="run only these examples (README.md:241,...) and the ones that write their inputs; "
                             "with --md the other rows are kept from the table as it is")
    args = parser.parse_args()
    examples = all_examples()
    if args.list:
        for e in examples:
            print(f"{e.where:<42} {'RUN ' if not e.reason else 'skip'} {e.command[:110]}"
                  + (f"\n{'':<47}({e.reason})" if e.reason else ""))
        return 0
    start = time.perf_counter()

    def report(o: Outcome) -> None:
        state = "skip" if o.code is None else f"{o.code:>4}"
        print(f"{state} {o.seconds:6.1f} s  {o.example.where:<40} {o.example.command[:90]}", flush=True)

    if args.only:
        wanted = set(args.only.split(","))
        chosen = [e for e in examples if e.where in wanted]
        needed = {id(e) for e in chosen}
        for example in chosen:  # the examples that write what a chosen one reads
            words = set(shlex.split(example.command)[1:])
            needed |= {id(w) for w in examples if not w.reason and written(w.command) & words}
        fresh = {id(o.example): o for o in run_all([e for e in examples if id(e) in needed], report=report)}
        old = previous_outcomes(ROOT / "docs" / "examples_table.md")
        outcomes = []
        for example in in_order(examples):
            if id(example) in fresh:
                outcomes.append(fresh[id(example)])
            elif example.reason:
                outcomes.append(Outcome(example, None, 0.0, example.reason))
            elif example.command in old:
                outcomes.append(Outcome(example, old[example.command].code, old[example.command].seconds, ""))
            else:
                raise SystemExit(f"{example.where}: no earlier row for {example.command!r}: add it to --only")
    else:
        outcomes = run_all(examples, report=report)
    seconds = time.perf_counter() - start
    if args.only:
        seconds = sum(o.seconds for o in outcomes)
    if args.md:
        (ROOT / "docs" / "examples_table.md").write_text(markdown(outcomes, seconds, args.conditions))
    bad = [o for o in outcomes if o.code is not None and o.code != EXPECTED.get(o.example.command, 0)]
    for o in bad:
        print(f"\nFAILED {o.example.where}: {o.example.command}\n{o.tail}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
