"""End-to-end estimate of one policy: throughput, latency, memory, diagnostics.

The engine's pipeline (:mod:`hrm.pipelines`) gives the prefill and the decode steps' times
and the peak memory; generation throughput (the paper's metric) = N·gen / (prefill + Σ_t
decode step(c_t)) with the context growing every decode step, decode throughput = N·(gen−1)
/ Σ_t step(c_t) (:mod:`hrm.cost.throughput`); per-token latency = the mean decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engines.engine import Engine, resolve_engine
from .engines.space import engine_for_policy, realised_policy
from .machine.hardware import HardwareProfile
from .cost.memory import MemoryLimits, fits
from .model.spec import ModelSpec
from .model.options import DEFAULT_OPTIONS, ModelOptions
from .pipelines import MemoryUse, pipeline_of
from .policy import Policy
from .problem import Problem, make_problem
from .machine.rates import Rates
from .cost.throughput import end_to_end_time_s, throughput_tok_s
from .units import GIB
from .workload import Workload, check_context_window


@dataclass(frozen=True)
class EstimateResult:
    policy: Policy
    schedule: str
    decode_layer_latency_s: float
    prefill_latency_s: float
    decode_time_s: float
    total_time_s: float
    decode_throughput_tok_s: float
    generation_throughput_tok_s: float
    per_token_latency_s: float
    gpu_peak_bytes: float
    cpu_peak_bytes: float
    gpu_limit_bytes: float
    cpu_limit_bytes: float
    shared_memory: bool
    bottleneck: str
    binding_memory: str
    resource_layer_s: dict[str, float]
    lane_layer_s: dict[str, float]
    memory_components: dict = field(default_factory=dict)
    engine: str = "ideal"
    #: weights spilled to disk beyond host memory (``cpu_peak_bytes`` is what stays there)
    disk_bytes: float = 0.0
    notes: tuple[str, ...] = ()
    defaulted: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return self.fits(MemoryLimits(self.gpu_limit_bytes, self.cpu_limit_bytes, self.shared_memory))

    def fits(self, limits: MemoryLimits) -> bool:
        """Whether the peaks fit ``limits`` (e.g. :func:`hrm.cost.memory.physical_limits`)."""
        return fits(self.gpu_peak_bytes, self.cpu_peak_bytes, limits)

    @property
    def utilization(self) -> dict[str, float]:
        """Busy fraction of each resource during decode: its time over the layer time."""
        return {k: v / self.decode_layer_latency_s for k, v in self.resource_layer_s.items()} if self.decode_layer_latency_s else {}

    def to_plan_estimate(self) -> dict:
        """The plan's ``estimate`` block (the key names of hrm/data/plan.schema.json)."""
        return {
            "decode_layer_latency_s": self.decode_layer_latency_s,
            "prefill_latency_s": self.prefill_latency_s,
            "decode_throughput_tok_s": self.decode_throughput_tok_s,
            "generation_throughput_tok_s": self.generation_throughput_tok_s,
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "cpu_peak_bytes": self.cpu_peak_bytes,
            "disk_bytes": self.disk_bytes,
            "bottleneck": self.bottleneck,
            "breakdown": {
                "per_token_latency_s": self.per_token_latency_s,
                "decode_time_s": self.decode_time_s,
                "total_time_s": self.total_time_s,
                "resource_layer_s": self.resource_layer_s,
                "utilization": self.utilization,
                "binding_memory": self.binding_memory,
                "gpu_limit_bytes": self.gpu_limit_bytes,
                "cpu_limit_bytes": self.cpu_limit_bytes,
                "engine": self.engine,
                "notes": list(self.notes),
                "defaulted_rates": list(self.defaulted),
            },
        }


def estimate(
    hw: HardwareProfile,
    model: ModelSpec,
    workload: Workload,
    policy: Policy,
    schedule: str | None = None,
    options: ModelOptions = DEFAULT_OPTIONS,
    limits: MemoryLimits | None = None,
    engine: str | Engine | None = None,
) -> EstimateResult:
    """Predict time, throughput and memory of ``policy`` run by ``engine`` (default
    :func:`hrm.engines.engine.default_engine_name`: moe-lightning on a GPU profile, ideal on a CPU-only
    one or with ``schedule``, ideal's lane structure, default cgopipe). Raises HRMError if
    the engine cannot run the placement; r_w is snapped to the engine's granularity (noted).
    An attention tier the engine hands to another engine file (``policy.attention_engines``:
    FlexGen's --cpu-cache-compute) is estimated with that engine."""
    check_context_window(model, workload)
    engine = engine_for_policy(resolve_engine(engine, schedule, hw), policy)
    return estimate_problem(make_problem(hw, model, workload, engine, options, limits), policy)


def bottleneck_in_words(bottleneck: str, resource_layer_s: dict, lane_layer_s: dict) -> str:
    """The bottleneck in words: a lane cut into affine pieces for the search (``all#0``, one
    piece per range of r_w) is named as its lane (``one unit (no overlap) (largest: ...)``)."""
    if "#" not in bottleneck:
        return bottleneck
    from .pipelines.lanes import bottleneck as lanes_bottleneck

    whole: dict[str, float] = {}
    for name, seconds in lane_layer_s.items():
        lane = name.split("#", 1)[0]
        whole[lane] = max(whole.get(lane, 0.0), seconds)
    return lanes_bottleneck(resource_layer_s, whole)


def binding_memory(memory: MemoryUse, limits: MemoryLimits) -> str:
    """The fuller tier in words, with its share of its usable bytes."""
    if limits.shared:
        return (f"host memory {100 * (memory.gpu_peak_bytes + memory.cpu_peak_bytes) / limits.cpu_bytes:.0f}% "
                f"(device tier shares it)")
    g, c = memory.gpu_peak_bytes / limits.gpu_bytes, memory.cpu_peak_bytes / limits.cpu_bytes
    if memory.disk_bytes > 0:  # the host tier is full: the rest of the weights are on disk
        return f"CPU memory {100 * c:.0f}% (+{memory.disk_bytes / GIB:.2f} GiB of weights on disk)"
    return f"GPU memory {100 * g:.0f}%" if g >= c else f"CPU memory {100 * c:.0f}%"


def estimate_problem(problem: Problem, policy: Policy) -> EstimateResult:
    """:func:`estimate` of a problem: the policy as the engine realises it, its times and
    memory from the engine's pipeline (:mod:`hrm.pipelines`), throughput from
    :mod:`hrm.cost.throughput`."""
    policy, notes = realised_policy(problem.model, problem.engine, policy)
    pipeline = pipeline_of(problem.engine)
    times = pipeline.times(problem, policy)
    memory = pipeline.memory(problem, policy)
    batch_size, gen_len, limits = policy.batch_size, problem.workload.gen_len, problem.limits
    return EstimateResult(
        policy=policy,
        schedule=problem.engine.schedule,
        decode_layer_latency_s=times.decode_layer_s,
        prefill_latency_s=times.prefill_s,
        decode_time_s=times.decode_s,
        total_time_s=end_to_end_time_s(times.prefill_s, times.decode_s),
        decode_throughput_tok_s=throughput_tok_s(batch_size, gen_len, times.prefill_s, times.decode_s, "decode"),
        generation_throughput_tok_s=throughput_tok_s(batch_size, gen_len, times.prefill_s, times.decode_s),
        per_token_latency_s=times.per_token_s,
        gpu_peak_bytes=memory.gpu_peak_bytes,
        cpu_peak_bytes=memory.cpu_peak_bytes,
        gpu_limit_bytes=limits.gpu_bytes,
        cpu_limit_bytes=limits.cpu_bytes,
        shared_memory=limits.shared,
        bottleneck=bottleneck_in_words(times.bottleneck, times.resource_layer_s, times.lane_layer_s),
        binding_memory=binding_memory(memory, limits),
        resource_layer_s=times.resource_layer_s,
        lane_layer_s=times.lane_layer_s,
        memory_components=memory.components,
        engine=problem.engine.name,
        disk_bytes=memory.disk_bytes,
        notes=(*notes, *times.notes),
        defaulted=used_defaults(problem.engine, problem.rates),
    )


def used_defaults(engine: Engine, rates: Rates) -> tuple[str, ...]:
    """Achieved-rate fields the profile lacks that this engine's mechanisms read (the ideal
    engine reads none: it runs at the profile's peaks)."""
    if engine.name == "ideal" or rates.achieved is None:
        return ()
    return rates.achieved.defaulted
