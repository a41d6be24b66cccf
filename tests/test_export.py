"""hrm export / hrm import (issue 15): plans as real engines' command lines, and back.

Round trips (export then import gives the exported policy) over plans from the search and
hand-built policies; every produced flag has a documented source and matches its documented
form; plans an engine cannot express are exported with the nearest policy, re-estimated,
and the difference stated; bad flags are refused in one line with exit 2."""

from __future__ import annotations

import json
import math
import re
import shlex

import pytest

import hrm_cli
from hrm.engine import load_engine
from hrm.errors import HRMError
from hrm.export import (EXPORTERS, Context, export_plan, export_policy, fix_pins, import_command, import_flags,
                        policy_space)
from hrm.hardware import load_hardware
from hrm.model import load_model
from hrm.plan import save_plan
from hrm.policy import parse_policy
from hrm.workload import make_workload
from solver.search import search

CASES = [("l4", "mixtral"), ("t4", "olmoe"), ("l4", "qwen1.5-moe-a2.7b"), ("t4", "deepseek-v2-lite")]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Real plans from the search (engine ideal and two shipped engines), saved to files."""
    out = {}
    folder = tmp_path_factory.mktemp("plans")
    for hw_name, model_name in CASES:
        hw, model = load_hardware(hw_name), load_model(model_name)
        for engine in ("ideal", "moe-lightning"):
            result = search(hw, model, make_workload(), top=0, engine=engine, hw_name=hw_name, model_name=model_name)
            path = folder / f"{hw_name}-{model_name}-{engine}.json"
            save_plan(result.plan, path)
            out[(hw_name, model_name, engine)] = (result.plan, path)
    return out


def flags_of(export) -> str:
    """The flags of every command of an export (program words dropped), as one string."""
    target = EXPORTERS[export.engine]
    words = []
    for program, command in zip(target.programs, export.commands):
        words += shlex.split(command)[len(program.split()):]
    return shlex.join(words)


def same_fields(a, b, fields) -> bool:
    for key in fields:
        x, y = getattr(a, key), getattr(b, key)
        if isinstance(x, float) and not math.isclose(x, y, abs_tol=1e-9):
            return False
        if not isinstance(x, float) and x != y:
            return False
    return True


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_round_trip_over_searched_plans(plans, engine):
    target = EXPORTERS[engine]
    for (hw_name, model_name, _), (plan, _) in plans.items():
        export = export_plan(plan, engine)
        hw, model = load_hardware(hw_name), load_model(model_name)
        back = import_flags(engine, flags_of(export), model, plan.workload, hw)
        assert same_fields(back, export.exported_policy, target.expressed_fields), (engine, hw_name, model_name,
                                                                                   back.short(), export.exported_policy.short())
        # a policy the engine can express exports unchanged
        reading = load_engine("flexgen") if engine == "flexgen" else None  # the exported r_w's own reading
        again = export_policy(engine, export.exported_policy, Context(model=model, workload=plan.workload, hardware=hw),
                              plan_engine=reading)
        assert same_fields(again.exported_policy, export.exported_policy, target.expressed_fields)


HAND_BUILT = {  # policies each engine can express exactly (mixtral-8x7b: 32 layers, 8 experts) on l4
    "flexgen": ["N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0.25,rc=0.5", "N=96,mu=32,n=3,attn=cpu,ffn=gpu,rw=0.07,rc=0"],
    "moe-lightning": ["N=256,mu=32,n=8,attn=cpu,ffn=gpu,rw=0,rc=0", "N=36,mu=36,n=1,attn=cpu,ffn=gpu,rw=0.125,rc=0"],
    "llama.cpp": ["N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0.25,rc=1", "N=8,mu=8,n=1,attn=cpu,ffn=gpu,rw=0,rc=0",
                  "N=32,mu=8,n=4,attn=cpu,ffn=gpu,rw=1,rc=0"],
    "vllm": ["N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"],
    "sglang": ["N=32,mu=32,n=1,attn=gpu,ffn=gpu,rw=0.25,rc=1", "N=4,mu=4,n=1,attn=gpu,ffn=cpu,rw=0,rc=1"],
}


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_round_trip_hand_built(engine):
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    ctx = Context(model=model, workload=workload, hardware=hw)
    reading = load_engine("flexgen") if engine == "flexgen" else None  # flexgen's r_w: a share of all weights
    for text in HAND_BUILT[engine]:
        policy = parse_policy(text)
        export = export_policy(engine, policy, ctx, hw=hw, plan_engine=reading)
        assert export.exact and export.exported_policy == policy and not export.differences, (engine, text)
        back = import_flags(engine, flags_of(export), model, workload, hw)
        assert same_fields(back, policy, EXPORTERS[engine].expressed_fields), (engine, text, back.short())


def test_llama_cpp_counts_dense_blocks_and_reads_ot():
    """--n-cpu-moe N names blocks 0..N-1, dense first blocks included (DeepSeek); -ot regexes
    are matched against the expert tensor names of every block."""
    model, workload = load_model("deepseek-v2-lite"), make_workload()
    ctx = Context(model=model, workload=workload)
    policy = parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=0.5,rc=1")  # 13 of 26 MoE layers on the CPU
    export = export_policy("llama.cpp", policy, ctx)
    values = {f.flag: f.value for f in export.flags}
    assert values["--n-cpu-moe"] == str(13 + model.first_dense_layers)
    ot = r"blk\.([1-9]|1[0-3])\.ffn_(up|down|gate)_exps=CPU"  # blocks 1..13: the same 13 MoE layers
    back = import_flags("llama.cpp", f"-np 16 -ub 16 -ot '{ot}'", model, workload)
    assert back.weights_gpu_ratio == pytest.approx(0.5)
    # every layer's experts on the CPU: under HRM's llama.cpp engines (one ubatch) that is
    # ffn=gpu with r_w = 0, KV on the GPU (llama.cpp) or in host memory (-nkvo: llama.cpp-nkvo);
    # with several ubatches (the plan's engine) it is ffn=cpu
    every = import_flags("llama.cpp", "-np 16 -ub 16 -cmoe", model, workload)
    assert (every.ffn_on_gpu, every.weights_gpu_ratio, every.attn_on_gpu) == (True, 0.0, True)
    nkvo = import_flags("llama.cpp", "-np 16 -ub 16 -cmoe -nkvo", model, workload)
    assert (nkvo.ffn_on_gpu, nkvo.attn_on_gpu, nkvo.kv_gpu_ratio) == (True, False, 0.0)
    assert import_flags("llama.cpp", "-np 16 -ub 8 -cmoe", model, workload).ffn_on_gpu is False


def check_documented_form(engine, flag_tokens):
    """Every token produced for a flag matches the form its table row documents."""
    target = EXPORTERS[engine]
    for flag, tokens in flag_tokens.items():
        spec = target.spec(flag)
        assert spec.source and spec.checked_against, (engine, flag)
        if flag == "--percent":
            numbers = [int(t) for t in tokens]
            assert len(numbers) == 6 and all(0 <= x <= 100 for x in numbers)
            assert numbers[0] + numbers[1] == numbers[2] + numbers[3] == numbers[4] + numbers[5] == 100
        else:
            assert len(tokens) == spec.values, (engine, flag, tokens)
        for token in tokens:
            assert re.fullmatch(spec.value_form, token), (engine, flag, token, spec.value_form)


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_exported_flags_have_the_documented_syntax(plans, engine):
    target = EXPORTERS[engine]
    for spec in target.flags:  # the table: every flag with a version and a file:line (or a named form)
        assert target.version in spec.checked_against
        assert re.search(r"\.(py|cpp|h):\d+", spec.source) or "(" in spec.source, (engine, spec.flag, spec.source)
    for (hw_name, model_name, _), (plan, _) in plans.items():
        export = export_plan(plan, engine)
        ctx = Context(model=load_model(model_name), workload=plan.workload, hardware=load_hardware(hw_name))
        check_documented_form(engine, target.render(export.exported_policy, ctx))
        words = [w for c in export.commands for w in shlex.split(c)]
        for value in export.flags:
            assert value.flag in words


@pytest.mark.parametrize("engine", ["flexgen", "llama.cpp", "vllm", "sglang", "moe-lightning"])
def test_nearest_policy_is_stated_and_re_estimated(plans, engine):
    plan, path = plans[("l4", "mixtral", "ideal")]  # attn=cpu, n > 1, rw not whole: no target expresses it exactly
    export = export_plan(plan, engine)
    assert not export.exact and export.differences
    assert export.exported_policy != export.planned_policy
    assert export.estimate_engine and export.exported_throughput_tok_s > 0 and export.planned_throughput_tok_s > 0
    doc = export.to_json()
    assert doc["planned_policy"] == plan.policy.short() and doc["exported_policy"] == export.exported_policy.short()


def test_cli_export_text_and_json(plans, capsys):
    _, path = plans[("l4", "mixtral", "ideal")]
    assert hrm_cli.main(["export", str(path), "--to", "llama.cpp"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("llama-server ") and "--n-cpu-moe" in out
    assert "cannot express" in err and "tok/s" in err
    assert hrm_cli.main(["export", str(path), "--to", "flexgen", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["flag"]: row for row in doc["flags"]}
    assert rows["--percent"]["checked_against"].startswith("FMInference/FlexLLMGen@")
    assert rows["--percent"]["source"].startswith("flexllmgen/flex_opt.py:")
    assert doc["differences"] and doc["exported_throughput_tok_s"] > 0


def test_cli_import_json(capsys):
    code = hrm_cli.main(["import", "--from", "flexgen", "--gpu-batch-size 32 --num-gpu-batches 4 --percent 10 90 0 100 "
                         "100 0 --cpu-cache-compute", "--hw", "l4", "--model", "mixtral", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["policy_short"] == "N=128,mu=32,n=4,attn=cpu,ffn=gpu,rw=0.1,rc=0"
    assert doc["engine"] == "flexgen-cpu-attn" and doc["estimate"]["generation_throughput_tok_s"] > 0


BAD_FLAGS = [
    ("llama.cpp", "-np 64 --bogus 3", "--bogus"),
    ("llama.cpp", "-np 64 -ub", "-ub"),
    ("llama.cpp", "-np abc", "-np"),
    ("llama.cpp", "-np 0", "-np"),
    ("llama.cpp", "-np 64 -ub 24", "-ub"),
    ("llama.cpp", "-ngl 10", "-ngl"),
    ("llama.cpp", "-np 8 -ot 'blk\\.(0=CPU'", "-ot"),
    ("flexgen", "--percent 10 80 0 100 100 0", "--percent"),
    ("flexgen", "--percent 10 90 0 100", "--percent"),
    ("flexgen", "--percent 10 90 50 50 100 0 --cpu-cache-compute", "--cpu-cache-compute"),
    ("flexgen", "--gpu-batch-size 1e400", "--gpu-batch-size"),
    ("vllm", "--max-num-seqs 8 --cpu-offload-gb nan", "--cpu-offload-gb"),
    ("vllm", "--max-num-seqs 8 --cpu-offload-gb inf", "--cpu-offload-gb"),
    ("vllm", "--max-num-seqs 8 -tp 4", "-tp"),
    ("vllm", "--max-num-seqs 8 --gpu-memory-utilization 1.5", "--gpu-memory-utilization"),
    ("sglang", "--max-running-requests 8 --kt-num-gpu-experts 9", "--kt-num-gpu-experts"),
    ("sglang", "--max-running-requests 8 --kt-num-gpu-experts -1", "--kt-num-gpu-experts"),
    ("moe-lightning", "--ubs 8", "--n-ub"),
    ("moe-lightning", "--ubs 8 --n-ub 4 --n-ub 5", "--n-ub"),
    ("vllm", "--max-num-seqs '8", "flags"),
]


@pytest.mark.parametrize("engine,text,needle", BAD_FLAGS)
def test_bad_flags_refused_in_one_line(capsys, engine, text, needle):
    code = hrm_cli.main(["import", "--from", engine, text, "--hw", "l4", "--model", "mixtral"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_unknown_target_engine(plans, capsys):
    _, path = plans[("l4", "mixtral", "ideal")]
    with pytest.raises(SystemExit) as exc:  # argparse's choices: one line, exit 2
        hrm_cli.main(["export", str(path), "--to", "tgi"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    with pytest.raises(HRMError, match="unknown target engine"):
        import_command("tgi", "", load_model("mixtral"), make_workload())


def test_hrm_search_export_flexgen_end_to_end(capsys):
    assert hrm_cli.main(["search", "--hw", "t4", "--model", "olmoe", "--top", "0", "--export", "flexgen"]) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("python -m flexllmgen.flex_opt"))
    back = import_flags("flexgen", command, load_model("olmoe"), make_workload(), load_hardware("t4"))
    assert "--percent" in command and back.batch_size > 0
    assert hrm_cli.main(["search", "--hw", "t4", "--model", "olmoe", "--top", "0", "--export", "flexgen", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["export"]["engine"] == "flexgen" and doc["plan"]["policy"]["batch_size"] > 0


def test_flexgen_percent_is_a_share_of_every_weight():
    """A plan's r_w shares the routed experts (engine ideal); FlexGen's wg shares every layer
    weight: the export keeps the offloaded bytes, (1 - r_w) x experts = (1 - wg) x all
    (Mixtral-8x7B in fp16, the bytes by hand below)."""
    from hrm import costs
    from hrm.export import all_weights_ratio

    model, workload = load_model("mixtral"), make_workload()
    experts = 32 * 8 * 3 * 4096 * 14336 * 2  # layers x experts x (w1, w2, w3) x h1 x h2 x fp16
    others = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 8 * 4096 + 2 * 4096) * 2  # q,k,v,o + router + 2 norms
    assert costs.total_expert_bytes(model) == experts
    for rw in (0.0, 0.25, 0.9):
        policy = parse_policy(f"N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw={rw},rc=0.5")
        wg = 1 - (1 - rw) * experts / (experts + others)
        assert all_weights_ratio(policy, Context(model=model, workload=workload)) == pytest.approx(wg, rel=1e-12)
        assert all_weights_ratio(policy, Context(model=model, workload=workload, rw_reads="all")) == rw
        export = export_policy("flexgen", policy, Context(model=model, workload=workload))
        percent = int({f.flag: f.value.split() for f in export.flags}["--percent"][0])
        assert percent in (math.floor(100 * wg), math.ceil(100 * wg))
        assert rw > 0 or percent >= 1  # the non-expert weights stay on the GPU: not r_w = 0 copied
        assert export.exported_policy.weights_gpu_ratio == percent / 100


# --- the policy space of a target: its HRM engines' engine files ---------------------------

#: what each target's engine files (or, for vllm and sglang, its own stated space) pin
EXPECTED_PINS = {"flexgen": "ffn=gpu", "moe-lightning": "ffn=gpu", "llama.cpp": "ffn=gpu n=1",
                 "vllm": "attn=gpu rc=1 ffn=gpu n=1", "sglang": "attn=gpu rc=1 n=1"}


def tier(on_gpu: bool) -> str:
    return "gpu" if on_gpu else "cpu"


def in_space(policy, space) -> bool:
    """``policy`` runs inside an engine's ``policy:`` block (tiers, fixed values)."""
    return (tier(policy.attn_on_gpu) in space.attention and tier(policy.ffn_on_gpu) in space.ffn
            and all(math.isclose(getattr(policy, key), value) for key, value in space.fixed.items()))


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_fix_pins_are_what_the_engine_files_allow(engine):
    """A target's --fix pins are the policy fields every one of its HRM engines' files allows
    one value of (rc=0 under attn=cpu, rw=0 under ffn=cpu left out: the policy rules imply
    them); the pins parse as hrm-search --fix and agree with each engine's own space."""
    from hrm_cli.search import parse_fix

    target = EXPORTERS[engine]
    pins = fix_pins(target)
    assert pins == EXPECTED_PINS[engine]
    fixed = parse_fix(pins.split())
    spaces = [load_engine(name).policy for name in target.engines] or [target.policy]
    for space in spaces:
        if "attn_on_gpu" in fixed:
            assert space.attention == (tier(fixed["attn_on_gpu"]),)
        if "ffn_on_gpu" in fixed:
            assert space.ffn == (tier(fixed["ffn_on_gpu"]),)
        for key in ("num_micro_batches", "weights_gpu_ratio", "kv_gpu_ratio"):
            if key in fixed:
                assert space.fixed[key] == fixed[key], (engine, key)
    union = policy_space(target)
    assert set(union.attention) == {t for s in spaces for t in s.attention}
    assert set(union.ffn) == {t for s in spaces for t in s.ffn}


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_exported_policies_lie_in_the_engine_files_space(engine):
    """Every policy a target exports is one its HRM engine (named by hrm_engine, one of its
    engines) runs; several llama.cpp ubatches, estimated with the plan's engine, are outside."""
    target = EXPORTERS[engine]
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    ctx = Context(model=model, workload=workload, hardware=hw)
    texts = [t for texts in HAND_BUILT.values() for t in texts] + ["N=32,mu=8,n=4,attn=cpu,ffn=cpu,rw=0,rc=0"]
    for text in texts:
        exported = export_policy(engine, parse_policy(text), ctx).exported_policy
        name = target.hrm_engine(exported) if target.hrm_engine else None
        if target.engines and name is None:
            assert engine == "llama.cpp" and exported.num_micro_batches > 1
            continue
        space = load_engine(name).policy if name else target.policy
        assert name is None or name in target.engines
        assert in_space(exported, space), (engine, text, exported.short())


def test_cli_warning_names_the_fix_pins(plans, capsys):
    """An exported policy over a memory limit: the warning gives the target's --fix pins."""
    _, path = plans[("l4", "mixtral", "ideal")]
    assert hrm_cli.main(["export", str(path), "--to", "vllm"]) == 0
    err = capsys.readouterr().err
    assert "exceeds a memory limit" in err and "hrm-search ... --fix attn=gpu rc=1 ffn=gpu n=1" in err
