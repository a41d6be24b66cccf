"""Dispatch overhead: the fixed cost of one task and of one operator call (the α of the
α-β cost model, ``hrm.machine.hardware.Dispatch``), measured on the software that executes plans.

The reference runtime (:mod:`runtime.executor`) runs a *probe model* — a Mixtral layer at
minimal size (hidden 16, one token per micro-batch, every token routed to every expert) —
so a task's time is all dispatch and no work. Each α is the median duration of the tasks
that contain the operator, and differences of such medians:

- ``pre_attn_s`` = PreAttn; ``attention_s`` = CPU attention; ``head_s`` = Head;
  ``copy_s`` = LoadH (one tier-to-tier copy);
- ``expert_s`` = (PostAttn with 8 experts − PostAttn with 2 experts) / 6 (the expert loop
  runs once per distinct expert touched);
- ``post_attn_s`` = PostAttn with the experts on the CPU (no expert loop inside);
  ``experts_call_s`` = PostAttn with 2 experts − ``post_attn_s`` − 2 × ``expert_s``;
- ``device_attention_s`` = the fused device-attention Layer task (KV on the host) − PreAttn
  − PostAttn with 2 experts; ``kv_load_s`` / ``kv_store_s`` = LoadKV / StoreKV − 2 copies;
- ``task_s`` = the idle time between consecutive tasks of the probe runs when the lanes
  share one unit (one task at a time: what is left is the hand-off); with concurrent lanes
  (CUDA), the time per task of a dependency chain of empty tasks across the four lanes,
  less their own duration (launch, hand-off, completion).

On a CPU-only host the runtime's default lane mode (one unit, exclusive) is measured;
on a CUDA device the lanes are streams and the α include the launch latency and the
synchronisation that ends each task.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

PROBE_EXPERTS = (2, 8)  # top_k = num_experts: every token touches all of them
PROBE_STEPS = 12  # generated tokens per probe run (11 decode steps)
CHAIN_TASKS = 200  # empty tasks in the task-overhead chain
GAP = "(gap)"  # key of the hand-off samples between consecutive tasks of an exclusive run


@dataclass(frozen=True)
class DispatchResult:
    """α values (seconds) and a note per value on how it was obtained."""

    values: dict[str, float]
    notes: dict[str, str]


def probe_spec(experts: int):
    """A minimal Mixtral layer stack: all compute negligible next to dispatch."""
    from hrm.model.spec import ModelSpec

    return ModelSpec(name=f"dispatch-probe-{experts}", hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                     head_dim=8, vocab_size=32, num_experts=experts, top_k=experts, expert_intermediate_size=16,
                     weight_dtype="fp32", kv_dtype="fp32", activation_dtype="fp32")


def task_durations_s(configs: list[tuple[int, bool, bool]], device: str, repeats: int) -> list[dict[str, list[float]]]:
    """Durations of every decode task of the probe model, by task kind (first word of the
    task name), for each (experts, attn_on_gpu, ffn_on_gpu) config: one warm-up run, then
    ``repeats`` rounds that run every config in turn (so that a passing load on the host
    affects them alike)."""
    from contextlib import ExitStack

    from hrm.policy import Policy
    from hrm.workload import make_workload
    from runtime.executor import PlanExecutor
    from runtime.model import build_weights
    from runtime.requests import synthetic_requests

    workload = make_workload(None, prompt_len=4, max_prompt_len=4, gen_len=PROBE_STEPS)
    out: list[dict[str, list[float]]] = [{} for _ in configs]
    with ExitStack() as stack:
        runs = []
        for experts, attn, ffn in configs:
            spec = probe_spec(experts)
            policy = Policy(batch_size=2, micro_batch_size=1, num_micro_batches=2, weights_gpu_ratio=0.0,
                            attn_on_gpu=attn, ffn_on_gpu=ffn, kv_gpu_ratio=0.0)
            ex = stack.enter_context(PlanExecutor(spec, build_weights(spec, None, 0), policy, workload, device=device,
                                                  track_memory=False, keep_logits=False))
            requests = synthetic_requests(workload, policy.batch_size, spec.vocab_size, 0)
            ex.run(requests)
            runs.append((ex, requests))
        for _ in range(max(1, repeats)):
            for (ex, requests), samples in zip(runs, out):
                ex.tier.tracer.clear()
                decode = sorted((rec for rec in ex.run(requests).records if rec.args.get("phase") == "decode"),
                                key=lambda rec: rec.start_s)
                for rec in decode:
                    samples.setdefault(rec.name.split()[0], []).append(rec.duration_s)
                if ex.tier.lane_mode == "exclusive":  # one task at a time: the idle time between is the hand-off
                    samples.setdefault(GAP, []).extend(b.start_s - a.end_s for a, b in zip(decode, decode[1:]))
    return out


def task_overhead_s(device: str, tasks: int = CHAIN_TASKS) -> tuple[float, float]:
    """(α per task, median own duration) of a chain of empty tasks, each depending on the
    previous one, cycling over the four lanes."""
    from runtime.device import LANES, DeviceTier

    with DeviceTier(device, track_memory=False) as tier:
        tier.hold()
        chain, prev = [], None
        for k in range(tasks):
            prev = tier.submit(LANES[k % len(LANES)], f"empty {k}", lambda: None, [prev])
            chain.append(prev)
        start = tier.release()
        end = tier.wait(chain)
    own = statistics.median(t.end_s - t.start_s for t in chain)
    return max((end - start) / tasks - own, 0.0), own


def _median(samples: dict[str, list[float]], kind: str) -> float:
    if not samples.get(kind):
        raise ValueError(f"dispatch probe: no {kind} task was recorded")
    return statistics.median(samples[kind])


def _spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"median of {len(values)} tasks, spread {100 * (max(values) - min(values)) / max(med, 1e-12):.0f}%"


def measure_dispatch(device: str = "cpu", repeats: int = 3) -> DispatchResult:
    """Every α of :class:`hrm.machine.hardware.Dispatch` on ``device`` ('cpu' = emulated tier)."""
    start = time.perf_counter()
    k0, k1 = PROBE_EXPERTS
    small, large, cpu_ffn, dev_attn = task_durations_s(
        [(k0, False, True), (k1, False, True), (k0, False, False), (k0, True, True)], device, repeats)
    expert = max((_median(large, "PostAttn") - _median(small, "PostAttn")) / (k1 - k0), 0.0)
    post = _median(cpu_ffn, "PostAttn")
    call = max(_median(small, "PostAttn") - post - k0 * expert, 0.0)
    if small.get(GAP):
        task = statistics.median(small[GAP])
        task_note = (f"idle time between consecutive tasks of the probe runs (one task at a time), "
                     f"{_spread(small[GAP])}")
    else:
        task, own = task_overhead_s(device)
        task_note = (f"chain of {CHAIN_TASKS} empty tasks over the 4 lanes, wall time per task less the task's "
                     f"own duration ({own * 1e6:.1f} us)")
    values = {
        "task_s": task, "pre_attn_s": _median(small, "PreAttn"), "attention_s": _median(small, "CPUAttn"),
        "post_attn_s": post, "experts_call_s": call, "expert_s": expert, "head_s": _median(small, "Head"),
        "copy_s": _median(small, "LoadH"),
    }
    values["device_attention_s"] = max(_median(dev_attn, "Layer") - values["pre_attn_s"] - _median(small, "PostAttn"),
                                       0.0)
    values["kv_load_s"] = max(_median(dev_attn, "LoadKV") - 2 * values["copy_s"], 0.0)
    values["kv_store_s"] = max(_median(dev_attn, "StoreKV") - 2 * values["copy_s"], 0.0)
    where = f"reference runtime on {device}, probe Mixtral layer (hidden 16, 1 token per micro-batch)"
    notes = {
        "task_s": f"{where}: {task_note}",
        "pre_attn_s": f"{where}: PreAttn task, {_spread(small['PreAttn'])}",
        "attention_s": f"{where}: CPU attention task, {_spread(small['CPUAttn'])}",
        "post_attn_s": f"{where}: PostAttn task with experts on the CPU (no expert loop), {_spread(cpu_ffn['PostAttn'])}",
        "expert_s": f"{where}: (PostAttn with {k1} experts - with {k0}) / {k1 - k0}, medians",
        "experts_call_s": f"{where}: PostAttn with {k0} experts - post_attn_s - {k0} x expert_s",
        "head_s": f"{where}: Head task (final norm, lm_head, argmax, next embedding), {_spread(small['Head'])}",
        "copy_s": f"{where}: LoadH task (one copy between the tiers), {_spread(small['LoadH'])}",
        "device_attention_s": f"{where}, attention on the device, KV on the host: Layer task ({_spread(dev_attn['Layer'])}) "
                              f"- pre_attn_s - PostAttn with {k0} experts (medians)",
        "kv_load_s": f"{where}, attention on the device: LoadKV task ({_spread(dev_attn['LoadKV'])}) - 2 x copy_s",
        "kv_store_s": f"{where}, attention on the device: StoreKV task ({_spread(dev_attn['StoreKV'])}) - 2 x copy_s",
    }
    notes = {k: v + f"; {time.perf_counter() - start:.1f} s for all" if k == "task_s" else v for k, v in notes.items()}
    return DispatchResult(values, notes)
