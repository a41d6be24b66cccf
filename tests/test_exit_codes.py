"""The exit-code contract (``hrm_cli.parser.EXIT_CODES``), subcommand by subcommand: every
--help ends with it; a bad flag and a missing input file exit 2 with one line; the ones that
search or estimate exit 3 when nothing fits; a closed standard output exits 1 quietly; Ctrl-C
exits 130 before an answer (a search with one prints it, exit 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hrm_cli import SUBCOMMANDS, main
from hrm_cli.parser import EXIT_CODES

PLOT_KINDS = ("roofline", "policy-map", "cpu-memory", "timeline")


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "HRM_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "hrm_cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, **kwargs)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("argv", [[name] for name in SUBCOMMANDS] + [["plot", kind] for kind in PLOT_KINDS])
def test_every_help_ends_with_the_exit_codes(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.rstrip().endswith(EXIT_CODES)


def test_the_top_level_help_ends_with_the_exit_codes(capsys):
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(EXIT_CODES)


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_an_unknown_flag_exits_2_with_one_line(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--no-such-flag"])
    assert exit_info.value.code == 2
    _one_error_line(capsys.readouterr().err)


#: per subcommand, a command whose input file does not exist (the path is the last part named)
MISSING_FILE = {
    "estimate": ["--hw", "{missing}.yaml", "--model", "mixtral", "--policy", "N=8,mu=8,n=1,attn=gpu,ffn=gpu,rw=0,rc=0"],
    "search": ["--hw", "{missing}.yaml", "--model", "mixtral"],
    "show": ["{missing}.json"],
    "profile": ["--compare", "{missing}.yaml"],
    "run": ["--plan", "{missing}.json"],
    "validate": ["--hw", "{missing}.yaml", "--model", "tiny-mixtral"],
    "plot": ["roofline", "--hw", "{missing}.yaml", "--model", "mixtral", "--out", "{tmp}/r.png"],
    "ops": ["--model", "{missing}.json"],
    "export": ["{missing}.json", "--to", "vllm"],
    "import": ["--from", "vllm", "--hw", "{missing}.yaml", "--model", "mixtral", "--cpu-offload-gb 10"],
    "sweep": ["{missing}.yaml", "--out", "{tmp}/out.parquet", "--dry-run"],
    "calibrate": ["{missing}.yaml"],
    "fit": ["--hw", "{missing}.yaml", "--gguf", "x.gguf", "--context", "2048"],
}


#: subcommands that read no input file (hrm serve: uploads come over HTTP, tests/test_web.py)
NO_INPUT_FILE = {"serve"}


def test_the_missing_file_table_covers_every_subcommand():
    assert set(MISSING_FILE) | NO_INPUT_FILE == set(SUBCOMMANDS)


@pytest.mark.parametrize("name", list(MISSING_FILE))
def test_a_missing_input_file_exits_2_naming_it(name, tmp_path):
    missing = str(tmp_path / "no-such-file")
    argv = [part.format(missing=missing, tmp=tmp_path) for part in MISSING_FILE[name]]
    done = _cli(name, *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "no-such-file" in _one_error_line(done.stderr)
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("argv", [
    ["search", "--hw", "l4", "--model", "mixtral", "--gpu-mem", "1", "--cpu-mem", "8"],
    ["estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy", "N=100000,mu=1000,n=100,attn=gpu,ffn=gpu,rw=1,rc=1"],
    ["import", "--from", "llama.cpp", "--hw", "l4", "--model", "mixtral", "-np 256 -c 2000000 -ngl 99"],
])
def test_what_does_not_fit_exits_3(argv, tmp_path):
    done = _cli(*argv, cwd=tmp_path)
    assert done.returncode == 3, done.stdout[-500:] + done.stderr
    assert _one_error_line(done.stderr)


@pytest.mark.parametrize("argv", [
    ["search", "--hw", "l4", "--model", "mixtral"],
    ["search", "--hw", "l4", "--model", "mixtral", "--json"],
    ["estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy", "N=64,mu=64,n=1,attn=cpu,ffn=gpu,rw=0,rc=0"],
    ["ops", "--model", "mixtral"],
])
def test_a_closed_standard_output_exits_0_quietly(argv, tmp_path):
    """The reader is gone before the first write (the read end closed at once)."""
    env = {**os.environ, "HRM_PROGRESS": "0"}
    process = subprocess.Popen([sys.executable, "-m", "hrm_cli", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=tmp_path, env=env)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 0, stderr
    assert stderr == ""


def _interrupt_after_progress(argv, cwd, started=("Ctrl-C", "%")) -> tuple[int, str, str]:
    """Start ``hrm argv`` with progress forced on, send SIGINT once a line on standard error
    holds one of ``started`` (the work has begun), and return (exit code, stdout, stderr)."""
    env = {**os.environ, "HRM_PROGRESS": "1", "COLUMNS": "100"}
    # as from a terminal: SIGINT at its default in the child, whatever this process inherited or set
    # (an ignored SIGINT survives exec, and Python then installs no KeyboardInterrupt handler)
    process = subprocess.Popen([sys.executable, "-m", "hrm_cli", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in process.stderr:
        lines.append(line)
        if any(mark in line for mark in started):
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=300)
    return process.returncode, out, "".join(lines) + err


def test_ctrl_c_in_a_long_search_prints_the_best_so_far(capsys, monkeypatch):
    """Ctrl-C during Klotski's branch and bound (here on its third schedule: every catalog search
    now proves its optimum within seconds, too soon for a signal from outside) prints the best
    scheduled policy, marked stopped, and exits 0."""
    from conftest import call, interrupt_klotski_schedule

    calls = interrupt_klotski_schedule(monkeypatch, 3)
    # 7 of this space's 36 candidates are scheduled before the optimum is proven
    code, out, err = call(capsys, "search", "--hw", "l4", "--model", "qwen2-57b-a14b", "--engine", "klotski",
                          "--cpu-mem", "512", "--fix", "mu=55", "--time-limit", "120")
    assert len(calls) == 3
    assert code == 0, err
    assert "stopped on Ctrl-C" in out + err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_while_profiling_exits_130_and_writes_nothing(tmp_path):
    out_file = tmp_path / "profile.yaml"
    code, _, err = _interrupt_after_progress(["profile", "--quick", "--out", str(out_file)], tmp_path,
                                             started=("note:", "%", "Ctrl-C", "measur"))
    assert code == 130, err
    assert err.rstrip().splitlines()[-1] == "error: interrupted" and "Traceback" not in err
    assert not out_file.exists()
