"""Issue 32 (the GPU-side mechanisms) and issue 35 (FlexGen plans FlexGen runs), by hand.

- FlexGen's flags that choose a mechanism are data of its engine files (``flags``): what
  ``hrm import`` of a command estimates is the mechanism the command runs;
- ``--cpu-cache-compute`` is a policy dimension: ``--engine flexgen`` searches both
  attention tiers, its plan exports as it is (r_w at a midpoint level, r_c at whole rows);
- a measured ``dispatch`` is its owner's (the reference runtime's) alone;
- eager per-op costs, the pageable copy and the host-DRAM lane have named, sourced values.

Every expected number is derived here from the engine's source facts or the profile's own
fields, not read back from the code under test.
"""

from __future__ import annotations

import shlex

import pytest
import yaml

import hrm_cli
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.lane import RESOURCES
from hrm.cost.latency.lanes import schedule_lanes
from hrm.cost.latency.transfers import dram_bytes_s, weight_transfer_s
from hrm.machine.achieved import achieved_rates
from hrm.engines.engine import load_engine
from hrm.engines.mechanisms import flag_engine
from hrm.estimate import estimate
from hrm.export.importing import read_command
from hrm.engines.flexgen import realisable_cache_shares
from hrm.machine.hardware import load_hardware, parse_hardware
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.policy import parse_policy
from hrm.machine.rates import rates_from_profile
from hrm.units import GB
from hrm.workload import make_workload
from solver.search import search

H100 = "docs/validation/h100-measured.yaml"
# Mixtral-8x7B (hrm/data/models/mixtral-8x7b.json): hidden, KV width, expert width, experts
H, H_KV, H2, E = 4096, 1024, 14336, 8
#: one decoder layer's fp16 bytes as FlexGen lists them (docs/engines/flexgen.md §3)
LAYER_BYTES = 2 * ((H + H * H + 2 * H_KV * H + H * H + H) + (E * H + E * 2 * H2 * H + E * H * H2))
COMMAND = ("python -m flexgen.flex_moe --model mistralai/Mixtral-8x7B-v0.1 --gpu-batch-size 64 "
           "--num-gpu-batches 4 --percent 0 100 100 0 100 0 --prompt-len 128 --gen-len 16")


def _imported(extra: str):
    return read_command("flexgen", f"{COMMAND} {extra}", load_model("mixtral"), make_workload(),
                        load_hardware(H100))


# --- flags as data ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,fields", [
    ("", {}),
    ("--pin-weight 0", {}),
    ("--pin-weight", {"decode.weight_path": "pinned", "prefill.weight_path": "pinned"}),   # const=True
    ("--pin-weight TRUE", {"decode.weight_path": "pinned", "prefill.weight_path": "pinned"}),
    ("--overlap f", {"schedule": "sequential", "prefill.weights_overlap": "none", "sync": "none"}),
    ("--sep-layer no", {"launches.syncs": 1, "memory.gpu_weight_buffer_layers": 2,
                        "prefill.weights_overlap": "one-micro-batch"}),
    ("--sep-layer 1 --overlap yes", {}),
])
def test_mechanism_flags_set_the_engine_fields_the_source_says(extra, fields):
    # flex_moe.py:1368-1385 (str2bool, const True), :105/:146 pin_memory=policy.pin_weight,
    # :916-919 generation_loop_normal, :625-629 TransformerLayer without sep_layer
    assert _imported(extra).engine_fields == fields


def test_pinned_weights_move_at_the_pinned_rate():
    """--pin-weight 1: one layer of weights (r_w = 0) crosses at the profile's pinned 55.17 GB/s;
    without it FlexGen relays each tensor through pin_memory(), a copy by every core (the
    profile's all-threads memcpy, 56.75 GB/s) and then the DMA, in turn: 1 / (1/56.75 + 1/55.17)
    = 27.97 GB/s, not the driver's one-thread pageable 14.13 GB/s (docs/validation/h100-measured.yaml;
    measured on the lent H100 box: docs/validation/ground_truth.md §3)."""
    hw, model = load_hardware(H100), load_model("mixtral")
    rates = rates_from_profile(hw, ModelOptions().for_model(model), "flexgen")
    pinned, _ = flag_engine(load_engine("flexgen"), {"--pin-weight": "true"})
    unpinned = load_engine("flexgen")
    assert weight_transfer_s(rates, pinned, pinned.decode.weight_path, LAYER_BYTES)["h2d"] == \
        pytest.approx(LAYER_BYTES / (55.17 * GB), rel=1e-12)
    assert weight_transfer_s(rates, unpinned, unpinned.decode.weight_path, LAYER_BYTES)["h2d"] == \
        pytest.approx(LAYER_BYTES * (1 / (56.75 * GB) + 1 / (55.17 * GB)), rel=1e-12)


def test_no_overlap_is_one_serial_lane():
    """--overlap false: every resource's work of a layer in one lane, their sum."""
    hw, model = load_hardware(H100), load_model("mixtral")
    rates = rates_from_profile(hw, ModelOptions().for_model(model), "flexgen")
    serial, _ = flag_engine(load_engine("flexgen"), {"--overlap": "false"})
    res = decode_resources(model, rates, 64, 200, 1.0, 1.0, True, serial)
    lanes = schedule_lanes(res, serial, rates.shared_unit)
    tasks = [res[r] for r in res if r in RESOURCES]
    total = sum(float(t.per_micro_batch_s) for t in tasks)
    assert float(lanes[0].per_micro_batch_s) == pytest.approx(total, rel=1e-12)


def test_sep_layer_false_buffers_a_second_layer():
    """--sep-layer false: the GPU holds the layer computing and the whole next one loading:
    one more layer of offloaded weights (r_w = 0: every byte of the layer) than with blocks."""
    hw, model = load_hardware(H100), load_model("mixtral")
    policy = parse_policy("N=64,mu=64,attn=gpu,ffn=gpu,rw=0,rc=1")
    wl = make_workload(prompt_len=128, max_prompt_len=128, gen_len=16, padding=True)
    blocks = estimate(hw, model, wl, policy, engine="flexgen")
    layers = estimate(hw, model, wl, policy, engine=flag_engine(load_engine("flexgen"), {"--sep-layer": "false"})[0])
    assert layers.gpu_peak_bytes - blocks.gpu_peak_bytes == pytest.approx(LAYER_BYTES, rel=1e-9)


def test_cli_import_notes_the_modelled_mechanism(capsys):
    assert hrm_cli.main(["import", "--from", "flexgen", "--hw", H100, "--model", "mixtral",
                         f"{COMMAND} --pin-weight 1"]) == 0
    err = capsys.readouterr().err
    assert "--pin-weight true" in err and "decode.weight_path: pinned" in err


def test_a_flag_naming_no_engine_field_is_refused_in_one_line(tmp_path, capsys):
    text = (load_engine.__globals__["ENGINES_DIR"] / "flexgen.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("when_true: {decode.weight_path: pinned", "when_true: {decode.weight_pth: pinned"))
    code = hrm_cli.main(["estimate", "--hw", "l4", "--model", "mixtral", "--engine", str(bad),
                         "--policy", "N=64,mu=64,attn=gpu,ffn=gpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "bad.yaml" in err[0] and "decode.weight_pth" in err[0], err


# --- FlexGen's policy space: both attention tiers, whole KV rows, midpoint levels ------------------

def test_cache_rows_by_hand():
    """moe_pytorch_backend.py:779-801: GPU rows = int(μ·nkv·cg/100) rounded down to a multiple of
    the 32 query heads; μ = 10: 80 rows -> 0, 32, 64 or all 80 -> r_c 0, 0.4, 0.8, 1; μ = 3:
    24 rows, fewer than 32 -> none or all."""
    model = load_model("mixtral")
    assert realisable_cache_shares(model, 10) == (0.0, 0.4, 0.8, 1.0)
    assert realisable_cache_shares(model, 3) == (0.0, 1.0)


@pytest.fixture(scope="module")
def l4_searches():
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload(padding=True, gen_len=32)
    both = search(hw, model, wl, engine="flexgen", top=0, hw_name="l4", model_name="mixtral")
    gpu = search(hw, model, wl, engine="flexgen", top=0, fixed={"attn_on_gpu": True}, hw_name="l4",
                 model_name="mixtral")
    cpu = search(hw, model, wl, engine="flexgen-cpu-attn", top=0)
    return model, both, gpu, cpu


def test_flexgen_searches_both_attention_tiers(l4_searches):
    _, both, gpu, cpu = l4_searches
    best = max(gpu.best.estimate.generation_throughput_tok_s, cpu.best.estimate.generation_throughput_tok_s)
    assert both.best.estimate.generation_throughput_tok_s == pytest.approx(best, rel=1e-12)
    winner = "flexgen" if gpu.best.estimate.generation_throughput_tok_s >= best else "flexgen-cpu-attn"
    assert both.plan.engine == winner
    assert any("both attention tiers searched" in n for n in both.stats.notes)


def test_an_estimate_of_cpu_attention_under_flexgen_is_flexgen_cpu_attn():
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload(padding=True, gen_len=32)
    policy = parse_policy("N=256,mu=64,attn=cpu,ffn=gpu,rw=0,rc=0")
    got = estimate(hw, model, wl, policy, engine="flexgen")
    want = estimate(hw, model, wl, policy, engine="flexgen-cpu-attn")
    assert got.generation_throughput_tok_s == want.generation_throughput_tok_s and got.schedule == "flexgen-cpu-attn"


def test_gpu_attention_plan_keeps_whole_rows_and_exports_as_planned(l4_searches, tmp_path, capsys):
    model, _, gpu, _ = l4_searches
    policy = gpu.best.policy
    assert policy.attn_on_gpu
    assert any(abs(policy.kv_gpu_ratio - s) < 1e-12 for s in realisable_cache_shares(model, policy.micro_batch_size))
    from hrm.plan import save_plan

    path = tmp_path / "plan.json"
    save_plan(gpu.plan, path)
    assert hrm_cli.main(["export", str(path), "--to", "flexgen"]) == 0
    out, err = capsys.readouterr()
    assert out.endswith("\n") and "re-planned" not in err, err
    words = shlex.split(out)
    assert words[words.index("--gpu-batch-size") + 1] == str(policy.micro_batch_size)
    assert words[words.index("--num-gpu-batches") + 1] == str(policy.num_micro_batches)
    cg = int(words[words.index("--percent") + 3])
    rows = policy.micro_batch_size * 8  # μ·nkv rows, GPU rows a multiple of 32 query heads
    gpu_rows = rows if cg == 100 else int(rows * cg / 100) // 32 * 32
    assert gpu_rows / rows == pytest.approx(policy.kv_gpu_ratio, abs=1e-12)


@pytest.mark.parametrize("hw_name", ["a100-80g"])
def test_a_midpoint_level_is_planned_exactly(hw_name):
    """r_w of a FlexGen plan is one of the midpoint rule's placements itself (not the whole
    expert count nearest to it): --percent reproduces it."""
    from test_export import hand_layer_share

    hw, model = load_hardware(hw_name), load_model("mixtral")
    result = search(hw, model, make_workload(padding=True, gen_len=32), engine="flexgen-cpu-attn", top=0,
                    fixed={"weights_gpu_ratio": hand_layer_share(21)})
    assert result.best.policy.weights_gpu_ratio == pytest.approx(hand_layer_share(21), abs=1e-15)


# --- whose dispatch ----------------------------------------------------------------------------

def test_the_runtime_dispatch_is_charged_to_the_runtime_alone():
    """h100-measured's dispatch was measured on the reference runtime (its methods say so; no
    owner field: a measured profile's reads as hrm-runtime). FlexGen pays its counted launches at
    8 us per op and 20 us per sync instead."""
    hw, model = load_hardware(H100), load_model("mixtral")
    opts = ModelOptions().for_model(model)
    assert "reference runtime" in hw.source.methods["gpu.dispatch.task_s"] and hw.gpu.dispatch.owner is None
    runtime = rates_from_profile(hw, opts, "hrm-runtime")
    assert runtime.gpu_dispatch == hw.gpu.dispatch and runtime.op_costs is None
    flexgen = rates_from_profile(hw, opts, "flexgen")
    assert flexgen.gpu_dispatch is None and flexgen.cpu_dispatch is None
    assert (flexgen.op_costs.gpu_op_s, flexgen.op_costs.cpu_op_s, flexgen.op_costs.sync_bubble_s) == (8e-6, 2e-6, 20e-6)
    # all on the GPU, one micro-batch of 64: the host issues 24 kernels + 9 allocations + 2 copies
    # + vLLM's 3 ops as eager calls, 2 Triton launches, and waits out 2 syncs per layer
    # (flexgen.yaml launches, docs/engines/op_counts.md §2), and no runtime α anywhere
    res = decode_resources(model, flexgen, 64, 200, 1.0, 1.0, True, load_engine("flexgen"))
    host = 8e-6 * (24 + 9 + 2 + 3) + 91e-6 * 2 + 20e-6 * 2
    assert float(res["host"].per_micro_batch_s) == pytest.approx(host, rel=1e-12)


def _profile_data(**dispatch) -> dict:
    return {"name": "hand", "source": {"kind": "measured"},
            "gpu": {"name": "g", "memory_gib": 16, "memory_bandwidth_gbps": 100, "tflops": {"fp32": 10},
                    "dispatch": {"task_s": 1e-4, **dispatch}},
            "cpu": {"name": "c", "cores": 4, "memory_gib": 64, "memory_bandwidth_gbps": 100, "tflops": {"fp32": 1}},
            "link": {"h2d_gbps": 10, "d2h_gbps": 10}}


def test_an_owner_names_whose_dispatch_and_keeps_old_hashes():
    opts = ModelOptions().for_model(load_model("mixtral"))
    own = parse_hardware(_profile_data(owner="flexgen"))
    assert rates_from_profile(own, opts, "flexgen").gpu_dispatch is not None
    assert rates_from_profile(own, opts, "hrm-runtime").gpu_dispatch is None
    hand = parse_hardware({**_profile_data(), "source": {"kind": "datasheet"}})  # a hand-set α: everyone's
    assert rates_from_profile(hand, opts, "flexgen").gpu_dispatch is not None
    unset = parse_hardware(_profile_data())
    assert unset.sha256() == parse_hardware(_profile_data(owner=None)).sha256() != own.sha256()


def test_bad_owner_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(_profile_data(owner="../runtime")))
    assert hrm_cli.main(["estimate", "--engine", "ideal", "--hw", str(path), "--model", "mixtral", "--policy", "N=8,mu=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "owner" in err[0], err


def test_a_profiles_measured_op_costs_and_the_options_override():
    data = _profile_data()
    data["gpu"].pop("dispatch")
    data["gpu"].update(eager_op_s=1.1e-5, sync_bubble_s=3e-5)
    data["cpu"]["eager_op_s"] = 3e-6
    hw, opts = parse_hardware(data), ModelOptions().for_model(load_model("mixtral"))
    got = rates_from_profile(hw, opts, "flexgen").op_costs
    assert (got.gpu_op_s, got.cpu_op_s, got.sync_bubble_s) == (1.1e-5, 3e-6, 3e-5)
    over = rates_from_profile(hw, opts.model_copy(update={"eager_gpu_op_s": 5e-6}), "flexgen").op_costs
    assert over.gpu_op_s == 5e-6 and over.sync_bubble_s == 3e-5


# --- pageable copies and host DRAM -------------------------------------------------------------

def test_pageable_default_is_one_staging_thread_then_the_dma():
    """t4.yaml has pinned 9.7 GB/s and no memcpy measurement (10 GB/s default):
    1 / (1/9.7 + 1/10) GB/s."""
    ach = achieved_rates(load_hardware("t4"))
    assert ach.h2d_pageable_bytes_s == pytest.approx(GB / (1 / 9.7 + 1 / 10), rel=1e-12)
    assert ach.d2h_pageable_bytes_s == pytest.approx(GB / (1 / 11.1 + 1 / 10), rel=1e-12)


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_the_pageable_rule_lies_inside_the_measured_boxes(name):
    """On the project's measured boxes the rule (their pinned H2D and one-thread memcpy) falls
    between the 1 GiB point and the best point of their own measured pageable curve."""
    import re

    hw = load_hardware(f"docs/validation/{name}-measured.yaml")
    points = [float(v) for v in re.findall(r"MiB: ([0-9.]+) GB/s", hw.source.methods["link.h2d_pageable_gbps_vs_bytes"])]
    rule = 1 / (1 / hw.link.h2d_gbps + 1 / hw.cpu.memcpy_one_thread_gbps)
    assert points[-1] < rule < max(points)


def test_host_dram_lane_uses_the_measured_traffic():
    """h100-measured: cpu.dram_gbps 105.8 (its own STREAM copy), not the 35.75 triad."""
    hw = load_hardware(H100)
    rates = rates_from_profile(hw, ModelOptions().for_model(load_model("mixtral")), "flexgen")
    assert dram_bytes_s(rates) == pytest.approx(105.8 * GB)
    assert hw.cpu.memory_bandwidth_gbps == 35.75


def test_the_verifier_certifies_a_row_granular_kv_plan():
    """--verify on FlexGen with GPU attention: the enumeration (largest whole-row z, the exact
    midpoint level) agrees with the search; the MILP's continuous z is not FlexGen's space."""
    result = search(load_hardware("l4"), load_model("mixtral"), make_workload(padding=True, gen_len=16),
                    engine="flexgen", fixed={"attn_on_gpu": True}, verify=True, top=0)
    assert result.verified and result.best.policy.attn_on_gpu
