"""The README against what the code does: its quoted numbers (benchmarks/readme_numbers.py),
its exit-code table, its example grid, its set-up commands, and the recipes' fixes (hrm run
progress, sweep warning, validate --out, plot timeline --plan, [ray] and a loopback Ray)."""

import importlib.util
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def load_readme_numbers():
    spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "benchmarks" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *map(str, args)], capture_output=True, text=True,
                          **kwargs)


def one_line_error(out, needle, code=2):
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert needle in lines[0], lines[0]


# --- the README's own text -----------------------------------------------------------------
def test_setup_commands_unchanged():
    text = README.read_text()
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[highs]' && "
            ".venv/bin/hrm-search --hw l4.yaml --model mixtral") in text
    assert ("python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 && .venv/bin/pip install -q -e "
            "'.[runtime,test,highs,notebooks,ray,web]' && .venv/bin/python -m pytest -q") in text


def test_exit_code_table_is_the_help_epilogs():
    from hrm_cli.parser import EXIT_CODES

    numbers = load_readme_numbers()
    block = dict((m.group("name"), m.group("body")) for m in numbers.MARKER.finditer(README.read_text()))
    rows = [line.split(" | ", 1) for line in block["exit-codes"].strip().splitlines()[2:]]
    table = [(code.strip("| "), meaning.rstrip(" |").replace(r"\|", "|")) for code, meaning in rows]
    assert table == numbers.exit_code_rows(EXIT_CODES)
    assert [code for code, _ in table] == ["0", "2", "3", "130"]


def test_exit_code_rows_join_continuation_lines():
    numbers = load_readme_numbers()
    text = "exit codes:\n  0    ok\n  7    first part\n       second part"
    assert numbers.exit_code_rows(text) == [("0", "ok"), ("7", "first part second part")]


def test_render_refuses_a_marker_without_a_generator_and_a_lost_marker():
    numbers = load_readme_numbers()
    text = "a <!-- readme-numbers:x -->1<!-- /readme-numbers:x --> b"
    assert numbers.render(text, {"x": "2"}) == "a <!-- readme-numbers:x -->2<!-- /readme-numbers:x --> b"
    with pytest.raises(ValueError, match="without a generator"):
        numbers.render(text, {})
    with pytest.raises(ValueError, match="not in the README"):
        numbers.render(text, {"x": "2", "y": "3"})


def test_static_blocks_are_current():
    """The blocks that need no search (exit codes, example grid) equal what the script writes."""
    numbers = load_readme_numbers()
    found = {m.group("name"): m.group("body") for m in numbers.MARKER.finditer(README.read_text())}
    for generate in (numbers.exit_codes, numbers.grid_example):
        for name, body in generate().items():
            assert found[name] == body, f"README block {name} is stale: python benchmarks/readme_numbers.py --write"


@pytest.mark.slow
def test_readme_numbers_match_the_commands():
    """Every number the README quotes is what its command prints now (about 20 s)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readme_numbers.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


# --- the example grid and the sweep's announcement -----------------------------------------
def test_example_grid_is_small_and_reads():
    from hrm_cli.sweep import LARGE_GRID_CELLS
    from solver.grid import grid_cells, read_grid

    path = ROOT / "examples" / "grid.yaml"
    cells = grid_cells(read_grid(path), path)
    assert len(cells) == 48 <= LARGE_GRID_CELLS
    assert "examples/grid.yaml" in README.read_text()


def test_large_grid_warning_names_count_and_time():
    from hrm_cli.sweep import LARGE_GRID_CELLS, large_grid_warning

    assert large_grid_warning(LARGE_GRID_CELLS, 2, "on 2 workers") is None
    line = large_grid_warning(9216, 2, "on 2 workers")
    assert line.startswith("warning: 9,216 cells to run, about ") and " min on 2 workers" in line


def test_sweep_warns_on_stderr_before_a_large_grid(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("hardware: [cpu-only]\nmodels: [tiny-mixtral]\nworkloads: [mtbench]\nengines: [ideal]\n"
                    "batch_sizes: [" + ", ".join(str(n) for n in range(1, 502)) + "]\n")
    # the warning comes before the first cell runs: read it, then stop the sweep (not 501 searches)
    process = subprocess.Popen([sys.executable, "-m", "hrm_cli", "sweep", str(grid), "--out", str(tmp_path / "r.parquet"),
                                "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: the sweep stops, saves and exits (stdout flushed)
        stdout, _ = process.communicate(timeout=60)
    assert first.startswith("warning: 501 cells to run"), first
    assert "warning" not in stdout and stdout.startswith("501 cells")


# --- recipe fixes --------------------------------------------------------------------------
def test_plot_timeline_reads_hardware_and_model_from_the_plan(tmp_path):
    plan = tmp_path / "p.json"
    assert run("search", "--hw", "l4", "--model", "mixtral", "--out", plan).returncode == 0
    out = run("plot", "timeline", "--plan", plan, "--out", tmp_path / "t.png")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "t.png").stat().st_size > 0
    one_line_error(run("plot", "timeline", "--out", tmp_path / "u.png"), "--hw and --model: required without --plan")
    one_line_error(run("plot", "timeline", "--plan", plan, "--hw", "t4", "--out", tmp_path / "u.png"), "sha256")


def test_cpu_memory_with_no_schedules_is_one_line(tmp_path):
    out = run("plot", "cpu-memory", "--hw", "l4", "--model", "mixtral", "--schedules", "", "--out", tmp_path / "c.png")
    one_line_error(out, "--schedules: expected comma-separated schedules")
    assert not (tmp_path / "c.png").exists()


def test_validate_out_makes_the_folder(tmp_path):
    pytest.importorskip("torch")
    target = tmp_path / "new" / "dir"
    out = run("validate", "--hw", "cpu-only", "--policies", "8", "--repeats", "1", "--prompt-len", "8", "--gen-len",
              "2", "--out", target, "--json", timeout=600)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in target.iterdir()) == ["validation.csv", "validation.json", "validation.png"]


def test_validate_out_under_a_file_is_refused_before_the_runs(tmp_path):
    (tmp_path / "file").write_text("x")
    out = run("validate", "--hw", "cpu-only", "--out", tmp_path / "file" / "dir")
    one_line_error(out, "cannot be made")


class FakeTask:
    def __init__(self, phase):
        self.done, self.args = threading.Event(), {"phase": phase}


class FakeExecutor:
    def __init__(self, tasks):
        self.submitted, self.round = tasks, 0


def test_run_progress_counts_the_tasks_done_of_the_current_phase():
    from hrm_cli.run import TaskCounter

    tasks = [FakeTask("prefill") for _ in range(4)]
    ex = FakeExecutor(tasks)
    count = TaskCounter(ex)
    assert count() == (0, 4, "prefill")
    tasks[0].done.set()
    tasks[1].done.set()
    tasks[3].done.set()  # out of order: counted once the ones before it are done
    assert count() == (2, 4, "prefill")
    tasks[2].done.set()
    assert count() == (4, 4, "prefill")
    ex.submitted = [FakeTask("decode") for _ in range(3)]  # the next phase starts from 0
    assert count() == (0, 3, "decode")


def test_run_progress_reports_on_stderr_when_asked(monkeypatch, capsys):
    import time

    import hrm.progress
    from hrm_cli import run as run_module

    monkeypatch.setattr(hrm.progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(hrm.progress, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(run_module, "PROGRESS_POLL_S", 0.01)
    monkeypatch.setenv("HRM_PROGRESS", "1")
    tasks = [FakeTask("decode") for _ in range(3)]
    tasks[0].done.set()
    with run_module.run_progress("hrm run 3/3 (timed)", FakeExecutor(tasks)):
        deadline = time.monotonic() + 5
        while "1/3 tasks" not in capsys.readouterr().err and time.monotonic() < deadline:
            time.sleep(0.02)
    out = capsys.readouterr()
    assert out.out == ""


# --- [ray] and a loopback Ray --------------------------------------------------------------
def test_ray_extra_installs_ray_client():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.replace(" ", "").startswith("ray[client]") for req in extras["ray"])


@pytest.mark.slow
def test_local_ray_listens_on_loopback_only():
    ray = pytest.importorskip("ray")
    from solver.sweep import LOOPBACK, start_local_ray

    assert not ray.is_initialized()
    start_local_ray(1)
    try:
        nodes = ray.nodes()
        assert [node["NodeManagerAddress"] for node in nodes] == [LOOPBACK]
        assert ray.util.get_node_ip_address() == LOOPBACK
        gcs = ray.get_runtime_context().gcs_address
        assert gcs.startswith(f"{LOOPBACK}:"), gcs
    finally:
        ray.shutdown()
