"""Public llama.cpp speed reports beside HRM's predictions (docs/validation/fit_reports.md, from
docs/validation/runs/public-reports.yaml): the data is what the reports say, the commands read to
the placement they state, and the committed table is the one the generator prints now."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

from hrm.analysis.public_reports import Measured, load_reports, predict

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "validation" / "fit_reports.md"
REPORTS = load_reports()


def test_six_machine_model_pairs_are_reported():
    pairs = {(r.parts.label, r.model) for r in REPORTS}
    assert len(pairs) >= 6


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: r.key)
def test_every_measured_number_is_in_the_reports_own_words(report):
    m = report.measured
    for value in (m.prefill_tok_s, m.decode_tok_s, m.decode_low, m.decode_high):
        if value is not None:
            assert re.search(rf"(?<![\d.]){re.escape(f'{value:g}')}(?![\d])", report.quote), (report.key, value)


def test_a_range_is_read_at_its_middle():
    assert Measured(decode_low=10, decode_high=17).decode() == 13.5
    with pytest.raises(ValueError):
        Measured(decode_low=10)


def _placement(report):
    """(MoE layers whose experts sit on the CPU, MoE layers) the command states: --n-cpu-moe /
    -ncmoe N of a model whose every block is MoE, else none."""
    from hrm.analysis.public_reports import report_model

    model = report_model(report)
    found = re.search(r"(?:--n-cpu-moe|-ncmoe)\s+(\d+)", report.hrm_command)
    cpu = min(int(found.group(1)), model.num_moe_layers) if found else 0
    return cpu, model.num_moe_layers


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: r.key)
def test_the_command_reads_to_the_placement_it_states(report):
    pred = predict(report)
    cpu, layers = _placement(report)
    if pred.policy.startswith("llama-bench"):
        assert f"-ncmoe {cpu}" in pred.policy
    else:
        rw = float(re.search(r"rw=([\d.]+)", pred.policy).group(1))
        assert rw == pytest.approx((layers - cpu) / layers, abs=1e-4)
    assert pred.fits


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: r.key)
def test_ratio_is_predicted_over_reported(report):
    pred = predict(report)
    assert pred.ratio(report.measured, "decode") == pytest.approx(pred.decode_tok_s / report.measured.decode())
    if report.measured.prefill_tok_s is None:
        assert pred.ratio(report.measured, "prefill") is None


def test_the_doc_is_what_the_generator_prints_now():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fit_reports
    finally:
        sys.path.pop(0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fit_reports.main()
    assert DOC.read_text() == out.getvalue(), "regenerate: python benchmarks/fit_reports.py > docs/validation/fit_reports.md"


def test_the_doc_states_each_rows_ratio():
    text = DOC.read_text()
    for report in REPORTS:
        pred = predict(report)
        line = next(x for x in text.splitlines() if x.startswith(f"| {report.key} |"))
        assert f"/ {pred.ratio(report.measured, 'decode'):.2f} |" in line
