"""The disk tier (docs/model.md §4.9): weights beyond host memory spill to disk, the minimal
spill E = max(0, host need − usable host bytes), read back every pass on a ``disk`` lane of
E / (L · disk read rate)."""

import pytest

from conftest import two_level_machine
from hrm.engines.engine import IDEAL, load_engine
from hrm.engines.mechanisms import with_fields, without
from hrm.errors import InfeasibleError
from hrm.estimate import estimate
from hrm.analysis.explain import explain
from hrm.engines.flexgen import disk_percent_for_spill, placed_bytes
from hrm.machine.hardware import load_hardware, parse_hardware
from hrm.cost.memory import MemoryLimits, memory_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.policy import Policy
from hrm.problem import make_problem
from hrm.workload import Workload, make_workload
from solver.lanes import milp
from solver.search import choice_to_policy, search
from solver.lanes.terms import build_terms, enumerate_modes
from solver.lanes.verify import exhaustive

GIB = 2 ** 30
DISK = with_fields(IDEAL, {"memory.disk_weights": True})  # the ideal engine that may spill weights to disk
WORKLOAD = Workload(prompt_len=16, max_prompt_len=16, gen_len=4)  # context at most 16 + 4 = 20 tokens

# tiny-mixtral by hand (fp16, hidden 64, expert FFN 128, 4 experts, 2 layers, 4 query / 2 KV
# heads of 16): an expert 3·64·128·2 = 49,152 B, a layer's experts 4 × that = 196,608 B, the
# offloadable weights W = 2 × 196,608 = 393,216 B. Host tier (ideal, attention and experts on
# the GPU): (1 − r_w)·W offloaded weights + (1 − r_w)·2 layers of pinned staging (393,216 B at
# r_w = 0) + per sequence 384 B of QKV/hidden staging ((128 + 64)·2) + (1 − r_c)·5,120 B of KV
# (20 tokens × 128 B (K and V: 2·2 heads·16·2 B) × 2 layers).
POLICY = Policy(batch_size=4, micro_batch_size=2, num_micro_batches=2, attn_on_gpu=True, ffn_on_gpu=True,
                weights_gpu_ratio=0.25, kv_gpu_ratio=0.5)
# host need at this policy: 0.75·393,216 + 0.75·393,216 + 4·384 + 0.5·4·5,120
#   = 294,912 + 294,912 + 1,536 + 10,240 = 601,600 B
HOST_NEED = 601_600.0
SPILLABLE = 294_912.0  # the offloaded weights the host would hold: 0.75·393,216
HOST_LIMIT = 500_000.0
SPILL = 101_600.0  # 601,600 − 500,000
DISK_READ_GBPS = 2.0
DISK_LANE_S = 2.54e-5  # 101,600 B / 2 layers / 2e9 B/s


def machine(**over):
    return two_level_machine(disk={"read_gbps": DISK_READ_GBPS}, **over)


def limits(cpu_bytes):
    return MemoryLimits(16 * GIB, cpu_bytes, False)


def test_spill_bytes_and_disk_lane_by_hand():
    tiny = load_model("tiny-mixtral")
    result = estimate(machine(), tiny, WORKLOAD, POLICY, limits=limits(HOST_LIMIT), engine=DISK)
    assert result.disk_bytes == pytest.approx(SPILL, rel=1e-12)
    assert result.cpu_peak_bytes == pytest.approx(HOST_LIMIT, rel=1e-12)  # the host holds all it can
    assert result.memory_components["disk"]["spillable_weights"] == pytest.approx(SPILLABLE, rel=1e-12)
    assert result.feasible
    assert result.lane_layer_s["disk"] == pytest.approx(DISK_LANE_S, rel=1e-9)
    # the link carries 0.75·196,608 B per layer at 10 GB/s = 1.47e-5 s (+ a little KV): the disk binds
    assert result.decode_layer_latency_s == pytest.approx(DISK_LANE_S, rel=1e-9)
    assert result.bottleneck == "disk read of weights beyond host memory"
    assert "+0.00 GiB of weights on disk" in result.binding_memory
    # every prefill layer waits for its disk read too (its other lanes are shorter)
    assert result.prefill_latency_s >= 2 * DISK_LANE_S


def test_host_dram_charges_the_disk_reads_write():
    tiny = load_model("tiny-mixtral")
    engine = with_fields(DISK, {"host_dram": True})
    result = estimate(machine(), tiny, WORKLOAD, POLICY, limits=limits(HOST_LIMIT), engine=engine)
    # E / L written into DRAM at 100 GB/s: 101,600 / 2 / 1e11 = 5.08e-7 s per layer on top of the DRAM lane
    assert result.lane_layer_s["dram+disk"] - result.lane_layer_s["dram"] == pytest.approx(5.08e-7, rel=1e-9)


def test_nothing_spills_when_the_host_holds_it():
    tiny = load_model("tiny-mixtral")
    spilling = estimate(machine(), tiny, WORKLOAD, POLICY, limits=limits(HOST_NEED + 1000), engine=DISK)
    plain = estimate(machine(), tiny, WORKLOAD, POLICY, limits=limits(HOST_NEED + 1000), engine=IDEAL)
    assert spilling.disk_bytes == 0.0 and spilling.cpu_peak_bytes == pytest.approx(HOST_NEED, rel=1e-12)
    assert spilling.generation_throughput_tok_s == plain.generation_throughput_tok_s
    assert "disk" not in spilling.lane_layer_s


def test_too_little_host_memory_does_not_fit_even_with_disk():
    # only weights spill: the host still needs 601,600 − 294,912 = 306,688 B (staging and KV)
    tiny = load_model("tiny-mixtral")
    result = estimate(machine(), tiny, WORKLOAD, POLICY, limits=limits(300_000.0), engine=DISK)
    assert result.disk_bytes == pytest.approx(SPILLABLE, rel=1e-12)
    assert result.cpu_peak_bytes == pytest.approx(306_688.0, rel=1e-12)
    assert not result.feasible


@pytest.mark.parametrize("hw,engine", [(two_level_machine(), DISK), (machine(), IDEAL)],
                         ids=["no-disk-section", "engine-without-disk"])
def test_no_disk_section_or_capability_never_spills(hw, engine):
    tiny = load_model("tiny-mixtral")
    result = estimate(hw, tiny, WORKLOAD, POLICY, limits=limits(HOST_LIMIT), engine=engine)
    assert result.disk_bytes == 0.0 and result.cpu_peak_bytes == pytest.approx(HOST_NEED, rel=1e-12)
    assert not result.feasible and "disk" not in result.lane_layer_s


def test_disk_profile_fields():
    hw = machine()
    assert hw.disk.write_gbps is None
    assert parse_hardware({**hw.model_dump(mode="json", exclude_none=True),
                           "disk": {"read_gbps": 2.0, "write_gbps": 1.5}}).disk.write_gbps == 1.5
    from hrm.errors import HRMError

    with pytest.raises(HRMError, match="write_gbps"):
        parse_hardware({**hw.model_dump(mode="json", exclude_none=True),
                        "disk": {"read_gbps": 2.0, "write_gbps": 2e6}})
    # the shipped Klotski env 1 profile keeps the hash its plans recorded (write_gbps unset)
    assert load_hardware("rtx3090").sha256() == "da758db367a285177cf9760fb43ad1b63c8615d69fb983c67189121a7b2cd7cc"


def test_klotski_spills_whole_layers_of_experts():
    """Klotski (expert-level pipeline) keeps the last layers' experts on disk once host
    memory is spent, in whole layers: Mixtral-8x22B's layer of experts is
    8 × 3 × 6144 × 16384 × 2 B = 4,831,838,208 B; the spill is the fewest such layers that
    cover the host's excess, read once per pass at the SSD's 1 GB/s."""
    from hrm.cost import costs

    hw, model, wl = load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8)
    layer = 4_831_838_208
    assert costs.layer_expert_bytes(model) == layer
    klotski = load_engine("klotski")
    assert klotski.memory.disk_weights
    best = search(hw, model, wl, engine=klotski, max_batch=64, top=0).best.estimate
    limits_ = memory_limits(hw, ModelOptions())
    need = estimate(hw, model, wl, best.policy, engine=without(klotski, "memory.disk_weights")).cpu_peak_bytes
    layers = round(best.disk_bytes / layer)
    assert layers >= 1 and best.disk_bytes == layers * layer
    assert (layers - 1) * layer < need - limits_.cpu_bytes <= layers * layer  # the fewest whole layers
    assert best.cpu_peak_bytes == pytest.approx(need - layers * layer, rel=1e-12) and best.feasible
    assert best.lane_layer_s["disk"] == pytest.approx(layers * layer / 1e9 / model.num_layers, rel=1e-12)
    assert best.per_token_latency_s >= layers * layer / 1e9  # each step reads them from disk
    with pytest.raises(InfeasibleError):  # without the disk tier Mixtral-8x22B does not fit env 1
        search(hw, model, wl, engine=without(klotski, "memory.disk_weights"), max_batch=64, top=0)


# --- the search: rtx3090 (Klotski env 1: 1 GB/s SSD) with FlexGen, Mixtral-8x7B -------------

@pytest.fixture(scope="module")
def env1():
    return load_hardware("rtx3090"), load_model("mixtral"), make_workload("mtbench", gen_len=8)


def test_search_spills_only_when_host_memory_is_short(env1):
    hw, model, wl = env1
    flexgen = load_engine("flexgen")
    roomy = memory_limits(hw, ModelOptions())
    best = search(hw, model, wl, engine=flexgen, limits=roomy, max_batch=64, top=0).best.estimate
    plain = search(hw, model, wl, engine=without(flexgen, "memory.disk_weights"), limits=roomy, max_batch=64,
                   top=0).best.estimate
    assert best.disk_bytes == 0.0
    assert best.generation_throughput_tok_s == pytest.approx(plain.generation_throughput_tok_s, rel=1e-12)


def test_search_spills_the_least_it_must(env1):
    hw, model, wl = env1
    flexgen = load_engine("flexgen")
    short = memory_limits(hw, ModelOptions(), cpu_mem_gib=64.0)  # 51.2 GiB usable < the 87 GiB of weights
    best = search(hw, model, wl, engine=flexgen, limits=short, max_batch=64, top=0).best.estimate
    need = estimate(hw, model, wl, best.policy, engine=without(flexgen, "memory.disk_weights"), limits=short)
    assert best.disk_bytes > 0
    assert best.disk_bytes == pytest.approx(need.cpu_peak_bytes - short.cpu_bytes, rel=1e-9)
    assert best.cpu_peak_bytes == pytest.approx(short.cpu_bytes, rel=1e-9)
    assert best.lane_layer_s["disk"] == pytest.approx(best.disk_bytes / model.num_layers / 1e9, rel=1e-9)
    with pytest.raises(InfeasibleError):  # the engine without the disk tier cannot run it
        search(hw, model, wl, engine=without(flexgen, "memory.disk_weights"), limits=short, max_batch=64, top=0)
    no_disk = parse_hardware({k: v for k, v in hw.model_dump(mode="json", exclude_none=True).items() if k != "disk"})
    with pytest.raises(InfeasibleError):  # nor a machine without a disk section
        search(no_disk, model, wl, engine=flexgen, limits=short, max_batch=64, top=0)


def test_search_with_disk_is_verified(env1):
    hw, model, wl = env1
    short = memory_limits(hw, ModelOptions(), cpu_mem_gib=64.0)
    result = search(hw, model, wl, engine=DISK, limits=short, max_batch=256, top=0, verify=True)
    assert result.verified and result.best.estimate.disk_bytes > 0


def test_milp_equals_exhaustive_with_disk():
    """Klotski's environment 1 in bf16: Mixtral-8x22B (262 GiB of weights) on 256 GB of host
    memory with a 1 GB/s SSD; the MILP and the enumeration on the same modes agree."""
    hw, model, wl = load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8)
    limits_ = memory_limits(hw, ModelOptions())
    problem = make_problem(hw, model, wl, DISK, ModelOptions(), limits_)
    terms = build_terms(problem, enumerate_modes(DISK, (1, 2, 4, 8, 16, 32, 64)))
    result = milp.solve_dinkelbach(terms, 512, "generation", solver="cbc")
    check = exhaustive(terms, 512, "generation")
    assert result.choice is not None and check.choice is not None
    assert result.objective == pytest.approx(check.objective, rel=1e-3)
    est = estimate(hw, model, wl, choice_to_policy(terms, check.choice), limits=limits_, engine=DISK)
    assert est.feasible and est.disk_bytes > 0
    assert est.generation_throughput_tok_s == pytest.approx(check.objective, rel=1e-6)


def test_explain_shows_the_disk_tier(env1):
    hw, model, wl = env1
    flexgen = load_engine("flexgen")
    short = memory_limits(hw, ModelOptions(), cpu_mem_gib=64.0)
    best = search(hw, model, wl, engine=flexgen, limits=short, max_batch=64, top=0).best.estimate
    report = explain(hw, model, wl, best.policy, flexgen, ModelOptions(), short)
    cost = next(c for c in report.costs if c.mechanism == "memory.disk_weights")
    assert cost.disk_bytes == pytest.approx(best.disk_bytes, rel=1e-12)
    assert cost.cpu_bytes == pytest.approx(-best.disk_bytes, rel=1e-12)  # the host holds that much less
    assert cost.total_s > 0
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(report.table())
    assert "disk" in console.export_text()


def test_flexgen_export_prints_the_disk_share():
    """Mixtral-8x22B on Klotski's env 1: the plan spills, and --percent puts the fewest whole
    tensors on disk that hold the spill (wg + wc < 100)."""
    from hrm.export.exporting import export_plan
    from hrm.export.registry import get_exporter
    from hrm.export.target import Context

    hw, model, wl = load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8)
    plan = search(hw, model, wl, engine=load_engine("flexgen"), max_batch=64, top=0).plan
    assert plan.estimate.disk_bytes > 0
    exported = export_plan(plan, "flexgen")
    flags = {f.flag: f.value.split() for f in exported.flags}
    wg, wc = (int(v) for v in flags["--percent"][:2])
    disk = 100 - wg - wc
    assert disk == disk_percent_for_spill(model, wg, plan.estimate.disk_bytes) > 0
    assert placed_bytes(model, (wg, wc))["layers"]["disk"] >= plan.estimate.disk_bytes
    assert placed_bytes(model, (wg, wc + 1))["layers"]["disk"] < plan.estimate.disk_bytes  # the fewest
    assert any("disk share" in note for note in exported.notes)
    # and FlexGen's command reads back to the same policy (the disk share is a note)
    target = get_exporter("flexgen")
    policy, notes = target.parse(flags,
                                 Context(model=model, workload=plan.workload, hardware=hw))
    assert policy.weights_gpu_ratio == pytest.approx(plan.policy.weights_gpu_ratio, abs=1e-9)
    assert any("on disk" in note for note in notes)


def test_cli_shows_the_disk_tier_and_exits_3_without_it(capsys):
    """Klotski env 1 (rtx3090: 256 GB host, 1 GB/s SSD) with Mixtral-8x22B: FlexGen spills
    and both the search's and the estimate's tables (and --explain) show the disk; an engine
    without the disk tier cannot run it (exit 3, one line)."""
    from conftest import call

    args = ("--hw", "rtx3090", "--model", "mixtral-8x22b", "--gen-len", "8", "--max-batch", "64")
    code, out, err = call(capsys, "search", *args, "--engine", "flexgen")
    assert code == 0 and "disk (weights)" in out and "of weights on disk" in out, err
    code, out, err = call(capsys, "search", *args, "--engine", "moe-lightning")
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1
    code, out, err = call(capsys, "search", "--json", *args, "--engine", "flexgen")
    plan = __import__("json").loads(out)
    assert code == 0 and plan["estimate"]["disk_bytes"] > 0
    short = search(load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8),
                   engine=load_engine("flexgen"), max_batch=64, top=0).best.estimate.policy.short()
    code, out, err = call(capsys, "estimate", "--engine", "ideal", "--hw", "rtx3090", "--model", "mixtral-8x22b", "--gen-len", "8",
                          "--engine", "flexgen", "--policy", short, "--explain")
    assert code == 0 and "disk (weights)" in out and "from disk" in out, err  # the row and the mechanism


def test_runtime_refuses_a_plan_that_spills(capsys, tmp_path):
    """The reference runtime has no disk tier: a plan with weights on disk exits 3, one line."""
    pytest.importorskip("torch")
    from conftest import call

    from hrm.plan import save_plan

    plan = search(load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8),
                  engine=load_engine("flexgen"), max_batch=64, top=0).plan
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    code, out, err = call(capsys, "run", "--plan", path)
    assert code == 3 and len(err.strip().splitlines()) == 1 and "no disk tier" in err


def test_klotski_search_with_disk_is_verified():
    """Klotski's branch and bound (disk read in each candidate's bound and schedule) against
    scheduling every candidate."""
    hw, model, wl = load_hardware("rtx3090"), load_model("mixtral-8x22b"), make_workload("mtbench", gen_len=8)
    result = search(hw, model, wl, engine=load_engine("klotski"), max_batch=16, top=0, verify=True)
    assert result.verified and result.best.estimate.disk_bytes > 0
