"""Search for Klotski (engine ``klotski``, schedule ``klotski``): the best (μ, n, r_w, r_c).

Klotski's layer time is the period of a list schedule (:mod:`hrm.pipelines.expert_level_tasks`), not an affine
lane sum, so the MILP of :mod:`solver.lanes.exact` does not apply. This is a branch and bound
over an enumeration instead:

- the space: every integer μ and n with N = n·μ ≤ ``--max-batch``, every whole number of
  MoE layers whose experts stay on the GPU (r_w = layers / L), and for each the largest KV
  share on the GPU that memory allows (r_c: more of the cache on the GPU only removes
  loads), subject to GPU and CPU memory (:func:`hrm.pipelines.expert_level.klotski_memory`; the
  host without the whole layers of experts that may go to disk,
  :func:`hrm.pipelines.expert_level.klotski_disk_bytes`) and the pins;
- a bound per candidate, vectorised over all of them: each layer takes at least the busy
  time of each of its resources (GPU, CPU→GPU, GPU→CPU) — the period of a schedule is never
  below its lane bound — from the very durations the scheduler gets
  (:func:`hrm.pipelines.expert_level_tasks.batch_durations`, :func:`hrm.pipelines.expert_level_tasks.batch_expert_s`), nor below the
  host-KV chain (:func:`_kv_chain_s`, docs/model.md §5 "Klotski's bound"), and a pass never
  below its heads plus its disk read;
- candidates are scheduled (:func:`hrm.pipelines.expert_level.klotski_times`) in order of their bound
  until the next bound cannot beat the best scheduled one: the result is the optimum of the
  scheduled model over the whole space. ``--verify`` schedules every candidate instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hrm.cost.latency.ops import lm_head_time_s
from hrm.errors import HRMError, InfeasibleError
from hrm.estimate import estimate
from hrm.pipelines.expert_level_tasks import (MAX_SCHEDULED_BATCHES, batch_durations, batch_expert_s, batch_kv_s, expert_load_s,
                         experts_used, task_dispatch_s)
from hrm.pipelines.expert_level import (expert_buffers, klotski_disk_bytes, klotski_disk_read_s, klotski_memory,
                                       klotski_own_batches, klotski_times)
from hrm.placement import make_placement
from hrm.policy import Policy
from hrm.progress import Progress
from hrm.machine.rates import rates_from_profile
from hrm.cost.throughput import decode_steps, throughput_tok_s
from hrm.units import GIB
from hrm.workload import mean_decode_context

from .request import Candidate, SearchResult, SearchStats, describe_limits, make_plan

#: --verify schedules every candidate; above this many it is refused (pin part of the policy)
VERIFY_MAX_CANDIDATES = 4000
#: seconds the branch and bound schedules candidates before it stops with the best so far
#: and the gap to the best bound left (many-expert models have weak lane bounds: thousands
#: of schedules of ~0.1 s each); issue 24's worst case for any search on the catalog.
#: Override: search(..., time_limit_s=...) / hrm-search --time-limit S
SEARCH_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class Candidates:
    """Feasible candidates (arrays) with their bounds: μ, n, N, resident MoE layers, r_c,
    and lower bounds of the decode step and the prefill (seconds)."""

    mu: np.ndarray
    n: np.ndarray
    batch_size: np.ndarray
    resident: np.ndarray
    kv_ratio: np.ndarray
    step_lb_s: np.ndarray
    prefill_lb_s: np.ndarray
    #: per pass, the read of the layers of experts kept on disk (docs/model.md §4.9; 0: none)
    disk_read_s: np.ndarray

    def __len__(self) -> int:
        return len(self.mu)

    def policy(self, i: int, layers: int) -> Policy:
        return Policy(batch_size=int(self.batch_size[i]), micro_batch_size=int(self.mu[i]),
                      num_micro_batches=int(self.n[i]), attn_on_gpu=True, ffn_on_gpu=True, weights_gpu_ratio=int(self.resident[i]) / layers,
                      kv_gpu_ratio=float(self.kv_ratio[i]))


def objective_value(kind: str, batch_size, gen_len: int, step_s, prefill_s):
    """The value maximised: generation or decode tok/s (:func:`hrm.cost.throughput.throughput_tok_s`
    of the prefill and gen−1 decode steps), or minus the per-token latency (−step, at a
    pinned N)."""
    if kind == "latency":
        return -step_s
    return throughput_tok_s(batch_size, gen_len, prefill_s, decode_steps(gen_len) * step_s, kind)


def _pairs(max_batch: int, fixed: dict) -> tuple[np.ndarray, np.ndarray]:
    """Every (μ, n) with n·μ ≤ max_batch that the pins allow."""
    mus = np.arange(1, max_batch + 1)
    if "micro_batch_size" in fixed:
        mus = mus[mus == fixed["micro_batch_size"]]
    mu = np.repeat(mus, max_batch // mus)
    n = np.concatenate([np.arange(1, max_batch // m + 1) for m in mus]) if len(mus) else np.zeros(0, int)
    keep = np.ones(len(mu), dtype=bool)
    if "num_micro_batches" in fixed:
        keep &= n == fixed["num_micro_batches"]
    if "batch_size" in fixed:
        keep &= mu * n == fixed["batch_size"]
    return mu[keep], n[keep]


def candidates(request, rates) -> Candidates:
    """Every feasible candidate with its bounds (module docstring)."""
    model, workload, engine, fixed, limits = (request.model, request.workload, request.engine, request.fixed,
                                              request.limits)
    layers = model.num_moe_layers
    mu, n = _pairs(request.max_batch, fixed)
    residents = range(layers + 1)
    if "weights_gpu_ratio" in fixed:
        residents = [int(round(fixed["weights_gpu_ratio"] * layers))]
    context, prompt = mean_decode_context(workload), workload.effective_prompt_len
    batch_size = mu * n
    rows: list[tuple] = []
    for resident in residents:
        memory = klotski_memory(model, workload, mu, batch_size, resident, engine=engine)
        # the most r_c the GPU holds (its bytes grow with r_c); the CPU must hold the rest
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(memory.gpu_per_kv_ratio > 0, (limits.gpu_bytes - memory.gpu_const) / memory.gpu_per_kv_ratio,
                          np.inf)
        ratio = np.full(len(mu), float(fixed["kv_gpu_ratio"])) if "kv_gpu_ratio" in fixed else np.clip(hi, 0.0, 1.0)
        # the host holds what is not on disk (whole layers of experts, klotski_disk_bytes)
        disk = klotski_disk_bytes(model, memory, ratio, engine, rates, limits)
        ok = ((memory.gpu_bytes(ratio) <= limits.gpu_bytes)
              & (memory.cpu_bytes(ratio) - disk <= limits.cpu_bytes * (1 + 1e-12)))
        if np.any(ok):
            rows.append((mu[ok], n[ok], batch_size[ok], np.full(int(ok.sum()), resident), ratio[ok],
                         np.broadcast_to(klotski_disk_read_s(disk, rates), mu.shape)[ok]))
    if not rows:
        return Candidates(*(np.zeros(0),) * 8)
    mu, n, batch_size, resident, ratio, disk_s = (np.concatenate(parts) for parts in zip(*rows))
    step, pre = _lower_bounds(model, rates, engine, mu=mu, n=n, batch_size=batch_size, resident=resident, ratio=ratio,
                              context=context, prompt=prompt, layers=layers)
    # a pass takes at least its heads and the disk read (klotski_times: the layers' max with it)
    mus, at_mu = np.unique(mu, return_inverse=True)
    head = n * lm_head_time_s(model, rates, mus, engine)[at_mu]
    return Candidates(mu, n, batch_size, resident, ratio, np.maximum(step, head + disk_s),
                      np.maximum(pre, head + disk_s), disk_s)


def _lower_bounds(model, rates, engine, *, mu, n, batch_size, resident, ratio, context, prompt, layers):
    """Per candidate: decode step and prefill at least n heads plus, per layer, its busiest
    resource's work (the durations of :func:`hrm.pipelines.expert_level_tasks.klotski_layer`, summed)."""
    call = task_dispatch_s(rates, engine)["expert"]
    # what depends on μ alone is evaluated once per distinct μ (millions of candidates, a
    # few thousand μ); the KV parts depend on r_c too
    mus, at_mu = np.unique(mu, return_inverse=True)
    head = n * lm_head_time_s(model, rates, mus, engine)[at_mu]
    out = []
    for prompt_len, per_token in ((None, 1), (prompt, prompt)):
        kv = batch_kv_s(model, rates, mu, context, engine, ratio, prompt_len)
        per_batch = {**{k: v[at_mu] for k, v in batch_durations(model, rates, mus, context, engine, 1.0, prompt_len)
                        .items() if k in ("attention_s", "gate_s")}, **kv}
        dense = {"attention_s": batch_durations(model, rates, mus, context, engine, 1.0, prompt_len,
                                                moe=False)["attention_s"][at_mu], **kv}
        groups, at_group = np.unique(batch_size * per_token, return_inverse=True)
        used = experts_used(model, groups)[at_group]
        batches, at_batch = np.unique(mu * per_token, return_inverse=True)
        cumulative = np.concatenate([np.zeros((len(batches), 1)),
                                     np.cumsum(batch_expert_s(model, rates, batches, engine=engine), axis=1)], axis=1)
        group_s = n * (cumulative[at_batch, used] + used * call)  # every used expert, every batch
        last_s = n * (cumulative[at_batch, used] - cumulative[at_batch, np.maximum(used - 1, 0)] + call)
        load = expert_load_s(model, rates, engine, prefill=prompt_len is not None)
        kv_in, kv_out = n * per_batch["kv_load_s"], n * per_batch["kv_store_s"]
        gpu = n * (per_batch["attention_s"] + per_batch["gate_s"]) + group_s
        # the forced idle holds for one expert buffer (the next layer's prefetch waits for this
        # layer's last expert); with more buffers the bound is each resource's work alone
        idle = _link_idle_s(model, per_batch, n, used, load, last_s) if expert_buffers(engine) == 1 else 0.0
        link = used * load + kv_in + idle
        chain = _kv_chain_s(model, per_batch, n, cumulative[at_batch, used] + used * call, load, engine)
        offloaded = np.maximum.reduce([gpu, link, kv_out, chain + model.top_k * load])
        kept = np.maximum.reduce([gpu, kv_in, kv_out, chain])
        dense_layer = np.maximum.reduce([n * dense["attention_s"], n * dense["kv_load_s"], n * dense["kv_store_s"]])
        out.append(head + (layers - resident) * offloaded + resident * kept + model.first_dense_layers * dense_layer)
    return out[0], out[1]


def _kv_chain_s(model, per_batch, n, expert_work_s, load, engine):
    """A chain every decode layer's period contains when its KV cache is loaded from the host
    (docs/model.md §5, "Klotski's bound"), less the hot loads (``model.top_k * load``, 0 for a
    layer whose experts stay on the GPU); 0 where it does not apply. In the scheduled graph
    (:func:`hrm.pipelines.expert_level_tasks.klotski_layer_tasks`, one expert buffer) layer i's gate weights and
    hot experts wait for layer i−1's last expert (end E_{i−1}), and the link, in order, then
    loads the KV of batches 1..n−1; the GPU, in order, runs the last batch's attention after
    its KV, then every gate and every expert call. So E_i − E_{i−1} ≥ K·t_load + (n−f)·t_KV
    + f·t_A + n·(t_G + Σ experts' calls), f = max(1, n/64) the scheduler's chunk of batches.
    The period is the spacing of the layers' last ends; E_i is that end when the KV stores
    (the only tasks after it) cannot outlast the work after the last attention: t_store ≤
    t_G + Σ calls per batch (then each layer's stores end by its E_i, by induction)."""
    if expert_buffers(engine) != 1:  # a later layer's loads wait for an older one: no such chain
        return np.zeros(np.shape(n))
    f = np.maximum(1.0, n / MAX_SCHEDULED_BATCHES)
    attention, gate, kv, store = (per_batch[k] for k in ("attention_s", "gate_s", "kv_load_s", "kv_store_s"))
    applies = (kv > 0) & (n >= 2) & (store <= gate + expert_work_s)
    return np.where(applies, (n - f) * kv + f * attention + n * (gate + expert_work_s), 0.0)


def _link_idle_s(model, per_batch, n, used, load, last_expert_s):
    """Time the CPU→GPU link must idle in every offloaded layer of the scheduled pipeline
    (:func:`hrm.pipelines.expert_level_tasks.klotski_layer_tasks`; in chunks of f = max(1, n/64) batches), when
    the layer has cold experts. The link takes its loads in order:

    - before the first cold load: it waits for the first gate, which follows the last
      attention on the GPU. With a host KV cache and n ≥ 2 the last batch's KV load precedes
      it in the queue, so the link idles ≥ f·(t_A + t_G); with n = 1, the hot loads follow
      the only KV load: ≥ t_A + t_G − K·t_E; without a host cache, the gate weights and hot
      loads (which start when the previous layer's experts are done) precede it, so it
      idles ≥ n·t_A + f·t_G − K·t_E;
    - after the last cold load: the next layer's hot loads wait for this layer's last
      expert, and only the first batch's KV load can run meanwhile: ≥ t_last − t_KV."""
    f = np.maximum(1.0, n / MAX_SCHEDULED_BATCHES)
    attention, gate, kv = per_batch["attention_s"], per_batch["gate_s"], per_batch["kv_load_s"]
    before = np.where((kv > 0) & (n > 1), f * (attention + gate), n * attention + f * gate - model.top_k * load)
    after = last_expert_s - f * kv
    return np.where(used > model.top_k, np.maximum(before, 0.0) + np.maximum(after, 0.0), 0.0)


@dataclass(frozen=True)
class Found:
    index: int | None
    value: float
    scheduled: int
    #: the best bound of the candidates not scheduled when the time limit (or Ctrl-C) stopped
    #: the search (None: it ran to the end, the result is the optimum)
    open_bound: float | None = None
    #: Ctrl-C stopped it (rather than the time limit)
    interrupted: bool = False


def branch_and_bound(request, rates, cands: Candidates, everything: bool = False,
                     deadline: float | None = None) -> Found:
    """Schedule candidates in order of their bound until none left can beat the best (all
    of them with ``everything``), honouring the latency limits. Past ``deadline`` (a
    ``time.perf_counter()``) or on Ctrl-C, once a feasible one was scheduled, it stops and
    returns the best bound still open; Ctrl-C before that is re-raised. Progress on standard
    error (:class:`hrm.progress.Progress`)."""
    kind, gen = request.solve_for if request.objective != "latency" else "latency", request.workload.gen_len
    bound = objective_value(kind, cands.batch_size, gen, cands.step_lb_s, cands.prefill_lb_s)
    limits = request.latency_limits
    alive = np.ones(len(cands), dtype=bool)
    if limits.tpot_s is not None:
        alive &= cands.step_lb_s <= limits.tpot_s * (1 + 1e-9)
    if limits.ttft_s is not None:
        alive &= cands.prefill_lb_s <= limits.ttft_s * (1 + 1e-9)
    order = np.argsort(-bound, kind="stable")
    order = order[alive[order]]  # an array, not a list: millions of candidates, few scheduled
    best, best_value, scheduled = None, -np.inf, 0
    layers = request.model.num_moe_layers
    with Progress(f"engine {request.engine.name}: branch and bound, candidates scheduled", len(order)) as progress:
        i = int(order[0]) if len(order) else 0
        try:  # a Ctrl-C anywhere in the loop (a schedule, the progress line) keeps the best so far
            for i in map(int, order):
                if not everything and bound[i] <= best_value + 1e-12 * abs(best_value):
                    break
                if deadline is not None and best is not None and time.perf_counter() > deadline:
                    return Found(best, best_value, scheduled, float(bound[i]))
                policy = cands.policy(i, layers)
                times = klotski_times(request.model, rates, request.workload, policy, request.engine,
                                      disk_read_s=float(cands.disk_read_s[i]))
                scheduled += 1
                progress(scheduled, _progress_note(kind, best_value, float(bound[i])) if best is not None else "")
                if limits.tpot_s is not None and times.decode_step_s > limits.tpot_s * (1 + 1e-9):
                    continue
                if limits.ttft_s is not None and times.prefill_s > limits.ttft_s * (1 + 1e-9):
                    continue
                value = objective_value(kind, cands.batch_size[i], gen, times.decode_step_s, times.prefill_s)
                if value > best_value:
                    best, best_value = i, float(value)
        except KeyboardInterrupt:
            if best is None or everything:
                raise
            return Found(best, best_value, scheduled, float(bound[i]), interrupted=True)
    return Found(best, best_value, scheduled)


def _progress_note(kind: str, best_value: float, open_bound: float) -> str:
    """The best so far and the bound of the next candidate, in the objective's unit."""
    if kind == "latency":
        return f"best TPOT {-best_value * 1e3:.1f} ms, the rest at least {-open_bound * 1e3:.1f} ms"
    return f"best {best_value:.1f} tok/s, the rest at most {open_bound:.1f} tok/s"


def search_klotski(request):
    """:func:`solver.search.search` for the expert-level pipeline (module docstring)."""
    hw, model, workload, engine = request.hw, request.model, request.workload, request.engine
    if request.limits.shared or hw.gpu is None:
        raise HRMError(f"engine {engine.name}: profile '{hw.name}' has no GPU (Klotski loads experts to a GPU)")
    if not model.num_moe_layers or model.num_experts <= 1:
        raise HRMError(f"engine {engine.name}: {model.name} has no routed experts")
    options = request.options.for_model(model)
    rates = rates_from_profile(hw, options, engine.name, engine.gpu_split)
    cands = candidates(request, rates)
    verify = request.verify
    if verify and len(cands) > VERIFY_MAX_CANDIDATES:
        raise HRMError(f"--verify with engine {engine.name} schedules every candidate: {len(cands):,} are more than "
                       f"{VERIFY_MAX_CANDIDATES:,}; pin part of the policy (--fix mu=... or N=...)")
    limit_s = request.time_limit_s if request.time_limit_s is not None else SEARCH_TIME_LIMIT_S
    # the limit counts from the search's start: building the candidates and their bounds is
    # part of the time the user waits
    found = branch_and_bound(request, rates, cands, deadline=request.start + limit_s)
    if found.index is None:
        if len(cands):
            limits = describe_limits(request.latency_limits)[len(", subject to "):]
            raise InfeasibleError(f"latency limit binds: no policy that fits memory meets {limits} (engine {engine.name})")
        raise InfeasibleError(_infeasible_reason(request, rates) + f" (engine {engine.name})")
    policy = cands.policy(found.index, model.num_moe_layers)
    result = estimate(hw, model, workload, policy, options=request.options, limits=request.limits, engine=engine)
    seconds = time.perf_counter() - request.start
    why_stopped = "on Ctrl-C" if found.interrupted else f"after {limit_s:g} s"
    stopped = "" if found.open_bound is None else (
        f"; stopped {why_stopped}: not proven optimal, the best candidate left is bounded by "
        f"{_gap(found):.1%} above the result")
    space = (f"every integer mu and n with N <= {request.max_batch} ({len(cands):,} feasible (mu, n, layers) "
             f"candidates, {found.scheduled} scheduled, the rest bounded{stopped}), every whole number of MoE "
             f"layers with GPU experts, the largest r_c memory allows")
    verified = verify_objective = verify_seconds = None
    if verify:
        t0 = time.perf_counter()
        check = branch_and_bound(request, rates, cands, everything=True)
        verify_seconds = time.perf_counter() - t0
        verify_objective = abs(check.value) if request.objective == "latency" else check.value
        verified = abs(check.value - found.value) <= 1e-9 * max(abs(check.value), 1e-12)
    own = klotski_own_batches(model, rates, workload, policy, engine)
    placement = make_placement(model, round(policy.weights_gpu_ratio * model.num_moe_layers) * model.num_experts,
                               policy.num_micro_batches, whole_layers=True)
    plan = make_plan(request, result, placement,
                     f"Klotski branch and bound over {space}{describe_limits(request.latency_limits)}", seconds,
                     found.scheduled)
    objective = abs(found.value) if request.objective == "latency" else found.value
    notes = list(request.notes)  # Klotski's own n at this μ is the estimate's note
    if found.open_bound is not None:
        notes.append(f"engine {engine.name}: search stopped {why_stopped} with {found.scheduled} of "
                     f"{len(cands):,} candidates scheduled; the best left could be at most {_gap(found):.1%} better "
                     "(pin mu or N with --fix to search a smaller space exactly)")
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"optimal": False})})
    stats = SearchStats(objective_value=objective, objective_name=request.objective, notes=tuple(notes),
                        latency_limits=request.latency_limits, engine=engine, search_space=space,
                        modes_total=len(cands), candidates_evaluated=found.scheduled, mu_max=int(cands.mu.max()),
                        verify_modes_enumerated=len(cands) if verify else None,
                        verify_modes_total=len(cands) if verify else None, klotski_own_num_micro_batches=own)
    return SearchResult(Candidate(policy, result, None), [], plan, "Klotski B&B", seconds, found.scheduled, verified,
                        verify_objective, verify_seconds, stats)


def _gap(found: Found) -> float:
    """How much better than the result the best candidate left unscheduled could be (its
    bound over the result, minus 1; for the latency objective the values are negated)."""
    value, bound = found.value, found.open_bound
    return (bound - value) / abs(value) if value else float("inf")


def _infeasible_reason(request, rates) -> str:
    """The smallest footprint (μ = n = 1, or the pins; no resident layer; the KV share that
    fits) against the limits (the host's with the layers of experts that may go to disk
    there, :func:`hrm.pipelines.expert_level.klotski_disk_bytes`)."""
    model, workload, limits, fixed = request.model, request.workload, request.limits, request.fixed
    mu = int(fixed.get("micro_batch_size", 1))
    batch_size = int(fixed.get("batch_size", mu * int(fixed.get("num_micro_batches", 1))))
    resident = int(round(fixed.get("weights_gpu_ratio", 0.0) * model.num_moe_layers))
    memory = klotski_memory(model, workload, mu, batch_size, resident, engine=request.engine)

    def host(kv_ratio: float) -> float:
        return float(memory.cpu_bytes(kv_ratio) - klotski_disk_bytes(model, memory, kv_ratio, request.engine, rates,
                                                                      limits))

    gpu, cpu = float(memory.gpu_bytes(0.0)), host(1.0)
    if gpu > limits.gpu_bytes:
        return (f"GPU memory binds: {batch_size} sequence(s) in batches of {mu} need at least {gpu / GIB:.1f} GiB of "
                f"{limits.gpu_bytes / GIB:.1f} GiB usable (non-expert weights, one layer's experts, KV buffers)")
    if host(0.0) > limits.cpu_bytes and cpu > limits.cpu_bytes:
        return (f"CPU memory binds: the offloaded experts and KV need at least {cpu / GIB:.1f} GiB of "
                f"{limits.cpu_bytes / GIB:.1f} GiB usable")
    return "GPU and CPU memory bind together: no KV split of the smallest batch fits both"
