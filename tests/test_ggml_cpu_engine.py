"""The llama.cpp engines' CPU experts at the profile's measured ggml kernel rates (engine field
``cpu_kernels: ggml``, docs/model.md §4.10), checked by hand."""

from __future__ import annotations

import pytest

from hrm.cost import costs
from hrm.engines.engine import load_engine
from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel, load_hardware
from hrm.cost.latency.ops import cpu_time_s
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.machine.rates import default_llama_threads, rates_from_profile


def _with_ggml(hw, threads):
    kernel = GgmlKernel(type="f16", op="mmid", threads=threads,
                        s_per_elem_vs_rows=[CurvePoint(x=1, y=1e-10), CurvePoint(x=2, y=2e-10), CurvePoint(x=8, y=5e-10)])
    section = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=threads, y=1e-7)], kernels=(kernel,))
    return hw.model_copy(update={"ggml_cpu": section})


def test_cpu_experts_run_at_the_measured_mmid_rate():
    hw = load_hardware("l4")
    model = load_model("mixtral")
    threads = default_llama_threads(hw.cpu.cores)
    rates = rates_from_profile(_with_ggml(hw, threads), DEFAULT_OPTIONS.for_model(model))
    op = costs.routed_experts(model, 4)
    # by hand: 4 tokens touch 8(1 - (6/8)^4) = 5.46875 experts of 3 x 4096 x 14336 weights,
    # each with 4 x 2 / 5.46875 = 1.4629 rows: 1.4629e-10 s per element on the curve
    touched = 8 * (1 - (6 / 8) ** 4)
    rows = 4 * 2 / touched
    expected = touched * 3 * 4096 * 14336 * (1e-10 + (rows - 1) * 1e-10)
    got = float(cpu_time_s(op, rates, rows, load_engine("llama.cpp"), model))
    assert got == pytest.approx(expected, rel=1e-9)
    # the ideal engine (no ggml kernels) keeps the CPU roofline
    roof = float(cpu_time_s(op, rates, rows, load_engine("ideal"), model))
    assert roof != pytest.approx(expected, rel=1e-3)


def test_llama_default_threads_halve_above_four_cores():
    assert [default_llama_threads(c) for c in (1, 2, 4, 6, 16)] == [1, 2, 4, 3, 8]


def test_a_commands_threads_choose_the_measured_kernel():
    from hrm.engines.mechanisms import with_fields
    from hrm.export.llama_cpp import cpu_threads_field

    assert cpu_threads_field({"-t": ["8"]}, None) == {"cpu_threads": 8}
    assert cpu_threads_field({"--threads": ["-1"]}, None) == {}
    hw = load_hardware("l4")
    model = load_model("mixtral")
    one = GgmlKernel(type="f16", op="mmid", threads=1, s_per_elem_vs_rows=[CurvePoint(x=1, y=4e-10)])
    many = GgmlKernel(type="f16", op="mmid", threads=8, s_per_elem_vs_rows=[CurvePoint(x=1, y=1e-10)])
    section = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)], kernels=(one, many))
    rates = rates_from_profile(hw.model_copy(update={"ggml_cpu": section}), DEFAULT_OPTIONS.for_model(model))
    op = costs.routed_experts(model, 1)
    engine = load_engine("llama.cpp")
    t1 = float(cpu_time_s(op, rates, 1.0, with_fields(engine, {"cpu_threads": 1}), model))
    t8 = float(cpu_time_s(op, rates, 1.0, with_fields(engine, {"cpu_threads": 8}), model))
    assert t1 == pytest.approx(4 * t8)
