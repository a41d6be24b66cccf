"""The bad-input corpus of issue 24 (tests/corpus/, README.md there) against this checkout:
every case is clean (its expected exit, one ``error:`` line for a refusal, no traceback, no
hang, nothing left half-written). A case marked ``known_defect`` in the data is a strict
xfail, so a fix makes this file say to unmark it.

The cases run in processes of their own (one per case, two at a time, each forked from a
server that imported the CLI once: benchmarks/corpus_table.py) once for the module; each test
then reads its case's outcome. ``benchmarks/corpus_table.py --root DIR`` prints the same as a
table by surface and outcome.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus_table as ct  # noqa: E402

CASES = ct.load_cases()


#: the quick loop (-m "not slow") runs the first case of each surface and every SAMPLE_EVERY-th;
#: the whole corpus (about a minute on 2 cores) is exhaustive, so it is marked slow
SAMPLE_EVERY = 16


def _sampled(index: int, case: dict) -> bool:
    return index % SAMPLE_EVERY == 0 or index == 0 or CASES[index - 1]["surface"] != case["surface"]


def _param(index: int, case: dict):
    marks = [pytest.mark.xfail(strict=True, reason=case["known_defect"])] if case.get("known_defect") else []
    marks += [] if _sampled(index, case) else [pytest.mark.slow]
    return pytest.param(case["id"], marks=marks, id=case["id"])


@pytest.fixture(scope="session")  # once: xdist runs this whole file on one worker (--dist loadfile)
def outcomes(request) -> dict[str, ct.Result]:
    """The outcome of every selected case (``-k`` runs only those), two processes at a time."""
    wanted = {item.callspec.params["case_id"] for item in request.session.items
              if "case_id" in getattr(getattr(item, "callspec", None), "params", {})}
    results = ct.run_corpus(ROOT, [c for c in CASES if c["id"] in wanted], workers=ct.MAX_WORKERS)
    return {r.id: r for r in results}


@pytest.mark.parametrize("case_id", [_param(i, c) for i, c in enumerate(CASES)])
def test_case_is_clean(outcomes, case_id):
    result = outcomes[case_id]
    if result.outcome == "skipped":
        pytest.skip(result.reason)
    assert result.outcome == "clean", f"{result.outcome}: {result.reason}"


# --- the runner's own classification, on hand-made answers (no subprocess) -----------------
REFUSED = {"id": "x", "surface": "s", "argv": [], "expected": "refused"}


@pytest.mark.parametrize("rc, out, err, changed, want", [
    (None, "", "", [], "hang"),
    (2, "", "Traceback (most recent call last):\n  ...\nValueError: x\n", [], "traceback"),
    (2, "", "error: hw.yaml: cores: must be positive\n", ["plan.json"], "partial write"),
    (0, "fine\n", "", [], "nonsense accepted"),
    (3, "", "error: nothing fits\n", [], "wrong exit"),
    (2, "", "usage: hrm\nerror: bad\n", [], "bad message"),
    (2, "", "bad\n", [], "bad message"),
    (2, "", "error: one\nerror: two\n", [], "bad message"),
    (3, "", "note: read as every layer on the GPU\nerror: does not fit\n", [], "wrong exit"),
    (2, "", "error: hw.yaml: cores: must be positive\n", [], "clean"),
])
def test_classify(rc, out, err, changed, want):
    assert ct.classify(REFUSED, rc, out, err, changed)[0] == want


def test_classify_notes_before_the_error_line():
    infeasible = {**REFUSED, "expected": "infeasible"}
    assert ct.classify(infeasible, 3, "", "note: a default\nerror: does not fit\n", [])[0] == "clean"
    assert ct.classify(infeasible, 3, "", "error: does not fit\nnote: a default\n", [])[0] == "bad message"


def test_classify_closed_and_output_checks():
    closed = {**REFUSED, "expected": "closed"}
    assert ct.classify(closed, 0, "", "", [])[0] == "clean"
    assert ct.classify(closed, 0, "", "error: broken pipe\n", [])[0] == "bad message"
    ok = {**REFUSED, "expected": "ok", "stdout_contains": ["[bold]x"], "max_line_chars": 10}
    assert ct.classify(ok, 0, "x\n", "", [])[0] == "wrong output"
    assert ct.classify(ok, 0, "[bold]x 0123456789\n", "", [])[0] == "wrong output"
    assert ct.classify(ok, 0, "[bold]x\n", "", ["plan.json"])[0] == "clean"  # exit 0 may write


def test_corpus_is_large_and_covers_every_surface():
    surfaces = {c["surface"] for c in CASES}
    assert len(CASES) >= 300
    assert {"hardware", "model", "engine", "grid", "routing", "plan", "checkpoint", "import", "export",
            "flags", "latency", "klotski"} <= surfaces


def test_malformed_corpus_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("surface: s\ncases:\n  - {id: a, argv: [], expected: maybe}\n")
    with pytest.raises(ct.CorpusError):
        ct.load_cases(tmp_path)
    (tmp_path / "a.yaml").write_text("surface: s\ncases:\n  - {id: a, argv: [], expected: ok}\n"
                                     "  - {id: a, argv: [], expected: ok}\n")
    with pytest.raises(ct.CorpusError):
        ct.load_cases(tmp_path)


def test_write_files_replace_must_match(tmp_path):
    (tmp_path / "src.txt").write_text("cores: 2\n")
    ct.write_files([{"path": "out.txt", "copy": "src.txt", "replace": [["cores: 2", "cores: -2"]]}],
                   tmp_path, tmp_path, None)
    assert (tmp_path / "out.txt").read_text() == "cores: -2\n"
    with pytest.raises(ct.CorpusError):
        ct.write_files([{"path": "o2.txt", "copy": "src.txt", "replace": [["cores: 3", "x"]]}], tmp_path, tmp_path, None)


def test_fork_server_kills_a_case_past_its_timeout_and_goes_on(tmp_path):
    """The fork server's hang path (no corpus case hangs): the case is killed and counts as a
    hang; the next case answers as a fresh ``python -m hrm_cli`` does, byte for byte (argparse
    names the program after sys.argv[0])."""
    folder = tmp_path / "case"
    folder.mkdir()
    usage_error = {"argv": ["search", "--hw", "l4", "--model", "mixtral", "--max-batch", "x"]}
    with ct.ForkServer(ROOT, tmp_path / "server") as server:
        assert server.ready(), server.noise
        assert server.execute({"argv": ["search", "--hw", "l4", "--model", "mixtral"]}, folder, tmp_path, 0.0) == \
            (None, "", "")
        forked = server.execute(usage_error, folder, tmp_path, 60.0)
    assert forked == ct._execute(usage_error, ROOT, folder, tmp_path, 60.0)
    assert forked[0] == 2 and "--max-batch" in forked[2]
    assert ct.classify(REFUSED, None, "", "", [])[0] == "hang"
