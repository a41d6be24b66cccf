"""Sweeps of the policy search over hardware what-ifs, as tables the plots draw.

- :func:`policy_map`: the best policy on a grid of CPU→GPU bandwidth × CPU scaling ratio
  (MoE-Lightning §6.3, Fig. 10: Mixtral-8x7B on 2×A100-80G, prompt 512, gen 32);
- :func:`cpu_memory_sweep`: the best throughput of each schedule as CPU memory grows
  (the paper's Fig. 1).

Every cell is one :func:`solver.search.search` call, so a cell equals what ``hrm-search``
prints for that machine (``--cpu-mem`` for the memory sweep).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import pandas as pd

from hrm.errors import HRMError, InfeasibleError
from hrm.hardware import HardwareProfile
from hrm.memory import memory_limits
from hrm.model import ModelSpec
from hrm.options import DEFAULT_OPTIONS, ModelOptions
from hrm.whatif import with_cpu_scaled, with_link_bandwidth
from hrm.workload import Workload

from .search import search

COLUMNS = ["feasible", "batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
           "weights_gpu_ratio", "kv_gpu_ratio", "weights_offloaded", "kv_offloaded",
           "generation_throughput_tok_s", "decode_throughput_tok_s", "bottleneck", "reason"]


def _cell(run: Callable[[], object]) -> dict:
    """One search as a table row; an infeasible cell keeps its reason."""
    try:
        result = run()
    except InfeasibleError as exc:
        return {"feasible": False, "reason": str(exc), "generation_throughput_tok_s": math.nan,
                "decode_throughput_tok_s": math.nan}
    p, e = result.best.policy, result.best.estimate
    return {
        "feasible": True, "batch_size": p.batch_size, "micro_batch_size": p.micro_batch_size,
        "num_micro_batches": p.num_micro_batches, "attn_on_gpu": p.attn_on_gpu, "ffn_on_gpu": p.ffn_on_gpu,
        "weights_gpu_ratio": p.weights_gpu_ratio, "kv_gpu_ratio": p.kv_gpu_ratio,
        "weights_offloaded": 1.0 - p.weights_gpu_ratio, "kv_offloaded": 1.0 - p.kv_gpu_ratio,
        "generation_throughput_tok_s": e.generation_throughput_tok_s,
        "decode_throughput_tok_s": e.decode_throughput_tok_s, "bottleneck": e.bottleneck, "reason": "",
    }


def policy_map(hw: HardwareProfile, model: ModelSpec, workload: Workload, h2d_gbps: Iterable[float],
               cpu_scales: Iterable[float], schedule: str | None = None, objective: str = "generation",
               options: ModelOptions = DEFAULT_OPTIONS, solver: str = "auto", progress=None,
               engine=None) -> pd.DataFrame:
    """Best policy per (link bandwidth, CPU scaling ratio) cell; one row per cell."""
    if hw.gpu is None:
        raise HRMError(f"{hw.name}: a policy map varies the CPU→GPU link; this profile has no GPU")
    rows = []
    cells = [(b, s) for s in cpu_scales for b in h2d_gbps]
    for bandwidth, scale in cells:
        machine = with_link_bandwidth(with_cpu_scaled(hw, scale), bandwidth)
        row = _cell(lambda: search(machine, model, workload, schedule=schedule, objective=objective,
                                   options=options, top=0, solver=solver, engine=engine))
        rows.append({"h2d_gbps": float(bandwidth), "cpu_scale": float(scale), **row})
        if progress:
            progress(len(rows), len(cells))
    return pd.DataFrame(rows).reindex(columns=["h2d_gbps", "cpu_scale", *COLUMNS])


def cpu_memory_sweep(hw: HardwareProfile, model: ModelSpec, workload: Workload, cpu_mem_gib: Iterable[float],
                     schedules: Iterable[str] = ("cgopipe", "flexgen", "flexgen-cpu-attn", "sequential"),
                     objective: str = "generation", options: ModelOptions = DEFAULT_OPTIONS,
                     solver: str = "auto", progress=None) -> pd.DataFrame:
    """Best policy of each schedule (a schedule of engine ideal, or an engine name) for each
    CPU memory capacity (GiB, before the utilisation headroom, as ``hrm-search --cpu-mem``)."""
    from hrm.schedules import SCHEDULES

    rows = []
    cells = [(s, c) for s in schedules for c in cpu_mem_gib]
    for schedule, capacity in cells:
        limits = memory_limits(hw, options, cpu_mem_gib=capacity)
        run = {"schedule": schedule} if schedule in SCHEDULES else {"engine": schedule}
        row = _cell(lambda: search(hw, model, workload, objective=objective, options=options,
                                   limits=limits, top=0, solver=solver, **run))
        rows.append({"schedule": schedule, "cpu_mem_gib": float(capacity), **row})
        if progress:
            progress(len(rows), len(cells))
    return pd.DataFrame(rows).reindex(columns=["schedule", "cpu_mem_gib", *COLUMNS])
