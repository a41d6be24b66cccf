"""FlexGen as it runs (issue 25): its MoE entry point, whole-tensor midpoint placement,
padding to --prompt-len, its flags and its one-GPU limit (docs/engines/flexgen.md).

Every expected number is derived here by hand from the facts table — tensor shapes of
flex_moe.py:186-257, :313-333, :508-518, the rule of :79-98 in exact rationals — never
copied from hrm.engines.flexgen's output."""

from __future__ import annotations

import argparse
import shlex
from fractions import Fraction

import pytest

import hrm_cli
from hrm.engines.engine import load_engine
from hrm.errors import HRMError, InfeasibleError
from hrm.export import FLEXGEN, Context, export_policy, import_command
from hrm.engines.flexgen import (cache_gpu_share, expert_gpu_share, layer_gpu_share, layer_tensors, percent_for_share,
                         placed_bytes, realisable_shares)
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.policy import parse_policy
from hrm.workload import make_workload
from solver.search import search

#: config.json numbers (h, h2, experts, q heads, kv heads, vocab) of two catalog models
CONFIGS = {"tiny-mixtral": (64, 128, 4, 4, 2, 256), "mixtral": (4096, 14336, 8, 32, 8, 32000)}


def attention_sizes(h, nq, nkv):
    """SelfAttention's list (flex_moe.py:320-333): preln, q, k, v, o, post-ln, in elements."""
    h_kv = h // (nq // nkv)
    return [h, h * h, h_kv * h, h_kv * h, h * h, h]


def moe_sizes(h, h2, e):
    """MoEMLP's list (flex_moe.py:511-518): gate, w1|w3 stacked, w2."""
    return [e * h, e * 2 * h2 * h, e * h * h2]


def on_gpu(sizes, wg):
    """By hand, exactly: tensor i is on the GPU iff its midpoint 100·(cum_i − s_i/2)/total is
    not below 100 − wg (get_choice over [disk 0, cpu 100−wg, gpu wg], flex_moe.py:79-98)."""
    total, cum, out = sum(sizes), 0, []
    for size in sizes:
        cum += size
        out.append(100 * (Fraction(cum) - Fraction(size, 2)) / total >= 100 - wg)
    return out


def hand_expert_share(name, wg):
    h, h2, e, *_ = CONFIGS[name]
    sizes = moe_sizes(h, h2, e)
    gpu = on_gpu(sizes, wg)
    return Fraction(sum(s for s, g in zip(sizes[1:], gpu[1:]) if g), sum(sizes[1:]))


def hand_layer_share(name, wg):
    h, h2, e, nq, nkv, _ = CONFIGS[name]
    att, moe = attention_sizes(h, nq, nkv), moe_sizes(h, h2, e)
    gpu = [s for s, g in zip(att, on_gpu(att, wg)) if g] + [s for s, g in zip(moe, on_gpu(moe, wg)) if g]
    return Fraction(sum(gpu), sum(att) + sum(moe))


# --- the placement rule ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("wg", [0, 1, 13, 16, 17, 21, 50, 66, 67, 71, 99, 100])
def test_expert_share_is_the_midpoint_rule_by_hand(name, wg):
    model = load_model(name)
    assert expert_gpu_share(model, wg) == pytest.approx(float(hand_expert_share(name, wg)), abs=1e-15)
    assert layer_gpu_share(model, wg) == pytest.approx(float(hand_layer_share(name, wg)), rel=1e-12, abs=1e-15)


def test_mixtral_experts_are_none_a_third_or_all():
    """Mixtral-8x7B: w2's midpoint is 35841/43009 = 83.33% and w1|w3's 14337/43009 = 33.33%
    of the MoE block (h2 = 14336), so the GPU holds no expert for wg <= 16, w2 (1/3) for
    17-66, all for >= 67 (what the issue measured: l4's 13 -> 0, 2xt4's 21 -> 1/3, 67 -> all)."""
    model = load_model("mixtral")
    assert [expert_gpu_share(model, wg) for wg in (13, 16, 17, 21, 66, 67, 71)] == [0, 0, 1 / 3, 1 / 3, 1 / 3, 1, 1]
    assert percent_for_share(model, 1 / 3, "experts") == 17 and percent_for_share(model, 1.0, "experts") == 67
    assert percent_for_share(model, 0.5, "experts") is None
    assert {round(s, 12) for s in realisable_shares(model, "experts")} == {0.0, round(1 / 3, 12), 1.0}


def test_layer_tensors_and_placed_bytes_by_hand():
    """tiny-mixtral (h 64, h2 128, 4 experts, 4/2 heads, vocab 256, 2 layers) in fp16."""
    model = load_model("tiny-mixtral")
    names = [name for name, _ in layer_tensors(model)]
    assert names == ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "post_attention_layernorm", "block_sparse_moe.gate", "block_sparse_moe.ws", "block_sparse_moe.w2s"]
    assert [size for _, size in layer_tensors(model)] == [2 * s for s in attention_sizes(64, 4, 2) + moe_sizes(64, 128, 4)]
    # wg 20: attention midpoints 0.26, 17.0, 41.8, 58.3, 83.0, 99.7% -> o_proj and post-ln on the
    # GPU (>= 80); MoE 0.13, 33.5, 83.4% -> w2 on the GPU; embeddings (50%, 50.1%) on the CPU
    placed = placed_bytes(model, (20, 80))
    gpu_layer = 2 * (64 * 64 + 64 + 4 * 64 * 128)
    assert placed["layer"] == {"disk": 0, "cpu": 2 * (12416 + 98560) - gpu_layer, "gpu": gpu_layer}
    assert placed["layers"]["gpu"] == 2 * gpu_layer and placed["embeddings"]["gpu"] == 0
    # wg 10, wc 80 (10% disk): what lies below 10% goes to disk (preln, gate)
    assert placed_bytes(model, (10, 80))["layer"]["disk"] == 2 * (64 + 4 * 64)
    with pytest.raises(HRMError, match="--percent"):
        placed_bytes(model, (60, 60))


def test_cache_split_rounds_to_query_heads():
    """moe_pytorch_backend.py:787-788: GPU rows int(mu*nkv*cg/100) // nq * nq (Mixtral nq 32, nkv 8)."""
    model = load_model("mixtral")
    assert cache_gpu_share(model, 16, 50) == 0.5  # 128 rows: 64 -> 64
    assert cache_gpu_share(model, 16, 30) == 0.25  # 38.4 -> 38 -> 32
    assert cache_gpu_share(model, 3, 99) == 0.0 and cache_gpu_share(model, 3, 100) == 1.0  # 24 rows < 32


# --- export ------------------------------------------------------------------------------

#: the fork's argparse as the facts table writes it (flex_moe.py:1343-1385): (flag, kwargs)
TABLE = [("--model", dict(type=str, default="facebook/opt-6.7b")), ("--path", dict(type=str)),
         ("--offload-dir", dict(type=str)), ("--prompt-len", dict(type=int, default=256)),
         ("--gen-len", dict(type=int, default=32)), ("--cut-gen-len", dict(type=int)),
         ("--gpu-batch-size", dict(type=int, default=4)), ("--num-gpu-batches", dict(type=int, default=1)),
         ("--percent", dict(nargs="+", type=int, default=[100, 0, 100, 0, 100, 0])),
         ("--pin-weight", dict(nargs="?", const="1", default="0", choices=["1", "0", "true", "false"])),
         ("--cpu-cache-compute", dict(action="store_true"))]


def table_parser():
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=True)
    for flag, kwargs in TABLE:
        parser.add_argument(flag, **kwargs)
    return parser


def parse_exported(command: str):
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "flexgen.flex_moe"]  # the MoE entry, not flexllmgen.flex_opt
    args = table_parser().parse_args(words[3:])
    assert len(args.percent) == 6 and all(0 <= p <= 100 for p in args.percent)  # flex_moe.py:1393
    wg, wc, cg, cc, hg, hc = args.percent
    assert wg + wc == 100 and cg + cc == 100 and 100 in (hg, hc)  # no disk; flex_moe.py:636-643
    return args


@pytest.fixture(scope="module")
def padded_plans():
    """FlexGen plans on l4 (engine flexgen, padded prompts) at realisable r_w levels."""
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload(padding=True)
    out = []
    for engine, fixed in (("flexgen", {"weights_gpu_ratio": 0.0, "kv_gpu_ratio": 0.0}),
                          ("flexgen-cpu-attn", {"weights_gpu_ratio": 0.0, "attn_on_gpu": False})):
        out.append(search(hw, model, workload, top=0, engine=engine, fixed=fixed).plan)
    return hw, model, workload, out


def test_exported_percent_realises_the_plans_share(padded_plans):
    hw, model, workload, plans = padded_plans
    for plan in plans:
        ctx = Context(model=model, workload=workload, hardware=hw)
        export = export_policy("flexgen", plan.policy, ctx, hw=hw, plan_engine=load_engine(plan.engine))
        assert export.exact and export.exported_feasible
        args = parse_exported(export.commands[0])
        wg = args.percent[0]
        assert float(hand_layer_share("mixtral", wg)) == pytest.approx(plan.policy.weights_gpu_ratio, abs=1e-12)
        assert hand_expert_share("mixtral", wg) == 0
        assert args.prompt_len == workload.max_prompt_len == 418 and args.gen_len == workload.gen_len
        assert args.model == "mistralai/Mixtral-8x7B-Instruct-v0.1"
        assert args.cpu_cache_compute == (not plan.policy.attn_on_gpu)


def test_unrealisable_share_exports_the_nearest_realised_one():
    """rw 0.25 of every layer's bytes is no FlexGen placement: the export names one that is."""
    model = load_model("mixtral")
    ctx = Context(model=model, workload=make_workload(padding=True))
    policy = parse_policy("N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0.25,rc=0.5")
    export = export_policy("flexgen", policy, ctx, plan_engine=load_engine("flexgen"))
    assert not export.exact and any(d.startswith("rw 0.25 ->") for d in export.differences)
    wg = parse_exported(export.commands[0]).percent[0]
    assert float(hand_layer_share("mixtral", wg)) == pytest.approx(export.exported_policy.weights_gpu_ratio, abs=1e-12)
    assert export.exported_policy.kv_gpu_ratio == 0.5  # mu 16: 64 of 128 rows, a multiple of 32


def test_unpadded_plan_that_does_not_fit_padded_is_refused():
    """A plan that assumed 77-token prompts (FlexGen's engine with its padding switched off);
    FlexGen pads to 418: the KV cache no longer fits. (The shipped flexgen engines pad:
    pads_prompts, flex_moe.py:1207-1211.)"""
    from hrm.engines.mechanisms import with_fields

    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    unpadded = with_fields(load_engine("flexgen"), {"pads_prompts": False})
    assert load_engine("flexgen").pads_prompts
    plan = search(hw, model, workload, top=0, engine=unpadded, fixed={"weights_gpu_ratio": 0.0, "kv_gpu_ratio": 0.0}).plan
    with pytest.raises(InfeasibleError, match="--prompt-len 418"):
        export_policy("flexgen", plan.policy, Context(model=model, workload=workload, hardware=hw), hw=hw,
                      plan_engine=load_engine("flexgen"))
    assert FLEXGEN.workload(None, Context(model=model, workload=workload)).max_context_len == 418 + 128


@pytest.mark.parametrize("hw_name,model_name,needle", [("2xt4", "mixtral", "dist_flex_moe"),
                                                        ("t4", "olmoe", "Mixtral"), ("t4", "dbrx", "Mixtral"),
                                                        ("t4", "deepseek-v2-lite", "Mixtral")])
def test_what_flexgen_cannot_run_is_refused_in_one_line(capsys, tmp_path, hw_name, model_name, needle):
    hw, model = load_hardware(hw_name), load_model(model_name)
    policy = parse_policy("N=8,mu=8,n=1,attn=gpu,ffn=gpu,rw=0,rc=0")
    with pytest.raises(HRMError, match=needle) as exc:
        export_policy("flexgen", policy, Context(model=model, workload=make_workload(), hardware=hw))
    assert "\n" not in str(exc.value)
    code = hrm_cli.main(["import", "--from", "flexgen", "--percent 0 100 0 100 100 0", "--hw", hw_name,
                         "--model", model_name])
    assert code == 2 and needle in capsys.readouterr().err


# --- import ------------------------------------------------------------------------------

def _import(text, model="mixtral"):
    return import_command("flexgen", text, load_model(model), make_workload(), load_hardware("l4"))


def test_import_reads_percent_by_the_midpoint_rule_and_aliases():
    """The artifact's own command (caoshiyi/artifacts benchmarks/flexgen/mtbench/
    run_script_mtbench_l4_7b.sh:3): wg 12 puts no expert on the GPU."""
    policy, notes = _import("--percent 12 88 0 100 0 100 --gbs 64 --num-gb 21 --gen-len 32 --cpu-cache-compute")
    assert (policy.micro_batch_size, policy.num_micro_batches, policy.attn_on_gpu) == (64, 21, False)
    assert policy.weights_gpu_ratio == pytest.approx(float(hand_layer_share("mixtral", 12)), abs=1e-15)
    assert hand_expert_share("mixtral", 12) == 0 and any("0% of the experts" in n for n in notes)
    same, _ = _import("--percent 12 88 0 100 0 100 --gpu-batch-size 64 --num-gpu-batches 21 --cpu-cache-compute")
    assert same == policy


@pytest.mark.parametrize("text", [
    # caoshiyi/artifacts@6bc86009 benchmarks/flexgen/mtbench/run_script_mtbench_t4_7b.sh:9
    "--percent 7 93 0 100 0 100 --gbs 32 --num-gb 40 --gen-len 32",
    # benchmarks/flexgen/helm/helm_moe_8x7b_l4.sh:1 (helm_run_moe.py takes the same policy flags)
    "--percent 14 86 0 100 0 100 --gpu-batch-size 64 --num-gpu-batches 33 --cpu-cache-compute",
    # lynnliu030/FlexGen@a80c8d15 experimental/distributed-moe/bench_8x7b_1x2.sh, one GPU's flags
    "--model mistralai/Mixtral-8x7B-Instruct-v0.1 --gpu-batch-size 1 --percent 0 100 0 100 0 100 --cut-gen-len 5",
])
def test_real_commands_import(text):
    policy, _ = _import(text)
    wg = int(text.split("--percent ")[1].split()[0])
    assert policy.weights_gpu_ratio == pytest.approx(float(hand_layer_share("mixtral", wg)), abs=1e-15)


def test_bare_pin_weight_and_the_commands_workload():
    text = "--model mistralai/Mixtral-8x7B-v0.1 --percent 17 83 100 0 100 0 --gpu-batch-size 8 --pin-weight " \
           "--prompt-len 256"
    policy, notes = _import(text)
    assert policy.kv_gpu_ratio == 1.0 and any(n.startswith("--pin-weight") for n in notes)
    assert _import(text.replace("--pin-weight", "--pin-weight false"))[1] != notes
    from hrm.export.importing import split_flags

    ctx = Context(model=load_model("mixtral"), workload=make_workload())
    workload = FLEXGEN.workload(split_flags(FLEXGEN, text), ctx)
    assert (workload.max_prompt_len, workload.gen_len, workload.padding) == (256, 32, True)  # --gen-len default 32


@pytest.mark.parametrize("text,needle", [
    ("--model facebook/opt-1.3b --percent 100 0 100 0 100 0", "--model facebook/opt-1.3b"),
    ("--model mistralai/Mixtral-8x22B-v0.1", "--model"),
    ("--percent 50 60 0 100 100 0", "--percent"),
    ("--percent 50 50 0 100 50 50", "--percent"),
    ("--percent 0 100 0 100 100 0 --compress-weight", "--compress-weight"),
    ("--pin-weight maybe", "--pin-weight"),
])
def test_bad_commands_are_refused_in_one_line(capsys, text, needle):
    code = hrm_cli.main(["import", "--from", "flexgen", text, "--hw", "l4", "--model", "mixtral"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0], err


@pytest.mark.parametrize("hw_name", ["l4", "t4"])
def test_search_plans_flexgen_as_flexgen_runs(hw_name):
    """Issue 25: the flexgen engines plan on padded prompts (pads_prompts) and only at the
    placements FlexGen's midpoint rule makes (policy.weights_levels): the plan's r_w is one
    of hrm.engines.flexgen's realisable shares, the best of the searches pinned at each of them, and
    a pin between two placements is refused in one line."""
    from hrm.errors import HRMError as Refusal
    from hrm.engines.flexgen import realisable_shares

    hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload()
    result = search(hw, model, workload, top=0, engine="flexgen")
    assert result.plan.workload.padding and result.plan.workload.effective_prompt_len == 418
    shares = realisable_shares(model, "layers")
    assert any(abs(result.best.policy.weights_gpu_ratio - s) < 1e-12 for s in shares)
    pinned = []
    for share in shares:
        try:
            pinned.append(search(hw, model, make_workload(padding=True), top=0, engine="flexgen",
                                 fixed={"weights_gpu_ratio": share}).best.estimate.generation_throughput_tok_s)
        except Refusal:
            continue
    assert result.best.estimate.generation_throughput_tok_s == pytest.approx(max(pinned), rel=1e-12)
    with pytest.raises(Refusal, match="places weights only at"):
        search(hw, model, workload, top=0, engine="flexgen", fixed={"weights_gpu_ratio": 0.2})
