"""kTransformers' --kt-* flags of SGLang (issue 34 part 3), read against kvcache-ai/sglang@04653fa8
and kvcache-ai/ktransformers@95009ea6 (hrm/export/sglang_kt.py): the GPU experts' share, the CPU
experts' format per --kt-method, threads and NUMA pools, the GPU prefill threshold, and one-line
refusals of malformed values. Expected numbers are derived here by hand (Mixtral-8x7B: 32 MoE
layers of 8 experts, fp16; DeepSeek-V3: 58 MoE layers of 256, fp8 with 128x128 block scales)."""

from __future__ import annotations

import pytest

from hrm.cost.costs import static_bytes_per_param, weight_bytes_per_param
from hrm.engines.engine import load_engine
from hrm.engines.mechanisms import with_fields
from hrm.errors import HRMError
from hrm.export import export_policy
from hrm.export.importing import read_command
from hrm.machine.hardware import load_hardware
from hrm.machine.parts import compose_profile
from hrm.model.spec import load_model
from hrm.policy import parse_policy
from hrm.workload import make_workload
from hrm.export.target import Context

BASE = "python -m sglang.launch_server --model-path MODEL --max-running-requests 8 --kt-weight-path W "


def read(text, model="mixtral", hw=None):
    return read_command("sglang", text, load_model(model), make_workload(), hw or load_hardware("l4"))


def test_num_gpu_experts_is_per_layer_and_ratio_of_all_experts_overrides_it():
    """k per MoE layer -> k·L of E·L (kt_ep_wrapper.py:1935-1941): r_w = k/E; a ratio f keeps
    int(E·L·f) (:1918-1934): int(8·32·0.3) = int(76.8) = 76 of 256, and wins over k."""
    assert read(BASE + "--kt-num-gpu-experts 3").policy.weights_gpu_ratio == pytest.approx(3 / 8)
    for extra in ("--kt-gpu-experts-ratio 0.3", "--kt-gpu-experts-ratio 0.3 --kt-num-gpu-experts 7"):
        imported = read(BASE + extra)
        assert imported.policy.weights_gpu_ratio == pytest.approx(76 / 256)
        assert any("76 experts on the GPU" in n for n in imported.notes)


@pytest.mark.parametrize("method,dtype,fmt,bytes_per_weight", [
    ("AMXINT8", "int8", "int8-channelwise", 1.0),  # BufferB: n·k int8 (+ n fp32 scales, not counted)
    ("AMXINT4", "int4", "int4-channelwise", 0.5),  # BufferBInt4Impl: n·k/2 bytes (+ n fp32 scales)
    ("FP8", "int8", "fp8-block128", 1 + 4 / (128 * 128)),  # 1 byte + one fp32 per 128x128 block
    ("GPTQ_INT4", "int4", "int4-g128", (64 + 2) / 128),  # 64 bytes of nibbles + an fp16 scale per 128
])
def test_kt_method_stores_the_cpu_experts_and_keeps_the_rest(method, dtype, fmt, bytes_per_weight):
    """A converted --kt-weight-path holds the experts in --kt-method's format; attention and the
    rest stay as --model-path stores them (Mixtral: fp16, 2 bytes)."""
    imported = read(BASE + f"--kt-method {method} --kt-num-gpu-experts 2")
    model = imported.model
    assert (model.weight_dtype, model.weight_format, model.static_weight_format) == (dtype, fmt, "fp16")
    assert weight_bytes_per_param(model) == pytest.approx(bytes_per_weight)
    assert static_bytes_per_param(model) == 2.0
    assert any(f"--kt-method {method}" in n and "GPU's experts" in n for n in imported.notes)


def test_default_method_is_amxint4_and_bf16_keeps_the_model():
    """--kt-method defaults to AMXINT4 (server_args.py:4834-4839); BF16 on a 16-bit model and k = 0
    change nothing but where the experts run."""
    assert read(BASE + "--kt-num-gpu-experts 2").model.weight_format == "int4-channelwise"
    assert read(BASE + "--kt-method BF16 --kt-num-gpu-experts 0").model is None


def test_shared_checkpoint_is_the_whole_model_in_that_format():
    """--kt-weight-path = --model-path (GPTQ_INT4, FP8 checkpoints): every weight in that format."""
    text = ("python -m sglang.launch_server --model-path /m/Qwen3-30B-A3B-GPTQ-Int4/ --max-running-requests 1 "
            "--kt-weight-path /m/Qwen3-30B-A3B-GPTQ-Int4 --kt-method GPTQ_INT4 --kt-num-gpu-experts 2")
    imported = read(text, "qwen3-30b-a3b")
    assert imported.policy.weights_gpu_ratio == pytest.approx(2 / 128)
    assert static_bytes_per_param(imported.model) == weight_bytes_per_param(imported.model) == pytest.approx(66 / 128)


def test_deepseek_v3_amxint8_keeps_its_fp8_attention():
    """ktransformers#1804's form: DeepSeekV3 (the directory) is deepseek-v3; 2 of 256 experts a
    layer on the GPU; the CPU experts int8 (1 byte), the rest fp8 with block scales."""
    text = ("python -m sglang.launch_server --model /home/models/DeepSeekV3 --kt-weight-path /home/models/X-Int8 "
            "--kt-num-gpu-experts 2 --kt-method AMXINT8 --max-running-requests 10")
    imported = read(text, "deepseek-v3")
    assert imported.policy.weights_gpu_ratio == pytest.approx(2 / 256) and imported.policy.batch_size == 10
    assert weight_bytes_per_param(imported.model) == 1.0
    assert static_bytes_per_param(imported.model) == pytest.approx(1 + 4 / (128 * 128))


def test_export_names_the_method_of_the_models_format_and_reads_back():
    """deepseek-v3 (fp8 block-128) exports --kt-method FP8 reading its own checkpoint; read back,
    the model is unchanged and r_w is k/E."""
    ctx = Context(model=load_model("deepseek-v3"), workload=make_workload(), hardware=load_hardware("h100"))
    export = export_policy("sglang", parse_policy("N=4,mu=4,n=1,attn=gpu,ffn=gpu,rw=0.125,rc=1"), ctx)
    values = {f.flag: f.value for f in export.flags}
    assert values["--kt-method"] == "FP8" and values["--kt-weight-path"] == "MODEL"
    assert values["--kt-num-gpu-experts"] == "32"  # int(256 x 0.125)
    back = read_command("sglang", export.commands[0], ctx.model, ctx.workload, ctx.hardware)
    assert back.model is None and back.policy.weights_gpu_ratio == pytest.approx(32 / 256)


def test_threads_and_pools_are_read_against_the_machine():
    """--kt-cpuinfer N and --kt-threadpool-count P (one pool per NUMA node, default 2):
    said when they differ from the machine's cores and nodes (2 x 56-core Xeon: 112, 2)."""
    hw = compose_profile("rtx-4090", "xeon-platinum-8480plus", 512, 1, 2)
    notes = read(BASE + "--kt-num-gpu-experts 2 --kt-cpuinfer 64", hw=hw).notes
    assert any("--kt-cpuinfer 64" in n and "112 cores" in n for n in notes)
    assert not any("--kt-threadpool-count" in n for n in notes)  # the default 2 = the two sockets
    notes = read(BASE + "--kt-num-gpu-experts 2 --kt-cpuinfer 24 --kt-threadpool-count 1", hw=hw).notes
    assert any("--kt-threadpool-count 1" in n and "has 2" in n for n in notes)


def test_prefill_threshold_is_the_engines_op_offload_min_tokens():
    """Passes of T tokens or more compute the layer's experts on the GPU (kt_ep_wrapper.py:2954-2958);
    0 leaves it off."""
    imported = read(BASE + "--kt-num-gpu-experts 2 --kt-gpu-prefill-token-threshold 4096")
    assert imported.engine_fields == {"op_offload_min_tokens": 4096}
    assert with_fields(load_engine("sglang"), imported.engine_fields).op_offload_min_tokens == 4096
    assert read(BASE + "--kt-num-gpu-experts 2 --kt-gpu-prefill-token-threshold 0").engine_fields == {}


@pytest.mark.parametrize("extra,flag", [
    ("--kt-method FOO --kt-num-gpu-experts 2", "--kt-method FOO"),
    ("--kt-method RAWINT4 --kt-num-gpu-experts 2", "--kt-method RAWINT4"),
    ("--kt-num-gpu-experts 9", "--kt-num-gpu-experts 9"),
    ("--kt-num-gpu-experts two", "--kt-num-gpu-experts"),
    ("--kt-num-gpu-experts -1", "--kt-num-gpu-experts"),
    ("--kt-gpu-experts-ratio 1.5", "--kt-gpu-experts-ratio"),
    ("--kt-num-gpu-experts 2 --kt-cpuinfer 0", "--kt-cpuinfer"),
    ("--kt-num-gpu-experts 2 --kt-threadpool-count 0", "--kt-threadpool-count"),
    ("--kt-num-gpu-experts 2 --kt-cpuinfer 2 --kt-threadpool-count 4", "--kt-threadpool-count 4"),
    ("--kt-num-gpu-experts 2 --kt-expert-placement-strategy best", "--kt-expert-placement-strategy best"),
    ("--kt-num-gpu-experts 2 --kt-gpu-prefill-token-threshold -5", "--kt-gpu-prefill-token-threshold"),
])
def test_malformed_kt_values_are_refused_in_one_line_naming_the_flag(extra, flag):
    with pytest.raises(HRMError) as info:
        read(BASE + extra)
    assert flag in str(info.value) and "\n" not in str(info.value)
