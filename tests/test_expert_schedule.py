"""Expert-level list schedule of a Klotski decode layer (issue 13, item 2) and the generic
list scheduler it shares with the CGOPipe/FlexGen timelines. Every number is derived by
hand in the comments (durations in ms); nothing is timed."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hrm.pipelines import lanes_timeline as tl
from hrm.pipelines.expert_level_tasks import expert_schedule, klotski_layer_tasks
from hrm.pipelines.list_scheduler import Task, TaskQueues, list_schedule
from hrm.pipelines.lanes_timeline import TaskTime

MS = 1e-3
TOL = 1e-12

# The bubble case: 2 batches, attention 1 ms and gate 0.5 ms per batch; one hot expert
# (load 2 ms, 0.5 ms per batch) and one cold expert (load 5 ms, 0.25 ms per batch).
BUBBLE = dict(num_batches=2, attention_s=1 * MS, gate_s=0.5 * MS,
              hot_experts=[(2 * MS, 0.5 * MS)], cold_experts=[(5 * MS, 0.25 * MS)])


def test_list_schedule_runs_queues_in_order_after_inputs():
    """a(gpu 2) → b(h2d 3) → d(gpu 1); c(gpu 4) queued between a and d on the GPU:
    a 0–2, c 2–6, b 2–5, d max(6, 5) = 6–7; makespan 7."""
    graph = TaskQueues(("gpu", "h2d"))
    a = graph.add("a", "gpu", 2.0)
    b = graph.add("b", "h2d", 3.0, [a])
    c = graph.add("c", "gpu", 4.0)
    d = graph.add("d", "gpu", 1.0, [b, None])
    assert list_schedule(graph.queues) == 7.0
    assert [(t.start_s, t.end_s) for t in (a, b, c, d)] == [(0.0, 2.0), (2.0, 5.0), (2.0, 6.0), (6.0, 7.0)]
    assert graph.order == [a, b, c, d] and d.deps == [b]


def test_list_schedule_refuses_a_cycle():
    x = Task("x", "gpu", 1.0)
    y = Task("y", "h2d", 1.0, [x])
    x.deps.append(y)
    with pytest.raises(RuntimeError, match="cycle"):
        list_schedule({"gpu": [x], "h2d": [y]})


# --- the CGOPipe/FlexGen/sequential timelines are the ones of the code before the refactor ---

KINDS = [("PreAttn", "gpu", "pre_attn"), ("GPUAttn", "gpu", "attention"), ("PostAttn", "gpu", "post_attn"),
         ("CPUAttn", "cpu", "attention"), ("CPUExperts", "cpu", "experts"), ("QKV→CPU", "d2h", "qkv"),
         ("FFN→CPU", "d2h", "hidden"), ("KV→CPU", "d2h", "kv"), ("Hidden→GPU", "h2d", "hidden"),
         ("FFN→GPU", "h2d", "hidden"), ("KV→GPU", "h2d", "kv"), ("W", "h2d", "weights")]
COMPUTE = {"PreAttn": 3.0, "GPUAttn": 5.0, "PostAttn": 7.0, "CPUAttn": 11.0, "CPUExperts": 13.0, "QKV→CPU": 1.0,
           "FFN→CPU": 2.0, "KV→CPU": 1.0, "Hidden→GPU": 2.0, "FFN→GPU": 1.0, "KV→GPU": 4.0, "W": 6.0, "StageW": 2.0}
SECONDS = {"compute": COMPUTE,  # the link rarely binds; "link": weight pages and KV loads do; "gpu": the link runs ahead
           "link": {**COMPUTE, "KV→GPU": 17.0, "W": 29.0, "StageW": 19.0, "KV→CPU": 9.0},
           "gpu": {**COMPUTE, "PreAttn": 9.0, "GPUAttn": 15.0, "PostAttn": 21.0, "KV→GPU": 1.0, "W": 1.0,
                   "Hidden→GPU": 1.0, "StageW": 1.0}}
# (durations, (schedule, GPU attention, CPU experts, staged weights), layer ends, digest of
# every task: resource, name, kind, layer, micro-batch, duration, start, end in queue order),
# recorded from the committed hrm/pipelines/lanes_timeline.py before the scheduler was made generic
# (3 micro-batches, 3 layers)
PINNED = [
    ("compute", ("cgopipe", False, False, False), [48.0, 83.0, 120.0], "88f0e3eceb856d07a368"),
    ("compute", ("cgopipe", False, True, True), [94.0, 172.0, 249.0], "1353f471ba402d47ca65"),
    ("compute", ("flexgen", True, False, False), [46.0, 91.0, 136.0], "c0743b4884b0ebffb24a"),
    ("compute", ("flexgen-cpu-attn", False, False, True), [72.0, 144.0, 216.0], "e8632bbf4086a42ea7a3"),
    ("compute", ("sequential", False, False, False), [105.0, 195.0, 270.0], "2905ee4ea04e693d9e82"),
    ("compute", ("cgopipe", True, True, False), [70.0, 123.0, 184.0], "d278716797fd546c54fc"),
    ("link", ("cgopipe", False, False, False), [108.0, 201.0, 294.0], "fe56fb4b9fe3c555849a"),
    ("link", ("cgopipe", False, True, True), [161.0, 296.0, 420.0], "af7fc7ff8a95238b55f3"),
    ("link", ("flexgen", True, False, False), [138.0, 276.0, 414.0], "8d1c36cbcec6abbebba9"),
    ("link", ("flexgen-cpu-attn", False, False, True), [135.0, 238.0, 351.0], "17134a7d9779c3c94930"),
    ("link", ("sequential", False, False, False), [174.0, 333.0, 477.0], "e8ae785c4cd72db73791"),
    ("link", ("cgopipe", True, True, False), [158.0, 299.0, 423.0], "a61308a0715c78013204"),
    ("gpu", ("cgopipe", False, False, False), [103.0, 193.0, 274.0], "b657dcc4da95a722dbc9"),
    ("gpu", ("cgopipe", False, True, True), [135.0, 249.0, 363.0], "e439e7c3dd78924b33cd"),
    ("gpu", ("flexgen", True, False, False), [135.0, 270.0, 405.0], "18d2b093a3ebf3fdaeb9"),
    ("gpu", ("flexgen-cpu-attn", False, False, True), [129.0, 258.0, 387.0], "23840c4b2b5532cb03f2"),
    ("gpu", ("sequential", False, False, False), [153.0, 285.0, 396.0], "27e794287cfa91d7ce16"),
    ("gpu", ("cgopipe", True, True, False), [151.0, 286.0, 421.0], "3f458b0a443055320a8a"),
]


@pytest.mark.parametrize("durations,config,ends,digest", PINNED)
def test_decode_task_graphs_schedule_as_before(durations, config, ends, digest):
    schedule, gpu_attention, cpu_experts, staged = config
    seconds = SECONDS[durations]
    times = [TaskTime(name, resource, kind, seconds[name]) for name, resource, kind in KINDS]
    times += [TaskTime("StageW", "cpu", "weights", seconds["StageW"])] if staged else []
    queues, _ = tl._build_tasks(times, 3, 3, schedule, gpu_attention, cpu_experts)
    list_schedule(queues)
    rows = [(t.resource, t.name, t.kind, t.layer, t.micro_batch, t.duration_s, t.start_s, t.end_s)
            for q in queues.values() for t in q]
    assert [max(r[7] for r in rows if r[3] == i) for i in range(3)] == ends
    assert hashlib.sha256(repr(rows).encode()).hexdigest()[:20] == digest


# --- Klotski's expert-level layer ---

def test_perfect_overlap_reproduces_the_lane_bound_gpu_bound():
    """2 batches, attention 5, gate 1, hot (load 4, 3/batch), cold (load 2, 1/batch).
    GPU: attention 0–10, gates 10–12, hot 12–18, cold 18–20. Link: hot 0–4 (during
    attention), cold 11–13 (after the first gate, hidden behind hot compute). Period 20 =
    GPU busy 2·(5+1+3+1); link busy 6."""
    result = expert_schedule(2, 5 * MS, 1 * MS, [(4 * MS, 3 * MS)], [(2 * MS, 1 * MS)])
    assert result.resource_busy_s["gpu"] == pytest.approx(20 * MS, abs=TOL)
    assert result.resource_busy_s["h2d"] == pytest.approx(6 * MS, abs=TOL)
    assert result.period_s == pytest.approx(20 * MS, abs=TOL)
    assert result.period_s == pytest.approx(max(result.resource_busy_s.values()), abs=TOL)
    assert result.lane_bound_s == pytest.approx(20 * MS, abs=TOL) and abs(result.bubble_s) < TOL


def test_double_buffered_slots_reach_the_bound_of_a_link_bound_layer():
    """1 batch, attention 1, gate 1, hot (3, 1), cold (3, 1): link 6 per layer, GPU 4.
    One buffer (prefetch from the layer's start): hot load 0–3, gate ends 2, cold load 3–6,
    cold compute 6–7 → period 7, bubble 1. Two buffers: the next layer's hot load follows
    this layer's cold load on the link (6–9), so the link never idles → period 6 = bound."""
    case = (1, 1 * MS, 1 * MS, [(3 * MS, 1 * MS)], [(3 * MS, 1 * MS)])
    single, double = expert_schedule(*case, expert_buffers=1), expert_schedule(*case, expert_buffers=2)
    assert single.lane_bound_s == pytest.approx(6 * MS, abs=TOL) == double.lane_bound_s
    assert single.period_s == pytest.approx(7 * MS, abs=TOL)
    assert single.bubble_s == pytest.approx(1 * MS, abs=TOL)
    assert double.period_s == pytest.approx(6 * MS, abs=TOL) and abs(double.bubble_s) < TOL


def test_a_cold_load_that_cannot_hide_leaves_a_bubble():
    """GPU: attention 0–2, gates 2–3, hot 3–4 (1 ms of hot compute), then waits for the
    cold load 2.5–7.5 (after the first gate; 5 ms) and computes it 7.5–8. Period 8 ms;
    bound max(GPU 2·(1+0.5+0.5+0.25) = 4.5, link 2+5 = 7) = 7; bubble 1 ms."""
    result = expert_schedule(**BUBBLE)
    assert result.resource_busy_s["gpu"] == pytest.approx(4.5 * MS, abs=TOL)
    assert result.lane_bound_s == pytest.approx(7 * MS, abs=TOL)
    assert result.period_s == pytest.approx(8 * MS, abs=TOL)
    assert result.bubble_s == pytest.approx(1 * MS, abs=TOL)
    layer = result.timeline.window(3)[0]
    cold = [t for t in result.timeline.tasks if t.name == "Cold0 L3"][0]
    assert (cold.start_s - layer, cold.end_s - layer) == pytest.approx((2.5 * MS, 7.5 * MS), abs=TOL)


def test_hot_first_beats_the_routed_order():
    """As routed (each batch cold expert first): batch 0 stalls on the cold load until 7.5,
    then cold 7.5–7.75, hot 7.75–8.25, batch 1 cold 8.25–8.5, hot 8.5–9 → 9 ms, 1 ms (the
    hot compute) more than hot-first's 8 ms, which ran hot compute during the load."""
    hot_first, routed = expert_schedule(**BUBBLE), expert_schedule(**BUBBLE, order="as-routed")
    assert routed.period_s == pytest.approx(9 * MS, abs=TOL)
    assert routed.period_s - hot_first.period_s == pytest.approx(1 * MS, abs=TOL)
    assert routed.lane_bound_s == hot_first.lane_bound_s


def test_prefetching_hot_experts_helps():
    """Without prefetch the hot load waits for the first gate too: hot 2.5–4.5, cold
    4.5–9.5, cold compute 9.5–10 → 10 ms against 8 ms with the hot expert loaded during
    attention."""
    on_demand = expert_schedule(**BUBBLE, prefetch_hot=False)
    assert on_demand.period_s == pytest.approx(10 * MS, abs=TOL)
    assert on_demand.period_s - expert_schedule(**BUBBLE).period_s == pytest.approx(2 * MS, abs=TOL)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_batches_share_one_load_per_expert(n):
    """The link carries each expert once per layer whatever n; the GPU computes it in one
    call over the n batches' tokens (hot-first), or once per batch (as routed)."""
    result = expert_schedule(**{**BUBBLE, "num_batches": n})
    assert result.resource_busy_s["h2d"] == pytest.approx(7 * MS, abs=TOL)
    assert result.resource_busy_s["gpu"] == pytest.approx(n * 2.25 * MS, abs=TOL)
    graph = klotski_layer_tasks(**{**BUBBLE, "num_batches": n}, layers=2)
    loads = [t.name for t in graph.queues["h2d"] if t.layer == 1 and t.duration_s > 0]
    assert loads == ["Hot0 L1", "Cold0 L1"]
    hot = [t for t in graph.queues["gpu"] if t.name.startswith("Hot0 L1")]
    assert len(hot) == 1 and hot[0].duration_s == pytest.approx(n * 0.5 * MS)
    routed = klotski_layer_tasks(**{**BUBBLE, "num_batches": n}, layers=2, order="as-routed")
    assert sum(t.name.startswith("Hot0 L1") for t in routed.queues["gpu"]) == n


def test_host_kv_loads_double_buffered_before_each_attention():
    """2 batches, attention 1, gate 0, no experts, KV load 3 and store 0.5 per batch: the
    link loads batch 0's cache 0–3 and batch 1's 3–6 (its buffer is free: two buffers), the
    GPU attends 3–4 and 6–7, each store follows its attention on the GPU→CPU queue; layer 2's
    first load waits only for the link (batch 0's buffer was freed at 4): the link never
    idles, so the period is the link's 6 ms."""
    result = expert_schedule(2, 1 * MS, 0.0, [], [], kv_load_s=3 * MS, kv_store_s=0.5 * MS)
    tasks = {t.name: t for t in result.timeline.tasks}
    assert (tasks["KV L0 b1"].start_s, tasks["Attn L0 b1"].start_s) == pytest.approx((3 * MS, 6 * MS), abs=TOL)
    assert tasks["KV→CPU L0 b0"].start_s == pytest.approx(tasks["Attn L0 b0"].end_s, abs=TOL)
    assert result.resource_busy_s == pytest.approx({"gpu": 2 * MS, "h2d": 6 * MS, "d2h": 1 * MS}, abs=TOL)
    assert result.period_s == pytest.approx(6 * MS, abs=TOL)


def test_orders_and_prefetch_never_hurt_on_random_layers():
    """Seeded spot check (not a theorem): the period is ≥ the lane bound, hot-first ≤ as
    routed, prefetch ≤ on demand, and the layer period is steady by layer 6."""
    rng = np.random.default_rng(13)
    for _ in range(150):
        case = dict(num_batches=int(rng.integers(1, 5)), attention_s=rng.uniform(0, 2), gate_s=rng.uniform(0, 1),
                    hot_experts=[tuple(rng.uniform(0, 3, 2)) for _ in range(rng.integers(0, 3))],
                    cold_experts=[tuple(rng.uniform(0, 3, 2) * [2, 0.5]) for _ in range(rng.integers(0, 4))],
                    gate_load_s=rng.uniform(0, 1), attention_load_s=rng.uniform(0, 1),
                    expert_buffers=int(rng.integers(1, 3)))
        best = expert_schedule(**case)
        assert best.period_s >= best.lane_bound_s - 1e-9
        assert best.period_s <= expert_schedule(**case, order="as-routed").period_s + 1e-9
        assert best.period_s <= expert_schedule(**case, prefetch_hot=False).period_s + 1e-9
        assert best.period_s == pytest.approx(expert_schedule(**case, layers=12).period_s, abs=1e-9)


def test_the_timeline_draws_one_row_per_resource():
    timeline = expert_schedule(**BUBBLE).timeline
    assert timeline.schedule == "klotski-hot-first"
    assert {t.resource for t in timeline.tasks} == {"gpu", "h2d"}
    assert {t.kind for t in timeline.tasks} == {"attention", "post_attn", "weights"}
    assert len(timeline.layer_end_s) == 6
    for resource in ("gpu", "h2d"):
        mine = sorted((t.start_s, t.end_s) for t in timeline.tasks if t.resource == resource)
        assert all(a[1] <= b[0] + TOL for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("change,message", [
    ({"num_batches": 0}, "num_batches"), ({"layers": 0}, "layers"), ({"expert_buffers": 0}, "expert_buffers"),
    ({"order": "cold-first"}, "order"), ({"attention_s": -1.0}, "durations"),
    ({"cold_experts": [(float("nan"), 0.0)]}, "durations"),
])
def test_bad_arguments_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        klotski_layer_tasks(**{**BUBBLE, **change})
