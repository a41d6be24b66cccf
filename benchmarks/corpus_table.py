"""The bad-input corpus of issue 24: run every case of tests/corpus/ against a source root and
print a table of outcomes by surface.

A case is data (tests/corpus/*.yaml, described in tests/corpus/README.md): the files to write
into an empty temporary folder, the ``hrm`` arguments, and the expected answer: ``ok`` (exit 0),
``refused`` (exit 2, one ``error:`` line on stderr), ``infeasible`` (exit 3, one line) or
``closed`` (stdout closed by its reader: exit 0, nothing on stderr). Each case runs in its own
process (``python -m hrm_cli`` with PYTHONPATH = the root under test, cwd = the case's folder)
and is classified as one of :data:`OUTCOMES`.

A case's process is forked from a server (:class:`ForkServer`, one per worker) that has
imported the root's ``hrm_cli`` and its subcommands once, so each case skips the ~0.5-2 s of
interpreter start and imports but is still its own process: its own folder, file
descriptors (a pipe, a closed pipe, /dev/full), session, exit status and interpreter exit.
``--no-fork`` (or a preload that printed anything) starts each case as a fresh interpreter.

    python benchmarks/corpus_table.py --root DIR [--md] [--workers 2] [--timeout 60] [--no-fork]

tests/test_corpus.py runs the same cases against this checkout and asserts each is clean.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = REPO_ROOT / "tests" / "corpus"
FIXTURES_FILE = "fixtures.yaml"

#: seconds one case may run before it counts as a hang; the slowest clean case (a tiny-mixtral
#: ``hrm run``) takes ~10 s on one shared core, so 60 s separates a hang from a slow machine.
#: Override: --timeout, or a case's own ``timeout_s``.
CASE_TIMEOUT_S = 60.0
#: worker processes; issue 24 asks for at most 2 (CI runners and this machine have 2 cores).
#: Override: --workers.
MAX_WORKERS = 2

#: exit code each expected answer means (hrm --help, "exit codes")
EXPECTED_EXIT = {"ok": 0, "refused": 2, "infeasible": 3, "closed": 0}
#: outcomes, in the order a case is checked for them (the first that applies wins)
OUTCOMES = ("clean", "hang", "traceback", "partial write", "nonsense accepted", "wrong exit",
            "bad message", "wrong output", "skipped")
CASE_KEYS = {"id", "argv", "files", "expected", "stdout", "timeout_s", "known_defect", "note",
             "stdout_contains", "stderr_contains", "max_line_chars", "needs_non_root", "fixtures"}
FILE_KEYS = {"path", "text", "copy", "fixture", "replace", "repeat", "dir", "mode", "size_bytes",
             "hex", "symlink", "truncate_bytes"}


class CorpusError(ValueError):
    """The corpus itself is malformed (a bug of the data, not an outcome of the code)."""


@dataclass(frozen=True)
class Result:
    id: str
    surface: str
    outcome: str
    reason: str
    seconds: float = 0.0


# --- loading ------------------------------------------------------------------------------
def load_cases(corpus_dir: Path = CORPUS_DIR) -> list[dict]:
    """Every case of ``corpus_dir/*.yaml`` (but the fixtures), with its file's ``surface``;
    ids are unique and every key is known, so a typo in the data fails here, loudly."""
    cases, seen = [], set()
    for path in sorted(Path(corpus_dir).glob("*.yaml")):
        if path.name == FIXTURES_FILE:
            continue
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "surface" not in data or not isinstance(data.get("cases"), list):
            raise CorpusError(f"{path.name}: a mapping with surface and cases")
        for case in data["cases"]:
            _check_case(path.name, case, seen)
            cases.append({**case, "surface": data["surface"]})
    return cases


def _check_case(source: str, case: dict, seen: set) -> None:
    cid = case.get("id") if isinstance(case, dict) else None
    if not cid or cid in seen:
        raise CorpusError(f"{source}: case id missing or repeated: {cid!r}")
    seen.add(cid)
    unknown = set(case) - CASE_KEYS
    if unknown or case.get("expected") not in EXPECTED_EXIT or not isinstance(case.get("argv"), list):
        raise CorpusError(f"{source}: case {cid}: unknown keys {sorted(unknown)}, or expected/argv missing")
    for spec in case.get("files", []):
        if "path" not in spec or set(spec) - FILE_KEYS:
            raise CorpusError(f"{source}: case {cid}: file {spec!r}")


# --- one case -------------------------------------------------------------------------------
def write_files(files: list[dict], folder: Path, root: Path, fixtures_dir: Path | None) -> None:
    """Write a case's files into ``folder``: literal ``text`` (``repeat`` times), ``hex`` bytes,
    a ``copy`` of a file of the root under test or a ``fixture``, each with text ``replace``
    pairs applied; or a ``dir``, a sparse file of ``size_bytes``, a ``symlink``; then ``mode``."""
    for spec in files:
        path = folder / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if spec.get("dir"):
            path.mkdir(exist_ok=True)
        elif "symlink" in spec:
            path.symlink_to(spec["symlink"])
        elif "size_bytes" in spec:
            with open(path, "wb") as fh:
                fh.truncate(int(spec["size_bytes"]))
        elif "hex" in spec:
            path.write_bytes(bytes.fromhex(spec["hex"]))
        else:
            path.write_bytes(_file_bytes(spec, root, fixtures_dir))
        if "mode" in spec:
            path.chmod(int(str(spec["mode"]), 8))


def _file_bytes(spec: dict, root: Path, fixtures_dir: Path | None) -> bytes:
    if "copy" in spec:
        data = (root / spec["copy"]).read_bytes()
    elif "fixture" in spec:
        if fixtures_dir is None:
            raise CorpusError(f"{spec['path']}: fixture {spec['fixture']} without fixtures")
        data = (fixtures_dir / spec["fixture"]).read_bytes()
    else:
        data = spec.get("text", "").encode()
    for old, new in spec.get("replace", []):
        if old.encode() not in data:
            raise CorpusError(f"{spec['path']}: {old!r} not in the copied file")
        data = data.replace(old.encode(), new.encode(), 1)
    if "truncate_bytes" in spec:
        data = data[: int(spec["truncate_bytes"])]
    return data * int(spec.get("repeat", 1))


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> content hash of every regular file under ``folder`` (links not
    followed), and ``folder`` for each folder (its path ends with ``/``)."""
    out = {}
    for dirpath, dirnames, names in os.walk(folder):
        for name in dirnames:  # a folder made by a refused run is a partial write too
            out[str(Path(dirpath, name).relative_to(folder)) + "/"] = "folder"
        for name in names:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            try:
                digest = hashlib.sha1(path.read_bytes()).hexdigest()
            except OSError:  # mode 000 as a non-root user: unchanged by definition of the case
                digest = "unreadable"
            out[str(path.relative_to(folder))] = digest
    return out


def classify(case: dict, rc: int | None, stdout: str, stderr: str, changed: list[str]) -> tuple[str, str]:
    """(outcome, reason) of one finished case; ``rc`` None means it timed out."""
    expected = case["expected"]
    want = EXPECTED_EXIT[expected]
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1][:160] if lines else ""
    if rc is None:
        return "hang", "no answer before the timeout (killed)"
    if "Traceback" in stderr:
        return "traceback", last or "traceback on stderr"
    if rc != 0 and changed:
        return "partial write", f"exit {rc} left {', '.join(sorted(changed))[:120]}"
    if rc == 0 and expected not in ("ok", "closed"):
        return "nonsense accepted", f"exit 0, expected {expected} (exit {want})"
    if rc != want:
        return "wrong exit", f"exit {rc}, expected {want}: {last}"
    if expected in ("refused", "infeasible") and not _one_error_line(lines):
        return "bad message", f"{len(lines)} stderr lines, want one 'error:' line: {last}"
    if expected == "closed" and lines:
        return "bad message", f"stdout closed, yet stderr says: {last}"
    for needle in case.get("stdout_contains", []):
        if needle not in stdout:
            return "wrong output", f"stdout lacks {needle!r}"
    for needle in case.get("stderr_contains", []):
        if needle not in stderr:
            return "wrong output", f"stderr lacks {needle!r}: {last}"
    width = case.get("max_line_chars")
    if width and any(len(line) > width for line in stdout.splitlines()):
        longest = max(len(line) for line in stdout.splitlines())
        return "wrong output", f"a stdout line of {longest} > {width} characters"
    return "clean", ""


def _one_error_line(lines: list[str]) -> bool:
    """Exactly one ``error:`` line, the last; lines before it may only be ``note:`` or
    ``warning:`` lines (hrm import prints the notes of a command it then finds infeasible)."""
    return (bool(lines) and lines[-1].startswith("error:")
            and all(line.startswith(("note:", "warning:")) for line in lines[:-1]))


def child_env(root: Path, scratch: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    env["MPLCONFIGDIR"] = str(scratch / "mpl")  # matplotlib's cache, outside the case folder
    env["MPLBACKEND"] = "Agg"
    env["COLUMNS"] = "80"
    env.pop("FORCE_COLOR", None)
    return env


def run_case(case: dict, root: str | Path, fixtures_dir: str | Path | None = None,
             timeout_s: float = CASE_TIMEOUT_S, server: ForkServer | None = None) -> Result:
    """Run one case in a fresh temporary folder and classify it (forked from ``server``, or a
    fresh interpreter without one)."""
    root = Path(root).resolve()
    if case.get("needs_non_root") and hasattr(os, "geteuid") and os.geteuid() == 0:
        return Result(case["id"], case["surface"], "skipped", "needs a non-root user (permissions)")
    timeout_s = float(case.get("timeout_s", timeout_s))
    with tempfile.TemporaryDirectory(prefix="hrm-corpus-") as scratch:
        scratch = Path(scratch)
        folder = scratch / "case"
        folder.mkdir()
        try:
            write_files(case.get("files", []), folder, root, Path(fixtures_dir) if fixtures_dir else None)
            before = snapshot(folder)
            start = time.perf_counter()
            if server is not None:
                rc, out, err = server.execute(case, folder, scratch, timeout_s)
            else:
                rc, out, err = _execute(case, root, folder, scratch, timeout_s)
            seconds = time.perf_counter() - start
            after = snapshot(folder)
        finally:  # mode-000 files and read-only folders must not block the clean-up
            for dirpath, dirnames, names in os.walk(folder):
                for name in dirnames + names:
                    path = Path(dirpath, name)
                    if not path.is_symlink():
                        path.chmod(0o700)
        changed = [p for p, h in after.items() if before.get(p) != h]
        outcome, reason = classify(case, rc, out, err, changed)
    return Result(case["id"], case["surface"], outcome, reason, seconds)


def _execute(case: dict, root: Path, folder: Path, scratch: Path, timeout_s: float):
    cmd = [sys.executable, "-m", "hrm_cli", *map(str, case["argv"])]
    env = child_env(root, scratch)
    mode = case.get("stdout")
    read_fd = write_fd = None
    if mode == "closed":  # `| head -c 0`: the reader is gone before the first write
        read_fd, write_fd = os.pipe()
        os.close(read_fd)
        stdout = write_fd
    elif mode == "full":
        stdout = open("/dev/full", "w")
    else:
        stdout = subprocess.PIPE
    try:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=stdout, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    finally:
        if write_fd is not None:
            os.close(write_fd)
        if mode == "full":
            stdout.close()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out or "", err or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the case's own process group (start_new_session), nothing else
        proc.communicate()
        return None, "", ""


# --- the fork server ----------------------------------------------------------------------------
#: modules a server imports before it forks cases, besides ``hrm_cli`` and every module of its
#: ``SUBCOMMANDS`` (their imports are what a case pays for), by the case's subcommand: torch for
#: those that run the runtime (~1.5 s of import a case), and only for them, since a child that
#: holds torch pays ~0.5 s more to exit (measured on this 2-core machine). One that cannot be
#: imported is skipped (a case that needs it imports it, and fails, itself). A subcommand
#: missing here only costs time: the child imports what it needs. Override: edit the table.
#: A sweep's pandas, pyarrow and process pool halve the grid cases' time (0.5 -> 0.14 s a case).
PRELOAD = {"run": ("torch",), "profile": ("torch",), "validate": ("torch",),
           "sweep": ("pandas", "pyarrow", "pyarrow.parquet", "solver.sweep", "solver.grid", "concurrent.futures",
                     "multiprocessing")}


def preload_of(case: dict) -> tuple[str, ...]:
    return PRELOAD.get(str(case["argv"][0]) if case["argv"] else "", ())

#: the server: ``python -c SERVER FD PRELOAD_JSON`` in the case environment. It imports, says
#: what the imports printed, then forks one child per request (the case's stdout and stderr
#: come as file descriptors over the socket). The child returns from ``serve()`` and runs
#: ``python -m hrm_cli ARGV`` as the top-level code, so that its exit (the interpreter's final
#: flush and exit code) is a fresh process's.
SERVER = """
import gc, importlib, io, json, os, socket, sys, warnings
ctrl = socket.socket(fileno=int(sys.argv[1]))
printed = io.StringIO()
real_err, sys.stderr = sys.stderr, printed
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import hrm_cli
    for name in [module for module, _ in hrm_cli.SUBCOMMANDS.values()] + json.loads(sys.argv[2]):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
sys.stderr = real_err
gc.freeze()  # the children's collections and exit then skip the preloaded objects (copy-on-write)
noise = printed.getvalue() + "".join(f"{w.category.__name__}: {w.message}\\n" for w in caught)
ctrl.send(json.dumps({"noise": noise[-2000:]}).encode())


def serve():
    while True:
        msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 20, 2)
        if not msg:
            os._exit(0)
        request = json.loads(msg)
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ctrl.close()
            os.setsid()  # before the pid is sent: a kill of its session then reaches it
            os.close(started_r)
            os.close(started_w)
            return request, fds
        for fd in (started_w, *fds):
            os.close(fd)
        os.read(started_r, 1)  # end of file once the child has its session
        os.close(started_r)
        ctrl.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        ctrl.send(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode())


request, fds = serve()
null = os.open(os.devnull, os.O_RDONLY)
for target, fd in ((0, null), (1, fds[0]), (2, fds[1])):
    os.dup2(fd, target)
for fd in (null, *fds):
    os.close(fd)
os.chdir(request["cwd"])
os.environ.update(request["env"])
sys.argv = ["-m", *request["argv"]]
sys.path[0] = request["cwd"]
import runpy
runpy.run_module("hrm_cli", run_name="__main__", alter_sys=True)
"""


class ForkServer:
    """A process that has imported ``root``'s CLI once and forks each case from there (the
    module docstring says what stays a fresh process's); a context manager. :meth:`ready` is
    False when the imports printed anything (a warning a fresh process would print into every
    case's stderr): then the cases must run without it."""

    def __init__(self, root: str | Path, scratch: Path, preload: tuple[str, ...] = ()):
        scratch.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctrl, self.noise = ours, None
        self.log = open(scratch / "server-stderr.txt", "w+")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()), json.dumps(list(preload))],
                                     cwd=scratch, env=child_env(Path(root).resolve(), scratch),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                                     pass_fds=[theirs.fileno()])
        theirs.close()

    def ready(self) -> bool:
        if self.noise is None:
            self.noise = self._receive(600.0)["noise"]
        return not self.noise

    def _receive(self, timeout_s: float | None) -> dict:
        self.ctrl.settimeout(timeout_s)
        try:
            msg = self.ctrl.recv(1 << 16)
        except TimeoutError:
            msg = b""
        if not msg:
            self.log.seek(0)
            raise CorpusError(f"the fork server stopped: {self.log.read()[-500:]}")
        return json.loads(msg)

    def execute(self, case: dict, folder: Path, scratch: Path, timeout_s: float):
        """(exit code, or None after a timeout; stdout; stderr) of one case, as :func:`_execute`."""
        mode = case.get("stdout")
        err_r, err_w = os.pipe()
        if mode == "full":
            out_r, out_w = None, os.open("/dev/full", os.O_WRONLY)
        else:
            out_r, out_w = os.pipe()
            if mode == "closed":  # `| head -c 0`: the reader is gone before the first write
                os.close(out_r)
                out_r = None
        request = {"argv": [str(a) for a in case["argv"]], "cwd": str(folder),
                   "env": {"MPLCONFIGDIR": str(scratch / "mpl")}}
        try:
            socket.send_fds(self.ctrl, [json.dumps(request).encode()], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        pid = self._receive(60.0)["pid"]
        reading = [fd for fd in (out_r, err_r) if fd is not None]
        data = {fd: bytearray() for fd in reading}
        timed_out = not _drain(reading, data, time.monotonic() + timeout_s)
        if timed_out:
            try:
                os.killpg(pid, 9)  # the case's own session (setsid), nothing else
            except ProcessLookupError:
                pass
            _drain(reading, data, None)
        rc = self._receive(None)["rc"]
        if timed_out:
            return None, "", ""
        text = (bytes(data.get(fd, b"")).decode(errors="replace") for fd in (out_r, err_r))
        return (rc, *text)

    def close(self) -> None:
        self.ctrl.close()  # the server reads the end of the socket and exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _drain(reading: list[int], data: dict, deadline: float | None) -> bool:
    """Read the file descriptors ``reading`` into ``data`` until each ends (closing it and
    leaving ``reading``; True) or ``deadline`` passes (False)."""
    with selectors.DefaultSelector() as sel:
        for fd in reading:
            sel.register(fd, selectors.EVENT_READ)
        while reading:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            for key, _ in sel.select(wait):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    data[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    reading.remove(key.fd)
    return True


# --- fixtures and the whole corpus ------------------------------------------------------------
def build_fixtures(root: str | Path, dest: str | Path, corpus_dir: Path = CORPUS_DIR,
                   timeout_s: float = 300.0) -> Path:
    """Run fixtures.yaml's commands once with the root under test (a plan, a routing trace, a
    sweep's Parquet file, ...) in ``dest``, so that cases can copy them; returns ``dest``."""
    root, dest = Path(root).resolve(), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    spec = yaml.safe_load((Path(corpus_dir) / FIXTURES_FILE).read_text())
    for step in spec["steps"]:
        write_files(step.get("files", []), dest, root, dest)
        proc = subprocess.run([sys.executable, "-m", "hrm_cli", *map(str, step["argv"])], cwd=dest,
                              env=child_env(root, dest), capture_output=True, text=True, timeout=timeout_s)
        missing = [name for name in step.get("makes", []) if not (dest / name).exists()]
        if proc.returncode != 0 or missing:
            raise CorpusError(f"fixture {step['argv']}: exit {proc.returncode}, missing {missing}: "
                              f"{proc.stderr.strip()[-300:]}")
    return dest


def _run_one(args, server: ForkServer | None = None) -> Result:
    case, root, fixtures_dir, timeout_s = args
    try:
        return run_case(case, root, fixtures_dir, timeout_s, server)
    except CorpusError as exc:
        return Result(case["id"], case["surface"], "corpus error", str(exc))


def run_corpus(root: str | Path, cases: list[dict] | None = None, workers: int = MAX_WORKERS,
               timeout_s: float = CASE_TIMEOUT_S, corpus_dir: Path = CORPUS_DIR, fork: bool = True) -> list[Result]:
    """Every case against ``root``, ``workers`` at a time, in the corpus order: forked from
    one :class:`ForkServer` per worker, or (``fork`` False, or a server's imports printed
    something) each as a fresh interpreter."""
    cases = load_cases(corpus_dir) if cases is None else cases
    with tempfile.TemporaryDirectory(prefix="hrm-corpus-fixtures-") as fixtures, \
            tempfile.TemporaryDirectory(prefix="hrm-corpus-servers-") as servers_dir:
        build_fixtures(root, fixtures, corpus_dir)
        jobs = [(case, str(root), fixtures, timeout_s) for case in cases]
        workers = max(1, workers)
        with ExitStack() as stack:
            pools = {}  # preload -> idle servers (at most ``workers`` of each)
            for preload in ({preload_of(case) for case in cases} if fork else ()):
                count = min(workers, sum(preload_of(case) == preload for case in cases))
                pools[preload] = [stack.enter_context(ForkServer(root, Path(servers_dir) / f"{len(pools)}-{i}", preload))
                                  for i in range(count)]
            servers = [server for pool in pools.values() for server in pool]
            if servers and not all(server.ready() for server in servers):
                noisy = next(server for server in servers if server.noise)
                print(f"note: a fork server's imports printed {noisy.noise.strip()[:300]!r}; "
                      "each case runs as a fresh interpreter", file=sys.stderr)
                pools = {}
            if pools:
                idle = {preload: queue.SimpleQueue() for preload in pools}
                for preload, pool in pools.items():
                    for server in pool:
                        idle[preload].put(server)

                def forked(job) -> Result:
                    server = idle[preload_of(job[0])].get()
                    try:
                        return _run_one(job, server)
                    finally:
                        idle[preload_of(job[0])].put(server)

                with ThreadPoolExecutor(max_workers=workers) as pool:
                    return list(pool.map(forked, jobs))
        if workers <= 1:
            return [_run_one(job) for job in jobs]
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_run_one, jobs))


# --- the table ---------------------------------------------------------------------------------
def table(results: list[Result], md: bool = False) -> str:
    """Rows = surfaces, columns = outcome counts (only outcomes that occur, clean always), totals;
    then each non-clean case with its reason."""
    surfaces = sorted({r.surface for r in results})
    seen = {r.outcome for r in results}
    cols = [o for o in OUTCOMES + ("corpus error",) if o == "clean" or o in seen]
    counts = Counter((r.surface, r.outcome) for r in results)
    header = ["surface", "cases", *cols]
    rows = [[s, str(sum(counts[(s, c)] for c in cols)), *(str(counts[(s, c)]) for c in cols)] for s in surfaces]
    rows.append(["total", str(len(results)), *(str(sum(counts[(s, c)] for s in surfaces)) for c in cols)])
    if md:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    bad = [r for r in results if r.outcome != "clean"]
    if bad:
        lines += ["", "Non-clean cases:", ""]
        lines += [f"- `{r.id}` ({r.surface}) {r.outcome}: {r.reason}" if md else
                  f"  {r.id} ({r.surface}) {r.outcome}: {r.reason}" for r in bad]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(REPO_ROOT), help="source root to test (PYTHONPATH)")
    ap.add_argument("--md", action="store_true", help="Markdown table")
    ap.add_argument("--workers", type=int, default=MAX_WORKERS)
    ap.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    ap.add_argument("--only", default="", help="comma-separated case ids or surfaces")
    ap.add_argument("--slowest", type=int, default=0, help="also list the N slowest cases")
    ap.add_argument("--no-fork", action="store_true", help="each case a fresh interpreter (no fork server)")
    args = ap.parse_args(argv)
    cases = load_cases()
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c["id"] in keep or c["surface"] in keep]
    results = run_corpus(args.root, cases, min(args.workers, MAX_WORKERS), args.timeout, fork=not args.no_fork)
    print(table(results, args.md))
    if args.slowest:
        print("\nSlowest cases:")
        for r in sorted(results, key=lambda r: -r.seconds)[: args.slowest]:
            print(f"  {r.seconds:6.1f} s  {r.id}")
    print(f"\n{len(results)} cases, {sum(r.seconds for r in results):.0f} s of case time in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
