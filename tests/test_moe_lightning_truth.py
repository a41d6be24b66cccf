"""The MoE-Lightning artifact as it runs (caoshiyi/artifacts@6bc86009, branch asplos25): the
server picks its own policy at launch; HRM predicts and exports that pick (issue 25).

Facts are derived by hand from the artifact's source (docs/engines/moe_lightning.md) or are
the artifact's own optimizer run on the inputs below (its backend/optimizer.py and
backend/utils.py at 6bc86009 with PuLP 3.3.2 / CBC, a stub ModelConfig holding the config
values: the method is in the doc). Never numbers copied from HRM's own output."""

from __future__ import annotations

import json
import shlex

import pytest
from pydantic import ValidationError

import hrm_cli
from hrm.engines.rules import CHOOSERS
from hrm.engines.engine import Engine, list_engines, load_engine
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.export import Context, export_plan, export_policy, import_command
from hrm.export.moe_lightning import CLIENT, FLAG_FACTS, SERVER, client_counts, prompts_sent
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.engines.moe_lightning import (FALLBACK_HARDWARE, ServerFlags, ServerModel, best_candidates,
                                         largest_feasible_count, micro_batch_sizes, recognised_hardware,
                                         server_choice, server_model, server_policy, solve_candidate)
from hrm.plan import Plan, ServerPick, load_plan, save_plan
from hrm.policy import Policy, parse_policy
from hrm.units import GIB
from hrm.workload import make_workload
from hrm_cli.search import server_pick_in_words
from solver.request import server_pick
from solver.search import search

# --- the hardware the server recognises (backend/utils.py:22-61) ----------------------------


def test_l4_and_t4_by_name_substring_others_get_the_class_defaults():
    l4 = recognised_hardware("NVIDIA L4", 184.0, 76.0, 1)
    assert (l4.gpu_gib, l4.link_gib_s, l4.gpu_bandwidth_gib_s, l4.gpu_tflops, l4.cpu_tflops) == (24, 16, 285, 104, 1.6)
    assert (l4.cpu_gib, l4.cpu_bandwidth_gib_s) == (184.0, 76.0)
    t4 = recognised_hardware("Tesla T4", 380.0, 100.0, 4)
    assert (t4.gpu_gib, t4.gpu_bandwidth_gib_s, t4.gpu_tflops, t4.cpu_tflops, t4.tp_size) == (15, 300, 65, 0.8, 4)
    assert recognised_hardware("NVIDIA L40S", 500.0, 200.0, 1).label == "L4"  # "L4" in the name
    # utils.py:60-61 returns the class: its defaults whatever the host, bandwidth and --tp-size
    for name in ("NVIDIA A100 80GB", "NVIDIA H100 SXM", "NVIDIA GeForce RTX 3090"):
        other = recognised_hardware(name, 1000.0, 400.0, 2)
        assert other is FALLBACK_HARDWARE
        assert (other.gpu_gib, other.cpu_gib, other.cpu_bandwidth_gib_s, other.tp_size) == (24, 192, 100, 1)
        assert (other.link_gib_s, other.gpu_bandwidth_gib_s, other.gpu_tflops, other.cpu_tflops) == (16, 300, 104, 13)
    with pytest.raises(HRMError, match="--cpu-mem-bdw"):  # utils.py:44: None * 2^30 at launch
        recognised_hardware("NVIDIA L4", 184.0, None, 1)


# --- the linear program of one candidate, by hand ---------------------------------------

TINY = ServerModel(layers=4, hidden=8, intermediate=16, heads=2, kv_heads=1, experts=2, top_k=1)


def tiny_hw(link_bytes_s: float) -> dict:
    """Constants picked so the hand arithmetic below is round (SI, tp 1)."""
    return {"gpu_bytes": 7001.6 / 0.86, "cpu_bytes": 7488 / 0.8, "link": link_bytes_s, "gpu_bw": 6336.0,
            "cpu_bw": 1600.0, "gpu_flops": 3072.0, "cpu_flops": 640.0, "tp": 1}


def test_tiny_model_sizes_by_hand():
    # W_E = 2 bytes x 3 matrices x h x I x E (optimizer.py:73); attention q,o h^2, k,v h^2/group
    assert TINY.expert_layer_bytes == 2 * 3 * 8 * 16 * 2 == 1536
    assert TINY.other_weight_bytes == (4 * 64 + 4 * 64 // 2) * 4 == 1536
    assert TINY.kv_width == 8 // (2 // 1) == 4


def test_one_candidate_by_hand_link_binds():
    """s = n = 4, one sequence. GPU peak at wg = 0: 1536 (attention) + max(decode 2*2*8 = 32,
    prefill 2*2*8*4 + 2*8*4 + 2*2*2*4*4 = 320) + 2 x 1536 (paged buffer) + 2*(8*4 + 3*16*4)*1.2
    = 537.6 (kernel) = 5465.6 B, plus 4*1536 - 2*1536 = 3072 B per unit of wg: under 7001.6 B
    up to wg = 0.5. CPU peak at wg = 0: 6 x 1536 + 2*2*8*4*4 (KV) + 2*8*4 (hidden) = 9792 B,
    less 9216 B per unit of wg: under 7488 B from wg = 0.25."""
    cand = solve_candidate(TINY, tiny_hw(1536.0), 4, 4, 1, 1)
    # link (1 - wg) x 1536 B at 1536 B/s: 0.5 s at wg = 0.5; GPU max(768 / 3072, 1584 / 6336) = 0.25 s;
    # CPU max(160 / 640, 160 / 1600) = 0.25 s: the link binds, wg is the most that fits
    assert cand.wg_high == pytest.approx(0.5) and cand.wg_low == pytest.approx(0.5)
    assert cand.layer_time_s == pytest.approx(0.5)
    assert cand.throughput_tok_s == pytest.approx(1 * 4 / (0.5 * 3 * 4))  # b n / (T (n - 1) L)


def test_one_candidate_by_hand_compute_binds_several_wg_optimal():
    # a link 4x faster: 0.125 s at wg = 0.5, so T = 0.25 s (GPU and CPU) and every wg whose link
    # time stays under it is optimal: 1 - 0.25 / 0.25 = 0, cut at the CPU's 0.25
    cand = solve_candidate(TINY, tiny_hw(4 * 1536.0), 4, 4, 1, 1)
    assert cand.layer_time_s == pytest.approx(0.25)
    assert (cand.wg_low, cand.wg_high) == (pytest.approx(0.25), pytest.approx(0.5))


def test_nothing_fits_and_the_micro_batch_sizes():
    hw = {**tiny_hw(1536.0), "cpu_bytes": 100.0}
    assert solve_candidate(TINY, hw, 4, 4, 1, 1) is None
    assert largest_feasible_count(TINY, hw, 4, 4, 1) == 0 and best_candidates(TINY, hw, 4, 4) == []
    sizes = micro_batch_sizes()
    assert [next(sizes) for _ in range(7)] == [1, 2, 3, 4, 36, 68, 100]  # optimizer.py:285-288


def test_largest_count_is_the_last_that_fits():
    hw = {**tiny_hw(1536.0), "cpu_bytes": 1e9, "gpu_bytes": 1e4}
    most = largest_feasible_count(TINY, hw, 4, 4, 1)
    assert most >= 1 and solve_candidate(TINY, hw, 4, 4, 1, most) is not None
    assert solve_candidate(TINY, hw, 4, 4, 1, most + 1) is None


# --- against the artifact's own optimizer -------------------------------------------------

#: (model, GPU name, available CPU GiB, --cpu-mem-bdw, --tp-size, s, n) -> the artifact's
#: optimizer's Policy (ubs, n_ub, wg), run at 6bc86009 (see the module docstring); the first is
#: the README's own optimizer printout (README.md:33-51: cmem=197880360960.0 bytes)
ARTIFACT_RUNS = [
    (("mixtral", "NVIDIA L4", 197880360960 / GIB, 76, 1, 77, 32), (324, 14, 0.055884688)),
    (("mixtral", "NVIDIA L4", 197880360960 / GIB, 76, 1, 77, 256), (164, 10, 0.11401186)),
    (("mixtral", "NVIDIA L4", 178.8, 100, 1, 77, 32), (260, 16, 0.073298968)),
    (("mixtral", "NVIDIA L4", 178.8, 100, 1, 418, 128), (68, 12, 0.046372737)),
    (("mixtral", "NVIDIA L4", 178.8, 100, 1, 1693, 64), (4, 16, 0.10170739)),
    (("mixtral", "NVIDIA T4", 178.8, 100, 1, 77, 32), (164, 19, 0.004715402)),
    (("mixtral", "NVIDIA T4", 178.8, 100, 1, 77, 256), (132, 10, 0.025417984)),
    (("mixtral", "NVIDIA A100 80GB", 256, 100, 1, 77, 32), (292, 17, 0.059996559)),
    (("mixtral", "NVIDIA A100 80GB", 256, 100, 1, 1693, 64), (4, 17, 0.0932859)),
    (("mixtral", "NVIDIA T4", 387.4, 100, 2, 1693, 64), (4, 32, 0.14662202)),
    (("mixtral", "NVIDIA T4", 387.4, 100, 4, 77, 256), (132, 44, 0.34038822)),
    (("mixtral", "NVIDIA T4", 387.4, 100, 4, 242, 50), (68, 75, 0.0)),
    (("dbrx", "NVIDIA T4", 387.4, 100, 4, 77, 32), (68, 58, 0.071928465)),
    (("dbrx", "NVIDIA T4", 387.4, 100, 2, 77, 32), (68, 39, 0.0)),
    (("dbrx", "NVIDIA T4", 387.4, 100, 2, 418, 128), (4, 37, 0.013312304)),
    (("mixtral-8x22b", "NVIDIA T4", 387.4, 100, 4, 418, 128), (36, 13, 0.074096228)),
]


def host(gpu_name: str, count: int, cpu_gib: float):
    """The l4 profile with another GPU name and count and host memory (what the server reads)."""
    hw = load_hardware("l4")
    return hw.model_copy(update={"gpu": hw.gpu.model_copy(update={"name": gpu_name, "count": count}),
                                 "cpu": hw.cpu.model_copy(update={"memory_gib": cpu_gib})})


def readme_host():
    """README.md:35's printout: cmem = 197880360960 bytes, psutil's available memory on S2."""
    return host("NVIDIA L4", 1, 197880360960 / GIB)


@pytest.mark.parametrize("inputs,picked", ARTIFACT_RUNS)
def test_the_artifacts_pick_is_among_ours(inputs, picked):
    """The artifact's pick is one of the candidates we find tied for the best throughput, its
    wg within the optimal range we give, its GPU experts per layer one we list."""
    name, gpu, cpu_gib, bdw, tp, s, n = inputs
    model = load_model(name)
    hw = host(gpu, tp, cpu_gib)
    workload = make_workload(prompt_len=s, gen_len=n)
    choice = server_choice(hw, model, workload, ServerFlags(cpu_mem_bdw_gib_s=bdw, tp_size=tp))
    ubs, n_ub, wg = picked
    tied = {(c.micro_batch, c.micro_batches): c for c in choice.tied}
    assert (ubs, n_ub) in tied, (inputs, sorted(tied))
    cand = tied[(ubs, n_ub)]
    assert cand.wg_low - 1e-6 <= wg <= cand.wg_high + 1e-6
    assert int(model.num_experts * wg) in choice.gpu_experts_possible


def test_the_readme_pick_exactly():
    hw = readme_host()
    choice = server_choice(hw, load_model("mixtral"), make_workload(prompt_len=77, gen_len=32),
                           ServerFlags(cpu_mem_bdw_gib_s=76))
    assert choice.policy.short() == "N=4536,mu=324,n=14,attn=cpu,ffn=gpu,rw=0,rc=0"
    assert len(choice.tied) == 1 and choice.candidate.wg_high == pytest.approx(0.055884688, abs=1e-8)


def test_deepseek_and_others_refused():
    for name in ("deepseek-v2-lite", "qwen1.5-moe-a2.7b", "olmoe", "mistral-7b"):
        with pytest.raises(HRMError, match="Mixtral and DBRX only"):
            server_model(load_model(name))


# --- export ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def l4_plan(tmp_path_factory):
    result = search(load_hardware("l4"), load_model("mixtral"), make_workload(), top=0, engine="moe-lightning",
                    hw_name="l4", model_name="mixtral")
    path = tmp_path_factory.mktemp("plans") / "l4.json"
    save_plan(result.plan, path)
    return result.plan, path


def flag_values(command: str, program: str) -> dict[str, str]:
    words = shlex.split(command.replace("&&", " && "))[len(shlex.split(program)):]
    return dict(zip(words[::2], words[1::2]))


def check_against_facts(values: dict[str, str], program: str) -> None:
    """Each flag is the program's (bench.py's or the server's) and its value converts as
    argparse's type= would (server_args.py, bench.py)."""
    for flag, value in values.items():
        fact = FLAG_FACTS[flag]
        assert fact.program == program, flag
        {"int": int, "float": float, "str": str}[fact.kind](value)


def test_export_prints_the_servers_pick_and_a_client_sized_to_it(l4_plan):
    plan, _ = l4_plan
    hw, model = load_hardware("l4"), load_model("mixtral")
    export = export_plan(plan, "moe-lightning")
    server_cmd, client_cmd = export.commands
    assert server_cmd.startswith(SERVER + " ") and client_cmd.startswith(CLIENT + " ")
    assert client_cmd.startswith("cd benchmarks/mtbench && python bench.py")  # bench.py:26 opens ./question.jsonl
    server, client = flag_values(server_cmd, SERVER), flag_values(client_cmd, CLIENT)
    check_against_facts(server, "server")
    check_against_facts(client, "client")
    w = plan.workload
    assert (int(server["--avg-prompt-len"]), int(server["--gen-len"])) == (w.prompt_len, w.gen_len)
    assert server["--cpu-mem-bdw"] == f"{hw.cpu.memory_bandwidth_gbps * 1e9 / 2**30:.1f}"  # GiB/s: utils.py:44
    assert int(client["--max-new-tokens"]) == w.gen_len  # bench.py counts requests of exactly this length
    choice = server_choice(hw, model, w, ServerFlags(cpu_mem_bdw_gib_s=float(server["--cpu-mem-bdw"])))
    assert export.exported_policy == choice.policy
    sent = prompts_sent(int(client["--ubs"]), int(client["--n-ub"]))
    assert sent >= max(c.batch for c in choice.tied) and sent >= choice.policy.micro_batch_size
    # the prediction is the moe-lightning engine's estimate of the server's pick
    assert export.estimate_engine == "moe-lightning"
    expected = estimate(hw, model, w, choice.policy, engine="moe-lightning").generation_throughput_tok_s
    assert export.exported_throughput_tok_s == pytest.approx(expected)
    assert export.planned_policy == plan.policy and export.differences  # the plan's 563 x 4 is not the server's


def test_client_counts_send_at_least_the_batch():
    for batch, ubs in ((2460, 164), (80, 80), (4536, 324), (36, 36), (4, 4), (1000, 68)):
        u, n = client_counts(batch, ubs)
        assert u == ubs and prompts_sent(u, n) >= batch > prompts_sent(u, n - 1)  # the fewest that reach it
    assert prompts_sent(324, 14) == 4480  # 4536 // 80 = 56 question files of 80 (bench.py:28)


@pytest.mark.parametrize("hw_name,tp_flag", [("t4", None), ("2xt4", "2"), ("4xt4", "4")])
def test_t4_exports_one_rank_per_gpu(hw_name, tp_flag):
    hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload()
    export = export_policy("moe-lightning", parse_policy("N=64,mu=16,n=4,attn=cpu,ffn=gpu,rw=0,rc=0"),
                           Context(model=model, workload=workload, hardware=hw), hw=hw)
    server = flag_values(export.commands[0], SERVER)
    assert server.get("--tp-size") == tp_flag


def test_every_flag_of_the_table_is_read_by_import():
    """The sourced table and the import agree: each flag is read (a value of its type)."""
    from hrm.export import EXPORTERS
    from hrm.export.importing import split_flags

    target = EXPORTERS["moe-lightning"]
    samples = {"int": "7", "float": "7.5", "str": "x", "switch": None, "ints": "7", "strs": "no-cache"}
    for flag, fact in FLAG_FACTS.items():
        text = flag if samples[fact.kind] is None else f"{flag} {samples[fact.kind]}"
        assert flag in split_flags(target, text), flag


def test_unrecognised_gpu_gets_no_bandwidth_flag_and_several_are_refused():
    model, workload = load_model("mixtral"), make_workload()
    policy = parse_policy("N=64,mu=16,n=4,attn=cpu,ffn=gpu,rw=0,rc=0")
    a100 = load_hardware("a100-80g")
    export = export_policy("moe-lightning", policy, Context(model=model, workload=workload, hardware=a100), hw=a100)
    assert "--cpu-mem-bdw" not in export.commands[0]  # never read off an L4/T4 (utils.py:60-61)
    two = load_hardware("2xa100-80g")
    with pytest.raises(HRMError, match="one rank"):
        export_policy("moe-lightning", policy, Context(model=model, workload=workload, hardware=two), hw=two)


def test_cli_export_of_a_deepseek_plan_is_refused_in_one_line(tmp_path, capsys):
    result = search(load_hardware("t4"), load_model("deepseek-v2-lite"), make_workload(), top=0,
                    engine="moe-lightning", hw_name="t4", model_name="deepseek-v2-lite")
    path = tmp_path / "deepseek.json"
    save_plan(result.plan, path)
    assert hrm_cli.main(["export", str(path), "--to", "moe-lightning"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Mixtral and DBRX only" in err


# --- import: real commands of the artifact -----------------------------------------------

README_PAIR = ("python -m fastmoe.serve.launch_server --model-path mistralai/Mixtral-8x7B-Instruct-v0.1 --port 30000 "
               "--cpu-mem-bdw 76 --avg-prompt-len 77 --gen-len 32\n"
               "cd benchmarks/mtbench\n"
               "python bench.py --port 30000 --max-new-tokens 32 --ubs 324 --n-ub 14")  # README.md:29-31


def test_import_readme_pair():
    """README.md:29-31: the server picks 324 x 14 (its printout) but bench.py sends 4480
    prompts (4536 // 80 files of 80): 14 micro-batches of about 320."""
    policy, notes = import_command("moe-lightning", README_PAIR, load_model("mixtral"), make_workload(), readme_host())
    assert policy.short() == "N=4480,mu=320,n=14,attn=cpu,ffn=gpu,rw=0,rc=0"
    assert any("4480 prompts" in n for n in notes)


@pytest.mark.parametrize("line,s,n", [
    # benchmarks/mtbench/launch_server.sh:2 (padding) and :4 (no padding)
    ("python -m fastmoe.serve.launch_server --model-path mistralai/Mixtral-8x7B-Instruct-v0.1 --port 30000 "
     "--cpu-mem-bdw 100 --avg-prompt-len 418 --gen-len 256", 418, 256),
    ("python3 -m fastmoe.serve.launch_server --model-path mistralai/Mixtral-8x7B-Instruct-v0.1 --port 30000 "
     "--cpu-mem-bdw 100 --avg-prompt-len 77 --gen-len 256", 77, 256),
])
def test_import_launch_script_server_alone(line, s, n):
    hw, model = load_hardware("l4"), load_model("mixtral")
    policy, notes = import_command("moe-lightning", line, model, make_workload(), hw)
    expected = server_choice(hw, model, make_workload(prompt_len=s, gen_len=n), ServerFlags(cpu_mem_bdw_gib_s=100))
    assert policy == expected.policy and not policy.attn_on_gpu and policy.kv_gpu_ratio == 0
    assert any("no client command" in note for note in notes)


@pytest.mark.parametrize("line,needle", [
    ("python -m fastmoe.serve.launch_server --model-path huggyllama/llama-7b --port 30000",  # tests/test/launch_server.sh:1
     "Mixtral and DBRX only"),
    ("python -m fastmoe.serve.launch_server --model-path mistralai/Mixtral-8x7B-Instruct-v0.1 --port 30000",  # :3
     "--avg-prompt-len"),
    ("--model-path M --avg-prompt-len 77 --gen-len 32 --cpu-mem-bdw 76 --max-new-tokens 64 --ubs 324 --n-ub 14",
     "--max-new-tokens 64"),
    ("--model-path M --avg-prompt-len 77 --gen-len 32 --cpu-mem-bdw 76 --max-new-tokens 32 --ubs 100 --n-ub 2",
     "fewer than the server's micro-batch"),
    ("--model-path M --avg-prompt-len 77 --gen-len 32 --max-new-tokens 32 --ubs 324 --n-ub 14", "--cpu-mem-bdw"),
    ("--model-path mistralai/Mixtral-8x22B-Instruct-v0.1 --avg-prompt-len 77 --gen-len 32 --cpu-mem-bdw 76", "8x22b"),
])
def test_import_refusals(line, needle):
    with pytest.raises(HRMError, match=needle.replace("+", r"\+")):
        import_command("moe-lightning", line, load_model("mixtral"), make_workload(), readme_host())


def test_export_imports_back_from_the_cli(l4_plan, capsys):
    """The issue's failure: the two printed commands pasted into hrm import ("unexpected word
    'python'")."""
    plan, path = l4_plan
    assert hrm_cli.main(["export", str(path), "--to", "moe-lightning"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(commands) == 2
    code = hrm_cli.main(["import", "--from", "moe-lightning", "\n".join(commands), "--hw", "l4", "--model", "mixtral",
                         "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 3) and doc["policy_short"] == export_plan(plan, "moe-lightning").exported_policy.short()


# --- hrm-search: the server's own pick beside HRM's best (engine policy.chosen_by) ---------


def search_json(capsys, *args) -> dict:
    assert hrm_cli.main(["search", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def export_flags(hw) -> ServerFlags:
    """The flags an export prints: the profile's CPU bandwidth in GiB/s to one decimal."""
    return ServerFlags(cpu_mem_bdw_gib_s=round(hw.cpu.memory_bandwidth_gbps * 1e9 / GIB, 1), tp_size=hw.gpu.count)


@pytest.mark.parametrize("hw_name", ["l4", "t4"])
def test_search_json_records_the_servers_pick_and_its_estimate(hw_name, capsys):
    hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload()
    doc = search_json(capsys, "--hw", hw_name, "--model", "mixtral")
    pick = doc["server_pick"]
    expected = server_policy(hw, model, workload, export_flags(hw))
    assert Policy.model_validate(pick["policy"]) == expected
    assert pick["chosen_by"] == "moe-lightning-optimizer" and pick["unavailable"] is None
    assert pick["program"] == SERVER
    est = estimate(hw, model, workload, expected, engine="moe-lightning")
    assert pick["generation_throughput_tok_s"] == pytest.approx(est.generation_throughput_tok_s, rel=1e-9)
    assert pick["decode_throughput_tok_s"] == pytest.approx(est.decode_throughput_tok_s, rel=1e-9)
    # the headline stays the search's best in the space: here not the server's pick, and above it
    plan = Plan.model_validate(doc)
    assert plan.policy != expected
    assert plan.estimate.generation_throughput_tok_s > pick["generation_throughput_tok_s"]
    # the pick the search shows is the one hrm export prints
    assert export_plan(plan, "moe-lightning").exported_policy == expected


def test_search_of_an_engine_that_takes_its_policy_has_no_pick(capsys):
    assert search_json(capsys, "--hw", "l4", "--model", "mixtral", "--engine", "ideal").get("server_pick") is None
    assert hrm_cli.main(["search", "--hw", "l4", "--model", "mixtral", "--engine", "vllm"]) in (0, 3)
    assert "server's own pick" not in capsys.readouterr().out
    assert [name for name in list_engines() if load_engine(name).policy.chosen_by] == ["moe-lightning"]


@pytest.mark.parametrize("args,reason", [
    (["--hw", "cpu-only", "--model", "tiny-mixtral", "--engine", "moe-lightning"], "from the GPU it finds at launch"),
    (["--hw", "l4", "--model", "deepseek-moe-16b"], "Mixtral and DBRX only"),
    # a tiny Mixtral: the optimizer's search runs through millions of candidates
    (["--hw", "l4", "--model", "tiny-mixtral", "--gen-len", "8"], "HRM does not follow it that far"),
])
def test_no_pick_is_one_line_why(args, reason, capsys):
    pick = search_json(capsys, *args)["server_pick"]
    assert pick["policy"] is None and pick["generation_throughput_tok_s"] is None
    assert reason in pick["unavailable"] and "\n" not in pick["unavailable"]
    assert hrm_cli.main(["search", *args]) == 0
    out, err = capsys.readouterr()
    assert "server's own pick" in out and "none: moe-lightning:" in out and "Traceback" not in out + err


def test_the_pick_row_in_words():
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload()
    pick = server_pick(hw, model, workload, load_engine("moe-lightning"))
    line = server_pick_in_words(pick, 500.0)
    assert line.startswith(pick.policy.short()) and f"{pick.generation_throughput_tok_s:,.1f} tok/s" in line
    assert f"what `{SERVER}` runs; HRM's best in its space: 500.0" in line
    assert server_pick(hw, model, workload, load_engine("ideal")) is None


def test_plan_file_keeps_the_pick(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert hrm_cli.main(["search", "--hw", "t4", "--model", "mixtral", "--out", str(path)]) == 0
    assert "server's own pick" in capsys.readouterr().out
    pick = load_plan(path).server_pick
    assert pick.policy == server_policy(load_hardware("t4"), load_model("mixtral"), make_workload(),
                                        export_flags(load_hardware("t4")))


def test_chosen_by_names_a_known_chooser_and_a_pick_has_a_policy_or_a_reason():
    data = load_engine("moe-lightning").model_dump()
    data["policy"]["chosen_by"] = "no-such-optimizer"
    with pytest.raises(ValidationError, match="chosen_by"):
        Engine.model_validate(data)
    assert set(CHOOSERS) == {"moe-lightning-optimizer"}
    with pytest.raises(ValidationError, match="unavailable"):
        ServerPick(chosen_by="moe-lightning-optimizer", program=SERVER)
    with pytest.raises(ValidationError, match="unavailable"):
        ServerPick(chosen_by="moe-lightning-optimizer", program=SERVER, unavailable="no GPU",
                   policy=parse_policy("N=1,mu=1,attn=cpu,rw=0"))
