"""A consumer hardware catalog: GPUs and CPU platforms (``hrm/data/parts/*.yaml``, every number
with its vendor page) composed into a :class:`hrm.machine.hardware.HardwareProfile`
(``hrm fit --gpu rtx-4090 --cpu ryzen-9-7950x --ram 64``).

A part's file holds what its spec sheet states; everything else is arithmetic here (peaks from
cores, clocks and bus widths) or a named prior with its source:

- the CPU's achieved DRAM rate is the datasheet rate × its platform class's ``stream_fraction``
  (``cpus.yaml``: the STREAM results read, or the value carried from one, said so);
- llama.cpp's CPU kernels can reach that rate: on this project's CPU host its repacked q4_K
  MUL_MAT_ID at one row on all (2) threads streams 15.4 GB/s against a STREAM triad of 15.5 GB/s
  (docs/validation/runs/this-host-llamacpp.yaml; :func:`ggml_over_stream` recomputes it, and
  tests/test_parts.py checks it), so no further factor is applied (GGML_OVER_STREAM = 1);
- with a GPU, the CPU experts' kernels are a prior (:func:`ggml_prior_of`, hrm.machine.ggml_prior):
  the larger of that DRAM stream and the cores' work, this project's measured cycles per weight
  per ggml type scaled to the part's cores, SIMD width and boost clock;
- the host link is the PCIe generation × lanes × the share of the raw rate a pinned copy reached
  on the project's measured H100 box (LINK_EFFICIENCY).

Prefer a measured profile (``hrm profile``) of your own machine: a composed one is a prior.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .. import bounds
from ..errors import HRMError, read_input_text, strict_yaml_load
from .hardware import HardwareProfile, parse_hardware

PARTS_DIR = Path(__file__).resolve().parents[1] / "data" / "parts"

#: PCIe raw rate per lane, GB/s after line coding (physics of the standard: 8 GT/s x 128/130 / 8
#: for gen 3, doubling each generation)
PCIE_LANE_GBPS = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}
#: share of the raw PCIe rate a pinned host->device copy reaches: 55.17 GB/s measured on the
#: project's H100 (PCIe gen 5 x16 host link) / 63.0 GB/s raw
#: (docs/validation/h100-measured.yaml:246, link.h2d_gbps). Override: reassign, or give a profile.
LINK_EFFICIENCY = 55.17 / (16 * PCIE_LANE_GBPS[5])
#: llama.cpp's CPU kernels' achieved weight stream over the STREAM triad on the same host
#: (docs/validation/runs/this-host-llamacpp.yaml: q4_K mmid, 2 threads, 1 row: 15.37 vs 15.52
#: GB/s = 0.99): taken as 1. Override: reassign.
GGML_OVER_STREAM = 1.0
#: bytes per DDR channel transfer (a 64-bit channel; DDR5's two 32-bit subchannels together)
DDR_CHANNEL_BYTES = 8
#: dense FP16 tensor FLOP per SM per clock with FP32 accumulate, GeForce Ampere/Ada/Blackwell
#: (gpus.yaml header: the GA102 and Ada whitepapers' RTX 3090 and 4090 peaks)
NVIDIA_FP16_FLOP_PER_SM_CLOCK = 512
#: FP32 shader cores per SM, GeForce Ampere GA10x / Ada / Blackwell (the same whitepapers)
NVIDIA_CORES_PER_SM = 128


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuPart(_Part):
    key: bounds.Name
    name: bounds.Label
    architecture: Literal["turing", "ampere", "ada", "hopper", "blackwell", "other"]
    cores: int = Field(gt=0)
    boost_ghz: float = Field(gt=0, lt=10)
    memory_gb: float = Field(gt=0, le=bounds.MAX_GPU_MEMORY_GIB)
    bus_bits: int = Field(gt=0)
    pin_gbps: float = Field(gt=0, lt=100)
    pcie_gen: Literal[3, 4, 5]
    pcie_lanes: Literal[1, 4, 8, 16]
    #: stated peaks (AMD's pages); NVIDIA's are derived from the cores and clock
    fp32_tflops: Optional[float] = Field(default=None, gt=0)
    fp16_tflops: Optional[float] = Field(default=None, gt=0)
    source: str

    @property
    def memory_bandwidth_gbps(self) -> float:
        return self.pin_gbps * self.bus_bits / 8

    @property
    def peak_fp32_tflops(self) -> float:
        return self.fp32_tflops or self.cores * 2 * self.boost_ghz / 1000

    @property
    def peak_fp16_tflops(self) -> float:
        if self.fp16_tflops is not None:
            return self.fp16_tflops
        return self.cores / NVIDIA_CORES_PER_SM * NVIDIA_FP16_FLOP_PER_SM_CLOCK * self.boost_ghz / 1000

    @property
    def link_gbps(self) -> float:
        """Achieved pinned host<->device copy rate (GB/s): raw lanes × LINK_EFFICIENCY."""
        return PCIE_LANE_GBPS[self.pcie_gen] * self.pcie_lanes * LINK_EFFICIENCY


class CoreGroup(_Part):
    cores: int = Field(gt=0)
    base_ghz: float = Field(gt=0, lt=10)
    #: the highest clock the vendor states for the group (the CPU experts' cycles run at it)
    boost_ghz: float = Field(gt=0, lt=10)
    flop_per_cycle: int = Field(gt=0)


class PlatformClass(_Part):
    stream_fraction: float = Field(gt=0, le=1)
    basis: str


class CpuPart(_Part):
    key: bounds.Name
    name: bounds.Label
    #: the achieved-rate prior's class (``classes`` of cpus.yaml)
    class_: str = Field(alias="class")
    groups: tuple[CoreGroup, ...]
    channels: int = Field(gt=0, le=24)
    ddr: Literal["DDR4", "DDR5"]
    mts: int = Field(gt=0, le=12000)
    max_sockets: Literal[1, 2]
    #: the vector instruction set llama.cpp's CPU kernels run on it (hrm.machine.ggml_prior)
    isa: Literal["avx512", "avx2"]
    source: str

    @property
    def cores(self) -> int:
        return sum(g.cores for g in self.groups)

    @property
    def datasheet_gbps(self) -> float:
        """One socket's DRAM peak: channels × MT/s × 8 bytes."""
        return self.channels * self.mts * DDR_CHANNEL_BYTES / 1000

    @property
    def peak_fp32_tflops(self) -> float:
        return sum(g.cores * g.base_ghz * g.flop_per_cycle for g in self.groups) / 1000


class Catalog(_Part):
    gpus: dict[str, GpuPart]
    cpus: dict[str, CpuPart]
    classes: dict[str, PlatformClass]


def _load(name: str) -> dict:
    data = strict_yaml_load(read_input_text(PARTS_DIR / name, "a parts list"))
    if not isinstance(data, dict):
        raise HRMError(f"{PARTS_DIR / name}: a mapping expected")
    return data


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    """The shipped parts (hrm/data/parts/gpus.yaml, cpus.yaml)."""
    g, c = _load("gpus.yaml"), _load("cpus.yaml")
    gpus = [GpuPart.model_validate(x) for x in g["gpus"]]
    cpus = [CpuPart.model_validate(x) for x in c["cpus"]]
    classes = {k: PlatformClass.model_validate(v) for k, v in c["classes"].items()}
    for cpu in cpus:
        if cpu.class_ not in classes:
            raise HRMError(f"{PARTS_DIR / 'cpus.yaml'}: {cpu.key}: class {cpu.class_!r} is not one of {sorted(classes)}")
    return Catalog(gpus={p.key: p for p in gpus}, cpus={p.key: p for p in cpus}, classes=classes)


def _pick(kind: str, key: str, parts: dict):
    if key in parts:
        return parts[key]
    import difflib

    close = difflib.get_close_matches(key, list(parts), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f" (one of {', '.join(parts)})"
    raise HRMError(f"--{kind} {key}: not in the parts catalog{hint}")


def compose_profile(gpu: str | None, cpu: str, ram_gib: float, gpu_count: int = 1, sockets: int = 1,
                    stream_fraction: float | None = None) -> HardwareProfile:
    """A hardware profile from catalog parts: ``gpu_count`` × ``gpu`` (None: CPU only) on
    ``sockets`` × ``cpu`` with ``ram_gib`` of host memory. ``stream_fraction`` overrides the
    platform class's prior."""
    cat = catalog()
    c = _pick("cpu", cpu, cat.cpus)
    bounds.CPU_MEMORY_GIB.check(ram_gib, "--ram")
    if sockets not in (1, 2) or sockets > c.max_sockets:
        raise HRMError(f"--sockets {sockets}: {c.name} runs in 1{' or 2' if c.max_sockets == 2 else ''} socket(s)")
    prior = cat.classes[c.class_]
    fraction = prior.stream_fraction if stream_fraction is None else \
        bounds.POSITIVE_FRACTION.check(stream_fraction, "--cpu-stream-fraction")
    datasheet = c.datasheet_gbps * sockets
    achieved = datasheet * fraction * GGML_OVER_STREAM
    name = f"{gpu_count}x{gpu}+{cpu}" if gpu else cpu
    data: dict = {
        "name": name.replace("+", "-"),
        "description": (f"composed from the parts catalog: {f'{gpu_count} x {gpu}, ' if gpu else ''}"
                        f"{sockets} x {c.name}, {ram_gib:g} GiB {c.ddr}-{c.mts}"),
        "source": {"kind": "datasheet", "notes": (
            f"hrm.machine.parts: {c.name} {c.source}; DRAM {datasheet:.1f} GB/s datasheet ({sockets} x {c.channels} x "
            f"{c.ddr}-{c.mts}) x {fraction:g} ({c.class_}: {prior.basis if stream_fraction is None else '--cpu-stream-fraction'})")},
        "cpu": {"name": c.name, "cores": c.cores * sockets, "memory_gib": float(ram_gib),
                "memory_bandwidth_gbps": round(achieved, 3), "numa_nodes": sockets,
                "tflops": {"fp32": round(c.peak_fp32_tflops * sockets, 4)}},
    }
    if gpu:
        g = _pick("gpu", gpu, cat.gpus)
        data["source"]["notes"] += f"; {g.name} {g.source}"
        data["gpu"] = {"name": g.name, "architecture": g.architecture, "count": gpu_count,
                       "memory_gib": float(g.memory_gb), "memory_bandwidth_gbps": g.memory_bandwidth_gbps,
                       "tflops": {"fp32": round(g.peak_fp32_tflops, 3), "fp16": round(g.peak_fp16_tflops, 3)}}
        if gpu_count > 1:  # GeForce cards have no NVLink (Ada, Blackwell): peer copies cross PCIe, at the link's rate
            data["gpu"]["gpu_to_gpu_gbps"] = round(g.link_gbps, 3)
        data["link"] = {"h2d_gbps": round(g.link_gbps, 3), "d2h_gbps": round(g.link_gbps, 3),
                        "gpus_per_pcie_switch": 1}
        data["ggml_cpu"] = ggml_prior_of(c, sockets, achieved).model_dump(mode="json", exclude_none=True)
        data["source"]["notes"] += ("; llama.cpp's CPU expert kernels: hrm.machine.ggml_prior (this project's measured "
                                    f"cycles per element, {c.isa} build, scaled to these cores)")
    return parse_hardware(data, f"parts {name}")


def llama_default_threads(c: CpuPart, sockets: int = 1) -> int:
    """llama.cpp's default -t on Linux: one thread per physical core, performance cores only on a
    hybrid Intel part (common/common.cpp:201-226 common_cpu_get_num_math: cpu_count_math_cpus skips
    efficiency cores and hyperthreads where CPUID says hybrid; else :77-103, the physical cores)."""
    return (c.groups[0].cores if len(c.groups) > 1 else c.cores) * sockets


def ggml_prior_of(c: CpuPart, sockets: int, achieved_gbps: float):
    """The CPU experts' kernels of ``sockets`` × ``c`` (:func:`hrm.machine.ggml_prior.prior_section`) at
    1, the powers of two below the cores, llama.cpp's default -t and every core."""
    from .ggml_prior import Cores, prior_section, thread_counts

    groups = tuple(Cores(cores=g.cores * sockets, ghz=g.boost_ghz, flop_per_cycle=g.flop_per_cycle) for g in c.groups)
    default = llama_default_threads(c, sockets)
    counts = tuple(sorted({*thread_counts(c.cores * sockets), default}))
    return prior_section(groups, c.isa, achieved_gbps * 1e9, counts, default)


__all__ = ["GpuPart", "CpuPart", "PlatformClass", "Catalog", "catalog", "compose_profile", "LINK_EFFICIENCY",
           "GGML_OVER_STREAM", "PCIE_LANE_GBPS"]
