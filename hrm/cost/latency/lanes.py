"""A schedule's lanes (paper eq. 12): how a layer's resources combine into concurrently
running lanes under a schedule's structure (:mod:`hrm.engines.schedules`), the lanes an
engine's syncs add (per micro-batch, per decode step), the lanes of weights spilled to disk,
and the model's layer kinds each set of lanes is built for.
"""

from __future__ import annotations

import numpy as np

from ...engines.engine import IDEAL, Engine
from ...engines.schedules import get_schedule
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from .lane import RESOURCES, Lane, expanded_lanes, scaled_lane, sum_lanes
from .transfers import dram_bytes_s


def schedule_lanes(resources: dict[str, Lane], schedule: str | Engine, shared_unit: bool,
                   phase: str = "decode") -> list[Lane]:
    """Combine resources into concurrently running lanes for ``schedule``
    (:mod:`hrm.engines.schedules`):

    - ``overlap``: every resource is its own lane (eq. 12: T = max(comm, T_cpu, T_gpu));
    - ``chain`` (decode): per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn
      run back to back; only the weight transfer overlaps them (the H2D lane, and the CPU
      side of a pageable weight path); prefill runs on the GPU alone: ``overlap``;
    - ``serial``, or any schedule on a CPU-only host (one unit, one bus): one lane, the sum.

    Capacity bounds (the staging-copy team, host DRAM, prefill's weight-load chain) stay
    lanes of their own under every structure: they limit, they do not queue."""
    engine = schedule if isinstance(schedule, Engine) else IDEAL
    lanes = get_schedule(engine.schedule if isinstance(schedule, Engine) else schedule).lanes
    if lanes not in ("overlap", "chain", "serial"):
        # an expert-level schedule (Klotski) has no lanes: its layer time is a scheduled period
        raise ValueError(f"schedule {engine.schedule if isinstance(schedule, Engine) else schedule} has no lanes "
                         f"(its layer time comes from hrm.pipelines.expert_level_tasks)")
    tasks = {r: lane for r, lane in resources.items() if r in RESOURCES}
    bounds = [lane for r, lane in resources.items() if r not in RESOURCES]
    if lanes == "serial" or shared_unit:
        return expanded_lanes([sum_lanes("all", tasks.values()), *bounds])
    if lanes == "chain" and phase == "decode" and "cpu" in tasks:
        h2d, cpu = tasks["h2d"], tasks["cpu"]
        chain = sum_lanes("chain", [tasks["gpu"], Lane("cpu", cpu.per_micro_batch_s, cpu.per_micro_batch_kv_cpu_s),
                                    tasks["d2h"], Lane("h2d", h2d.per_micro_batch_s, h2d.per_micro_batch_kv_cpu_s)])
        staged = [Lane("cpu", 0.0, 0.0, cpu.per_layer_offloaded_weights_s)] \
            if np.any(np.asarray(cpu.per_layer_offloaded_weights_s) != 0) else []
        combined = [chain, h2d, *staged]
    else:
        combined = list(tasks.values())
    if engine.sync == "per-micro-batch" and phase == "decode" and "h2d" in tasks:
        # a slot's host issue and its GPU work, serialised by the slot's sync (host_gpu_lane)
        serial = [lane for lane in bounds if lane.name == "host+gpu"]
        bounds = [lane for lane in bounds if lane.name != "host+gpu"]
        combined += serial
        combined += micro_batch_sync_lanes(combined, tasks["h2d"].per_layer_offloaded_weights_s)
    return expanded_lanes([*combined, *bounds])


def micro_batch_sync_lanes(lanes: list[Lane], weights_s) -> list[Lane]:
    """An engine that syncs after every (layer, micro-batch) slot issues the next layer's
    weight load in the first slot (FlexGen: ``load_weight`` copies when k == 0), so the load
    overlaps one micro-batch's tasks only: the layer takes at least, for every lane ℓ,
    (n − 1)·(ℓ's work per micro-batch) + the load. Affine: n·a + n(1−r_c)·b + (1−r_w)·W − a
    (one micro-batch's KV part is kept in, a slight over-count that keeps the form affine)."""
    return [Lane(f"{lane.name}+weights", lane.per_micro_batch_s, lane.per_micro_batch_kv_cpu_s, weights_s,
                 -np.asarray(lane.per_micro_batch_s)) for lane in lanes
            if not np.any(np.asarray(lane.per_layer_offloaded_weights_s) != 0)]


def step_sync_s(resources: dict[str, Lane], engine: Engine = IDEAL):
    """Per decode step, an engine that ends every step with host syncs (``sync: per-step``)
    drains its pipeline: the next step starts empty and waits one micro-batch's chain of
    tasks (the sum of its per-micro-batch task times) before the lanes overlap again."""
    if engine.sync != "per-step" or get_schedule(engine.schedule).lanes == "serial":
        return 0.0  # a serial schedule overlaps nothing, so a drained pipeline loses nothing
    return sum(resources[r].per_micro_batch_s for r in RESOURCES if r in resources)


def disk_spill_lane(cpu_form, cpu_limit_bytes, micro_batch) -> Lane:
    """The spill E = host need − usable host bytes (:func:`hrm.cost.memory.disk_spill_bytes`
    before its max with 0) as a :class:`Lane` in *bytes*: the host form
    c + s·N + w·r_w + k·(r_c·N) (:class:`hrm.cost.memory.MemoryForm`) with N = μ·n, r_c·N =
    μ·n − μ·n·(1 − r_c) and r_w = 1 − (1 − r_w) is
    n·μ(s + k) − n(1 − r_c)·μk − (1 − r_w)·w + (c + w − limit)."""
    mu = np.asarray(micro_batch, dtype=float)
    s, k, w = cpu_form.per_sequence, cpu_form.per_gpu_kv_sequence, cpu_form.per_weights_ratio
    return Lane("spill", mu * (s + k), -mu * k, -w + 0 * mu, cpu_form.const + w - cpu_limit_bytes + 0 * mu)


def disk_lanes(spill: Lane, num_layers: int, rates: Rates, engine: Engine, resources: dict[str, Lane]) -> list[Lane]:
    """Lanes of the weights beyond host memory (``memory.disk_weights``): each pass of a
    layer reads its share E / L of the spill from disk (the ``disk`` lane, E / (L · disk read
    rate)), concurrent with the rest of the layer (the read of layer i + 1 overlaps layer
    i, as the host-to-GPU copy does). Under ``host_dram`` the read also writes E / L bytes
    into host DRAM (``dram+disk``: the DRAM lane plus that write; its later DMA read is the
    weight path's). Both are affine (``spill`` from :func:`disk_spill_lane`); their max with
    the lanes without disk is the max with E = 0, so the spill's own max with 0 is free."""
    per_layer = 1.0 / num_layers
    lanes = [scaled_lane(spill, per_layer / rates.disk_read_bytes_s, "disk")]
    if engine.host_dram and "dram" in resources:
        written = scaled_lane(spill, per_layer / dram_bytes_s(rates), "")
        lanes.append(sum_lanes("dram+disk", [resources["dram"], written]))
    return lanes


def layer_kinds(model: ModelSpec) -> list[tuple[bool, int]]:
    """(is_moe, number of layers) for the model's layer kinds."""
    kinds = [(True, model.num_moe_layers)]
    if model.first_dense_layers:
        kinds.append((False, model.first_dense_layers))
    return kinds
