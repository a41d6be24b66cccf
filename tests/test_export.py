"""hrm export / hrm import (issues 15, 25): plans as real engines' command lines, and back.

Round trips (export then import gives the policy the printed command runs, on the workload
it runs) over plans from the search and hand-built policies; every produced flag has a
documented source and matches its documented form; a target that cannot run a plan refuses
it in one line naming why, and the reasons are the facts of docs/engines/*.md (FlexGen: a
Mixtral entry point on one GPU, prompts padded to --prompt-len; MoE-Lightning: Mixtral and
DBRX, the server's own pick; vLLM and SGLang: no CPU attention); a command's own workload
defines its import's estimate; bad flags are refused in one line with exit 2."""

from __future__ import annotations

import io
import json
import math
import re
import shlex

import pytest

import hrm_cli
from hrm.engines.engine import load_engine
from hrm.errors import HRMError, InfeasibleError
from hrm.estimate import estimate
from hrm.export import (EXPORTERS, Context, export_plan, export_policy, fix_pins, import_command, import_flags,
                        policy_space, read_command)
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.engines.moe_lightning import ServerFlags, server_choice
from hrm.plan import save_plan
from hrm.policy import parse_policy
from hrm.workload import Workload, make_workload
from hrm_cli.export import report_differences
from solver.search import search

CASES = [("l4", "mixtral"), ("t4", "olmoe"), ("l4", "qwen1.5-moe-a2.7b"), ("t4", "deepseek-v2-lite")]
#: the engines each CASE is planned with: the ideal machine, the seed's engine, and the two
#: serving engines whose targets run one forward pass per step
CASE_ENGINES = ("ideal", "moe-lightning", "vllm", "sglang")
#: FlexGen plans as FlexGen runs them (flexgen.md §3-4): prompts padded, whole-tensor
#: placement wg = 0 (r_w = 0 of every layer weight), cache on the CPU
FLEXGEN_PLANS = {"flexgen": {"weights_gpu_ratio": 0.0, "kv_gpu_ratio": 0.0, "attn_on_gpu": True},
                 "flexgen-cpu-attn": {"weights_gpu_ratio": 0.0, "attn_on_gpu": False}}
#: the plans each target's round trip is checked over (by the planning engine); FlexGen's
#: refusals of unpadded plans are derived by hand for CPU-attention plans only (below)
PLANS_FOR = {"flexgen": ("ideal", "moe-lightning", *FLEXGEN_PLANS)}

# Mixtral-8x7B's config.json (hrm/data/models): the sizes the hand computations below use
H, H_KV, H2, E, LAYERS, VOCAB, HEAD_DIM = 4096, 1024, 14336, 8, 32, 32000, 128
#: FlexGen's two weight lists of one decoder layer, in elements (flexgen.md §3: SelfAttention
#: [input_layernorm, q, k, v, o, post_attention_layernorm], MoEMLP [gate, ws = w1‖w3, w2s])
MIXTRAL_LISTS = ((H, H * H, H_KV * H, H_KV * H, H * H, H), (E * H, E * 2 * H2 * H, E * H * H2))


def hand_gpu_elements(wg: int, lists=MIXTRAL_LISTS) -> tuple[int, int]:
    """(layer elements, expert elements) FlexGen puts on the GPU under ``--percent wg 100-wg
    ...``: each whole tensor on the tier of its cumulative-size midpoint (in percent of its
    list); with no disk the CPU holds it iff 100 - wg > midpoint (get_choice,
    flex_moe.py:79-98, 130-139)."""
    on = experts = 0
    for sizes in lists:
        total, cum = sum(sizes), 0
        for i, size in enumerate(sizes):
            cum += size
            if not 100 - wg > 100 * (cum - size / 2) / total:
                on += size
                experts += size if sizes is lists[1] and i > 0 else 0
    return on, experts


def hand_layer_share(wg: int) -> float:
    return hand_gpu_elements(wg)[0] / sum(sum(sizes) for sizes in MIXTRAL_LISTS)


def hand_expert_share(wg: int) -> float:
    return hand_gpu_elements(wg)[1] / sum(MIXTRAL_LISTS[1][1:])


def hand_padded_bytes(batch: int, workload) -> int:
    """Bytes FlexGen holds for a Mixtral batch with every prompt padded (flexgen.md §4): the KV
    cache of max_prompt_len + gen_len tokens per sequence (fp16 K and V of every layer) and
    every weight (nothing on disk in HRM's export)."""
    kv = batch * (workload.max_prompt_len + workload.gen_len) * LAYERS * 2 * H_KV * 2
    layer = sum(sum(sizes) for sizes in MIXTRAL_LISTS)
    return kv + 2 * (LAYERS * layer + 2 * VOCAB * H + H)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Real plans from the search, saved to files: every CASE under CASE_ENGINES, FlexGen's own
    plans for l4 Mixtral (padded), and a two-GPU plan."""
    out = {}
    folder = tmp_path_factory.mktemp("plans")
    runs = [(hw, m, e, make_workload(), None) for hw, m in CASES for e in CASE_ENGINES]
    runs += [("l4", "mixtral", e, make_workload(padding=True), fixed) for e, fixed in FLEXGEN_PLANS.items()]
    runs.append(("2xt4", "mixtral", "ideal", make_workload(), None))
    for hw_name, model_name, engine, workload, fixed in runs:
        hw, model = load_hardware(hw_name), load_model(model_name)
        result = search(hw, model, workload, top=0, engine=engine, fixed=fixed, hw_name=hw_name, model_name=model_name)
        path = folder / f"{hw_name}-{model_name}-{engine}.json"
        save_plan(result.plan, path)
        out[(hw_name, model_name, engine)] = (result.plan, path)
    return out


def same_fields(a, b, fields) -> bool:
    for key in fields:
        x, y = getattr(a, key), getattr(b, key)
        if isinstance(x, float) and not math.isclose(x, y, abs_tol=1e-9):
            return False
        if not isinstance(x, float) and x != y:
            return False
    return True


def expected_refusal(engine: str, hw, model, plan):
    """(error type, words of its line) a target refuses ``plan`` with, from the facts docs;
    None: the target runs it."""
    if engine == "flexgen":
        if "mixtral" not in model.name:
            return HRMError, "Mixtral"  # flexgen.md §1: flex_moe builds MixtralLM only
        if hw.gpu.count > 1:
            return HRMError, "dist_flex_moe"  # §6: several GPUs are a pipeline-parallel launch
        if not plan.workload.padding:  # §4, and by hand: padded, the batch does not fit the machine
            assert hand_padded_bytes(plan.policy.batch_size, plan.workload) > (hw.gpu.memory_gib + hw.cpu.memory_gib) * 2**30
            return InfeasibleError, f"--prompt-len {plan.workload.max_prompt_len}"
    if engine == "moe-lightning" and not any(family in model.name for family in ("mixtral", "dbrx")):
        return HRMError, "Mixtral and DBRX only"  # moe_lightning.md §2 --model-path, §6
    if engine in ("vllm", "sglang") and not plan.policy.attn_on_gpu:
        return HRMError, "attention on the CPU"  # vllm.md §8, sglang.md §6
    return None


def checked_plans(plans, engine):
    """(hw, model, plan, export or None, refusal) of every plan checked against ``engine``;
    each refusal is asserted to be the one the facts predict, in one line of its own type."""
    out = []
    for (hw_name, model_name, planned_with), (plan, _) in plans.items():
        if planned_with not in PLANS_FOR.get(engine, (planned_with,)):
            continue
        hw, model = load_hardware(hw_name), load_model(model_name)
        refusal = expected_refusal(engine, hw, model, plan)
        if refusal is None:
            out.append((hw, model, plan, export_plan(plan, engine)))
            continue
        with pytest.raises(HRMError) as exc:
            export_plan(plan, engine)
        kind, needle = refusal
        line = str(exc.value)
        assert type(exc.value) is kind and needle in line and "\n" not in line, (engine, hw_name, model_name, line)
    return out


@pytest.fixture(scope="module")
def exports(plans):
    """``checked_plans`` of a target, computed once per target for the tests that read them."""
    done: dict = {}

    def of(engine):
        if engine not in done:
            done[engine] = checked_plans(plans, engine)
        return done[engine]

    return of


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_round_trip_over_searched_plans(exports, engine):
    """Export, then import the printed commands as a user pastes them: the policy and the
    workload the export predicted for come back; the exported policy exports unchanged."""
    target = EXPORTERS[engine]
    exported = exports(engine)
    assert exported, engine  # every target runs some of the plans
    for hw, model, plan, export in exported:
        back = read_command(engine, "\n".join(export.commands), model, plan.workload, hw)
        assert same_fields(back.policy, export.exported_policy, target.expressed_fields), (
            engine, hw.name, model.name, back.policy.short(), export.exported_policy.short())
        assert back.workload == export.workload, (engine, back.workload, export.workload)
        reading = load_engine("flexgen") if engine == "flexgen" else None  # the exported r_w's own reading
        again = export_policy(engine, export.exported_policy, Context(model=model, workload=plan.workload, hardware=hw),
                              plan_engine=reading)
        assert same_fields(again.exported_policy, export.exported_policy, target.expressed_fields)


HAND_BUILT = {  # policies each engine runs exactly (mixtral-8x7b: 32 layers, 8 experts) on l4
    # wg 0, and wg 1-16 (only post_attention_layernorm on the GPU, by hand); rc 0.5: 64 of
    # 128 cache rows of a micro-batch of 16, a multiple of the 32 query heads (flexgen.md §5)
    "flexgen": ["N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0,rc=0.5",
                f"N=96,mu=32,n=3,attn=cpu,ffn=gpu,rw={hand_layer_share(1)!r},rc=0"],
    "llama.cpp": ["N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0.25,rc=1", "N=8,mu=8,n=1,attn=cpu,ffn=gpu,rw=0,rc=0",
                  "N=32,mu=8,n=4,attn=cpu,ffn=gpu,rw=1,rc=0"],
    # whole layers of experts on the GPU (vllm.md §3): 28 of 32, and all
    "vllm": ["N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=1,rc=1", "N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=0.875,rc=1"],
    # k of 8 experts per layer on the GPU, k = 0: every expert on the CPU (sglang.md §3)
    "sglang": ["N=32,mu=32,n=1,attn=gpu,ffn=gpu,rw=0.25,rc=1", "N=4,mu=4,n=1,attn=gpu,ffn=gpu,rw=0,rc=1"],
}


@pytest.mark.parametrize("engine", list(HAND_BUILT))
def test_round_trip_hand_built(engine):
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    ctx = Context(model=model, workload=workload, hardware=hw)
    reading = load_engine("flexgen") if engine == "flexgen" else None  # flexgen's r_w: a share of all weights
    for text in HAND_BUILT[engine]:
        policy = parse_policy(text)
        export = export_policy(engine, policy, ctx, hw=hw, plan_engine=reading)
        assert export.exact and export.exported_policy == policy and not export.differences, (engine, text)
        back = import_flags(engine, "\n".join(export.commands), model, workload, hw)
        assert same_fields(back, policy, EXPORTERS[engine].expressed_fields), (engine, text, back.short())


def test_vllm_offloads_whole_layers_of_experts_by_hand():
    """r_w = 28/32: the experts of 4 layers offloaded, 4 x 8 x 3 x 4096 x 14336 x 2 bytes =
    10.5 GiB (vllm.md §3: --cpu-offload-gb rounded down to 0.01, --cpu-offload-params experts)."""
    ctx = Context(model=load_model("mixtral"), workload=make_workload(), hardware=load_hardware("l4"))
    export = export_policy("vllm", parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=0.875,rc=1"), ctx)
    values = {f.flag: f.value for f in export.flags}
    assert values["--cpu-offload-gb"] == f"{4 * E * 3 * H * H2 * 2 / 2**30:.2f}" == "10.50"
    assert values["--cpu-offload-params"] == "experts"


def test_sglang_runs_cpu_experts_as_k_gpu_experts():
    """SGLang's policy space (sglang.yaml, kt_ep_wrapper.py:99-125): experts 0..k-1 of every
    layer on the GPU, the rest on the CPU; ffn=cpu is k = 0, stated as a difference."""
    hw, model = load_hardware("l4"), load_model("mixtral")
    export = export_policy("sglang", parse_policy("N=4,mu=4,n=1,attn=gpu,ffn=cpu,rw=0,rc=1"),
                           Context(model=model, workload=make_workload(), hardware=hw), hw=hw)
    values = {f.flag: f.value for f in export.flags}
    assert values["--kt-num-gpu-experts"] == "0" and values["--kt-method"] == "BF16"
    assert not export.exact and export.differences == ("ffn cpu -> gpu",)
    assert (export.exported_policy.ffn_on_gpu, export.exported_policy.weights_gpu_ratio) == (True, 0.0)


def test_moe_lightning_exports_the_servers_pick_whatever_the_plan():
    """The server runs its optimizer's pick for the flags it plans from (moe_lightning.md §4):
    the workload's lengths and, on an L4, the CPU bandwidth in GiB/s (107.4 GB/s = 100.0 GiB/s).
    Every planned policy exports that pick, exact only when it is the pick; the printed pair
    imports back as it."""
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    pick = server_choice(hw, model, workload, ServerFlags(cpu_mem_bdw_gib_s=round(107.4e9 / 2**30, 1))).policy
    ctx = Context(model=model, workload=workload, hardware=hw)
    for policy in (pick, parse_policy("N=256,mu=32,n=8,attn=cpu,ffn=gpu,rw=0,rc=0"),
                   parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=1,rc=1")):
        export = export_policy("moe-lightning", policy, ctx, hw=hw)
        assert export.server_picks_policy and export.exported_policy == pick
        assert export.exact == (policy == pick) and bool(export.differences) == (policy != pick)
        assert "--cpu-mem-bdw 100.0" in export.commands[0]
        assert import_flags("moe-lightning", "\n".join(export.commands), model, workload, hw) == pick


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
        if flag == "--percent":  # six integers, no disk (wg + wc = cg + cc = 100), one activation tier
            numbers = [int(t) for t in tokens]
            assert len(numbers) == 6 and all(0 <= x <= 100 for x in numbers)
            assert numbers[0] + numbers[1] == numbers[2] + numbers[3] == 100 and 100 in numbers[4:]
        else:
            assert len(tokens) == spec.values, (engine, flag, tokens)
        for token in tokens:
            assert re.fullmatch(spec.value_form, token), (engine, flag, token, spec.value_form)


def check_engine_facts(engine, export, plan):
    """What each engine's facts doc says its command must hold (start-up limits, programs)."""
    values = {f.flag: f.value for f in export.flags}
    if engine == "flexgen":  # flexgen.md §1 (the MoE entry point), §4 (every prompt padded to the longest)
        assert export.commands[0].startswith("python -m flexgen.flex_moe ")
        assert int(values["--prompt-len"]) == plan.workload.max_prompt_len
        assert int(values["--gen-len"]) == plan.workload.gen_len
    if engine == "moe-lightning":  # moe_lightning.md §1, §3: bench.py from its folder, --max-new-tokens = --gen-len
        assert export.commands[1].startswith("cd benchmarks/mtbench && python bench.py ")
        assert values["--max-new-tokens"] == values["--gen-len"] == str(plan.workload.gen_len)
    if engine == "vllm":  # vllm.md §4: scheduler.py:331 refuses max_num_batched_tokens < max_num_seqs
        assert int(values["--max-num-seqs"]) <= int(values["--max-num-batched-tokens"])
    if engine == "sglang":  # sglang.md §3-4: never the default AMXINT4 nor --cpu-offload-gb
        assert values.get("--kt-method", "BF16") == "BF16" and "--cpu-offload-gb" not in values


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_exported_flags_have_the_documented_syntax(exports, engine):
    target = EXPORTERS[engine]
    for spec in target.flags:  # the table: every flag with a version and a file:line (or a named form)
        assert target.version in spec.checked_against
        assert re.search(r"\.(py|cpp|h):\d+", spec.source) or "(" in spec.source, (engine, spec.flag, spec.source)
    for hw, model, plan, export in exports(engine):
        ctx = Context(model=model, workload=plan.workload, hardware=hw)
        check_documented_form(engine, target.render(export.exported_policy, ctx))
        check_engine_facts(engine, export, plan)
        words = [w for c in export.commands for w in shlex.split(c)]
        for value in export.flags:
            assert value.flag in words


def near_export(plans, engine):
    """An export of a plan ``engine`` runs but not exactly as planned."""
    if engine == "flexgen":  # rw 0.25 of every layer weight is no placement FlexGen makes (flexgen.md §3)
        hw = load_hardware("l4")
        return export_policy("flexgen", parse_policy("N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0.25,rc=0.5"),
                             Context(model=load_model("mixtral"), workload=make_workload(padding=True), hardware=hw),
                             hw=hw, plan_engine=load_engine("flexgen"))
    key = ("l4", "mixtral", "flexgen" if engine in ("vllm", "sglang") else "ideal")  # GPU attention for those
    return export_plan(plans[key][0], engine)


@pytest.mark.parametrize("engine", list(EXPORTERS))
def test_nearest_policy_is_stated_and_re_estimated(plans, engine):
    export = near_export(plans, engine)
    assert not export.exact and export.differences
    assert export.exported_policy != export.planned_policy
    assert export.estimate_engine and export.exported_throughput_tok_s > 0 and export.planned_throughput_tok_s > 0
    assert export.server_picks_policy == (engine == "moe-lightning")
    doc = export.to_json()
    assert doc["planned_policy"] == export.planned_policy.short()
    assert doc["exported_policy"] == export.exported_policy.short()


@pytest.mark.parametrize("key,engine,needle,code", [
    (("t4", "olmoe", "ideal"), "flexgen", "runs Mixtral models only", 2),  # flexgen.md §1
    (("2xt4", "mixtral", "ideal"), "flexgen", "dist_flex_moe", 2),  # §6
    (("t4", "deepseek-v2-lite", "moe-lightning"), "moe-lightning", "Mixtral and DBRX only", 2),
    (("l4", "qwen1.5-moe-a2.7b", "ideal"), "moe-lightning", "Mixtral and DBRX only", 2),
])
def test_cli_export_refuses_in_one_line(plans, capsys, key, engine, needle, code):
    _, path = plans[key]
    assert hrm_cli.main(["export", str(path), "--to", engine]) == code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_cli_export_text_and_json(plans, capsys):
    _, path = plans[("l4", "mixtral", "ideal")]
    assert hrm_cli.main(["export", str(path), "--to", "llama.cpp"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("llama-server ") and "--n-cpu-moe" in out
    # an ideal plan is re-planned inside llama.cpp's space (tests/test_export_replan.py)
    assert "re-planned inside llama.cpp's policy space" in err and "tok/s" in err
    plan, path = plans[("l4", "mixtral", "flexgen")]
    assert hrm_cli.main(["export", str(path), "--to", "flexgen", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["flag"]: row for row in doc["flags"]}
    # flexgen.md: the fork's flex_moe at a80c8d15, --percent at flexgen/flex_moe.py:1359-1367
    assert doc["commands"][0].startswith("python -m flexgen.flex_moe ")
    assert rows["--percent"]["checked_against"].startswith("lynnliu030/FlexGen@a80c8d15")
    assert rows["--percent"]["source"].startswith("flexgen/flex_moe.py:1359")
    assert rows["--prompt-len"]["value"] == "418" and doc["workload"]["padding"] is True
    assert doc["exact"] and not doc["differences"] and doc["exported_feasible"] is True
    assert doc["exported_throughput_tok_s"] == pytest.approx(plan.estimate.generation_throughput_tok_s)


def test_cli_import_json(capsys):
    """--percent 10: wg 1-16 puts only post_attention_layernorm on the GPU, none of the experts
    (by hand: flexgen.md §3), not r_w = 0.1; no --gen-len: flex_moe's default 32 (:1352), every
    prompt padded."""
    code = hrm_cli.main(["import", "--from", "flexgen", "--gpu-batch-size 32 --num-gpu-batches 4 --percent 10 90 0 100 "
                         "100 0 --cpu-cache-compute", "--hw", "l4", "--model", "mixtral", "--json"])
    doc = json.loads(capsys.readouterr().out)
    policy = doc["policy"]
    assert code == 0 and doc["engine"] == "flexgen-cpu-attn" and doc["estimate"]["generation_throughput_tok_s"] > 0
    assert (policy["batch_size"], policy["micro_batch_size"], policy["attn_on_gpu"]) == (128, 32, False)
    assert policy["weights_gpu_ratio"] == pytest.approx(H / sum(sum(s) for s in MIXTRAL_LISTS), rel=1e-12)
    assert hand_expert_share(10) == 0 and policy["kv_gpu_ratio"] == 0
    assert (doc["workload"]["gen_len"], doc["workload"]["max_prompt_len"], doc["workload"]["padding"]) == (32, 418, True)


# --- the command's own workload defines the estimate ---------------------------------------

FLEXGEN_CMD = "--gpu-batch-size 8 --percent 0 100 0 100 100 0 --prompt-len 256 --gen-len 64"
ML_SERVER = ("python -m fastmoe.serve.launch_server --model-path mistralai/Mixtral-8x7B-Instruct-v0.1 "
             "--cpu-mem-bdw 100 --avg-prompt-len 418 --gen-len 256")  # benchmarks/mtbench/launch_server.sh:2


def run_import(capsys, engine, command, *extra):
    code = hrm_cli.main(["import", "--from", engine, command, "--hw", "l4", "--model", "mixtral", "--json", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


@pytest.mark.parametrize("engine,command,extra,expected", [
    # FlexGen pads every prompt to --prompt-len (flexgen.md §4), the average kept from hrm's workload
    ("flexgen", FLEXGEN_CMD, (), Workload(prompt_len=77, max_prompt_len=256, gen_len=64, padding=True)),
    ("flexgen", FLEXGEN_CMD, ("--gen-len", "64", "--max-prompt-len", "256"),
     Workload(prompt_len=77, max_prompt_len=256, gen_len=64, padding=True)),
    # the server plans for --avg-prompt-len/--gen-len; bench.py never pads (moe_lightning.md §1)
    ("moe-lightning", ML_SERVER, (), Workload(prompt_len=418, max_prompt_len=418, gen_len=256, padding=False)),
    # vLLM's --max-model-len bounds the workload: 300 + 128 <= 512 runs hrm's (vllm.md §5)
    ("vllm", "vllm serve MODEL --max-num-seqs 8 --max-model-len 512", ("--max-prompt-len", "300"),
     Workload(prompt_len=77, max_prompt_len=300, gen_len=128)),
])
def test_import_estimates_the_commands_workload(capsys, engine, command, extra, expected):
    code, doc, _ = run_import(capsys, engine, command, *extra)
    assert code in (0, 3) and Workload(**doc["workload"]) == expected
    policy = import_command(engine, command, load_model("mixtral"), expected, load_hardware("l4"))[0]
    by_hand = estimate(load_hardware("l4"), load_model("mixtral"), expected, policy, engine=doc["engine"])
    assert doc["estimate"]["generation_throughput_tok_s"] == pytest.approx(by_hand.generation_throughput_tok_s)


@pytest.mark.parametrize("engine,command,extra,needle", [
    ("flexgen", FLEXGEN_CMD, ("--gen-len", "128"), "--gen-len 128"),
    ("flexgen", FLEXGEN_CMD, ("--max-prompt-len", "418"), "--max-prompt-len 418"),
    ("flexgen", "--percent 0 100 0 100 100 0", ("--gen-len", "128"), "--gen-len 128"),  # flex_moe's default is 32
    ("flexgen", FLEXGEN_CMD, ("--workload", "summarization"), "--prompt-len 1693"),  # a preset names every length
    ("moe-lightning", ML_SERVER, ("--prompt-len", "77"), "--prompt-len 77"),
    ("moe-lightning", ML_SERVER, ("--padding",), "--padding"),
    ("vllm", "vllm serve MODEL --max-num-seqs 8 --max-model-len 512", (), "--max-model-len 512"),  # 418 + 128 > 512
    ("sglang", "--max-running-requests 8 --context-length 512", (), "--context-length 512"),
])
def test_import_workload_conflicts_are_refused_in_one_line(capsys, engine, command, extra, needle):
    code, doc, err = run_import(capsys, engine, command, *extra)
    lines = err.strip().splitlines()
    assert code == 2 and doc is None and len(lines) == 1 and needle in lines[0], err


def test_export_prediction_is_for_the_workload_the_target_runs():
    """FlexGen pads every prompt to --prompt-len (flexgen.md §4): an unpadded plan's export is
    predicted with padded prompts, and says so; vLLM pads nothing (vllm.md §5)."""
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    ctx = Context(model=model, workload=workload, hardware=hw)
    policy = parse_policy("N=8,mu=8,n=1,attn=gpu,ffn=gpu,rw=0,rc=0")
    export = export_policy("flexgen", policy, ctx, hw=hw, plan_engine=load_engine("flexgen"))
    from hrm.engines.mechanisms import with_fields

    padded = make_workload(padding=True)
    expected = estimate(hw, model, padded, policy, engine="flexgen").generation_throughput_tok_s
    # the flexgen engine pads by itself (pads_prompts); switched off, it would not
    assert estimate(hw, model, workload, policy, engine="flexgen").generation_throughput_tok_s == pytest.approx(expected)
    no_padding = with_fields(load_engine("flexgen"), {"pads_prompts": False})
    unpadded = estimate(hw, model, workload, policy, engine=no_padding).generation_throughput_tok_s
    assert export.exported_throughput_tok_s == pytest.approx(expected) != pytest.approx(unpadded)
    assert export.workload == padded and any("padded" in note for note in export.notes)
    other = export_policy("vllm", parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=0,rc=1"), ctx, hw=hw)
    assert other.workload == workload and not other.notes


# --- what the CLI says about an export -----------------------------------------------------

@pytest.mark.parametrize("hw_name,gen,needle", [
    ("a100-80g", 128, "does not recognise this GPU"),  # moe_lightning.md §4: utils.py:60-61
    ("t4", 32, "4 batches tie"),  # §4 ties: the solver's rounding picks one
    ("l4", 128, "aborts"),  # §5: prompts beyond the batch are aborted
])
def test_moe_lightning_notes_reach_the_output(hw_name, gen, needle):
    hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload(gen_len=gen)
    export = export_policy("moe-lightning", parse_policy("N=64,mu=16,n=4,attn=cpu,ffn=gpu,rw=0,rc=0"),
                           Context(model=model, workload=workload, hardware=hw), hw=hw)
    client = dict(zip(*[iter(shlex.split(export.commands[1])[5:])] * 2))
    sent = 80 * (int(client["--ubs"]) * int(client["--n-ub"]) // 80)  # bench.py:27-30
    aborted = sent - export.exported_policy.batch_size
    assert aborted >= 0 and any(f"aborts {aborted}" in n for n in export.notes) == (aborted > 0)
    stream = io.StringIO()
    report_differences(export, stream)
    text = stream.getvalue()
    assert needle in text and all(line.startswith(("note:", "warning:")) for line in text.splitlines())
    assert "cannot express" not in text and "nearest" not in text and "--fix" not in text


def test_cli_moe_lightning_export_says_the_server_runs_its_own_pick(plans, capsys):
    plan, path = plans[("l4", "mixtral", "ideal")]
    assert hrm_cli.main(["export", str(path), "--to", "moe-lightning"]) == 0
    err = capsys.readouterr().err
    pick = server_choice(load_hardware("l4"), load_model("mixtral"), plan.workload,
                         ServerFlags(cpu_mem_bdw_gib_s=100.0)).policy
    assert "picks its own policy" in err and pick.short() in err and plan.policy.short() in err
    assert "cannot express" not in err and "nearest" not in err and "--fix" not in err


def test_cli_warning_names_the_fix_pins():
    """An exported policy over a memory limit: the warning gives the target's --fix pins. Every
    expert on an L4: 32 x 8 x 3 x 4096 x 14336 x 2 bytes = 84 GiB on 22.35 GiB (by hand)."""
    hw = load_hardware("l4")
    assert LAYERS * E * 3 * H * H2 * 2 > hw.gpu.memory_gib * 2**30
    export = export_policy("vllm", parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"),
                           Context(model=load_model("mixtral"), workload=make_workload(), hardware=hw), hw=hw)
    stream = io.StringIO()
    report_differences(export, stream)
    text = stream.getvalue()
    assert export.exact and export.exported_feasible is False
    assert "exceeds physical memory" in text and "hrm-search ... --fix attn=gpu rc=1 ffn=gpu n=1" in text


BAD_FLAGS = [
    ("llama.cpp", "-np 64 --bogus 3", "--bogus"),
    ("llama.cpp", "-np 64 -ub", "-ub"),
    ("llama.cpp", "-np abc", "-np"),
    ("llama.cpp", "-np 0", "-np"),
    ("llama.cpp", "-np 64 -ub 24", "-ub"),
    ("llama.cpp", "-ngl 10", "-ngl"),
    ("llama.cpp", "-np 8 -ot 'blk\\.(0=CPU'", "-ot"),
    ("flexgen", "--percent 10 80 50 40 100 0", "--percent"),  # a cache share on disk
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
    """A FlexGen plan made as FlexGen runs it (padded, wg 0) exports flex_moe's command and
    imports back; a model flex_moe cannot build is refused before anything is printed."""
    args = ["search", "--hw", "l4", "--model", "mixtral", "--engine", "flexgen", "--padding", "--fix", "rw=0", "rc=0",
            "--top", "0", "--export", "flexgen"]
    assert hrm_cli.main(args) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("python -m flexgen.flex_moe "))
    back = import_flags("flexgen", command, load_model("mixtral"), make_workload(padding=True), load_hardware("l4"))
    assert "--percent 0 100 0 100 100 0" in command and back.batch_size > 0 and back.weights_gpu_ratio == 0
    assert hrm_cli.main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["export"]["engine"] == "flexgen" and doc["plan"]["policy"]["batch_size"] == back.batch_size
    assert hrm_cli.main(["search", "--hw", "t4", "--model", "olmoe", "--top", "0", "--export", "flexgen"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Mixtral" in err and len(err.strip().splitlines()) == 1


def test_flexgen_percent_is_a_share_of_every_weight():
    """A plan's r_w shares the routed experts (engine ideal); FlexGen's wg places every layer
    weight, whole tensors by midpoint (flexgen.md §3): the export keeps the GPU bytes as a share
    of the layer, (1 - r_w) x experts = (1 - share) x all, and prints the wg of the largest
    placement FlexGen makes at or below it (the nearest below, without a machine to rank them)."""
    from hrm.cost import costs
    from hrm.export import all_weights_ratio

    model, workload = load_model("mixtral"), make_workload()
    experts = LAYERS * E * 3 * H * H2 * 2  # layers x experts x (w1, w2, w3) x h1 x h2 x fp16
    others = LAYERS * (H * (H + 2 * H_KV + H) + E * H + 2 * H) * 2  # q,k,v,o + router + 2 norms
    assert costs.total_expert_bytes(model) == experts
    realisable = sorted({hand_layer_share(wg) for wg in range(101)})
    for rw in (0.0, 0.25, 0.9):
        policy = parse_policy(f"N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw={rw},rc=0.5")
        share = 1 - (1 - rw) * experts / (experts + others)
        assert all_weights_ratio(policy, Context(model=model, workload=workload)) == pytest.approx(share, rel=1e-12)
        assert all_weights_ratio(policy, Context(model=model, workload=workload, rw_reads="all")) == rw
        export = export_policy("flexgen", policy, Context(model=model, workload=workload))
        percent = int({f.flag: f.value.split() for f in export.flags}["--percent"][0])
        assert export.exported_policy.weights_gpu_ratio == pytest.approx(hand_layer_share(percent), abs=1e-15)
        assert hand_layer_share(percent) == max(s for s in realisable if s <= share)
        assert rw > 0 or hand_expert_share(percent) == 0  # r_w = 0: none of the experts on the GPU


# --- the policy space of a target: its HRM engines' engine files ---------------------------

#: what each target's engine files pin: MoE-Lightning's optimizer fixes attention on the CPU
#: (moe-lightning.yaml: optimizer.py:17); SGLang computes every expert on the GPU or, with
#: kTransformers, k of them (sglang.yaml ffn [gpu], r_w = k/E)
EXPECTED_PINS = {"flexgen": "ffn=gpu", "moe-lightning": "attn=cpu ffn=gpu", "llama.cpp": "ffn=gpu n=1",
                 "vllm": "attn=gpu rc=1 ffn=gpu n=1", "sglang": "attn=gpu rc=1 ffn=gpu n=1"}


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
    engines) runs; several llama.cpp ubatches, estimated with the plan's engine, are outside;
    vLLM and SGLang refuse CPU attention. FlexGen's space without a machine (no fit to check),
    MoE-Lightning's with one (the server's pick needs its GPU)."""
    target = EXPORTERS[engine]
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    ctx = Context(model=model, workload=workload, hardware=None if engine == "flexgen" else hw)
    texts = [t for texts in HAND_BUILT.values() for t in texts] + ["N=32,mu=8,n=4,attn=cpu,ffn=cpu,rw=0,rc=0"]
    for text in texts:
        policy = parse_policy(text)
        if engine in ("vllm", "sglang") and not policy.attn_on_gpu:
            with pytest.raises(HRMError, match="cannot run attention on the CPU"):
                export_policy(engine, policy, ctx)
            continue
        exported = export_policy(engine, policy, ctx).exported_policy
        name = target.hrm_engine(exported) if target.hrm_engine else None
        if target.engines and name is None:
            assert engine == "llama.cpp" and exported.num_micro_batches > 1
            continue
        space = load_engine(name).policy if name else target.policy
        assert name is None or name in target.engines
        assert in_space(exported, space), (engine, text, exported.short())


@pytest.mark.parametrize("name,full_layers", [("gpt-oss-20b", 12), ("mixtral-8x7b", 32)])
def test_llama_cpp_slot_padding_counts_only_full_layers(name, full_layers):
    """A KV stream per slot pads each slot's context to 256 tokens, and the llama.cpp engines' memory
    counts it (memory.kv_tokens_multiple); a sliding-window layer (gpt-oss: 12 of 24, window 128) keeps
    at most its window either way, so only the full layers' KV grows (the estimate's KV function,
    hrm.cost.memory.kv_cache_bytes). 4 slots of 1000 + 100 tokens: -c 4400 -> 4608 -> 1152 a slot ->
    1280, 180 tokens more a slot than the plan's; the export's note says so."""
    from hrm.cost.memory import kv_bytes_per_sequence
    from hrm.engines.engine import load_engine
    from hrm.export.llama_cpp import _notes

    model = load_model(name)
    workload = make_workload(prompt_len=1000, gen_len=100)
    per_token = 2 * model.num_kv_heads * model.head_dim * 2  # K and V, fp16, one layer
    for engine in ("llama.cpp", "llama.cpp-nkvo"):
        grown = kv_bytes_per_sequence(model, workload, load_engine(engine)) - kv_bytes_per_sequence(model, workload)
        assert grown == pytest.approx(full_layers * 180 * per_token, rel=1e-12), engine
    notes = _notes(parse_policy("N=4,mu=4,n=1,attn=cpu,ffn=gpu,rw=1,rc=0"), Context(model=model, workload=workload))
    assert "padded to 1280 tokens" in notes[0] and "holds 5120 tokens, 1.16x the plan's 4 x 1100" in notes[0]


def test_llama_cpp_import_pads_each_slot_unless_the_slots_share_one_stream():
    """hrm import: -np N alone is a KV stream per slot, padded to 256 (memory.kv_tokens_multiple 256,
    src/llama-context.cpp:295-305); -kvu (or no -np: auto slots, unified) is one stream, unpadded per
    sequence (1); the estimate's GPU memory differs by the padding, N x the full layers' extra cells."""
    from hrm.cost.memory import kv_bytes_per_sequence
    from hrm.estimate import estimate
    from hrm.export.importing import imported_engine, read_command

    hw, model = load_hardware("l4"), load_model("mixtral")
    workload = make_workload(prompt_len=1000, gen_len=100)
    peaks = {}
    for extra, multiple in (("", 256), (" -kvu", 1)):
        imported = read_command("llama.cpp", f"-ngl 99 -np 4 -c 4400 -ub 4 --n-cpu-moe 32{extra}", model, workload, hw)
        engine = imported_engine("llama.cpp", imported)
        assert engine.memory.kv_tokens_multiple == multiple, extra
        # a shared stream's masked attention is noted, not priced (the GPU engines do not count it)
        assert any("-kvu with 4 slots" in n and "not priced" in n for n in imported.notes) == (extra == " -kvu")
        peaks[extra] = estimate(hw, model, imported.workload, imported.policy, engine=engine).gpu_peak_bytes
    per_token = 2 * model.num_kv_heads * model.head_dim * 2 * model.num_layers
    assert kv_bytes_per_sequence(model, workload) == 1100 * per_token
    assert peaks[""] - peaks[" -kvu"] == pytest.approx(4 * 180 * per_token, rel=1e-9)
    auto = read_command("llama.cpp", "-ngl 99 -c 4400 --n-cpu-moe 32", model, workload, hw)
    assert imported_engine("llama.cpp", auto).memory.kv_tokens_multiple == 1
