"""The figures draw the model's numbers: roofs equal the profile's peaks, turning points sit
where hrm computes them (and where a hand computation puts them), policy-map cells equal
hrm-search for those machines, timeline tasks add up to the latency lanes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hrm.engines.engine import IDEAL
from hrm.machine.hardware import PROFILES_DIR, load_hardware, parse_hardware
from hrm.cost.latency.decode import decode_resources
from hrm.model.spec import load_model
from hrm.plots import plot_cpu_memory, plot_policy_map, plot_roofline, plot_timeline, roofline_data, trace_boxes
from hrm.plots.policy_map import grid
from hrm.plots.timeline import trace_policy
from hrm.policy import parse_policy
from hrm.problem import make_problem
from hrm.machine.rates import rates_from_profile
from hrm.cost.roofline import hrm_from_profile, turning_points
from hrm.pipelines import decode_timeline
from hrm.machine.whatif import with_cpu_scaled, with_link_bandwidth
from hrm.workload import make_workload

from conftest import two_level_machine


def raw_l4():
    return yaml.safe_load((Path(PROFILES_DIR) / "l4.yaml").read_text())


def lines_by_gid(fig):
    return {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}


def test_roofs_are_the_profile_peaks():
    raw = raw_l4()
    data = roofline_data(load_hardware("l4"), load_model("mixtral"), "moe-ffn")
    roofs = {r.key: r.value for r in data.roofs}
    assert roofs["roof:gpu-compute"] == pytest.approx(raw["gpu"]["tflops"]["fp16"] * 1e12)
    assert roofs["roof:cpu-compute"] == pytest.approx(raw["cpu"]["tflops"]["fp32"] * 1e12)
    assert roofs["roof:gpu-memory"] == pytest.approx(raw["gpu"]["memory_bandwidth_gbps"] * 1e9)
    assert roofs["roof:cpu-memory"] == pytest.approx(raw["cpu"]["memory_bandwidth_gbps"] * 1e9)
    assert roofs["roof:cpu-gpu-link"] == pytest.approx(raw["link"]["h2d_gbps"] * 1e9)
    drawn = lines_by_gid(plot_roofline(data))
    # compute roofs are horizontal at the peak (TFLOP/s on the axis)
    assert np.allclose(drawn["roof:gpu-compute"].get_ydata(), raw["gpu"]["tflops"]["fp16"])
    assert np.allclose(drawn["roof:cpu-compute"].get_ydata(), raw["cpu"]["tflops"]["fp32"])
    # memory roofs are y = B·I up to their compute roof
    for key, gbps, cap in (("roof:gpu-memory", raw["gpu"]["memory_bandwidth_gbps"], raw["gpu"]["tflops"]["fp16"]),
                           ("roof:cpu-memory", raw["cpu"]["memory_bandwidth_gbps"], raw["cpu"]["tflops"]["fp32"]),
                           ("roof:cpu-gpu-link", raw["link"]["h2d_gbps"], raw["gpu"]["tflops"]["fp16"])):
        x, y = np.asarray(drawn[key].get_xdata()), np.asarray(drawn[key].get_ydata())
        assert np.allclose(y, gbps * 1e9 * x / 1e12)
        assert y.max() == pytest.approx(cap)


def test_moe_ffn_turning_points_by_hand():
    raw = raw_l4()
    model = load_model("mixtral")
    mu = 128
    data = roofline_data(load_hardware("l4"), model, "moe-ffn", micro_batch=mu, batch_sizes=(64, 1024))
    h, f, ne, k = 4096, 14336, 8, 2
    # I_gpu(μ): 2·μ·k·(3·h·f) FLOPs over the expected distinct experts' weights + activations (fp16)
    flops = 2 * mu * k * 3 * h * f
    distinct = ne * (1 - (1 - k / ne) ** mu)
    i_gpu = flops / (distinct * 3 * h * f * 2 + mu * k * (2 * h + 3 * f) * 2)
    link, gpu_bw, gpu_peak = raw["link"]["h2d_gbps"] * 1e9, raw["gpu"]["memory_bandwidth_gbps"] * 1e9, raw["gpu"]["tflops"]["fp16"] * 1e12
    cpu_peak = raw["cpu"]["tflops"]["fp32"] * 1e12
    points = {p.key: p for p in data.points}
    assert points["point:p2"].intensity == pytest.approx(min(gpu_peak, gpu_bw * i_gpu) / link)
    assert points["point:p1"].intensity == pytest.approx(cpu_peak / link)  # CPU bandwidth > link
    assert data.kernel_flops == pytest.approx(min(gpu_peak, gpu_bw * i_gpu))
    # the same points from hrm.cost.roofline (eqs. 9-11)
    tp = turning_points(hrm_from_profile(load_hardware("l4")), i_gpu, cpu_peak / link)
    assert points["point:p2"].intensity == pytest.approx(tp.p2_intensity)
    assert points["point:p1"].intensity == pytest.approx(tp.p1_intensity)
    # N lines: I^cpu(N) = 2·N·k·3hf / (ne·3hf·2 bytes) = N·k/ne
    by_key = {line.key: line for line in data.lines}
    assert by_key["op:ffn-N1024"].intensity == pytest.approx(1024 * k / ne)
    assert by_key["op:ffn-N1024"].gpu_flops == pytest.approx(min(data.kernel_flops, link * 1024 * k / ne))
    drawn = lines_by_gid(plot_roofline(data))
    for key, point in points.items():
        assert drawn[key].get_xdata()[0] == pytest.approx(point.intensity)
        assert drawn[key].get_ydata()[0] == pytest.approx(point.flops / 1e12)
    assert drawn["op:ffn-N64"].get_xdata()[0] == pytest.approx(64 * k / ne)


def test_attention_points_by_hand():
    model = load_model("mixtral")
    data = roofline_data(load_hardware("l4"), model, "attention", context=512, kv_dtypes=("fp16", "int4"))
    # 4·heads·head_dim·c FLOPs over (c+1)·2·kv_heads·head_dim elements
    i_fp16 = 4 * 32 * 128 * 512 / (513 * 2 * 8 * 128 * 2)
    lines = {line.key: line for line in data.lines}
    assert lines["op:attention-fp16"].intensity == pytest.approx(i_fp16)
    assert lines["op:attention-int4"].intensity == pytest.approx(4 * i_fp16)
    raw = raw_l4()
    cpu_bw, link = raw["cpu"]["memory_bandwidth_gbps"] * 1e9, raw["link"]["h2d_gbps"] * 1e9
    # eq. 9 on the CPU's memory roof: P1 = B_cpu·I / B_link; attention sits left of it
    p1 = {p.key: p for p in data.points}["point:p1-fp16"]
    assert p1.intensity == pytest.approx(cpu_bw * i_fp16 / link)
    assert lines["op:attention-fp16"].intensity < p1.intensity


def test_roofline_on_cpu_only_and_two_level_profiles():
    data = roofline_data(two_level_machine(), load_model("tiny-mixtral"), "moe-ffn", micro_batch=4, batch_sizes=(8,))
    assert {r.key: r.value for r in data.roofs}["roof:cpu-gpu-link"] == pytest.approx(10e9)
    cpu_only = roofline_data(load_hardware("cpu-only"), load_model("tiny-mixtral"), "attention")
    assert "emulated" in cpu_only.roofs[0].label


def test_whatif_transforms():
    hw = load_hardware("2xa100-80g")
    scaled = with_cpu_scaled(hw, 3)
    assert scaled.cpu.memory_bandwidth_gbps == pytest.approx(300)
    assert scaled.cpu.memory_gib == pytest.approx(3 * 186.3)
    assert scaled.cpu.tflops.fp32 == pytest.approx(4.8)
    assert scaled.gpu == hw.gpu and scaled.sha256() != hw.sha256()
    linked = with_link_bandwidth(hw, 250)
    assert (linked.link.h2d_gbps, linked.link.d2h_gbps) == (250, 250)


def test_cpu_scaling_drops_the_measured_rates_of_the_old_cpu():
    raw = yaml.safe_load((Path(PROFILES_DIR) / "cpu-only.yaml").read_text())
    raw["emulation"] = {"threads": 1, "tflops": {"fp32": 0.05}, "memory_bandwidth_gbps": 10, "copy_gbps": 5}
    measured = parse_hardware(raw)
    scaled = with_cpu_scaled(measured, 2)
    assert measured.emulation is not None and scaled.emulation is None
    assert rates_from_profile(scaled).gpu_peak_flops == pytest.approx(2 * raw["cpu"]["tflops"]["fp32"] * 1e12)


def fig10_machine(h2d_gbps, ratio):
    """The 2×A100-80G ablation machine built from the YAML by hand (not via hrm.machine.whatif)."""
    raw = yaml.safe_load((Path(PROFILES_DIR) / "2xa100-80g.yaml").read_text())
    raw["cpu"]["memory_bandwidth_gbps"] *= ratio
    raw["cpu"]["memory_gib"] *= ratio
    raw["cpu"]["tflops"] = {k: v * ratio for k, v in raw["cpu"]["tflops"].items()}
    raw["link"] = {"h2d_gbps": h2d_gbps, "d2h_gbps": h2d_gbps}
    return parse_hardware(raw)


def test_policy_map_cells_equal_search():
    from solver.search import search
    from solver.sweep import policy_map

    model, workload = load_model("mixtral-8x22b"), make_workload(None, 512, None, 32)
    hw = load_hardware("2xa100-80g")
    table = policy_map(make_problem(hw, model, workload), [100, 500], [1, 3])
    assert len(table) == 4
    for _, row in table.iterrows():
        best = search(fig10_machine(row["h2d_gbps"], row["cpu_scale"]), model, workload, top=0, engine="ideal").best
        assert row["feasible"]
        assert row["generation_throughput_tok_s"] == pytest.approx(best.estimate.generation_throughput_tok_s, rel=1e-9)
        assert row["batch_size"] == best.policy.batch_size
        assert bool(row["attn_on_gpu"]) == best.policy.attn_on_gpu
        assert row["weights_offloaded"] == pytest.approx(1 - best.policy.weights_gpu_ratio)
    # the policy map of this setup is not uniform: placement or offload changes across cells
    assert table["attn_on_gpu"].nunique() > 1 or table["weights_offloaded"].nunique() > 1
    fig = plot_policy_map(table)
    images = {im.get_gid(): im for ax in fig.axes for im in ax.get_images()}
    for column in ("generation_throughput_tok_s", "weights_offloaded", "kv_offloaded", "attn_on_gpu"):
        _, _, expected = grid(table, column)
        assert np.allclose(np.asarray(images[f"map:{column}"].get_array(), float), expected, equal_nan=True)


def test_cpu_memory_sweep_equals_hrm_search_cli(capsys):
    from hrm_cli import main
    from solver.sweep import cpu_memory_sweep

    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench")
    table = cpu_memory_sweep(make_problem(hw, model, workload), [60, 200], ["cgopipe", "flexgen"])
    for _, row in table.iterrows():
        capsys.readouterr()
        code = main(["search", "--hw", "l4", "--model", "mixtral", "--cpu-mem", str(row["cpu_mem_gib"]),
                     "--schedule", row["schedule"], "--json"])
        if not row["feasible"]:
            assert code == 3
            continue
        plan = json.loads(capsys.readouterr().out)
        assert row["generation_throughput_tok_s"] == pytest.approx(plan["estimate"]["generation_throughput_tok_s"])
        assert row["batch_size"] == plan["policy"]["batch_size"]
    assert not table[table["cpu_mem_gib"] == 60]["feasible"].any()  # 87 GiB of weights cannot fit
    fig = plot_cpu_memory(table)
    lines = lines_by_gid(fig)
    for schedule in ("cgopipe", "flexgen"):
        rows = table[table["schedule"] == schedule].sort_values("cpu_mem_gib")
        assert np.allclose(lines[f"schedule:{schedule}"].get_ydata(), rows["generation_throughput_tok_s"], equal_nan=True)


def timeline_problem(hw, model_name: str, schedule: str):
    """The problem of a timeline: ``schedule`` on engine ideal (a timeline reads the problem's
    model, rates and engine; the workload is any)."""
    return make_problem(hw, load_model(model_name), make_workload("mtbench"), IDEAL.with_schedule(schedule))


POLICIES = [
    ("N=2496,mu=192,rw=0.1094", "cgopipe"),
    ("N=256,mu=64,attn=gpu,rc=0.25", "flexgen"),
    ("N=256,mu=64", "flexgen-cpu-attn"),
    ("N=256,mu=64", "sequential"),
    ("N=64,mu=32,attn=gpu,ffn=cpu,rc=0.5", "cgopipe"),
]


@pytest.mark.parametrize("text,schedule", POLICIES)
def test_timeline_tasks_add_up_to_the_lanes(text, schedule):
    problem, policy = timeline_problem(load_hardware("l4"), "mixtral", schedule), parse_policy(text)
    model, rates = problem.model, problem.rates
    timeline = decode_timeline(problem, policy, context=300.0, layers=4)
    lanes = decode_resources(model, rates, policy.micro_batch_size, 300.0, policy.attn_on_gpu, policy.ffn_on_gpu)
    for name, lane in lanes.items():
        expected = float(lane.time_s(policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
        assert timeline.resource_busy_s[name] == pytest.approx(expected, rel=1e-9, abs=1e-15)
        layer2 = sum(t.end_s - t.start_s for t in timeline.tasks if t.resource == name and t.layer == 2)
        assert layer2 == pytest.approx(expected, rel=1e-9, abs=1e-15)
    # no resource runs two tasks at once
    for name in lanes:
        mine = sorted((t.start_s, t.end_s) for t in timeline.tasks if t.resource == name)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(mine, mine[1:]))
    # list scheduling can only add bubbles to the perfect-overlap bound of eq. 12
    assert timeline.layer_period_s >= timeline.lane_bound_s * (1 - 1e-9)
    if schedule == "sequential":
        assert timeline.layer_period_s == pytest.approx(sum(timeline.resource_busy_s.values()))


DISPATCH = {"task_s": 2e-5, "pre_attn_s": 3e-5, "attention_s": 4e-5, "post_attn_s": 5e-5, "experts_call_s": 1e-5,
            "expert_s": 6e-6, "head_s": 1e-4, "copy_s": 7e-6, "kv_load_s": 3e-6, "kv_store_s": 2e-6}


@pytest.mark.parametrize("text,schedule", POLICIES)
def test_timeline_keeps_the_lanes_with_dispatch_overhead(text, schedule):
    """A measured profile's per-lane dispatch α is spread over the lane's tasks: totals stay."""
    raw = raw_l4()
    raw["gpu"]["dispatch"] = DISPATCH
    raw["cpu"]["dispatch"] = {**DISPATCH, "task_s": 3e-5}
    problem, policy = timeline_problem(parse_hardware(raw), "tiny-mixtral", schedule), parse_policy(text)
    model, rates = problem.model, problem.rates
    assert rates.gpu_dispatch is not None
    timeline = decode_timeline(problem, policy, context=64.0)
    lanes = decode_resources(model, rates, policy.micro_batch_size, 64.0, policy.attn_on_gpu, policy.ffn_on_gpu)
    for name, lane in lanes.items():
        expected = float(lane.time_s(policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
        assert timeline.resource_busy_s[name] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    if schedule != "flexgen-cpu-attn":  # S3's chain lane also carries the weight pages' α (known, small)
        assert timeline.layer_period_s >= timeline.lane_bound_s * (1 - 1e-9)


def test_cgopipe_timeline_reaches_the_bound_when_one_resource_dominates():
    problem = timeline_problem(load_hardware("l4"), "mixtral", "cgopipe")
    timeline = decode_timeline(problem, parse_policy("N=2496,mu=192,rw=0.1094"), context=140.0)
    assert timeline.layer_period_s == pytest.approx(timeline.lane_bound_s, rel=1e-6)
    fig = plot_timeline(timeline, "test")
    bars = {c.get_gid(): c for ax in fig.axes for c in ax.collections if c.get_gid()}
    assert set(bars) == {"lane:gpu", "lane:cpu", "lane:h2d", "lane:d2h"}


def synthetic_trace(path):
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}}
              for n, t in (("gpu", 1), ("cpu", 2), ("h2d", 3), ("d2h", 4))]

    def task(name, tid, ts, dur, **args):
        events.append({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur,
                       "args": {"phase": "decode", **args}})

    for layer in range(3):
        base = 1000 * layer
        task(f"PreAttn L{layer} mb0", 1, base, 100, step=1, layer=layer, mb=0)
        task(f"OffloadQKV L{layer} mb0", 4, base + 100, 10, step=1, layer=layer, mb=0)
        task(f"CPUAttn L{layer} mb0", 2, base + 110, 300, step=1, layer=layer, mb=0)
        task(f"LoadH L{layer} mb0", 3, base + 410, 10, step=1, layer=layer, mb=0)
        task(f"PostAttn L{layer} mb0", 1, base + 420, 500, step=1, layer=layer, mb=0)
    task("W_PintoG L2 page0", 3, 1500, 200, kind="weights", layer=2, page=0)
    path.write_text(json.dumps({"traceEvents": events, "metadata": {"policy": "N=16,mu=8,attn=cpu"}}))


def test_trace_boxes_pick_one_layer(tmp_path):
    path = tmp_path / "trace.json"
    synthetic_trace(path)
    boxes, window_s, (step, layer) = trace_boxes(path)
    assert (step, layer) == (1, 1)
    assert window_s == pytest.approx(920e-6)
    kinds = sorted((b.resource, b.kind) for b in boxes)
    assert kinds == sorted([("gpu", "pre_attn"), ("d2h", "qkv"), ("cpu", "attention"), ("h2d", "hidden"),
                            ("gpu", "post_attn"), ("h2d", "weights")])
    assert trace_policy(path) == "N=16,mu=8,attn=cpu"
    weights = next(b for b in boxes if b.kind == "weights")
    assert (weights.start_s, weights.end_s) == pytest.approx((500e-6, 700e-6))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hrm_cli", "plot", *args], capture_output=True, text=True)


def test_plot_cli_writes_png_and_rejects_bad_input(tmp_path):
    out = tmp_path / "r.png"
    done = run_cli("roofline", "--hw", "l4", "--model", "mixtral", "--op", "attention", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = tmp_path / "trace.json"
    synthetic_trace(trace)
    out2 = tmp_path / "t.png"
    done = run_cli("timeline", "--hw", "l4", "--model", "mixtral", "--policy", "N=256,mu=64", "--trace", str(trace),
                   "--out", str(out2))
    assert done.returncode == 0, done.stderr
    assert out2.read_bytes()[:4] == b"\x89PNG"
    for args, needle in ((("roofline", "--hw", "l4", "--model", "mistral-7b", "--out", str(out)), "no routed experts"),
                         (("policy-map", "--bandwidths", "0,1", "--out", str(out)), "--bandwidths"),
                         (("timeline", "--hw", "l4", "--model", "mixtral", "--trace", str(tmp_path / "none.json"),
                           "--policy", "N=64,mu=64", "--out", str(out2)), "none.json"),
                         (("roofline", "--hw", "l4", "--model", "mixtral", "--out", str(tmp_path / "no" / "r.png")),
                          "does not exist")):
        bad = run_cli(*args)
        assert bad.returncode == 2, (args, bad.stderr)
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in bad.stderr and needle in lines[0], bad.stderr
    assert not list(tmp_path.glob(".*png*"))  # no half-written temp files left behind
