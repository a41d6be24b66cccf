"""hrm export --to TARGET re-plans inside the target's space (issue 25, item 2).

A plan made for another engine (or one the target cannot run as it is) is not exported as a
"nearest" policy that exceeds memory or a start-up limit: the export repeats the plan's
search — same hardware, model, workload, objective, latency limits and memory — with each of
the target's HRM engines and prints the best the target expresses exactly. The expected
policies below come from running :func:`solver.search.search` with the target's engines
directly; the limits from the engines' facts tables (docs/engines/*.md)."""

from __future__ import annotations

import shlex

import pytest

import hrm_cli
from hrm.errors import InfeasibleError
from hrm.estimate import estimate
from hrm.export import get_exporter, read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.plan import save_plan
from hrm.workload import make_workload
from solver.retarget import export_for_target
from solver.search import objective_score, search
from solver.lanes.terms import LatencyLimits

#: llama-server's most slots: LLAMA_MAX_SEQ (ggml-org/llama.cpp@0349835b src/llama-cparams.h:7)
LLAMA_MAX_SEQ = 256
#: targets that run the printed policy themselves (MoE-Lightning's server picks its own)
REPLANNING_TARGETS = ("llama.cpp", "vllm", "sglang")


@pytest.fixture(scope="module")
def l4_mixtral():
    return load_hardware("l4"), load_model("mixtral"), make_workload()


@pytest.fixture(scope="module")
def ideal_plan(l4_mixtral):
    hw, model, workload = l4_mixtral
    return search(hw, model, workload, engine="ideal", top=0, hw_name="l4", model_name="mixtral").plan


def best_of_target(target_name: str, hw, model, workload, objective="generation", **kwargs):
    """(score, engine, policy) of the best of the target's engines' own searches."""
    target = get_exporter(target_name)
    results = []
    for name in target.engines:
        best = search(hw, model, workload, engine=name, top=0, objective=objective, **kwargs).best
        results.append((objective_score(best.estimate, objective), name, best.policy))
    return max(results, key=lambda item: item[0])


@pytest.mark.parametrize("target", REPLANNING_TARGETS)
def test_plan_of_another_engine_is_replanned_as_the_targets_own_search(l4_mixtral, ideal_plan, target):
    hw, model, workload = l4_mixtral
    done = export_for_target(ideal_plan, target)
    score, engine, policy = best_of_target(target, hw, model, workload)
    export = done.export
    assert done.replanned and export.replanned and "engine ideal" in done.reason
    assert export.exported_policy == policy and export.estimate_engine == engine
    assert export.exported_throughput_tok_s == pytest.approx(score, rel=1e-9)
    assert export.exported_feasible is True
    # the plan as it was made is reported beside the re-plan, not re-estimated on the target
    assert export.planned_policy == ideal_plan.policy and export.planned_engine == "ideal"
    assert export.planned_throughput_tok_s == pytest.approx(ideal_plan.estimate.generation_throughput_tok_s)
    assert not export.exact and export.differences


@pytest.mark.parametrize("target", REPLANNING_TARGETS)
def test_replanned_command_imports_back_to_the_replanned_policy(l4_mixtral, ideal_plan, target):
    hw, model, workload = l4_mixtral
    export = export_for_target(ideal_plan, target).export
    assert len(export.commands) == 1
    imported = read_command(target, export.commands[0], model, workload, hardware=hw)
    assert imported.policy.batch_size == export.exported_policy.batch_size
    assert imported.policy.attn_on_gpu == export.exported_policy.attn_on_gpu
    assert imported.policy.weights_gpu_ratio == pytest.approx(export.exported_policy.weights_gpu_ratio, abs=1e-9)


def _flags(command: str) -> dict[str, str]:
    tokens = shlex.split(command)
    return {tok: tokens[i + 1] if i + 1 < len(tokens) else "" for i, tok in enumerate(tokens) if tok.startswith("-")}


def test_replanned_commands_hold_the_engines_start_up_limits(ideal_plan):
    """The ideal plan's N=2548 would fail llama-server's start (n_seq_max <= 256) and vLLM's
    (max_num_batched_tokens >= max_num_seqs, vllm/config/scheduler.py:331)."""
    assert ideal_plan.policy.batch_size > LLAMA_MAX_SEQ
    llama = _flags(export_for_target(ideal_plan, "llama.cpp").export.commands[0])
    assert int(llama["-np"]) <= LLAMA_MAX_SEQ
    assert int(llama["-ub"]) <= int(llama.get("-b", "2048"))  # -b default 2048 (common/common.h)
    vllm = _flags(export_for_target(ideal_plan, "vllm").export.commands[0])
    assert int(vllm["--max-num-seqs"]) <= int(vllm["--max-num-batched-tokens"])


def test_plan_of_the_targets_own_engine_is_exported_as_it_is(l4_mixtral):
    hw, model, workload = l4_mixtral
    plan = search(hw, model, workload, engine="llama.cpp", top=0, hw_name="l4", model_name="mixtral").plan
    done = export_for_target(plan, "llama.cpp")
    assert not done.replanned and done.export.exact and done.export.exported_policy == plan.policy
    assert done.export.exported_throughput_tok_s == pytest.approx(plan.estimate.generation_throughput_tok_s)


def test_replan_keeps_the_plans_latency_limit(l4_mixtral):
    """A plan searched under a TPOT limit is re-planned under the same limit: the target's
    search with that limit, not without it."""
    hw, model, workload = l4_mixtral
    limits = LatencyLimits(tpot_s=5.0)  # vLLM on l4: 4.37 s at best, 5.69 s at its unlimited optimum
    plan = search(hw, model, workload, engine="ideal", top=0, latency_limits=limits, objective="generation",
                  hw_name="l4", model_name="mixtral").plan
    assert plan.search.max_tpot_s == 5.0
    export = export_for_target(plan, "vllm").export
    _, _, expected = best_of_target("vllm", hw, model, workload, latency_limits=limits)
    assert export.exported_policy == expected
    assert estimate(hw, model, workload, expected, engine="vllm").per_token_latency_s <= 5.0
    _, _, unlimited = best_of_target("vllm", hw, model, workload)
    assert unlimited != expected  # the limit binds: it was carried over, not dropped


def test_plan_without_recorded_settings_is_replanned_with_the_defaults(l4_mixtral, ideal_plan):
    hw, model, workload = l4_mixtral
    old = ideal_plan.model_copy(update={"search": None})
    assert export_for_target(old, "vllm").export.exported_policy == best_of_target("vllm", hw, model, workload)[2]


def test_nothing_fits_the_target_exits_3(ideal_plan, tmp_path, capsys):
    """The plan's own memory (recorded) too small for any vLLM policy: 1 GiB of GPU memory
    cannot hold Mixtral's non-expert weights (1.6 GB of attention weights alone)."""
    small = ideal_plan.search.model_copy(update={"gpu_limit_bytes": 2**30})
    plan = ideal_plan.model_copy(update={"search": small})
    with pytest.raises(InfeasibleError):
        export_for_target(plan, "vllm")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert hrm_cli.main(["export", str(path), "--to", "vllm"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: vllm: no policy")


def test_server_that_picks_its_own_policy_is_not_replanned(ideal_plan):
    done = export_for_target(ideal_plan, "moe-lightning")
    assert not done.replanned and done.export.server_picks_policy


def test_cli_says_why_and_prints_json(ideal_plan, tmp_path, capsys):
    import json

    path = tmp_path / "plan.json"
    save_plan(ideal_plan, path)
    assert hrm_cli.main(["export", str(path), "--to", "vllm"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("vllm serve ") and "why re-planned: the plan is for engine ideal" in err
    assert hrm_cli.main(["export", str(path), "--to", "vllm", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["replanned"] is True and doc["planned_engine"] == "ideal"
    assert [row["engine"] for row in doc["replan"]["searched"]] == ["vllm"]


def test_replan_starts_from_the_batch_cap_asked_not_the_plans_engine_limit(l4_mixtral):
    """A llama.cpp plan searched at most 256 sequences (its slot limit); the user asked for
    the default cap, so vLLM's re-plan may run more (its best on l4 has N > 256)."""
    hw, model, workload = l4_mixtral
    plan = search(hw, model, workload, engine="llama.cpp", top=0, hw_name="l4", model_name="mixtral").plan
    assert plan.policy.batch_size <= LLAMA_MAX_SEQ and plan.search.max_batch > LLAMA_MAX_SEQ
    export = export_for_target(plan, "vllm").export
    assert export.exported_policy == best_of_target("vllm", hw, model, workload)[2]
    assert export.exported_policy.batch_size > LLAMA_MAX_SEQ


@pytest.mark.parametrize("hw_name", ["l4", "t4"])
def test_flexgen_replan_uses_only_placements_flexgen_makes_on_padded_prompts(hw_name):
    """Issue 25: FlexGen places whole tensors by midpoint and pads every prompt. The re-plan
    searches only the r_w its --percent can produce (cache on the CPU) on the padded workload;
    the printed --percent gives, by the midpoint rule computed by hand (tests/test_export.py),
    exactly the exported GPU share; and it is the best of those pinned searches."""
    import shlex

    from hrm.engines.flexgen import realisable_shares
    from test_export import hand_layer_share

    hw, model = load_hardware(hw_name), load_model("mixtral")
    workload = make_workload()
    plan = search(hw, model, workload, engine="ideal", top=0, hw_name=hw_name, model_name="mixtral").plan
    done = export_for_target(plan, "flexgen")
    export = done.export
    assert done.replanned and export.exported_feasible and export.workload.padding
    assert export.workload.effective_prompt_len == workload.max_prompt_len
    rw = export.exported_policy.weights_gpu_ratio
    assert any(abs(rw - s) < 1e-12 for s in realisable_shares(model, "layers"))
    words = shlex.split(export.commands[0])
    wg = int(words[words.index("--percent") + 1])
    assert hand_layer_share(wg) == pytest.approx(rw, abs=1e-12)
    padded = make_workload(padding=True)
    best = max((search(hw, model, padded, engine=engine, top=0,
                       fixed={"weights_gpu_ratio": share, "kv_gpu_ratio": 0.0}).best
                for engine in ("flexgen", "flexgen-cpu-attn") for share in realisable_shares(model, "layers")
                if _fits_some(hw, model, padded, engine, share)),
               key=lambda c: c.estimate.generation_throughput_tok_s)
    assert export.exported_policy == best.policy
    assert export.exported_throughput_tok_s == pytest.approx(best.estimate.generation_throughput_tok_s, rel=1e-9)


def _fits_some(hw, model, workload, engine, share) -> bool:
    from hrm.errors import HRMError

    try:
        search(hw, model, workload, engine=engine, top=0, fixed={"weights_gpu_ratio": share, "kv_gpu_ratio": 0.0})
    except HRMError:
        return False
    return True
