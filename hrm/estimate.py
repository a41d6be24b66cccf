"""End-to-end estimate of one policy (SPEC §4.4–4.6): throughput, latency, memory, diagnostics.

Generation throughput (the paper's metric) = N·gen / (prefill + Σ_t decode step(c_t)) with
the context growing every decode step; decode throughput = N·(gen−1) / Σ_t step(c_t);
per-token latency = the mean decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import latency
from .engine import IDEAL, Engine, resolve_engine
from .errors import HRMError
from .hardware import HardwareProfile
from .memory import MemoryLimits, cpu_memory_form, gpu_memory_form, memory_limits
from .model import ModelSpec
from .options import DEFAULT_OPTIONS, ModelOptions
from .policy import Policy
from .rates import Rates, rates_from_profile
from .workload import Workload, check_context_window

RESOURCE_LABELS = {
    "gpu": "GPU compute/HBM",
    "cpu": "CPU compute/DRAM",
    "h2d": "CPU->GPU link",
    "d2h": "GPU->CPU link",
    "chain": "serial GPU-CPU chain",
    "all": "one unit (no overlap)",
    "copy": "CPU staging-copy team",
    "dram": "host DRAM bandwidth",
    "gpu+weights": "GPU chain waiting on the weight load",
}


def lane_label(name: str) -> str:
    """A lane's name for people (``X+weights``: lane X with the weight load of one slot)."""
    if name.endswith("+weights") and name not in RESOURCE_LABELS:
        return f"{lane_label(name[:-len('+weights')])} + weight load (sync per micro-batch)"
    return RESOURCE_LABELS.get(name, name)


def schedule_problem(policy_attn: bool, policy_ffn: bool, schedule: str) -> str | None:
    """Why a placement is not allowed under ``schedule`` (None if it is)."""
    from .schedules import SCHEDULES

    if schedule not in SCHEDULES:
        return f"unknown schedule '{schedule}' (one of {', '.join(SCHEDULES)})"
    return SCHEDULES[schedule].problem(policy_attn, policy_ffn)


def engine_problem(engine: Engine, policy_attn: bool, policy_ffn: bool) -> str | None:
    """Why a placement is not one ``engine`` can run (its schedule's and its own policy space)."""
    problem = schedule_problem(policy_attn, policy_ffn, engine.schedule)
    if problem:
        return problem if engine.name == "ideal" else f"engine {engine.name}: {problem}"
    tier = {True: "gpu", False: "cpu"}
    if tier[policy_attn] not in engine.policy.attention:
        return f"engine {engine.name} runs attention on the {'/'.join(engine.policy.attention).upper()} (attn=...)"
    if tier[policy_ffn] not in engine.policy.ffn:
        return f"engine {engine.name} runs the experts on the {'/'.join(engine.policy.ffn).upper()} (ffn=...)"
    return None


#: expert matrices per step of r_w (m = r_w·L·E) for each ``static_experts`` granularity
STATIC_EXPERT_STEP = {
    "continuous": lambda model: 1,
    "whole-experts-per-layer": lambda model: model.num_moe_layers,  # the same whole count per layer
    "whole-layers": lambda model: model.num_experts,  # all of a layer's experts, or none
}


def static_expert_step(model: ModelSpec, engine: Engine) -> int:
    """Granularity of r_w in expert matrices over all MoE layers (r_w = m / (L·E))."""
    return STATIC_EXPERT_STEP[engine.static_experts](model)


def snap_weights_ratio(model: ModelSpec, engine: Engine, ratio: float) -> float:
    """r_w as the engine realises it: the largest multiple of its granularity at or below
    r_w (``whole-experts-per-layer``: int(E·r_w) experts of every layer, MoE-Lightning's
    ``num_experts_gpu = int(num_local_experts * wg)``; ``whole-layers``: int(L·r_w) layers)."""
    if engine.static_experts == "continuous" or model.num_experts <= 1:
        return ratio
    units = model.num_moe_layers * model.num_experts // static_expert_step(model, engine)
    return int(units * ratio + 1e-9) / units


def static_experts_in_words(model: ModelSpec, engine: Engine, ratio: float) -> str:
    """What a snapped r_w keeps on the GPU under the engine's granularity, in words."""
    if engine.static_experts == "whole-layers":
        return f"the experts of {round(ratio * model.num_moe_layers)} of {model.num_moe_layers} MoE layers"
    return f"int({model.num_experts}*rw) = {round(ratio * model.num_experts)} experts of every layer"


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
    notes: tuple[str, ...] = ()
    defaulted: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        if self.shared_memory:
            return self.gpu_peak_bytes + self.cpu_peak_bytes <= self.cpu_limit_bytes
        return self.gpu_peak_bytes <= self.gpu_limit_bytes and self.cpu_peak_bytes <= self.cpu_limit_bytes

    @property
    def utilization(self) -> dict[str, float]:
        """Busy fraction of each resource during decode: its time over the layer time."""
        return {k: v / self.decode_layer_latency_s for k, v in self.resource_layer_s.items()} if self.decode_layer_latency_s else {}

    def to_plan_estimate(self) -> dict:
        """The plan's ``estimate`` block (SPEC §6 key names)."""
        return {
            "decode_layer_latency_s": self.decode_layer_latency_s,
            "prefill_latency_s": self.prefill_latency_s,
            "decode_throughput_tok_s": self.decode_throughput_tok_s,
            "generation_throughput_tok_s": self.generation_throughput_tok_s,
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "cpu_peak_bytes": self.cpu_peak_bytes,
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


def step_times_s(model: ModelSpec, rates: Rates, workload: Workload, policy: Policy, schedule: str | Engine):
    """Per-step decode times (array over steps), the prefill time, and per-layer diagnostics."""
    engine = schedule if isinstance(schedule, Engine) else IDEAL.with_schedule(schedule)
    mu, n = policy.micro_batch_size, policy.num_micro_batches
    rw, rc = policy.weights_gpu_ratio, policy.kv_gpu_ratio
    contexts = latency.decode_contexts(workload.effective_prompt_len, workload.gen_len)
    head = n * latency.lm_head_time_s(model, rates, mu)
    steps = np.full(contexts.shape, float(head))
    prefill = float(head)
    resource_sum: dict[str, float] = {}
    lane_sum: dict[str, float] = {}
    for moe, count in latency.layer_kinds(model):
        resources = latency.decode_resources(model, rates, mu, contexts, policy.attn_on_gpu, policy.ffn_on_gpu, moe,
                                             engine)
        lanes = latency.schedule_lanes(resources, engine, rates.shared_unit)
        steps = steps + count * latency.lanes_time_s(lanes, n, rw, rc)
        if moe:
            steps = steps + latency.step_sync_s(resources, engine)
        for name, lane in resources.items():
            resource_sum[name] = resource_sum.get(name, 0.0) + count * float(np.sum(lane.time_s(n, rw, rc)))
        for lane in lanes:
            lane_sum[lane.name] = lane_sum.get(lane.name, 0.0) + count * float(np.sum(lane.time_s(n, rw, rc)))
        pre = latency.prefill_resources(model, rates, mu, workload.effective_prompt_len, moe, engine, workload.gen_len)
        prefill += count * float(latency.lanes_time_s(
            latency.schedule_lanes(pre, engine, rates.shared_unit, "prefill"), n, rw, rc))
    per_layer = max(len(contexts), 1) * model.num_layers
    resource_layer = {k: v / per_layer for k, v in resource_sum.items()}
    lane_layer = {k: v / per_layer for k, v in lane_sum.items()}
    return steps, prefill, resource_layer, lane_layer


def realised_policy(model: ModelSpec, engine: Engine, policy: Policy) -> tuple[Policy, list[str]]:
    """``policy`` as ``engine`` runs it (r_w snapped to its static-weight granularity), with
    a note for each change; HRMError for a policy outside the engine's space."""
    problem = engine_problem(engine, policy.attn_on_gpu, policy.ffn_on_gpu)
    if problem:
        raise HRMError(problem)
    for key, value in engine.policy.fixed.items():
        if abs(float(getattr(policy, key)) - value) > 1e-9:
            raise HRMError(f"engine {engine.name} runs {key}={value:g} (policy has {getattr(policy, key):g})")
    notes = []
    snapped = snap_weights_ratio(model, engine, policy.weights_gpu_ratio)
    if snapped != policy.weights_gpu_ratio:
        notes.append(f"rw={policy.weights_gpu_ratio:.4g} snapped to {snapped:.4g}: engine {engine.name} keeps "
                     f"{static_experts_in_words(model, engine, snapped)} on the GPU")
        policy = policy.model_copy(update={"weights_gpu_ratio": snapped})
    return policy, notes


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
    ``ideal``; ``schedule`` is ideal's lane structure, default cgopipe). Raises HRMError if
    the engine cannot run the placement; r_w is snapped to the engine's granularity (noted)."""
    from dataclasses import replace

    from .schedules import pipeline_function

    check_context_window(model, workload)
    engine = resolve_engine(engine, schedule)
    policy, notes = realised_policy(model, engine, policy)
    options = options.for_model(model)
    limits = limits or memory_limits(hw, options)
    result = pipeline_function(engine.schedule, 0)(hw, model, workload, policy, options, limits, engine)
    return replace(result, notes=(*notes, *result.notes))


def estimate_lanes(hw: HardwareProfile, model: ModelSpec, workload: Workload, policy: Policy, options: ModelOptions,
                   limits: MemoryLimits, engine: Engine) -> EstimateResult:
    """:func:`estimate` of a policy the engine runs (realised), for the lanes pipeline: each
    layer the max of its lanes (eq. 12), summed over the decode steps."""
    rates = rates_from_profile(hw, options)
    steps, prefill, resource_layer, lane_layer = step_times_s(model, rates, workload, policy, engine)
    decode = float(np.sum(steps))
    n_steps = len(steps)
    big, gen = policy.batch_size, workload.gen_len
    total = prefill + decode
    # mean per-layer decode latency: the layer part of the steps, per layer
    layers_only = decode - n_steps * float(policy.num_micro_batches * latency.lm_head_time_s(model, rates, policy.micro_batch_size))
    decode_layer = layers_only / (n_steps * model.num_layers) if n_steps else 0.0
    args = (model, workload, policy.micro_batch_size, policy.attn_on_gpu, policy.ffn_on_gpu, engine)
    gpu_form, cpu_form = gpu_memory_form(*args), cpu_memory_form(*args)
    gpu_peak = float(gpu_form.bytes(big, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
    cpu_peak = float(cpu_form.bytes(big, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
    if limits.shared:
        binding = f"host memory {100 * (gpu_peak + cpu_peak) / limits.cpu_bytes:.0f}% (device tier shares it)"
    else:
        g, c = gpu_peak / limits.gpu_bytes, cpu_peak / limits.cpu_bytes
        binding = f"GPU memory {100 * g:.0f}%" if g >= c else f"CPU memory {100 * c:.0f}%"
    bottleneck_lane = max(lane_layer, key=lane_layer.get)
    if bottleneck_lane in ("all", "chain") and resource_layer:
        # name the resource that dominates inside the combined lane
        top = max(resource_layer, key=resource_layer.get)
        bottleneck = f"{lane_label(bottleneck_lane)} (largest: {lane_label(top)})"
    else:
        bottleneck = lane_label(bottleneck_lane)
    return EstimateResult(
        policy=policy,
        schedule=engine.schedule,
        decode_layer_latency_s=decode_layer,
        prefill_latency_s=prefill,
        decode_time_s=decode,
        total_time_s=total,
        decode_throughput_tok_s=big * n_steps / decode if decode else 0.0,
        generation_throughput_tok_s=big * gen / total,
        per_token_latency_s=decode / n_steps if n_steps else prefill,
        gpu_peak_bytes=gpu_peak,
        cpu_peak_bytes=cpu_peak,
        gpu_limit_bytes=limits.gpu_bytes,
        cpu_limit_bytes=limits.cpu_bytes,
        shared_memory=limits.shared,
        bottleneck=bottleneck,
        binding_memory=binding,
        resource_layer_s=resource_layer,
        lane_layer_s=lane_layer,
        memory_components={"gpu": gpu_form.components, "cpu": cpu_form.components},
        engine=engine.name,
        defaulted=used_defaults(engine, rates),
    )


def used_defaults(engine: Engine, rates: Rates) -> tuple[str, ...]:
    """Achieved-rate fields the profile lacks that this engine's mechanisms read (the ideal
    engine reads none: it runs at the profile's peaks)."""
    if engine.name == "ideal" or rates.achieved is None:
        return ()
    return rates.achieved.defaulted
