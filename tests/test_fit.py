"""hrm fit (hrm.analysis.fit, hrm_cli.fit): the pick is the optimum of an independent enumeration on the
same estimators, llama.cpp's defaults are among the candidates, memory and KV by hand, and bad
inputs end in one line."""

from pathlib import Path

import pytest

from hrm.errors import InfeasibleError
from hrm.analysis.fit import fit_cpu, fit_gpu
from hrm.cost.ggml_cpu import kv_bytes_per_token, run_times
from hrm.model.gguf import read_inventory
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.machine.parts import compose_profile

ROOT = Path(__file__).resolve().parents[1]
HOST = ROOT / "docs/validation/runs/this-host-llamacpp.yaml"
TABLE = ROOT / "docs/validation/runs/gguf/gt-qwen3moe-q4_k_m.tensors.json"


@pytest.fixture(scope="module")
def host():
    return load_hardware(str(HOST))


@pytest.fixture(scope="module")
def inventory():
    return read_inventory(TABLE)


def test_kv_bytes_by_hand(inventory):
    a = inventory.attention  # gt-qwen3moe: 8 layers, 4 KV heads of 64 + 64
    assert (a.layers, a.kv_heads, a.k_width, a.v_width) == (8, 4, 64, 64)
    assert kv_bytes_per_token(inventory) * 1000 == 8 * 4 * (64 + 64) * 2 * 1000


def test_cpu_fit_is_the_enumerated_optimum(host, inventory):
    context, gen = 640, 8
    prompt = context - gen
    res = fit_cpu(host, inventory, context, gen, ubatches=(128, 512, 1024))
    # independent enumeration: decode on -t, prefill on -tb and -ub (run_times directly); -ub 1024
    # is past the 512 rows the profile's dense matmuls were measured at, so not a pick
    best = None
    for t in (1, 2):
        dec = run_times(inventory, host.ggml_cpu, t, 1, 0, gen, prompt)
        for tb in (1, 2):
            for ub in (128, 512):
                pre = run_times(inventory, host.ggml_cpu, tb, 1, prompt, 0, 0, max(2048, ub), ub, tb)
                total = pre.prefill_s + dec.decode_s
                if best is None or total < best[0]:
                    best = (total, t, tb, ub)
    assert res.best.total_s == pytest.approx(best[0], rel=1e-9)
    assert (res.best.knobs["threads"], res.best.knobs["threads_batch"], res.best.knobs["ubatch"]) == best[1:]
    assert res.searched == 2 * 2 * 3
    # llama.cpp's defaults on 2 cores: -t 2, -ub 512 (common/common.h:454; common/common.cpp physical cores)
    assert res.default.knobs == {"threads": 2, "threads_batch": 2, "ubatch": 512, "batch": 2048, "measured_rows": True,
                                 "repack": True, "kv_unified": False}
    assert not any(c.flags[-1][0] == "-nr" for c in (res.best, *res.runners_up))  # no plain-buffer kernels here
    assert res.best.total_s <= res.default.total_s
    assert all(c.total_s >= res.best.total_s for c in res.runners_up)
    # memory: the file's weights and the f16 KV of the context
    assert res.best.memory_bytes["cpu"] == pytest.approx(inventory.weight_bytes + kv_bytes_per_token(inventory) * context)


def test_cpu_fit_keeps_to_the_measured_rows(host, inventory):
    # mm curves reach 512 rows, mmid 128 rows per expert (docs/validation/runs/this-host-llamacpp.yaml)
    reach = {op: max(max(p.x for p in k.s_per_elem_vs_rows) for k in host.ggml_cpu.kernels if k.op == op)
             for op in ("mm", "mmid")}
    assert reach == {"mm": 512.0, "mmid": 128.0}
    res = fit_cpu(host, inventory, 2200, 8, ubatches=(512, 2048))
    assert res.best.knobs["ubatch"] == 512 and res.infeasible == 4  # the four -ub 2048 candidates (t x tb)
    assert any("-ub 2048: past the rows" in n for n in res.notes)
    loose = fit_cpu(host, inventory, 2200, 8, ubatches=(512, 2048), extrapolate=True)
    assert loose.infeasible == 0


def test_cpu_fit_objectives(host, inventory):
    dec = fit_cpu(host, inventory, 300, 4, objective="decode", ubatches=(512,))
    assert dec.best.decode_tok_s == max(c.decode_tok_s for c in (dec.best,) + dec.runners_up)
    assert dec.best.knobs["threads"] == 2  # two threads decode faster on this host (its measured kernels)


@pytest.mark.parametrize("model", ["gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"])
def test_cpu_fit_leaves_weights_unpacked_for_a_prompt_as_the_runs_measured(model):
    """On a profile with the plain buffer's kernels (docs/validation/runs/this-host-repack.yaml), hrm fit
    searches -nr: for a prompt-bound request it picks -nr, for a decode-bound one llama.cpp's repacking,
    each the direction llama-bench --repack 1,0 measured on the same files (runs/llamacpp-cpu-repack.yaml:
    prompts 1.18-1.70x faster without repacking, decodes 0.84-0.90x as fast); and the pick is the
    enumerated optimum over both buffers (run_times directly)."""
    from hrm.analysis.fit import plain_kernels_measured
    from hrm.analysis.validation import load_runs_file
    from hrm.cost.ggml_cpu import HOST_BUFFER

    hw = load_hardware(str(ROOT / "docs/validation/runs/this-host-repack.yaml"))
    inv = read_inventory(ROOT / f"docs/validation/runs/gguf/{model}-q4_k_m.tensors.json")
    assert plain_kernels_measured(hw.ggml_cpu, inv, 2) and not plain_kernels_measured(host_profile(), inv, 2)
    runs = {r["name"]: r["measured"] for r in load_runs_file(ROOT / "docs/validation/runs/llamacpp-cpu-repack.yaml").runs}
    on, off = (runs[f"{model} q4_k_m t2 d0 repack{r} (llama-bench)"] for r in (1, 0))
    prefill = fit_cpu(hw, inv, 160, 32, objective="prefill", ubatches=(128, 512))
    decode = fit_cpu(hw, inv, 160, 32, objective="decode", ubatches=(128, 512))
    assert prefill.best.knobs["repack"] is False and prefill.best.flags[-1] == ("-nr", "")
    assert off["prefill_s"] < on["prefill_s"]  # measured: the prompt runs faster without repacking
    assert decode.best.knobs["repack"] is True and off["decode_s"] > on["decode_s"]
    best = max((run_times(inv, hw.ggml_cpu, 2, 1, 128, 0, 0, 2048, ub, 2, buffer=buf).prefill_tok_s, buf is None)
               for ub in (128, 512) for buf in (None, HOST_BUFFER))
    assert prefill.best.prefill_tok_s == pytest.approx(best[0], rel=1e-9) and prefill.best.knobs["repack"] is best[1]


def host_profile():
    return load_hardware(str(HOST)).ggml_cpu


@pytest.fixture(scope="module")
def gpu_fit():
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    model = load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m")
    return hw, model, fit_gpu(hw, model, 4096, 64, ubatches=(512, 2048))


def test_gpu_fit_fewest_cpu_layers_that_fit(gpu_fit):
    from hrm.engines.engine import load_engine
    from hrm.engines.mechanisms import with_fields
    from hrm.estimate import estimate
    from hrm.cost.memory import physical_limits
    from hrm.policy import Policy
    from hrm.workload import make_workload

    hw, model, res = gpu_fit
    best = res.best
    assert best.fits and best.knobs["kv"] == "gpu"
    k = best.knobs["cpu_layers"]
    assert 0 < k < 32  # mixtral at ~4.5 bits is ~26 GB: some layers must leave a 24 GiB card
    # one CPU layer fewer, same -ub, estimated here: over the GPU's physical memory less llama.cpp's
    # --fit margin (1 GiB a GPU, common/common.h:483): what the pick leaves free, as the fit does
    engine = with_fields(load_engine("llama.cpp"), {"cpu_threads": best.knobs["threads"],
                                                    "prefill.max_tokens_per_pass": best.knobs["ubatch"]})
    physical = physical_limits(hw, engine)
    limits = type(physical)(physical.gpu_bytes - 2**30, physical.cpu_bytes, physical.shared)
    work = make_workload(None, prompt_len=4096 - 64, gen_len=64)
    fewer = estimate(hw, model, work, Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True,
                                             ffn_on_gpu=True, weights_gpu_ratio=(32 - k + 1) / 32, kv_gpu_ratio=1.0),
                     limits=limits, engine=engine)
    assert not fewer.fits(limits)
    same = estimate(hw, model, work, Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True,
                                            ffn_on_gpu=True, weights_gpu_ratio=(32 - k) / 32, kv_gpu_ratio=1.0),
                    limits=limits, engine=engine)
    assert best.decode_tok_s == pytest.approx(same.decode_throughput_tok_s)
    assert best.memory_bytes["gpu"] == pytest.approx(same.gpu_peak_bytes)
    assert f"--n-cpu-moe {k}" in best.args() and "-ngl 33" in best.args()
    # searched: (32 + 1) CPU-layer counts x 2 KV places x 2 -ub x the -t of the catalog CPU's kernel prior
    # (hrm.machine.ggml_prior: 1, 2, 4, 8 and the 7950X's 16 cores)
    assert sorted({k.threads for k in hw.ggml_cpu.kernels}) == [1, 2, 4, 8, 16]
    assert res.searched == 33 * 2 * 2 * 5  # both -ub are below the 4032-token prompt
    assert res.default is not None and res.default.knobs["ubatch"] == 512
    assert best.total_s <= res.default.total_s


def test_gpu_fit_nothing_fits():
    hw = compose_profile("rtx-3060-12gb", "ryzen-7-5800x", 8)
    with pytest.raises(InfeasibleError, match="none of the"):
        fit_gpu(hw, load_model("mixtral"), 2048, 64, ubatches=(512,))


@pytest.mark.parametrize("argv, text", [
    (["--context", "2048"], "a machine is required"),
    (["--cpu", "ryzen-9-7950x", "--ram", "64", "--context", "2048"], "no GPU: give --gguf"),
    (["--gpu", "rtx-4090", "--cpu", "ryzen-9-7950x", "--ram", "64", "--context", "2048"], "--model is required"),
    (["--gpu", "rtx-4909", "--cpu", "ryzen-9-7950x", "--ram", "64", "--model", "mixtral", "--context", "2048"],
     "did you mean 'rtx-4090'"),
    (["--hw", str(HOST), "--gguf", str(TABLE), "--context", "64", "--gen", "64"], "context must hold"),
    (["--hw", str(HOST), "--gguf", str(TABLE), "--context", "640", "--users", "0"], "--users 0"),
    (["--hw", "l4", "--cpu", "ryzen-9-7950x", "--context", "640"], "not both"),
    # hrm fit's own flag, not the workload flags it builds (--max-prompt-len/--gen-len)
    (["--hw", "l4", "--model", "mixtral", "--context", "32769"], "--context 32769 exceeds the context window"),
])
def test_cli_refusals(argv, text, capsys):
    from hrm_cli import main

    assert main(["fit"] + argv) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1


def test_cli_json(capsys):
    import json

    from hrm_cli import main

    assert main(["fit", "--hw", str(HOST), "--gguf", str(TABLE), "--context", "300", "--gen", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == "cpu" and out["command"].startswith("llama-cli -m ")
    assert "-t 2" in out["best"]["args"] and out["llama_cpp_defaults"] is not None


# --- the ollama answer (hrm.analysis.fit_ollama) --------------------------------------------

def test_ollama_answer_reads_back_as_the_llama_cpp_pick():
    """Fits on the GPU whole: the Modelfile ollama is given launches the pick's own flags."""
    from hrm.export.ollama import llama_server_values, read_settings
    from hrm.export.target import Context
    from hrm.workload import make_workload

    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    model = load_model("qwen3-30b-a3b", weight_dtype="int4")
    r = fit_gpu(hw, model, 8192)
    assert r.best.knobs["n_cpu_moe"] == 0 and r.ollama.same_as_llama_cpp
    assert r.ollama.decode_tok_s == r.best.decode_tok_s
    ctx = Context(model=model, workload=make_workload(), hardware=hw)
    launched = llama_server_values(read_settings(r.ollama.modelfile.replace("MODEL", "qwen3:30b")), ctx)[0]
    pick = {flag: [value] for flag, value in r.best.flags if value}
    for flag in ("-ngl", "-c", "-np", "-ub", "-t", "-fa"):
        assert launched[flag] == pick[flag], flag
    assert r.ollama.num_gpu == 48 + 1  # 48 blocks and the output layer (src/llama-model.cpp:1589-1593)


def test_ollama_answer_for_partial_expert_offload():
    """int8 Qwen3-30B-A3B (~30 GiB) on 24 GiB: the pick keeps k layers' experts on the CPU; ollama
    cannot say so; no all-GPU command fits, so num_gpu keeps the same blocks wholly on the GPU:
    48 - k blocks plus the output layer, its decode bounded by the pick's."""
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    model = load_model("qwen3-30b-a3b", weight_dtype="int8")
    r = fit_gpu(hw, model, 8192)
    k = r.best.knobs["n_cpu_moe"]
    assert k > 0 and not r.ollama.same_as_llama_cpp
    assert r.ollama.num_gpu == 48 - k + 1
    assert f"PARAMETER num_gpu {48 - k + 1}" in r.ollama.modelfile
    assert r.ollama.line.startswith(f"ollama cannot express --n-cpu-moe {k}") and "\n" not in r.ollama.line
    assert r.ollama.decode_tok_s is None and r.ollama.decode_at_most_tok_s == r.best.decode_tok_s


def test_ollama_answer_takes_the_best_all_gpu_candidate_when_one_fits():
    from hrm.analysis.fit import Candidate
    from hrm.analysis.fit_ollama import ollama_answer

    model = load_model("qwen3-30b-a3b")

    def cand(n, decode, kv=()):
        flags = (("-ngl", "49"), ("--n-cpu-moe", str(n)), ("-c", "4096"), ("-np", "1"), ("-ub", "512"), *kv)
        return Candidate(flags, 100.0, decode, 1.0, knobs={"n_cpu_moe": n})
    best, nkvo, all_gpu = cand(4, 50.0), cand(0, 45.0, (("-nkvo", ""),)), cand(0, 40.0)
    a = ollama_answer(best, [best, nkvo, all_gpu], model)
    assert (a.decode_tok_s, a.num_gpu, a.same_as_llama_cpp) == (40.0, 49, False)  # -nkvo is skipped too
    assert "PARAMETER num_ctx 4096" in a.modelfile and "PARAMETER num_batch 512" in a.modelfile


def test_cli_prints_the_ollama_answer(capsys):
    from hrm_cli.fit import main

    assert main(["--gpu", "rtx-4090", "--cpu", "ryzen-9-7950x", "--ram", "64", "--model", "qwen3-30b-a3b",
                 "--weight-dtype", "int8", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "ollama: ollama cannot express --n-cpu-moe" in out and "PARAMETER num_gpu" in out


def test_hrm_fit_beats_llama_fit_params_on_this_host_as_measured():
    """docs/validation/runs/fit-vs-fitparams-nr.yaml: hrm fit's command (-nr, on this-host-repack.yaml,
    context 2048, 64 generated) and llama-fit-params' (-c 4096 -ngl -1: llama.cpp's defaults), each run 3
    times alternately as one request (llama-bench -pg 1984,64). hrm fit still picks that command; it
    measured 1.09-1.41x faster, and the gain hrm fit printed is within 10% of the measured one."""
    import statistics

    import yaml

    from hrm.analysis.fit import fit_cpu

    data = yaml.safe_load((ROOT / "docs/validation/runs/fit-vs-fitparams-nr.yaml").read_text())
    hw = load_hardware(str(ROOT / "docs/validation/runs" / data["hardware"]))
    assert len(data["runs"]) == 3
    for run in data["runs"]:
        table = ROOT / "docs/validation/runs/gguf" / run["model"].replace(".gguf", ".tensors.json")
        fit = fit_cpu(hw, read_inventory(table), run["context"], run["gen"])
        assert fit.best.args() == run["hrm_fit_args"] and fit.best.flags[-1] == ("-nr", "")
        theirs, ours = (statistics.median(run["measured_total_s"][k]) for k in ("fit-params", "hrm-fit"))
        measured_gain, predicted_gain = theirs / ours, fit.default.total_s / fit.best.total_s
        assert measured_gain > 1.05, run["model"]
        assert max(ours, *run["measured_total_s"]["hrm-fit"]) < min(run["measured_total_s"]["fit-params"])
        assert 1 / 1.1 <= predicted_gain / measured_gain <= 1.1, (run["model"], predicted_gain, measured_gain)


def test_cpu_fit_says_when_it_could_not_search_no_repack():
    """A profile without the plain buffer's kernels (measured before hrm profile had them) cannot price
    -nr: a model with repacked types gets a note, an f16 model (nothing repacked) does not."""
    hw = load_hardware(str(ROOT / "docs/validation/runs/this-host-window99.yaml"))
    tables = ROOT / "docs/validation/runs/gguf"
    q4 = fit_cpu(hw, read_inventory(tables / "gt-qwen3moe-q4_k_m.tensors.json"), 1024, 32, ubatches=(512,))
    f16 = fit_cpu(hw, read_inventory(tables / "gt-qwen3moe-f16.tensors.json"), 1024, 32, ubatches=(512,))
    assert any(n.startswith("-nr (no repacking) not searched") for n in q4.notes)
    assert not any("-nr" in n for n in f16.notes) and not any(c.knobs["repack"] is False for c in (q4.best, *q4.runners_up))


def test_cpu_fit_for_many_users_weighs_one_kv_stream_against_one_each(host, inventory):
    """64 users decoding together: one unified stream (-kvu) makes every decode step's 64 rows the
    tiled kernel over every user's cells (ground_truth.md §1.14, measured 1.3-1.6x on this file), so
    hrm fit's -kvu candidates decode slower than their stream-per-user twins and its pick has no -kvu;
    both are searched, -kvu printed only where priced."""
    res = fit_cpu(host, inventory, 128, 4, users=64, ubatches=(512,))
    cands = [res.best, *res.runners_up]
    twins = {}
    for c in cands:
        twins.setdefault((c.knobs["threads_batch"], c.knobs["ubatch"], c.knobs["repack"]), {})[c.knobs["kv_unified"]] = c
    paired = [pair for pair in twins.values() if len(pair) == 2]
    assert paired
    for pair in paired:
        assert pair[True].decode_tok_s < pair[False].decode_tok_s
        assert ("-kvu", "") in pair[True].flags and ("-kvu", "") not in pair[False].flags
    assert not res.best.knobs["kv_unified"] and not res.default.knobs["kv_unified"]


# --- what the answer prints: ties, runners-up, the weight format alone -----------------------

@pytest.fixture(scope="module")
def all_gpu_fit():
    """Qwen3-30B-A3B at ~4.9 bits on a 24 GiB card: every layer fits the GPU, so -t (no CPU
    layers) changes nothing the estimate prices, and -ub only the prefill (each pass re-reads
    the weights from GPU memory)."""
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    model = load_model("qwen3-30b-a3b", weight_dtype="int4").with_weight_format("q4_k_m")
    return fit_gpu(hw, model, 8192, 128, ubatches=(256, 512, 1024))


def test_a_tie_goes_to_llama_cpps_defaults_and_is_named(all_gpu_fit):
    from hrm.analysis.fit import _prediction

    res = all_gpu_fit
    best = res.best
    assert best.knobs["cpu_layers"] == 0 and best.knobs["kv"] == "gpu"
    tied = [c for c in (*res.runners_up,) if _prediction(c) == _prediction(best)]
    assert not tied  # a runner-up has a prediction of its own
    # the default -t predicts the same as the other -t: the default is printed
    assert best.knobs["threads"] == 16
    line = next(w for w in res.why if w.startswith("the same prediction with"))
    assert "-t 1/2/4/8" in line and "-ub" not in line
    # -ub is not a tie: every pass reads the weights from GPU memory again, so the largest -ub
    # prefills fastest at the same decode, and the answer says so against the default -ub 512
    assert best.knobs["ubatch"] == 1024 and res.default.knobs["ubatch"] == 512
    assert best.decode_tok_s == res.default.decode_tok_s and best.prefill_tok_s > res.default.prefill_tok_s
    assert any(w.startswith("-ub 1024: prefill") and "re-reading the layers' weights from GPU memory" in w
               and "PCIe" not in w for w in res.why)
    # every runner-up differs from every other in what is printed
    assert len({_prediction(c) for c in res.runners_up}) == len(res.runners_up)


def test_weight_format_alone_sets_the_dtype_its_bits_imply(capsys):
    from hrm.model.quantized import quantized_dtype
    from hrm_cli import main
    from hrm_cli.common import with_format_args

    # what hrm fit (and every --weight-format flag) builds: alone = with the dtype its bits imply
    alone = with_format_args(load_model("qwen3-30b-a3b"), "q4_k_m", None)
    assert alone == load_model("qwen3-30b-a3b", weight_dtype="int4").with_weight_format("q4_k_m")
    # a float dtype given beside a GGUF type is still a contradiction (one line, exit 2)
    machine = ["--gpu", "rtx-4090", "--cpu", "ryzen-9-7950x", "--ram", "64", "--model", "qwen3-30b-a3b",
               "--context", "4096"]
    assert main(["fit", *machine, "--weight-dtype", "fp16", "--weight-format", "q4_k_m"]) == 2
    assert "needs quantized weights" in capsys.readouterr().err
    # the rule: 8 bits per weight or more is int8 (q8_0: 34 bytes per 32 weights), anything less int4
    assert [quantized_dtype(f) for f in ("q8_0", "q6_k", "q4_k_m", "iq1_s", "mxfp4")] == \
        ["int8", "int4", "int4", "int4", "int4"]
