"""Hardware profile (docs/model.md §3.1): a YAML file with unit-suffixed keys, SI values via properties.

``*_gbps`` = 1e9 bytes/s, ``*_gib`` = 2^30 bytes, ``*_tflops`` = 1e12 FLOP/s. A profile
without a ``gpu`` section describes a CPU-only host: the device tier is then emulated on
the CPU and both tiers share one compute unit and one memory bus.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Literal, Optional

import numpy as np
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, model_validator

from .. import bounds
from ..errors import HRMError, read_yaml_mapping, validated
from ..units import GB, GIB, TFLOPS

#: shipped profiles inside an installed package (a wheel: setup.py copies the top-level
#: ``hardware_profiles/`` there at build time) ...
PACKAGED_PROFILES_DIR = Path(__file__).resolve().parents[1] / "data" / "hardware_profiles"
#: ... and in a checkout (editable install, or the source tree on sys.path)
CHECKOUT_PROFILES_DIR = Path(__file__).resolve().parents[2] / "hardware_profiles"


def profile_dirs() -> list[Path]:
    """Folders of the shipped profiles, in lookup order: package data first, then a checkout."""
    return [d for d in (PACKAGED_PROFILES_DIR, CHECKOUT_PROFILES_DIR) if d.is_dir()]


#: the folder the shipped profiles are read from (the first of :func:`profile_dirs`)
PROFILES_DIR = next(iter(profile_dirs()), CHECKOUT_PROFILES_DIR)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where the numbers come from. ``methods`` maps a field to how it was measured.
    ``kind: calibrated``: a profile whose achieved rates ``hrm calibrate`` fitted to the
    user's own runs (``methods`` names each fitted field; ``runs_sha256`` is the runs file's)."""

    kind: Literal["datasheet", "measured", "calibrated"] = "datasheet"
    date: Optional[str] = None
    tool_version: Optional[str] = None
    host: Optional[str] = None
    notes: Optional[str] = None
    methods: dict[str, str] = Field(default_factory=dict)
    runs_sha256: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class Flops(_Strict):
    """Peak dense FLOP/s per dtype in TFLOP/s; a missing dtype falls back to fp32."""

    fp32: bounds.TFLOPS.type
    fp16: Optional[bounds.TFLOPS.type] = None
    bf16: Optional[bounds.TFLOPS.type] = None
    int8: Optional[bounds.TFLOPS.type] = None

    def dtype_used(self, dtype: str) -> str:
        """The dtype whose peak computes ``dtype``: int4 is dequantised to fp16; a dtype the
        profile lacks falls back to fp32."""
        key = {"int4": "fp16"}.get(dtype, dtype)
        return key if getattr(self, key, None) is not None else "fp32"

    def flops(self, dtype: str) -> float:
        """FLOP/s for ``dtype`` (:meth:`dtype_used`)."""
        return getattr(self, self.dtype_used(dtype)) * TFLOPS


class CurvePoint(_Strict):
    x: bounds.CURVE_VALUE.type
    y: bounds.CURVE_VALUE.type


def _curve_points(points: list[CurvePoint]) -> list[CurvePoint]:
    """A measured curve: at least one point, each x once (interpolation needs a function)."""
    if not points:
        raise ValueError("an empty curve (at least one point)")
    return _unique_x(points)


def _unique_x(points: list[CurvePoint]) -> list[CurvePoint]:
    """Each x once: a curve is a function of x."""
    xs = [p.x for p in points]
    repeated = next((x for i, x in enumerate(xs) if x in xs[:i]), None)
    if repeated is not None:
        raise ValueError(f"x = {repeated:g} appears twice in one curve")
    return points


#: a curve of measured points (non-empty, x unique)
Curve = Annotated[list[CurvePoint], AfterValidator(_curve_points)]
#: matmul curves by dtype (a :class:`Flops` dtype)
DtypeCurves = dict[Literal["fp32", "fp16", "bf16", "int8"], Curve]


def curves_refusal(curves: dict[str, list[CurvePoint]], peaks: "Flops", where: str) -> str | None:
    """Why matmul ``curves`` cannot refine ``peaks`` (None if they can): a curve of a dtype the
    profile has no peak for would be silently unused; a point above its dtype's peak (beyond
    :data:`hrm.bounds.CURVE_PEAK_TOLERANCE`) is a curve of another dtype or unit."""
    for dtype, points in curves.items():
        peak = getattr(peaks, dtype)
        if peak is None:
            return f"{where}.{dtype}: the profile has no {dtype} peak for this curve to refine"
        top = max(p.y for p in points)
        if top > peak * (1 + bounds.CURVE_PEAK_TOLERANCE):
            return f"{where}.{dtype}: a point of {top:g} TFLOP/s is above the {dtype} peak {peak:g} TFLOP/s"
    return None


#: curves that profiles written by earlier ``hrm profile`` versions carry and nothing reads:
#: accepted on load, not kept, but hashed as they were so that plans keep their hardware hash
LEGACY_EFFICIENCY_CURVES = ("h2d_gbps_vs_bytes", "cpu_copy_gbps_vs_bytes", "cpu_attention_gbps_vs_context")
_CURVES = TypeAdapter(dict[str, Annotated[list[CurvePoint], AfterValidator(_unique_x)]])


class Efficiency(_Strict):
    """Measured curves that refine the peaks (docs/model.md §3.1): achieved TFLOP/s vs matmul rows M
    per dtype. Interpolated in log-x, clamped at the ends."""

    gpu_matmul_tflops_vs_m: DtypeCurves = Field(default_factory=dict)
    cpu_matmul_tflops_vs_m: DtypeCurves = Field(default_factory=dict)
    _legacy_curves: dict[str, list] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _accept_legacy_curves(cls, data, handler):
        legacy = {}
        if isinstance(data, dict) and any(key in data for key in LEGACY_EFFICIENCY_CURVES):
            data = dict(data)
            legacy = {key: data.pop(key) for key in LEGACY_EFFICIENCY_CURVES if key in data}
            legacy = _CURVES.dump_python(_CURVES.validate_python(legacy), mode="json")
        result = handler(data)
        if legacy:
            result._legacy_curves = legacy
        return result


def interpolate_curve(points: list[CurvePoint], x) -> np.ndarray:
    """Piecewise-linear in log(x), clamped outside the measured range."""
    xs = np.log([p.x for p in points])
    ys = np.array([p.y for p in points])
    order = np.argsort(xs)
    return np.interp(np.log(np.maximum(x, 1e-30)), xs[order], ys[order])


NonNegative = Field(default=0.0)  # bounds.DISPATCH_S: [0, 1] s
Seconds = bounds.DISPATCH_S.type


class Dispatch(_Strict):
    """Fixed cost of one invocation, whatever its size: the α of the α-β (latency-bandwidth)
    cost model, t = α + max(FLOPs / F, bytes / B). On a GPU it is the launch latency of the
    operator's kernels plus the stream synchronisation of a task; on an emulated device tier
    the Python/torch dispatch of the operator's ops. ``hrm profile`` measures it by running
    the reference runtime's operators at a minimal size (one token, hidden 16); datasheet
    profiles leave it out (every α = 0, the plain roofline of eq. 14).

    - ``task_s``: one task on a lane (launch, dependency hand-off, completion);
    - ``pre_attn_s`` / ``attention_s`` / ``post_attn_s``: pre-attention (RMSNorm, QKV,
      RoPE), decode attention over the cache, post-attention (O projection, RMSNorm,
      router) — one call each per micro-batch;
    - ``experts_call_s`` + ``expert_s`` × distinct experts touched: the routed-expert loop
      (a shared expert or a dense MLP counts as one more expert);
    - ``head_s``: final norm + lm_head + greedy choice + embedding of the next token;
    - ``copy_s``: one transfer between the tiers (issued by the host);
    - ``device_attention_s``: attention on the device tier when it is not the CPU path
      (``attention_s``): the KV cache assembled from device slots and prefetched host slots
      (FlexGen S4 order); unset = ``attention_s``;
    - ``kv_load_s`` / ``kv_store_s``: beyond the K and V copies, the indexing of the
      host-resident cache when the device attends over it (prefetch; the new token
      written back), per micro-batch;
    - ``owner``: the engine whose operators these costs were measured on (``hrm profile``'s
      probe runs the reference runtime: ``hrm-runtime``). Another engine is never charged
      them: on a GPU host it pays its own launch counts instead (:mod:`hrm.machine.launches`).
      Unset (profiles written before the field): ``hrm-runtime`` in a measured profile,
      every engine otherwise (:func:`hrm.machine.rates.dispatch_owner`).
    """

    task_s: Seconds = NonNegative
    pre_attn_s: Seconds = NonNegative
    attention_s: Seconds = NonNegative
    post_attn_s: Seconds = NonNegative
    experts_call_s: Seconds = NonNegative
    expert_s: Seconds = NonNegative
    head_s: Seconds = NonNegative
    copy_s: Seconds = NonNegative
    device_attention_s: Optional[Seconds] = None
    kv_load_s: Seconds = NonNegative
    kv_store_s: Seconds = NonNegative
    owner: Optional[bounds.Name] = None

    def device_attention(self) -> float:
        return self.attention_s if self.device_attention_s is None else self.device_attention_s


class _Memory(_Strict):
    """A processor's memory: ``memory_gib`` (per GPU) and ``memory_bandwidth_gbps``, in SI."""

    @property
    def memory_bytes(self) -> float:
        """Memory capacity in bytes (per GPU)."""
        return self.memory_gib * GIB

    @property
    def memory_bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_gbps * GB


class GPU(_Memory):
    name: bounds.Label
    count: bounds.GPU_COUNT.type = 1
    memory_gib: bounds.GPU_MEMORY_GIB.type
    memory_bandwidth_gbps: bounds.BANDWIDTH_GBPS.type
    tflops: Flops
    gpu_to_gpu_gbps: Optional[bounds.BANDWIDTH_GBPS.type] = None
    dispatch: Optional[Dispatch] = None
    # achieved rates (optional; hrm.machine.achieved names the default used when one is absent)
    architecture: Optional[Literal["turing", "ampere", "ada", "hopper", "blackwell", "other"]] = None
    memory_stream_efficiency: Optional[bounds.POSITIVE_FRACTION.type] = None
    gemm_efficiency: Optional[bounds.POSITIVE_FRACTION.type] = None
    # per-op costs of an eager framework on this host (optional; hrm.machine.launches has the sourced
    # defaults): the host's time to issue one tiny CUDA op, and the GPU's idle time one host
    # sync costs (hrm profile measures both with torch, profiler/gpu.py)
    eager_op_s: Optional[bounds.DISPATCH_S.type] = None
    sync_bubble_s: Optional[bounds.DISPATCH_S.type] = None

    @model_validator(mode="after")
    def _multi_gpu_needs_link(self):
        if self.count > 1 and self.gpu_to_gpu_gbps is None:
            raise ValueError("gpu_to_gpu_gbps is required when count > 1")
        return self


class CPU(_Memory):
    name: bounds.Label
    cores: bounds.CORES.type
    memory_gib: bounds.CPU_MEMORY_GIB.type
    memory_bandwidth_gbps: bounds.BANDWIDTH_GBPS.type
    tflops: Flops
    dispatch: Optional[Dispatch] = None
    # achieved rates (optional): a host memcpy (bytes moved per second) on one thread and on
    # all threads, and the NUMA nodes the cores and DRAM are split into
    memcpy_one_thread_gbps: Optional[bounds.BANDWIDTH_GBPS.type] = None
    memcpy_all_threads_gbps: Optional[bounds.BANDWIDTH_GBPS.type] = None
    numa_nodes: Optional[bounds.NUMA_NODES.type] = None
    # one eager framework op on small CPU tensors (optional; hrm.machine.launches.EAGER_CPU_OP_S otherwise)
    eager_op_s: Optional[bounds.DISPATCH_S.type] = None
    # host DRAM traffic (bytes read + written per second) every core and the DMA together
    # sustain: what an engine's host-DRAM lane is charged against (optional; hrm.machine.achieved)
    dram_gbps: Optional[bounds.BANDWIDTH_GBPS.type] = None


class Link(_Strict):
    """CPU<->GPU link per GPU (pinned memory unless said otherwise). ``gpus_per_pcie_switch``:
    GPUs that share one uplink to the host (1 = each GPU has its own x16 root port);
    ``p2p``: whether GPUs can copy peer-to-peer (False: collectives go through host memory)."""

    h2d_gbps: bounds.LINK_GBPS.type
    d2h_gbps: bounds.LINK_GBPS.type
    h2d_pageable_gbps: Optional[bounds.LINK_GBPS.type] = None
    d2h_pageable_gbps: Optional[bounds.LINK_GBPS.type] = None
    gpus_per_pcie_switch: Optional[bounds.GPU_COUNT.type] = None
    p2p: Optional[bounds.Flag] = None


class Disk(_Strict):
    """The disk weights beyond host memory are read from (docs/model.md §4.9): ``read_gbps``,
    its sequential read rate (what the ``disk`` lane charges per spilled byte); optional
    ``write_gbps``, its sequential write rate (recorded, not charged: spilled weights are
    written once, before generation starts)."""

    read_gbps: bounds.BANDWIDTH_GBPS.type
    write_gbps: Optional[bounds.BANDWIDTH_GBPS.type] = None


class Emulation(_Strict):
    """The device tier as the reference runtime emulates it on a CPU-only host (docs/model.md §8):
    torch operators on ``threads`` intra-op threads, one task at a time on one unit
    (``runtime.device.SharedUnit``). ``hrm profile`` measures it with the runtime's own
    operators, so that on a CPU-only host the model predicts the machine that executes the
    plans (the ``cpu`` section keeps the whole machine's peaks: all cores, numpy BLAS).

    - ``tflops``: best point of the matmul curve per dtype;
    - ``memory_bandwidth_gbps``: a large torch copy, bytes read + written per second
      (STREAM's counting, as ``cpu.memory_bandwidth_gbps``);
    - ``copy_gbps``: bytes *moved* per second by the same copy — what a tier-to-tier
      transfer (the emulated H2D/D2H) costs;
    - ``matmul_tflops_vs_m``: ``F.linear`` (weights in the [out, in] layout the runtime
      uses), cold weights (a pool larger than the last-level cache, as streamed expert
      weights are), achieved TFLOP/s vs rows M.
    """

    threads: bounds.CORES.type
    tflops: Flops
    memory_bandwidth_gbps: bounds.BANDWIDTH_GBPS.type
    copy_gbps: bounds.BANDWIDTH_GBPS.type
    matmul_tflops_vs_m: DtypeCurves = Field(default_factory=dict)

    @model_validator(mode="after")
    def _curves_below_peaks(self):
        refusal = curves_refusal(self.matmul_tflops_vs_m, self.tflops, "matmul_tflops_vs_m")
        if refusal:
            raise ValueError(refusal)
        return self


#: ggml's CPU ops as the probe names them: MUL_MAT (``mm``: one weight matrix, rows = tokens),
#: MUL_MAT_ID (``mmid``: a layer's expert tensor, rows = tokens per touched expert) and
#: FLASH_ATTN_EXT with one query row per head (``fa1``) or a tile of them (``fat``: the tiled
#: path, 64+ rows, ggml-cpu/ops.cpp), rows = cached tokens, per (query row x head x cached token
#: x (d_k + d_v)) element
#: matmuls (mm, mmid), flash attention (fa1, fat) and the elementwise kinds of a layer's graph
#: (hrm.cost.ggml_elementwise.ELEMENTWISE_KINDS: type f32, seconds per output element)
GgmlOp = Literal["mm", "mmid", "mmh", "fa1", "fat", "norm", "add", "mulw", "glu", "kv16", "rope", "softmax", "concat"]


def derived(model: BaseModel, field: str, make):
    """``make(model.<field>)``, kept on the frozen ``model`` while that field holds the same object
    (the step model reads a kernel's curve and a section's kernels thousands of times a
    prediction). Kept beside the fields, not in one: pydantic compares and dumps fields only, and
    a ``model_copy(update=...)`` that replaces the field is seen and re-derived, not served stale."""
    source = getattr(model, field)
    key = f"_derived_{field}"
    kept = model.__dict__.get(key)
    if kept is None or kept.source is not source:
        kept = model.__dict__[key] = _Kept(source, make(source))
    return kept.value


class _Kept:
    """A derived value and the field object it came from; equal only to itself, so pydantic's
    quick ``__dict__`` comparison falls back to the fields whenever two models keep different ones."""

    __slots__ = ("source", "value")

    def __init__(self, source, value):
        self.source, self.value = source, value


def _sorted_xy(curve) -> tuple[np.ndarray, np.ndarray]:
    points = sorted(curve, key=lambda p: p.x)
    return np.array([p.x for p in points], dtype=float), np.array([p.y for p in points], dtype=float)


def _kernels_by_key(kernels) -> dict:
    by_key: dict = {}
    for k in kernels:
        by_key.setdefault((k.type, k.op, k.threads), []).append(k)
    return by_key


class GgmlKernel(_Strict):
    """One ggml CPU matmul kernel as ``hrm profile --llama-cpp`` measured it on this host:
    seconds per weight element (``s_per_elem_vs_rows``: x = rows per weight matrix, y = s) for
    weight ``type`` (a ggml type name: f16, q8_0, q4_K, ...) at ``threads`` threads, with the
    weights in ``buffer`` (CPU, or CPU_REPACK where llama.cpp repacks that type) and cycled
    through a pool of ``pool_mib``: the pool is every weight byte's reuse distance, so the curves
    over pools are the last-level cache's effect that hrm.cost.ggml_cpu reads each tensor's rate on."""

    type: bounds.Label
    op: GgmlOp
    threads: bounds.CORES.type
    buffer: bounds.Label = "CPU"
    # the weight pool streamed (MiB; None: the section's pool_mib); flash attention: the head
    # shape "DK:DV:HEADS:KV_HEADS"; a per-head matmul (op mmh): "K:N:HEADS" (None for other matmuls)
    pool_mib: Optional[bounds.CURVE_VALUE.type] = None
    shape: Optional[str] = Field(default=None, pattern=r"^\d+:\d+:\d+(:\d+)?$")
    s_per_elem_vs_rows: Curve

    @property
    def head_shape(self) -> Optional[tuple[int, int, int, int]]:
        return tuple(int(x) for x in self.shape.split(":")) if self.shape else None

    @property
    def last_rows(self) -> float:
        """The most rows the curve was measured at."""
        return float(derived(self, "s_per_elem_vs_rows", _sorted_xy)[0][-1])

    def value(self, rows: float) -> float:
        """Seconds per element at ``rows``: linear between the measured points; past the last, a
        matmul is compute-bound and grows linearly with its rows (the last two points' slope);
        below the first, the first point."""
        xs, ys = derived(self, "s_per_elem_vs_rows", _sorted_xy)
        if rows <= xs[-1] or len(xs) == 1:
            return float(np.interp(rows, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + max(slope, 0.0) * (rows - xs[-1]))


class GgmlCpu(_Strict):
    """llama.cpp's CPU backend measured on this host (docs/model.md §4.10): its matmul kernels
    per weight type, op and thread count, and the fixed cost of one graph node (the threads'
    barrier after each op) against the thread count. ``llama_cpp`` names the tree the probe was built
    against; ``pool_mib`` the weight pool each kernel streamed."""

    llama_cpp: str
    pool_mib: bounds.CURVE_VALUE.type
    node_s_vs_threads: Optional[Curve] = None  # measured; a prior has none (its step model refuses it)
    kernels: tuple[GgmlKernel, ...]
    # hrm calibrate's fit to the user's own runs (1 = as measured): the matmul kernels' time in
    # their memory-bound regime (1 row) and compute-bound regime (16+ rows), geometric blend between
    stream_scale: float = Field(default=1.0, gt=0)
    compute_scale: float = Field(default=1.0, gt=0)
    # a prior, not a measurement (hrm.machine.ggml_prior: a catalog machine's CPU experts, MUL_MAT_ID
    # only), and llama.cpp's default -t on that machine (its physical performance cores)
    prior: bool = False
    default_threads: Optional[bounds.CORES.type] = None

    @model_validator(mode="after")
    def _one_curve_each(self):
        if self.node_s_vs_threads is None and not self.prior:
            raise ValueError("node_s_vs_threads: missing (hrm profile --llama-cpp measures it)")
        keys = [(k.type, k.op, k.threads, k.pool_mib or self.pool_mib, k.shape, k.buffer) for k in self.kernels]
        seen: set = set()
        repeated = next((k for k in keys if k in seen or seen.add(k)), None)
        if repeated is not None:
            raise ValueError(f"kernels: type {repeated[0]}, op {repeated[1]}, threads {repeated[2]}, pool "
                             f"{repeated[3]:g} MiB, shape {repeated[4]}, buffer {repeated[5]} appears twice")
        return self

    def kernels_of(self, ggml_type: str, op: str, threads: int) -> list[GgmlKernel]:
        """Every measured kernel of ``ggml_type``/``op`` at ``threads`` (pools, head shapes), in
        the section's order."""
        return list(derived(self, "kernels", _kernels_by_key).get((ggml_type, op, threads), ()))

    def node_s(self, threads: int) -> Optional[float]:
        """Seconds of one graph node at ``threads`` threads (None if not measured)."""
        return next((p.y for p in self.node_s_vs_threads or () if p.x == threads), None)

    def kernel(self, ggml_type: str, op: str, threads: int) -> Optional[GgmlKernel]:
        """The measured kernel of ``ggml_type``/``op`` at ``threads`` (None if not measured)."""
        return next((k for k in self.kernels if (k.type, k.op, k.threads) == (ggml_type, op, threads)), None)


class HardwareProfile(_Strict):
    name: bounds.Name
    description: str = ""
    source: Source = Field(default_factory=Source)
    gpu: Optional[GPU] = None
    cpu: CPU
    link: Optional[Link] = None
    disk: Optional[Disk] = None
    efficiency: Optional[Efficiency] = None
    emulation: Optional[Emulation] = None
    ggml_cpu: Optional[GgmlCpu] = None

    @model_validator(mode="after")
    def _gpu_needs_link(self):
        if self.gpu is not None and self.link is None:
            raise ValueError("a profile with a gpu section needs a link section (h2d_gbps, d2h_gbps)")
        refusal = link_refusal(self.link, self.gpu) or efficiency_refusal(self)
        if refusal:
            raise ValueError(refusal)
        return self

    # --- derived quantities (SI) -------------------------------------------------
    @property
    def cpu_only(self) -> bool:
        """No GPU: the device tier is emulated on the CPU (shared compute and memory bus)."""
        return self.gpu is None

    @property
    def gpu_count(self) -> int:
        return self.gpu.count if self.gpu else 1

    def sha256(self) -> str:
        """Hash of the canonical JSON of the profile (the plan records it)."""
        data = self.model_dump(mode="json")
        # fields added after plans were first written are hashed only when set, so that a
        # profile without them keeps the hash its plans recorded
        for section in ("cpu", "gpu"):
            if isinstance(data.get(section), dict) and data[section].get("dispatch") is None:
                data[section].pop("dispatch", None)
            elif isinstance(data.get(section), dict) and data[section]["dispatch"].get("owner") is None:
                data[section]["dispatch"].pop("owner", None)
        for section in ("emulation", "ggml_cpu"):
            if data.get(section) is None:
                data.pop(section, None)
        if data["source"].get("runs_sha256") is None:
            data["source"].pop("runs_sha256", None)
        if self.efficiency is not None:
            data["efficiency"].update(self.efficiency._legacy_curves)
        for section, keys in ACHIEVED_FIELDS.items():
            for key in keys:
                if isinstance(data.get(section), dict) and data[section].get(key) is None:
                    data[section].pop(key, None)
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def link_refusal(link: Optional[Link], gpu: Optional[GPU]) -> str | None:
    """A copy over the CPU<->GPU link writes (or reads) the GPU's memory, so no link rate
    can exceed the GPU's memory bandwidth: one that does is a unit slip."""
    if link is None or gpu is None:
        return None
    for field in ("h2d_gbps", "d2h_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps"):
        value = getattr(link, field)
        if value is not None and value > gpu.memory_bandwidth_gbps:
            return (f"link.{field}: {value:g} GB/s is faster than the GPU's memory "
                    f"(gpu.memory_bandwidth_gbps {gpu.memory_bandwidth_gbps:g}); a unit slip?")
    return None


def efficiency_refusal(profile: "HardwareProfile") -> str | None:
    """The efficiency curves against the peaks they refine (:func:`curves_refusal`); GPU
    curves need a gpu section (a CPU-only profile never reads them)."""
    eff = profile.efficiency
    if eff is None:
        return None
    if eff.gpu_matmul_tflops_vs_m and profile.gpu is None:
        return "efficiency.gpu_matmul_tflops_vs_m: a profile without a gpu section never uses GPU curves"
    gpu = (curves_refusal(eff.gpu_matmul_tflops_vs_m, profile.gpu.tflops, "efficiency.gpu_matmul_tflops_vs_m")
           if profile.gpu is not None else None)
    return gpu or curves_refusal(eff.cpu_matmul_tflops_vs_m, profile.cpu.tflops, "efficiency.cpu_matmul_tflops_vs_m")


#: optional achieved-rate fields (hashed only when set, so older profiles keep their hash)
ACHIEVED_FIELDS = {
    "gpu": ("architecture", "memory_stream_efficiency", "gemm_efficiency", "eager_op_s", "sync_bubble_s"),
    "cpu": ("memcpy_one_thread_gbps", "memcpy_all_threads_gbps", "numa_nodes", "eager_op_s", "dram_gbps"),
    "link": ("d2h_pageable_gbps", "gpus_per_pcie_switch", "p2p"),
    "disk": ("write_gbps",),
}


def resolve_profile_path(name_or_path: str) -> Path:
    """A path that exists, or a bare name (``l4`` / ``l4.yaml``) of a shipped profile
    (:func:`profile_dirs`: the installed package's data, else the checkout's ``hardware_profiles/``)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name[:-4] if path.name.endswith(".yml") else path.name
    for folder in profile_dirs():
        for candidate in (folder / f"{stem}.yaml", folder / f"{stem}.yml"):
            if candidate.exists():
                return candidate
    known = ", ".join(list_profiles()) or f"none found in {PACKAGED_PROFILES_DIR} or {CHECKOUT_PROFILES_DIR}"
    raise HRMError(f"hardware profile '{name_or_path}' not found (not a file; shipped profiles: {known})")


def list_profiles() -> list[str]:
    """Names of the shipped profiles (every folder of :func:`profile_dirs`)."""
    return sorted({p.stem for folder in profile_dirs() for p in (*folder.glob("*.yaml"), *folder.glob("*.yml"))})


def load_hardware(name_or_path: str) -> HardwareProfile:
    """Load and validate a hardware profile; raises HRMError with a one-line reason. A
    path-looking argument (with a folder separator) must exist: only bare names such as
    ``l4`` name shipped profiles. The file is stat-ed first (a FIFO is never opened)."""
    text_arg = str(name_or_path)
    if not text_arg.strip():
        raise HRMError("hardware profile: empty name (a YAML path or a shipped name such as l4)")
    if ("/" in text_arg or os.sep in text_arg) and not os.path.lexists(text_arg):
        raise HRMError(f"hardware profile '{text_arg}': no such file (only bare names such as l4 name shipped profiles)")
    path = resolve_profile_path(name_or_path)
    return parse_hardware(read_yaml_mapping(path, "a hardware profile YAML", "profile fields"), str(path))


def parse_hardware(data: dict, source: str = "hardware profile") -> HardwareProfile:
    return validated(HardwareProfile, data, source)


def dump_hardware_yaml(profile: HardwareProfile) -> str:
    """YAML text of a profile (None fields dropped) that load_hardware reads back."""
    return yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False)
