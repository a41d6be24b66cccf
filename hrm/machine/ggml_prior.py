"""ggml's CPU expert kernels on a machine nobody profiled (docs/model.md §4.10, "A machine without
the probe"; data: docs/validation/ggml_types.md).

On a machine with a GPU, llama.cpp's CPU experts (``--n-cpu-moe``, ``-ot exps=CPU``) run in ggml's
plain CPU kernels (MUL_MAT_ID, weights in the GPU's pinned host buffer, not repacked:
src/llama-model.cpp make_cpu_buft_list). Their seconds per weight element on ``t`` threads at
``rows`` tokens per expert is the larger of

- the cores' work: over the core groups the ``t`` threads fill (performance cores first), each
  group's threads at its clock (the catalog's boost clock: the measured host's clock was measured
  under the same load, at its turbo) and its cycles per element: the cycles this project's host
  measured for that type and rows on one core, in the build whose vectors match the group's
  datapath (:func:`runs_for`: AVX-512 for 512-bit pipes, else AVX2; the probe's ``clock`` op turns
  its seconds into cycles); threads add their rates on like cores and run at the slowest group's
  pace on mixed ones;
- the weights' bytes at the platform's achieved DRAM rate (bytes per element from the type's
  block struct, :func:`hrm.model.quantized.ggml_bits_per_weight`).

What is assumed (and named in the docs): the measured core's cycles per element carry to other
x86 cores of the same vector width (an E-core's half width: twice the cycles, an upper bound), at
the boost clock; the platform streams at its achieved DRAM rate from any thread count (this 2-core
VM cannot show a per-core limit on a 16-core desktop). A profile measured with
``hrm profile --llama-cpp`` replaces all of it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from ..model.quantized import ggml_bits_per_weight
from .hardware import CurvePoint, GgmlCpu, GgmlKernel

#: the ggml weight types a GGUF's matrices use that ggml's CPU backend multiplies (every type of
#: hrm.model.quantized.GGML_BLOCKS with a CPU vec_dot at ggml-org/llama.cpp@0c1e5709)
PRIOR_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q2_K", "q3_K", "q4_K", "q5_K",
               "q6_K", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs",
               "tq1_0", "tq2_0")
Isa = Literal["avx512", "avx2"]
#: the committed measurements, one per instruction set llama.cpp was built for
#: (benchmarks/ground_truth/ggml_types.py)
TYPE_RUNS_DIR = Path(__file__).resolve().parents[1] / "data" / "ggml_cpu"
#: the pool of the measurement the cycles come from: 32 MiB, held by this VM's last-level cache
#: (480 MiB), so the curve is the core's work and its cache reads, not the DRAM's
CACHE_POOL_MIB = 32.0
#: FP32 FLOP per cycle of the measured core on each build's vectors: the host is a Xeon with AMX
#: (Sapphire Rapids or later), two 512-bit FMA pipes = 64 (Intel 64 and IA-32 Architectures
#: Optimization Reference Manual, "Intel AVX-512"); its AVX2 build runs 256-bit vectors on the
#: same two pipes = 32. The catalog's ``flop_per_cycle`` is on the same scale (cpus.yaml header):
#: a core group takes the build of its width (:func:`runs_for`)
HOST_FLOP_PER_CYCLE: dict[str, int] = {"avx512": 64, "avx2": 32}
#: rows per expert the prior's curves hold (the measurement's)
PRIOR_ROWS = (1, 2, 4, 8, 16, 64)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TypeRuns(_Frozen):
    """One committed measurement: the host core's seconds per cycle (the probe's ``clock``) and its
    one-thread MUL_MAT_ID curves in the cache-sized pool, per ggml type."""

    isa: str
    measured: str
    s_per_cycle: float
    cache_kernels: dict[str, GgmlKernel]

    def cycles_per_element(self, ggml_type: str, rows: float) -> float:
        """Cycles of the measured core per weight element at ``rows`` rows per expert
        (:meth:`hrm.machine.hardware.GgmlKernel.value` of the one-thread cache-pool curve)."""
        return self.cache_kernels[ggml_type].value(rows) / self.s_per_cycle


@lru_cache(maxsize=None)
def type_runs(isa: Isa) -> TypeRuns:
    """The committed measurement for ``isa`` (hrm/data/ggml_cpu/types-ISA.yaml)."""
    doc = yaml.safe_load((TYPE_RUNS_DIR / f"types-{isa}.yaml").read_text())
    kernels = {k["type"]: GgmlKernel(type=k["type"], op="mmid", threads=1, buffer=k["buffer"], pool_mib=k["pool_mib"],
                                     s_per_elem_vs_rows=k["s_per_elem_vs_rows"])
               for k in doc["kernels"] if k["threads"] == 1 and k["pool_mib"] == CACHE_POOL_MIB}
    return TypeRuns(isa=doc["isa"], measured=doc["measured"], s_per_cycle=doc["clock"]["s_per_cycle"],
                    cache_kernels=kernels)


class Cores(_Frozen):
    """A group of like cores: how many, their clock and FP32 FLOP per cycle (their SIMD throughput)."""

    cores: int
    ghz: float
    flop_per_cycle: int


def threads_by_group(groups: tuple[Cores, ...], threads: int) -> list[tuple[Cores, int]]:
    """The ``threads`` threads placed one per core, the groups filled in order (performance cores
    first; threads beyond the cores are not placed: a hyperthread adds no vector pipes)."""
    placed, left = [], threads
    for g in groups:
        n = min(g.cores, left)
        if n > 0:
            placed.append((g, n))
        left -= n
    return placed


def thread_counts(cores: int) -> tuple[int, ...]:
    """1, the powers of two below ``cores``, and ``cores``: llama.cpp's -t values users pick (the
    thread counts ``hrm profile --llama-cpp`` measures and a prior holds)."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    counts.append(cores)
    return tuple(dict.fromkeys(counts))


def runs_for(isa: Isa, core: Cores) -> tuple[TypeRuns, float]:
    """The measurement a core group's cycles come from, and the factor on them: the build whose
    vectors match the core's datapath. A core with 512-bit pipes (64 FP32 FLOP a cycle) running an
    AVX-512 build: the AVX-512 measurement. Any other (Zen 3 and Intel client P-cores, 256-bit; Zen 4
    too, which splits a 512-bit op into two 256-bit halves: AMD pub. 57647, the Family 19h software
    optimization guide): the AVX2 measurement, which runs 256-bit vectors on this host's pipes. A
    narrower core (E-cores: 16) takes the AVX2 cycles times 32 / its FLOP a cycle. Halving the
    vectors on the same core cost a median 1.07x at one row and 1.6x at 64 here (docs/validation/
    ggml_types.md), so that factor of 2 for an E-core is an upper bound."""
    if isa == "avx512" and core.flop_per_cycle >= HOST_FLOP_PER_CYCLE["avx512"]:
        return type_runs("avx512"), HOST_FLOP_PER_CYCLE["avx512"] / core.flop_per_cycle
    return type_runs("avx2"), max(1.0, HOST_FLOP_PER_CYCLE["avx2"] / core.flop_per_cycle)


def compute_s_per_element(isa: Isa, ggml_type: str, rows: float, groups: tuple[Cores, ...], threads: int) -> float:
    """Seconds per weight element of the cores' work alone: each group's cycles (:func:`runs_for`) at
    its clock. Threads on like cores add their rates; threads that spill onto a slower group run in
    lockstep with it (each op ends in a barrier, and a matmul with fewer than 4 chunks a thread
    splits its rows evenly: ggml-cpu.c ggml_compute_forward_mul_mat_id, so the slowest core sets the
    pace; llama.cpp leaves efficiency cores out of its default -t for that reason, common/common.cpp
    cpu_count_math_cpus)."""
    placed = threads_by_group(groups, threads)

    def rate(core: Cores) -> float:
        runs, factor = runs_for(isa, core)
        return core.ghz * 1e9 / (runs.cycles_per_element(ggml_type, rows) * factor)

    return 1.0 / (min(rate(g) for g, _ in placed) * sum(n for _, n in placed))


def bytes_per_element(ggml_type: str) -> float:
    """Bytes per weight of ``ggml_type`` (its block struct: hrm.model.quantized.ggml_bits_per_weight)."""
    return ggml_bits_per_weight(ggml_type) / 8


def memory_s_per_element(ggml_type: str, dram_bytes_s: float) -> float:
    """Seconds per weight element of streaming its bytes from DRAM at the achieved rate."""
    return bytes_per_element(ggml_type) / dram_bytes_s


def prior_s_per_element(isa: Isa, ggml_type: str, rows: float, groups: tuple[Cores, ...], threads: int,
                        dram_bytes_s: float) -> float:
    """The larger of the cores' work and the DRAM stream (a roofline: the kernel overlaps both)."""
    return max(compute_s_per_element(isa, ggml_type, rows, groups, threads),
               memory_s_per_element(ggml_type, dram_bytes_s))


def prior_section(groups: tuple[Cores, ...], isa: Isa, dram_bytes_s: float, thread_counts: tuple[int, ...],
                  default_threads: int) -> GgmlCpu:
    """A ``ggml_cpu`` section of MUL_MAT_ID curves for every type of :data:`PRIOR_TYPES` at
    ``thread_counts``, from :func:`prior_s_per_element` (``prior`` says so; the CPU-only step
    model, which needs every kernel measured, refuses it)."""
    kernels = tuple(
        GgmlKernel(type=t, op="mmid", threads=n, buffer="CPU",
                   s_per_elem_vs_rows=[CurvePoint(x=r, y=prior_s_per_element(isa, t, r, groups, n, dram_bytes_s))
                                       for r in PRIOR_ROWS])
        for n in thread_counts for t in PRIOR_TYPES)
    return GgmlCpu(llama_cpp=f"prior: hrm.machine.ggml_prior ({isa} part; measured {type_runs('avx2').measured}, "
                             f"{type_runs('avx512').measured})",
                   pool_mib=1024.0, kernels=kernels, prior=True,
                   default_threads=default_threads)


__all__ = ["PRIOR_TYPES", "HOST_FLOP_PER_CYCLE", "CACHE_POOL_MIB", "PRIOR_ROWS", "TypeRuns", "type_runs", "Cores",
           "threads_by_group", "thread_counts", "runs_for", "compute_s_per_element", "bytes_per_element", "memory_s_per_element",
           "prior_s_per_element", "prior_section"]
