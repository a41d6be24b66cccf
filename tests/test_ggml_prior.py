"""The CPU experts' kernel prior of a catalog machine (hrm.machine.ggml_prior, docs/validation/ggml_types.md):
hand-computed from the committed measurements, and held to this host's own two-thread measurement."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import yaml

from hrm.errors import HRMError
from hrm.machine.ggml_prior import (HOST_FLOP_PER_CYCLE, PRIOR_TYPES, TYPE_RUNS_DIR, Cores, compute_s_per_element,
                                    prior_s_per_element, runs_for, type_runs)
from hrm.machine.parts import catalog, compose_profile
from hrm.model.quantized import GGML_BLOCKS

ISAS = ("avx512", "avx2")


@lru_cache(maxsize=None)
def _raw(isa: str) -> dict:
    return yaml.safe_load((TYPE_RUNS_DIR / f"types-{isa}.yaml").read_text())


def _point(isa: str, ggml_type: str, threads: int, pool: float, rows: int) -> float:
    k = next(k for k in _raw(isa)["kernels"]
             if (k["type"], k["threads"], k["pool_mib"]) == (ggml_type, threads, pool))
    return next(p["y"] for p in k["s_per_elem_vs_rows"] if p["x"] == rows)


@pytest.mark.parametrize("isa", ISAS)
def test_every_type_measured_on_both_pools_and_threads(isa):
    doc = _raw(isa)
    assert doc["isa"] == isa and 0 < doc["clock"]["s_per_cycle"] < 1e-9  # a clock between 1 and ~5 GHz...
    assert 1 / doc["clock"]["s_per_cycle"] > 1e9
    got = {(k["type"], k["threads"], k["pool_mib"]) for k in doc["kernels"]}
    assert got == {(t, n, p) for t in PRIOR_TYPES for n in (1, 2) for p in (32.0, 1024.0)}
    assert all(k["buffer"] == "CPU" for k in doc["kernels"])  # the plain buffer: CPU experts beside a GPU
    assert all(t.upper() in GGML_BLOCKS for t in PRIOR_TYPES)


def test_a_catalog_kernel_by_hand():
    """Ryzen 9 7950X (Zen 4: 256-bit pipes, 32 FP32 FLOP a cycle, so the AVX2 build's cycles though it
    runs AVX-512), q4_K at 16 rows on 16 threads: the measured core's cycles (seconds per element /
    seconds per cycle) over 16 x 5.7 GHz, against the bytes (144 per 256) at DDR5-5200 x 2 channels x
    8 B x 0.78. A Xeon Platinum 8480+ (512-bit pipes, 64) takes the AVX-512 build's cycles."""
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    clock = _raw("avx2")["clock"]["s_per_cycle"]
    cycles = _point("avx2", "q4_K", 1, 32.0, 16) / clock
    compute = cycles / (16 * 5.7e9)
    memory = (144 / 256) / (5200 * 2 * 8 * 0.78 * 1e6)
    k = hw.ggml_cpu.kernel("q4_K", "mmid", 16)
    assert next(p.y for p in k.s_per_elem_vs_rows if p.x == 16) == pytest.approx(max(compute, memory), rel=1e-3)
    assert compute > memory  # 16 rows an expert: the cores, not the DRAM
    one = next(p.y for p in k.s_per_elem_vs_rows if p.x == 1)
    assert one == pytest.approx(max(_point("avx2", "q4_K", 1, 32.0, 1) / clock / (16 * 5.7e9), memory), rel=1e-3)
    assert hw.ggml_cpu.prior and hw.ggml_cpu.default_threads == 16
    xeon = compose_profile("rtx-4090", "xeon-platinum-8480plus", 256)
    k = xeon.ggml_cpu.kernel("f16", "mmid", 56)
    c512 = _point("avx512", "f16", 1, 32.0, 64) / _raw("avx512")["clock"]["s_per_cycle"]
    assert next(p.y for p in k.s_per_elem_vs_rows if p.x == 64) == pytest.approx(c512 / (56 * 3.8e9), rel=1e-3)


def test_hybrid_threads_run_at_the_slowest_cores_pace():
    """Core i9-14900K (AVX2): 8 P-cores at 5.6 GHz, 32 FLOP a cycle; 16 E-cores at 4.4 GHz, 16. Eight
    threads run on the P-cores; 24 run in lockstep with an E-core (half the SIMD width: twice the
    cycles). llama.cpp's default -t there is the 8 P-cores."""
    c = catalog().cpus["core-i9-14900k"]
    groups = tuple(Cores(cores=g.cores, ghz=g.boost_ghz, flop_per_cycle=g.flop_per_cycle) for g in c.groups)
    cycles = _point("avx2", "mxfp4", 1, 32.0, 1) / type_runs("avx2").s_per_cycle
    assert compute_s_per_element("avx2", "mxfp4", 1, groups, 8) == pytest.approx(cycles / (8 * 5.6e9), rel=1e-9)
    assert compute_s_per_element("avx2", "mxfp4", 1, groups, 24) == pytest.approx(cycles * 2 / (24 * 4.4e9), rel=1e-9)
    assert compose_profile("rtx-3090", "core-i9-14900k", 96).ggml_cpu.default_threads == 8


def test_the_vector_width_costs_less_than_its_ratio():
    """The same core, AVX2 build against AVX-512 (half the vector width): a median 1.07x the cycles at one
    row, 1.6x at 64, never the 2x a FLOP-per-cycle ratio says; hence a core takes the build of its own
    width (runs_for), and the E-cores' factor 2 is an upper bound."""
    a, b = type_runs("avx512"), type_runs("avx2")
    one = np.median([b.cycles_per_element(t, 1) / a.cycles_per_element(t, 1) for t in PRIOR_TYPES])
    many = np.median([b.cycles_per_element(t, 64) / a.cycles_per_element(t, 64) for t in PRIOR_TYPES])
    assert 0.9 < one < 1.3 and 1.3 < many < 1.9


@pytest.mark.parametrize("isa", ISAS)
def test_the_cores_term_carries_to_two_threads_on_this_host(isa):
    """The prior's cores term for this host (its measured clock and SIMD width) at 2 threads, against
    the 2-thread measurement in the same cache-sized pool: from 4 rows an expert (where the points
    are long enough to be steady) median within 0.9-1.1, every one within 1.5x (docs/validation/ggml_types.md)."""
    runs = type_runs(isa)
    host = (Cores(cores=2, ghz=1 / runs.s_per_cycle / 1e9, flop_per_cycle=HOST_FLOP_PER_CYCLE[isa]),)
    assert runs_for(isa, host[0]) == (runs, 1.0)
    ratios = [compute_s_per_element(isa, t, r, host, 2) / _point(isa, t, 2, 32.0, r)
              for t in PRIOR_TYPES for r in (4, 8, 16, 64)]
    assert 0.9 <= float(np.median(ratios)) <= 1.1
    assert max(max(ratios), 1 / min(ratios)) < 1.5


@pytest.mark.parametrize("isa", ISAS)
def test_the_i_quants_cost_more_work_per_element_than_the_k_quants(isa):
    """What the prior adds over a bandwidth roofline: at one row the i-quants' lookups and MXFP4's
    table take 1.5-4x q4_K's cycles per element, so on few cores they are the cores' bound."""
    runs = type_runs(isa)
    base = runs.cycles_per_element("q4_K", 1)
    for t in ("iq1_s", "iq2_xxs", "iq3_xxs", "mxfp4"):
        assert runs.cycles_per_element(t, 1) > 1.5 * base, t


def test_the_prior_is_only_for_the_experts():
    from hrm.cost.ggml_cpu import run_times

    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    with pytest.raises(HRMError, match="catalog prior"):
        run_times(None, hw.ggml_cpu, 16, 1, 32, 4)
    assert compose_profile(None, "ryzen-9-7950x", 64).ggml_cpu is None  # CPU only: no prior


def test_memory_bound_at_one_row_with_many_cores():
    """A 96-core EPYC 9654 at one row: q4_K's bytes, not its cores, set the time."""
    hw = compose_profile("rtx-4090", "epyc-9654", 384)
    k = hw.ggml_cpu.kernel("q4_K", "mmid", hw.ggml_cpu.default_threads)
    one = next(p.y for p in k.s_per_elem_vs_rows if p.x == 1)
    assert one == pytest.approx((144 / 256) / (hw.cpu.memory_bandwidth_gbps * 1e9), rel=1e-6)


def test_a_prior_needs_no_node_cost_but_a_measurement_does():
    from hrm.machine.hardware import GgmlCpu

    with pytest.raises(ValueError, match="node_s_vs_threads"):
        GgmlCpu(llama_cpp="x", pool_mib=1024.0, kernels=())
    assert prior_s_per_element("avx2", "q8_0", 1, (Cores(cores=1, ghz=1.0, flop_per_cycle=32),), 1, 1e12) > 0
    assert Path(TYPE_RUNS_DIR).is_dir()


def test_the_doc_table_is_the_committed_measurement():
    from conftest import benchmark_module

    types = benchmark_module("benchmarks/ground_truth/ggml_types.py")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "validation" / "ggml_types.md").read_text()
    assert types.table() in doc, "regenerate: python benchmarks/ground_truth/ggml_types.py --table"


def test_beside_a_gpu_the_experts_take_the_plain_buffers_kernel():
    """A profile with both placements of q4_K's MUL_MAT_ID (hrm profile --llama-cpp on a GPU host): the
    CPU-only step model reads the repacked kernel (a CPU-only llama.cpp repacks q4_K), the CPU experts
    beside a GPU the plain one (the GPU's pinned host buffer, src/llama-model.cpp make_cpu_buft_list);
    a profile with the repacked kernel only gives it to both."""
    from hrm.cost.ggml_cpu import seconds_per_element
    from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel

    def kernel(buffer, y):
        return GgmlKernel(type="q4_K", op="mmid", threads=2, buffer=buffer,
                          s_per_elem_vs_rows=[CurvePoint(x=1, y=y), CurvePoint(x=16, y=4 * y)])

    both = GgmlCpu(llama_cpp="t", pool_mib=1024.0, node_s_vs_threads=[CurvePoint(x=2, y=1e-7)],
                   kernels=(kernel("CPU_REPACK", 3e-11), kernel("CPU", 7e-11)))
    assert seconds_per_element(both, "Q4_K", "mmid", 2, 1) == pytest.approx(3e-11)
    assert seconds_per_element(both, "Q4_K", "mmid", 2, 1, buffer="CPU") == pytest.approx(7e-11)
    old = both.model_copy(update={"kernels": (kernel("CPU_REPACK", 3e-11),)})
    assert seconds_per_element(old, "Q4_K", "mmid", 2, 16, buffer="CPU") == pytest.approx(12e-11)
    with pytest.raises(ValueError, match="appears twice"):
        GgmlCpu(llama_cpp="t", pool_mib=1024.0, node_s_vs_threads=[CurvePoint(x=2, y=1e-7)],
                kernels=(kernel("CPU", 7e-11), kernel("CPU", 7e-11)))
