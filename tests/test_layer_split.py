"""llama.cpp's layer split over several GPUs (engine field ``gpu_split: layers``): the GPUs run
their blocks of layers one after another, so a step is the sum of each GPU's layers' time at
its own rates plus the hidden states' hop (a prompt's ubatches pipelined across them: not modelled).
And a llama-server command's -ub / -b as the prompt's pass. Every expected number is derived
here by hand from the parts' datasheets and the model's bytes."""

from __future__ import annotations

import math

import pytest

from hrm.cost import costs
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.prefill import prefill_passes, prefill_resources
from hrm.engines.engine import Engine, load_engine
from hrm.engines.mechanisms import with_fields
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.export.importing import read_command
from hrm.machine.parts import catalog, compose_profile
from hrm.machine.rates import rates_from_profile
from hrm.model.options import DEFAULT_OPTIONS
from hrm.model.spec import load_model
from hrm.policy import Policy
from hrm.units import dtype_bytes
from hrm.workload import make_workload

GPU, CPU = "rtx-3090", "ryzen-9-7900x"
PART = catalog().gpus[GPU]
BW_1 = PART.memory_bandwidth_gbps * 1e9  # one RTX 3090's datasheet bandwidth, bytes/s
FLOPS_1 = PART.peak_fp16_tflops * 1e12
G2G = round(PART.link_gbps, 3) * 1e9  # compose_profile: peer copies cross PCIe at the link's rate
SPLIT = Engine(name="split", gpu_split="layers")  # ideal otherwise: datasheet roofline
MODEL = load_model("qwen3-30b-a3b")
OPTIONS = DEFAULT_OPTIONS.for_model(MODEL)


def two_gpus():
    return compose_profile(GPU, CPU, 64, gpu_count=2)


def test_a_layer_split_runs_at_one_gpus_rates_tensor_parallel_at_the_sum():
    hw = two_gpus()
    split = rates_from_profile(hw, OPTIONS, "split", "layers")
    tensor = rates_from_profile(hw, OPTIONS, "ideal")
    assert split.gpu_bandwidth_bytes_s == pytest.approx(BW_1)
    assert split.h2d_bytes_s == pytest.approx(round(PART.link_gbps, 3) * 1e9)
    assert (split.gpu_count, split.layer_split_gpus) == (1, 2)
    assert tensor.gpu_bandwidth_bytes_s == pytest.approx(2 * BW_1)
    assert (tensor.gpu_count, tensor.layer_split_gpus) == (2, 1)


def _layer_s_by_hand(mu: int, context: int) -> float:
    """One MoE layer on one RTX 3090 by the roofline: each op max(FLOPs / peak, bytes / bandwidth)."""
    ops = costs.decode_layer_ops(MODEL, mu, context, True)
    return sum(max(op.flops / FLOPS_1, op.bytes / BW_1) for op in (ops.pre_attn, ops.attention, ops.post_attn, ops.ffn))


def test_a_two_gpu_split_step_is_the_sum_of_the_gpus_layer_times_plus_one_hop():
    layers = MODEL.num_layers
    assert MODEL.first_dense_layers == 0 and layers == MODEL.num_moe_layers
    rates = rates_from_profile(two_gpus(), OPTIONS, "split", "layers")
    lane = decode_resources(MODEL, rates, 1, 1024, 1.0, 1.0, True, SPLIT)["gpu"]
    t = _layer_s_by_hand(1, 1024)
    first, second = layers // 2, layers - layers // 2  # -ts 1,1: half the layers each
    hop_s = MODEL.hidden_size * dtype_bytes(MODEL.activation_dtype) / G2G  # one token's hidden state, GPU0 -> GPU1
    step_by_hand = first * t + second * t + hop_s
    assert layers * float(lane.per_micro_batch_s) == pytest.approx(step_by_hand, rel=1e-9)


def test_the_split_estimate_is_one_gpus_plus_the_hop_and_slower_than_tensor_parallel():
    work = make_workload(None, prompt_len=512, gen_len=64)
    policy = Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                    weights_gpu_ratio=1.0, kv_gpu_ratio=1.0)
    one = estimate(compose_profile(GPU, CPU, 64), MODEL, work, policy, engine=SPLIT)
    split = estimate(two_gpus(), MODEL, work, policy, engine=SPLIT)
    tensor = estimate(two_gpus(), MODEL, work, policy, engine=Engine(name="tp"))
    hop_s = MODEL.hidden_size * dtype_bytes(MODEL.activation_dtype) / G2G
    assert 1 / split.decode_throughput_tok_s == pytest.approx(1 / one.decode_throughput_tok_s + hop_s, rel=1e-6)
    assert tensor.decode_throughput_tok_s > 1.5 * split.decode_throughput_tok_s


SERVER = "llama-server -m Qwen3-30B-A3B-Q6_K.gguf -ngl 99 -c 16384"


def _fields(command: str, prompt: int = 12717, gpus: int = 2) -> dict:
    work = make_workload(None, prompt_len=prompt, gen_len=128)
    return read_command("llama.cpp", command, MODEL, work, compose_profile(GPU, CPU, 64, gpu_count=gpus)).engine_fields


def test_a_server_prompt_runs_in_ubatches_of_ub():
    """-ub 512 by default (common/common.h:455): 12,717 tokens in ceil(12717 / 512) = 25 passes."""
    engine = with_fields(load_engine("llama.cpp"), _fields(SERVER))
    assert engine.prefill.max_tokens_per_pass == 512
    assert int(prefill_passes(engine, 12717)) == 25
    assert _fields(SERVER + " -ub 2048 -b 4096")["prefill.max_tokens_per_pass"] == 2048
    assert _fields(SERVER + " --ubatch-size 1024 -b 256")["prefill.max_tokens_per_pass"] == 256  # n_ubatch <= n_batch
    assert _fields("llama-server -m Qwen3-30B-A3B-Q6_K.gguf -ngl 99 -c 1024 -ub 4096",
                   prompt=512)["prefill.max_tokens_per_pass"] == 1024  # n_batch <= n_ctx


def test_the_split_mode_follows_the_command():
    assert "gpu_split" not in _fields(SERVER)  # -sm layer, the engine's own split
    assert _fields(SERVER + " -sm row")["gpu_split"] == "tensor"
    with pytest.raises(HRMError, match="-sm none"):
        _fields(SERVER + " --split-mode none")
    assert load_engine("llama.cpp").gpu_split == load_engine("llama.cpp-nkvo").gpu_split == "layers"
    assert load_engine("vllm").gpu_split == load_engine("sglang").gpu_split == "tensor"


def test_a_prompt_of_25_ubatches_pays_25_expert_copies():
    """The 14900K report's 12,717-token prompt with every expert on the CPU: each ubatch of 512
    copies the used experts to the GPU (>= 32 tokens), so the weight lane is 25 passes' worth."""
    engine = with_fields(load_engine("llama.cpp"), {"prefill.max_tokens_per_pass": 512})
    one_pass = with_fields(load_engine("llama.cpp"), {})
    rates = rates_from_profile(compose_profile(GPU, CPU, 64), OPTIONS, "llama.cpp")
    h2d = {e.prefill.max_tokens_per_pass: float(prefill_resources(MODEL, rates, 1, 12717, True, e)["h2d"]
                                                .per_layer_offloaded_weights_s) for e in (engine, one_pass)}
    assert h2d[512] == pytest.approx(math.ceil(12717 / 512) * h2d[None], rel=1e-3)
