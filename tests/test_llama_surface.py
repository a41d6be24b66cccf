"""llama.cpp's command surface as hrm import reads it (issue 34 item 3): one user is batch 1
(llama-cli; llama-server without -np), -np N is N users, ik_llama.cpp's flags and --numa on a
multi-node machine are refused in one line."""

import pytest

from hrm.errors import HRMError
from hrm.export.importing import read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.machine.parts import compose_profile
from hrm.workload import make_workload


def _read(command, hw="l4"):
    hw = load_hardware(hw) if isinstance(hw, str) else hw
    return read_command("llama.cpp", command, load_model("mixtral"), make_workload(), hw)


@pytest.mark.parametrize("command", [
    "llama-cli -m mixtral-8x7b-v0.1.Q4_K_M.gguf -ngl 99 --n-cpu-moe 8 -c 4096 -p 'hello' -n 64",
    "llama-server -m mixtral-8x7b.gguf -ngl 99 --n-cpu-moe 8 -c 4096",
    "./main -m mixtral.gguf -ngl 99 --n-cpu-moe 8 -c 4096 -no-cnv",
])
def test_one_user_is_batch_one(command):
    p = _read(command).policy
    assert (p.batch_size, p.micro_batch_size, p.num_micro_batches) == (1, 1, 1)
    assert p.weights_gpu_ratio == pytest.approx((32 - 8) / 32)


def test_np_gives_the_users():
    p = _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 8 -c 16384 -np 4 -kvu").policy
    assert p.batch_size == 4


@pytest.mark.parametrize("flag", ["-rtr", "-fmoe", "-amb 512", "-mla 2"])
def test_ik_llama_flags_refused_in_one_line(flag):
    with pytest.raises(HRMError, match="ik_llama.cpp flag") as exc:
        _read(f"llama-server -m mixtral.gguf -ngl 99 -c 4096 {flag}")
    assert "\n" not in str(exc.value)


def test_numa():
    two = compose_profile("rtx-4090", "epyc-9654", 512, sockets=2)
    with pytest.raises(HRMError, match="2 NUMA nodes"):
        _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 --numa distribute", two)
    one = compose_profile("rtx-4090", "epyc-9654", 512)
    assert _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 --numa distribute", one).policy


def test_threads_are_read():
    # -t 12; the prompt in passes of the default -ub 512 (common/common.h:455); no -np: the auto
    # slots share one KV stream (tools/server/server.cpp:156-160), no per-slot padding
    assert _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 -t 12").engine_fields == \
        {"cpu_threads": 12, "prefill.max_tokens_per_pass": 512, "memory.kv_tokens_multiple": 1}
    assert "memory.kv_tokens_multiple" not in _read(
        "llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 -t 12 -np 2 -ub 2").engine_fields


def test_llama_bench_sweep_on_a_gpu_machine():
    """-t 4,8 -ngl 99 -ncmoe 20,30 is a sweep: every (t, ncmoe) point gets its pp and tg test,
    each the llama.cpp engine's estimate of that placement."""
    from hrm.export.llama_tools import bench_runs, gpu_estimate

    runs, _ = bench_runs("llama-bench -m m.gguf -p 512 -n 128 -t 4,8 -ngl 99 -ncmoe 20,30", 8)
    assert [(r.threads, r.n_cpu_moe, r.prompt_len, r.gen_len) for r in runs] == [
        (t, c, p, n) for t in (4, 8) for c in (20, 30) for p, n in ((512, 0), (0, 128))]
    hw = load_hardware("rtx3090")
    model = load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m")
    tg20 = gpu_estimate(runs[1], hw, model)
    tg30 = gpu_estimate(runs[3], hw, model)
    assert tg20[1] > tg30[1] > 0  # more CPU layers, slower decode
    imported = read_command("llama.cpp", "llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 640 -ub 512", model,
                            make_workload(None, prompt_len=512, gen_len=128), hw)
    from hrm.engines.engine import load_engine
    from hrm.engines.mechanisms import with_fields
    from hrm.estimate import estimate

    engine = with_fields(load_engine("llama.cpp"), {"cpu_threads": 4, "prefill.max_tokens_per_pass": 512})
    same = estimate(hw, model, make_workload(None, prompt_len=1, gen_len=128), imported.policy, engine=engine)
    assert tg20[1] == pytest.approx(same.decode_throughput_tok_s)
    with pytest.raises(HRMError, match="-ngl 10"):
        gpu_estimate(bench_runs("llama-bench -m m.gguf -ngl 10", 8)[0][0], hw, model)


def test_llama_bench_on_a_gpu_machine_reads_the_files_named_weights(capsys):
    """llama-bench -m ...-Q4_K_M.gguf is predicted with Q4_K_M weights, as the llama-server path
    reads the same name (and says so), not the catalog model's 16-bit ones."""
    import json

    from hrm_cli import main

    sweep = "llama-bench -m Qwen3-30B-A3B-Q4_K_M.gguf -ngl 99 -ncmoe 20 -p 512 -n 128"
    base = ["import", "--from", "llama.cpp", "--hw", "l4", "--model", "qwen3-30b-a3b", "--json"]
    assert main([*base, sweep]) == 0
    named = json.loads(capsys.readouterr().out)
    assert main([*base, "--weight-format", "q4_k_m", sweep.replace("-Q4_K_M", "")]) == 0
    given = json.loads(capsys.readouterr().out)
    assert named["tests"] == given["tests"] and all(t["fits_memory"] for t in named["tests"])
    assert any("the model file's name says Q4_K_M" in n for n in named["notes"])


def test_a_local_gguf_is_matched_by_its_header(tmp_path):
    """-m FILE that is here: its header decides, not its name (issue 34: a renamed or oddly named
    file of the right model is read, one of another model refused in one line)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    src = Path("/work/main/.ground/models/gt-mixtral-q4_k_m.gguf")
    if not src.is_file():
        pytest.skip("the ground-truth GGUFs are not on this machine")
    odd = tmp_path / "renamed-anything.gguf"
    odd.symlink_to(src)
    mixtral = load_model(str(root / "benchmarks/ground_truth/configs/gt-mixtral.json"))
    qwen = load_model(str(root / "benchmarks/ground_truth/configs/gt-qwen3moe.json"))
    hw = load_hardware("l4")
    got = read_command("llama.cpp", f"llama-server -m {odd} -ngl 99 -c 1024", mixtral, make_workload(), hw)
    assert any("matches" in n and "GGUF header" in n for n in got.notes)
    with pytest.raises(HRMError, match="its GGUF header") as exc:
        read_command("llama.cpp", f"llama-server -m {odd} -ngl 99 -c 1024", qwen, make_workload(), hw)
    assert "\n" not in str(exc.value)


def test_repack_is_read_from_the_benchmarks_commands():
    """llama-bench --repack 1,0 is a sweep of two runs (tools/llama-bench/llama-bench.cpp:912-918), and
    llama-batched-bench's -nr/--no-repack (common/arg.cpp:2421-2428) keeps the weights unrepacked: the
    CPU step model then reads the plain buffer's kernels (hrm.cost.ggml_cpu.placed_kernels)."""
    from hrm.export.llama_tools import bench_runs

    runs, _ = bench_runs("llama-bench -m m.gguf -t 2 -p 128 -n 0 --repack 1,0", 2)
    assert [(r.label, r.repack) for r in runs] == [("pp128 repack1", True), ("pp128 repack0", False)]
    runs, _ = bench_runs("llama-batched-bench -m m.gguf -npp 32 -ntg 4 -npl 1 -nr", 2)
    assert [r.repack for r in runs] == [False]
    runs, _ = bench_runs("llama-batched-bench -m m.gguf -npp 32 -ntg 4 -npl 1", 2)
    assert [r.repack for r in runs] == [True]


def test_no_c_gives_every_kv_stream_the_trained_context_under_fit():
    """No -c and -np 64 (a KV stream per slot): llama.cpp's --fit, on by default, gives every stream
    the model's trained context (common/fit.cpp:197,267-272), so 546-token sequences fit; with
    --fit off the trained context is split among the slots (512 each) and the server rejects them."""
    got = _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 28 -np 64")
    assert got.policy.batch_size == 64 and any("each of the 64 slots' KV streams" in n for n in got.notes)
    with pytest.raises(HRMError, match=r"no -c \(the model's 32768 tokens\) with 64 slots gives each 512"):
        _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 28 -np 64 --fit off")


def test_ngl_auto_is_estimated_where_fit_places_the_experts(capsys):
    """No -ngl (auto) and no tensor placement: llama.cpp's --fit moves the first layers' experts to
    the CPU until each GPU keeps its 1 GiB margin (common/fit.cpp); hrm import estimates that
    placement. By hand: the fewest CPU layers whose GPU memory is within the physical limit less
    1 GiB, one fewer is not. -ngl given, or --fit off, keeps every layer on the GPU (exit 3)."""
    import json

    from hrm.cost.memory import physical_limits
    from hrm.engines.engine import load_engine
    from hrm.estimate import estimate
    from hrm.policy import Policy
    from hrm_cli import main

    base = ["import", "--from", "llama.cpp", "--hw", "rtx3090", "--model", "qwen3-30b-a3b", "--json"]
    assert main([*base, "llama-server -m Qwen3-30B-A3B-BF16.gguf -c 4096"]) == 0
    out = json.loads(capsys.readouterr().out)
    hw, model = load_hardware("rtx3090"), load_model("qwen3-30b-a3b")
    layers = model.num_moe_layers
    engine = load_engine("llama.cpp")
    room = physical_limits(hw, engine).gpu_bytes - 2**30
    workload = make_workload(None, prompt_len=out["workload"]["prompt_len"], gen_len=out["workload"]["gen_len"])

    def gpu_bytes(cpu_layers):
        p = Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                   weights_gpu_ratio=(layers - cpu_layers) / layers, kv_gpu_ratio=1.0)
        return estimate(hw, model, workload, p, engine=engine).gpu_peak_bytes

    k = round((1 - out["policy"]["weights_gpu_ratio"]) * layers)
    assert 0 < k < layers and gpu_bytes(k) <= room < gpu_bytes(k - 1)
    assert any(f"--n-cpu-moe {k}," in n for n in out["notes"])
    for pinned in ("llama-server -m Qwen3-30B-A3B-BF16.gguf -c 4096 -ngl 99", "llama-server -m Qwen3-30B-A3B-BF16.gguf -c 4096 --fit off"):
        assert main([*base, pinned]) == 3
        capsys.readouterr()


def test_fit_margins_and_ngl_words_as_llama_cpp_reads_them():
    """-ngl -1 is auto and -2 or below all (common/arg.cpp:2787-2801); --fit-target's MiB, one
    for every device or one each (:2895-2919), is the margin --fit leaves; 1 GiB by default."""
    from hrm.export.llama_cpp import fit_margins_bytes, ngl_word

    assert [ngl_word({"-ngl": [v]}) for v in ("-1", "auto", "-2", "-7", "all", "0", "99")] == \
        ["auto", "auto", "all", "all", "all", "0", "99"]
    assert ngl_word({}) == "auto"
    assert fit_margins_bytes(None, 2) == 2 * 1024 * 2**20
    assert fit_margins_bytes({"--fit-target": ["4096"]}, 2) == 2 * 4096 * 2**20
    assert fit_margins_bytes({"--fit-target": ["4096,2048"]}, 2) == 6144 * 2**20


def test_a_larger_fit_target_leaves_more_experts_on_the_cpu(capsys):
    import json

    from hrm_cli import main

    base = ["import", "--from", "llama.cpp", "--hw", "l4", "--model", "qwen3-30b-a3b", "--json"]
    rw = {}
    for extra in ("", " -ngl -1", " --fit-target 4096"):
        assert main([*base, "llama-server -m Qwen3-30B-A3B-BF16.gguf -c 4096" + extra]) == 0
        rw[extra] = json.loads(capsys.readouterr().out)["policy"]["weights_gpu_ratio"]
    assert rw[""] == rw[" -ngl -1"] > rw[" --fit-target 4096"]
    assert main([*base, "llama-server -m Qwen3-30B-A3B-BF16.gguf -c 4096 -ngl -2"]) == 3  # all: no fit
