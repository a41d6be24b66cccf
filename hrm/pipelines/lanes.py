"""The lanes pipeline (CGOPipe, FlexGen, DeepSpeed, llama.cpp, MoE-Infinity and Fiddler
schedules): each layer's resources combine into concurrently running affine lanes and the
layer takes the max over them (MoE-Lightning eq. 12, :mod:`hrm.cost.latency`); decode steps are
summed over the growing context, prefill is one pass. Memory is the affine forms of
:mod:`hrm.cost.memory`; the timeline is :func:`hrm.pipelines.lanes_timeline.lanes_timeline`. It models every
engine field. Its search is the exact branch and bound of :mod:`solver.lanes.exact`."""

from __future__ import annotations

import numpy as np

from ..cost.latency import lanes as cost_lanes
from ..cost.latency.decode import decode_resources
from ..cost.latency.lane import lanes_time_s
from ..cost.latency.lanes import layer_kinds, schedule_lanes, step_sync_s
from ..cost.latency.ops import lm_head_time_s
from ..cost.latency.prefill import prefill_resources
from ..cost.memory import (cpu_memory_form, disk_spill_allowed, disk_spill_bytes, gpu_memory_form, host_floor_form,
    spillable_weights_form)
from ..policy import Policy
from ..problem import Problem
from ..engines.schedules import PIPELINE_FIELDS
from .lanes_timeline import lanes_timeline
from ..workload import decode_contexts
from .base import MemoryUse, PhaseTimes, Pipeline, PipelineFunctions, lane_label


def disk_lanes(problem: Problem, micro_batch, attn_on_gpu, ffn_on_gpu, resources: dict) -> list:
    """The ``disk`` lanes of a layer (:func:`hrm.cost.latency.lanes.disk_lanes`) of the mode (μ, A_g,
    F_g) — arrays broadcast — when weights may spill (:func:`hrm.cost.memory.disk_spill_allowed`);
    [] otherwise. The search's terms and the estimate both take them from here."""
    if not disk_spill_allowed(problem.engine, problem.rates.disk_read_bytes_s, problem.limits):
        return []
    form = cpu_memory_form(problem.model, problem.workload, micro_batch, attn_on_gpu, ffn_on_gpu, problem.engine)
    spill = cost_lanes.disk_spill_lane(form, problem.limits.cpu_bytes, micro_batch)
    return cost_lanes.disk_lanes(spill, problem.model.num_layers, problem.rates, problem.engine, resources)


def step_times_s(problem: Problem, policy: Policy):
    """Per-step decode times (array over steps), the prefill time, and per-layer busy seconds
    of each resource and lane (summed over steps and layers), the disk lanes of the
    problem's spill included (:func:`disk_lanes`)."""
    model, rates, workload, engine = problem.model, problem.rates, problem.workload, problem.engine
    mu, n = policy.micro_batch_size, policy.num_micro_batches
    rw, rc = policy.weights_gpu_ratio, policy.kv_gpu_ratio
    contexts = decode_contexts(workload.effective_prompt_len, workload.gen_len)
    head = n * lm_head_time_s(model, rates, mu, engine)
    steps = np.full(contexts.shape, float(head))
    prefill = float(head)
    resource_sum: dict[str, float] = {}
    lane_sum: dict[str, float] = {}
    for moe, count in layer_kinds(model):
        resources = decode_resources(model, rates, mu, contexts, policy.attn_on_gpu, policy.ffn_on_gpu, moe,
                                             engine)
        lanes = schedule_lanes(resources, engine, rates.shared_unit)
        disk = disk_lanes(problem, mu, policy.attn_on_gpu, policy.ffn_on_gpu, resources)
        if disk and float(np.max(disk[0].time_s(n, rw, rc))) <= 0:
            disk = []  # nothing spills: the disk lanes are below the others (E < 0) and reported as absent
        lanes = lanes + disk
        steps = steps + count * lanes_time_s(lanes, n, rw, rc)
        if moe:
            steps = steps + step_sync_s(resources, engine)
        def busy_s(lane):  # over the decode steps (a lane without a step axis, disk, broadcasts)
            return count * float(np.sum(np.broadcast_to(lane.time_s(n, rw, rc), contexts.shape)))

        for name, lane in [*resources.items(), *((lane.name, lane) for lane in disk if lane.name == "disk")]:
            resource_sum[name] = resource_sum.get(name, 0.0) + busy_s(lane)
        for lane in lanes:
            lane_sum[lane.name] = lane_sum.get(lane.name, 0.0) + busy_s(lane)
        pre = prefill_resources(model, rates, mu, workload.effective_prompt_len, moe, engine, workload.gen_len)
        pre_disk = disk_lanes(problem, mu, policy.attn_on_gpu, policy.ffn_on_gpu, pre)
        prefill += count * float(lanes_time_s(
            schedule_lanes(pre, engine, rates.shared_unit, "prefill") + pre_disk, n, rw, rc))
    per_layer = max(len(contexts), 1) * model.num_layers
    resource_layer = {k: v / per_layer for k, v in resource_sum.items()}
    lane_layer = {k: v / per_layer for k, v in lane_sum.items()}
    return steps, prefill, resource_layer, lane_layer


def bottleneck(resource_layer: dict[str, float], lane_layer: dict[str, float]) -> str:
    """The busiest lane in words; inside a combined lane (one unit, the serial chain) the
    resource that dominates it."""
    lane = max(lane_layer, key=lane_layer.get)
    if lane in ("all", "chain") and resource_layer:
        top = max(resource_layer, key=resource_layer.get)
        return f"{lane_label(lane)} (largest: {lane_label(top)})"
    return lane_label(lane)


def lanes_times(problem: Problem, policy: Policy) -> PhaseTimes:
    """Each layer the max of its lanes (eq. 12), summed over the decode steps."""
    model, rates = problem.model, problem.rates
    steps, prefill, resource_layer, lane_layer = step_times_s(problem, policy)
    decode = float(np.sum(steps))
    n_steps = len(steps)
    # mean per-layer decode latency: the layer part of the steps, per layer
    head = float(policy.num_micro_batches * lm_head_time_s(model, rates, policy.micro_batch_size, problem.engine))
    layers_only = decode - n_steps * head
    return PhaseTimes(
        prefill_s=prefill, decode_s=decode, decode_steps=n_steps,
        per_token_s=decode / n_steps if n_steps else prefill,
        decode_layer_s=layers_only / (n_steps * model.num_layers) if n_steps else 0.0,
        resource_layer_s=resource_layer, lane_layer_s=lane_layer, bottleneck=bottleneck(resource_layer, lane_layer))


def lanes_memory(problem: Problem, policy: Policy) -> MemoryUse:
    """The affine memory forms of :mod:`hrm.cost.memory` at the policy; where weights may spill
    (:func:`hrm.cost.memory.disk_spill_allowed`), the minimal spill on disk
    (:func:`hrm.cost.memory.disk_spill_bytes`) and the host tier less it."""
    args = (problem.model, problem.workload, policy.micro_batch_size, policy.attn_on_gpu, policy.ffn_on_gpu,
            problem.engine)
    gpu_form, cpu_form = gpu_memory_form(*args), cpu_memory_form(*args)
    point = (policy.batch_size, policy.weights_gpu_ratio, policy.kv_gpu_ratio)
    cpu_bytes = float(cpu_form.bytes(*point))
    components = {"gpu": gpu_form.components, "cpu": cpu_form.components}
    disk = 0.0
    if disk_spill_allowed(problem.engine, problem.rates.disk_read_bytes_s, problem.limits):
        spillable_form = spillable_weights_form(problem.model, problem.engine)
        spillable = float(spillable_form.bytes(*point))
        disk = float(disk_spill_bytes(cpu_bytes, spillable, problem.limits.cpu_bytes))
        components["disk"] = {"spilled_weights": disk, "spillable_weights": spillable,
                              "host_floor": float(host_floor_form(cpu_form, spillable_form).bytes(*point))}
    return MemoryUse(float(gpu_form.bytes(*point)), cpu_bytes - disk, components, disk)


#: the lanes pipeline (:class:`hrm.pipelines.base.Pipeline`)
LANES: Pipeline = PipelineFunctions(
    "lanes", "the max of affine lanes per layer (eq. 12), searched exactly by solver.lanes.exact",
    PIPELINE_FIELDS["lanes"], lanes_times, lanes_memory, lanes_timeline)
