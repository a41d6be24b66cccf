"""vLLM and SGLang as they run (issue 25): their start-up checks, the CPU offload of
--cpu-offload-gb (module order, whole parameters), --cpu-offload-params experts, the
kTransformers CPU experts of SGLang (--kt-num-gpu-experts, --kt-method), and real commands
from the engines' issues (docs/engines/vllm.md, docs/engines/sglang.md).

Expected numbers are derived here by hand from the facts tables (Mixtral-8x7B: 32 layers,
8 experts, h 4096, h2 14336, fp16), never copied from hrm's output."""

from __future__ import annotations

import shlex

import pytest

import hrm_cli
from hrm.engines.engine import load_engine
from hrm.errors import HRMError
from hrm.export import SGLANG, VLLM, Context, export_plan, export_policy, fix_pins, import_command, split_flags
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.plan import save_plan
from hrm.policy import parse_policy
from hrm.workload import make_workload
from solver.search import search

GIB = 2**30
#: one Mixtral-8x7B layer's experts, by hand: 8 experts x (w1, w3, w2) x 4096 x 14336 x 2 bytes
MIXTRAL_LAYER = 8 * 3 * 4096 * 14336 * 2
W13, W2 = MIXTRAL_LAYER * 2 // 3, MIXTRAL_LAYER // 3  # gate+up, down (vllm fused-MoE parameters)
#: vLLM's server defaults below 70 GiB or on an A100 (arg_utils.py:2998-3006)
VLLM_DEFAULT_TOKENS, VLLM_DEFAULT_SEQS = 2048, 256


def ctx_for(hw_name="l4", model_name="mixtral", workload=None):
    return Context(model=load_model(model_name), workload=workload or make_workload(),
                   hardware=load_hardware(hw_name))


def flags(export) -> dict[str, str]:
    return {f.flag: f.value for f in export.flags}


def import_cmd(engine, text, hw_name="l4", model_name="mixtral", workload=None):
    return import_command(engine, text, load_model(model_name), workload or make_workload(), load_hardware(hw_name))


def hand_offloaded_layers(budget_bytes, per_layer=(W13, W2), layers=32):
    """vLLM's UVA offloader by hand (uva.py:84-125): whole parameters, layer after layer, until
    the budget is reached; returns the bytes offloaded."""
    done = 0
    for _ in range(layers):
        for size in per_layer:
            if done >= budget_bytes:
                return done
            done += size
    return done


# --- the engine files --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_engine_files_load_and_pin_gpu_attention_one_pass(name):
    engine = load_engine(name)
    assert engine.policy.attention == ("gpu",) and engine.policy.ffn == ("gpu",)
    assert engine.policy.fixed == {"num_micro_batches": 1, "kv_gpu_ratio": 1.0}
    assert fix_pins(VLLM if name == "vllm" else SGLANG) == "attn=gpu rc=1 ffn=gpu n=1"
    assert engine.sources and all("0.33.0" in s or "sglang" in s or "kt-kernel" in s for s in engine.sources)


def test_engine_mechanisms_are_the_sourced_ones():
    vllm, sglang = load_engine("vllm"), load_engine("sglang")
    # vLLM: experts of the first layers (whole layers) read from pinned memory, no GPU copy
    assert (vllm.offloaded_weights, vllm.static_experts, vllm.decode.weight_path) == ("experts", "whole-layers",
                                                                                      "pinned")
    assert vllm.memory.gpu_weight_buffer_layers == 0 and vllm.decode.offloaded_experts == "streamed"
    # SGLang + kTransformers: experts 0..k-1 of every layer on the GPU, the rest on the CPU
    assert (sglang.decode.offloaded_experts, sglang.prefill.offloaded_experts) == ("cpu", "cpu")
    assert sglang.static_experts == "whole-experts-per-layer" and sglang.op_offload_min_tokens is None


# --- vLLM export -------------------------------------------------------------------------

#: r_w -> MoE layers offloaded; 0.9 is no whole layer count: 32 x 0.9 = 28.8 -> the nearest, 29 on the GPU
@pytest.mark.parametrize("rw,layers_off", [(0.25, 24), (0.5, 16), (0.0, 32), (0.875, 4), (0.9, 3)])
def test_vllm_offload_gb_realises_the_plans_layers(rw, layers_off):
    """--cpu-offload-gb is the offloaded layers' experts per GPU; fed to vLLM's rule by hand it
    offloads exactly those layers (rounding down by < 0.01 GiB stays above the bytes less w2)."""
    policy = parse_policy(f"N=64,mu=64,n=1,attn=gpu,ffn=gpu,rw={rw},rc=1")
    export = export_policy("vllm", policy, ctx_for())
    gib = float(flags(export)["--cpu-offload-gb"])
    assert layers_off * MIXTRAL_LAYER / GIB - 0.01 < gib <= layers_off * MIXTRAL_LAYER / GIB
    assert hand_offloaded_layers(gib * GIB) == layers_off * MIXTRAL_LAYER
    assert flags(export)["--cpu-offload-params"] == "experts"


def test_vllm_offload_is_per_gpu_under_tensor_parallelism():
    """Each rank offloads its own shards (the budget is per GPU, config/offload.py:24)."""
    policy = parse_policy("N=64,mu=64,n=1,attn=gpu,ffn=gpu,rw=0.5,rc=1")
    export = export_policy("vllm", policy, ctx_for("2xt4"))
    gib = float(flags(export)["--cpu-offload-gb"])
    assert hand_offloaded_layers(gib * GIB, (W13 / 2, W2 / 2)) == 16 * MIXTRAL_LAYER / 2
    assert flags(export)["-tp"] == "2"


def test_vllm_no_offload_prints_no_offload_flags():
    export = export_policy("vllm", parse_policy("N=8,mu=8,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"), ctx_for())
    assert "--cpu-offload-gb" not in flags(export) and "--cpu-offload-params" not in flags(export)


@pytest.fixture(scope="module")
def vllm_plans():
    out = []
    for hw_name, model_name in (("l4", "mixtral"), ("t4", "mixtral"), ("2xt4", "mixtral"), ("a100-80g", "mixtral"),
                                ("l4", "deepseek-v2-lite"), ("t4", "deepseek-v2-lite")):
        hw, model, workload = load_hardware(hw_name), load_model(model_name), make_workload()
        for engine in ("vllm", "sglang"):
            result = search(hw, model, workload, top=0, engine=engine, hw_name=hw_name, model_name=model_name)
            out.append((engine, hw_name, model_name, result.plan))
    return out


def test_exports_hold_the_engines_start_up_limits(vllm_plans):
    """Every printed vLLM command: --max-num-seqs <= --max-num-batched-tokens (scheduler.py:331),
    the budget holds the plan's prefill batch (N prompts of 77 tokens, at least the longest,
    418); SGLang: --tp-size is the GPU count, --cpu-offload-gb (an int) is never printed."""
    for engine, hw_name, model_name, plan in vllm_plans:
        export = export_policy(engine, plan.policy, ctx_for(hw_name, model_name, plan.workload),
                               hw=load_hardware(hw_name), plan_engine=load_engine(engine))
        assert export.exact and export.exported_feasible, (engine, hw_name, model_name)
        values = flags(export)
        n = plan.policy.batch_size
        gpus = load_hardware(hw_name).gpu.count
        if engine == "vllm":
            assert int(values["--max-num-seqs"]) == n <= int(values["--max-num-batched-tokens"])
            assert int(values["--max-num-batched-tokens"]) == max(n * 77, 418, n)
            assert values["--max-model-len"] == str(418 + 128) and values["-tp"] == str(gpus)
        else:
            assert values["--tp-size"] == str(gpus) and "--cpu-offload-gb" not in values
            assert int(values["--max-running-requests"]) == n


def test_cpu_attention_plan_is_refused_or_replanned(capsys, tmp_path):
    """The issue: a CPU-attention plan exported to vLLM/SGLang printed a command needing 567%
    of GPU memory and exited 0; neither engine has CPU attention. The policy itself is refused
    in one line (hrm.export.export_plan); ``hrm export`` re-plans inside the engine's space
    (GPU attention, tests/test_export_replan.py)."""
    hw, model = load_hardware("l4"), load_model("mixtral")
    plan = search(hw, model, make_workload(), top=0, engine="moe-lightning", hw_name="l4", model_name="mixtral").plan
    assert not plan.policy.attn_on_gpu
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    for target in ("vllm", "sglang"):
        with pytest.raises(HRMError, match="attention on the CPU"):
            export_plan(plan, target)
        assert hrm_cli.main(["export", str(path), "--to", target]) == 0
        out, err = capsys.readouterr()
        assert "attn=gpu" in err and "re-planned" in err


# --- vLLM import -------------------------------------------------------------------------

def test_vllm_start_up_check_batched_tokens_at_least_seqs():
    """scheduler.py:331: max_num_batched_tokens >= max_num_seqs; the default budget on an L4 is
    2048 (arg_utils.py:2998-3006), so --max-num-seqs 4000 alone does not start."""
    with pytest.raises(HRMError, match="scheduler.py:331"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 4000")
    with pytest.raises(HRMError, match="scheduler.py:331"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 300 --max-num-batched-tokens 256")
    policy, _ = import_cmd("vllm", "vllm serve MODEL --max-num-seqs 4000 --max-num-batched-tokens 4000")
    assert policy.batch_size == 4000 and policy.num_micro_batches == 1


def test_vllm_defaults_and_human_readable_tokens():
    policy, notes = import_cmd("vllm", "vllm serve MODEL")
    assert policy.batch_size == VLLM_DEFAULT_SEQS and any("default" in n for n in notes)
    # 2k = 2000 (decimal k), 2K = 2048 (binary K); decimals with a binary suffix are refused
    assert import_cmd("vllm", "vllm serve MODEL --max-num-seqs 2000 --max-num-batched-tokens 2k")[0].batch_size == 2000
    with pytest.raises(HRMError, match="scheduler.py:331"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 2049 --max-num-batched-tokens 2K")
    with pytest.raises(HRMError, match="--max-num-batched-tokens"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --max-num-batched-tokens 1.5K")
    # without chunked prefill the budget must hold --max-model-len (scheduler.py:318-329)
    with pytest.raises(HRMError, match="chunked prefill"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --max-num-batched-tokens 512 --max-model-len 4096 "
                           "--no-enable-chunked-prefill")


def test_vllm_cpu_offload_params_experts_by_hand():
    """--cpu-offload-gb 10 with experts only: w13 1.75, w2 0.875 GiB per layer; the budget is
    passed after 4 whole layers (10.5 GiB), so r_w = 1 - 4/32."""
    policy, notes = import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --cpu-offload-gb 10 --cpu-offload-params experts")
    assert hand_offloaded_layers(10 * GIB) == 4 * MIXTRAL_LAYER
    assert policy.weights_gpu_ratio == pytest.approx(1 - 4 / 32) and not notes
    # only w2: 0.875 GiB per layer, 12 layers pass 10 GiB (10.5)
    policy, _ = import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --cpu-offload-gb 10 --cpu-offload-params w2_weight")
    assert policy.weights_gpu_ratio == pytest.approx(1 - 12 * W2 / (32 * MIXTRAL_LAYER))


def test_vllm_offload_without_params_is_read_as_bytes_and_noted():
    policy, notes = import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --cpu-offload-gb 21")
    assert policy.weights_gpu_ratio == pytest.approx(1 - 21 * GIB / (32 * MIXTRAL_LAYER))
    assert any("module order" in n for n in notes)
    with pytest.raises(HRMError, match="--cpu-offload-params experts"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --cpu-offload-gb 100")
    with pytest.raises(HRMError, match="routed experts only"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 --cpu-offload-gb 4 --cpu-offload-params self_attn")


def test_vllm_tensor_parallel_spellings():
    for text in ("-tp 2", "--tensor-parallel-size 2", "--tensor-parallel-size=2"):
        assert import_cmd("vllm", f"vllm serve MODEL --max-num-seqs 8 {text}", "2xt4")[0].batch_size == 8
    with pytest.raises(HRMError, match="-tp 2"):
        import_cmd("vllm", "vllm serve MODEL --max-num-seqs 8 -tp 2", "l4")


def test_vllm_max_model_len_bounds_the_workload():
    """--max-model-len L: requests longer than L are refused by the server, so the HRM
    workload (418 + 128 = 546 tokens at most) must fit; auto/-1 bound nothing."""
    ctx = ctx_for()
    assert VLLM.workload(split_flags(VLLM, "--max-model-len 4096"), ctx) == ctx.workload
    assert VLLM.workload(split_flags(VLLM, "--max-model-len auto"), ctx) == ctx.workload
    assert VLLM.workload(split_flags(VLLM, "--max-model-len 1k"), ctx) == ctx.workload
    with pytest.raises(HRMError, match="--max-model-len 512"):
        VLLM.workload(split_flags(VLLM, "--max-model-len 512"), ctx)
    assert VLLM.workload(None, ctx) == ctx.workload


def test_served_model_must_be_the_planned_one():
    assert import_cmd("vllm", "vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1 --max-num-seqs 8")[0].batch_size == 8
    for other in ("facebook/opt-1.3b", "mistralai/Mixtral-8x22B-Instruct-v0.1"):
        with pytest.raises(HRMError, match="not the model being planned"):
            import_cmd("vllm", f"vllm serve {other} --max-num-seqs 8")
    with pytest.raises(HRMError, match="not the model being planned"):
        import_cmd("sglang", "python -m sglang.launch_server --model-path facebook/opt-1.3b --max-running-requests 8")


# --- SGLang ------------------------------------------------------------------------------

@pytest.mark.parametrize("rw,k", [(0.25, 2), (0.5, 4), (0.0, 0), (0.3, 2)])
def test_sglang_kt_num_gpu_experts_is_int_e_rw(rw, k):
    """--kt-num-gpu-experts k keeps experts 0..k-1 of every layer (kt_ep_wrapper.py:205-213):
    k = int(8·r_w) for Mixtral; --kt-method BF16 reads the 16-bit checkpoint."""
    export = export_policy("sglang", parse_policy(f"N=32,mu=32,n=1,attn=gpu,ffn=gpu,rw={rw},rc=1"), ctx_for())
    values = flags(export)
    assert values["--kt-num-gpu-experts"] == str(k) and values["--kt-method"] == "BF16"
    assert values["--kt-weight-path"] == values["--model-path"] == "MODEL"
    assert export.exported_policy.weights_gpu_ratio == k / 8


def test_sglang_all_experts_on_gpu_prints_no_kt_flags():
    export = export_policy("sglang", parse_policy("N=8,mu=8,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"), ctx_for())
    assert not any(flag.startswith("--kt-") for flag in flags(export))


def test_sglang_kt_method_names_the_cpu_experts_format():
    """--kt-method is the CPU experts' stored format, not another model (tests/test_sglang_kt.py
    has the formats); without --kt-num-gpu-experts or --kt-gpu-experts-ratio kTransformers is
    off (sglang-kt kt_ep_wrapper.py:1942-1944)."""
    base = "python -m sglang.launch_server --model-path MODEL --max-running-requests 8 --kt-weight-path W "
    for method in ("--kt-method BF16 ", "", "--kt-method AMXINT8 "):
        policy, _ = import_cmd("sglang", base + method + "--kt-num-gpu-experts 2")
        assert policy.weights_gpu_ratio == pytest.approx(2 / 8) and policy.ffn_on_gpu
    policy, notes = import_cmd("sglang", base + "--kt-method BF16")
    assert policy.weights_gpu_ratio == 1.0 and any("kTransformers is off" in n for n in notes)


def test_sglang_kt_flags_without_weight_path_keep_every_expert_on_the_gpu():
    policy, notes = import_cmd("sglang", "python -m sglang.launch_server --model-path MODEL --max-running-requests 8 "
                                         "--kt-num-gpu-experts 2")
    assert policy.weights_gpu_ratio == 1.0 and any("kTransformers is off" in n for n in notes)


def test_sglang_tp_spellings_and_refusals():
    for text in ("--tp 2", "--tp-size 2", "--tensor-parallel-size 2"):
        policy, _ = import_cmd("sglang", f"python -m sglang.launch_server --model-path MODEL "
                                         f"--max-running-requests 8 {text}", "2xt4")
        assert policy.batch_size == 8
    with pytest.raises(HRMError, match="--from vllm"):
        import_cmd("sglang", "python -m sglang.launch_server --model-path MODEL --max-running-requests 8 "
                             "--cpu-offload-gb 7")
    with pytest.raises(HRMError, match="--max-running-requests"):
        import_cmd("sglang", "python -m sglang.launch_server --model-path MODEL")
    with pytest.raises(HRMError, match="--context-length 512"):
        SGLANG.workload(split_flags(SGLANG, "--context-length 512"), ctx_for())


def test_sglang_launch_forms():
    for prefix in ("python3 -m sglang.launch_server --model-path MODEL", "sglang serve MODEL",
                   "sglang serve --model-path MODEL"):
        assert import_cmd("sglang", f"{prefix} --max-running-requests 8")[0].batch_size == 8


def test_vllm_launch_forms():
    for prefix in ("vllm serve MODEL", "vllm serve --model MODEL", "python -m vllm.entrypoints.openai.api_server "
                   "--model MODEL", "python3 -m vllm.entrypoints.openai.api_server --model MODEL"):
        assert import_cmd("vllm", f"{prefix} --max-num-seqs 8")[0].batch_size == 8


# --- real commands -----------------------------------------------------------------------

#: the commands posted in vLLM's and SGLang's issues and docs are in the import table
#: (tests/data/real_commands.yaml, tests/test_real_commands.py)


def test_a_real_flag_set_on_the_planned_model_imports():
    """vllm-project/vllm#2134: Mixtral served with --tensor-parallel-size 2 on two GPUs (the
    answer's flag); no --max-num-seqs: vLLM's default 256 on an A100 (arg_utils.py:2985-2987
    exclude A100s from the large tier), every expert on the GPU."""
    policy, notes = import_cmd("vllm", "python -m vllm.entrypoints.openai.api_server "
                                       "--model mistralai/Mixtral-8x7B-Instruct-v0.1 --tensor-parallel-size 2",
                               "2xa100-80g")
    assert policy.batch_size == VLLM_DEFAULT_SEQS and policy.weights_gpu_ratio == 1.0
    assert any("default" in n for n in notes)


def test_exported_commands_split_back_with_every_flag_known(vllm_plans):
    """Every word of every printed command is a flag of the table (or its value)."""
    for engine, hw_name, model_name, plan in vllm_plans:
        export = export_policy(engine, plan.policy, ctx_for(hw_name, model_name, plan.workload))
        target = VLLM if engine == "vllm" else SGLANG
        words = shlex.split(export.commands[0])[len(target.programs[0].split()):]
        assert set(split_flags(target, shlex.join(words))) == set(flags(export))
