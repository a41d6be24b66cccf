"""DeepSpeed ZeRO-3's prefetch bucket (issue 26): only ``stage3_prefetch_bucket_size`` =
hidden² parameters of the offloaded weights ahead are fetched while the GPU computes
(FlexGen's DeepSpeed baseline, benchmark/hf_ds/hf_opt.py:115); the rest of a layer's weights
is fetched on demand, so the GPU chain waits for it: a ``gpu+weights`` bound of
n·(GPU per micro-batch) + (1 − r_w)·share·(the layer's load)."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.offload import offloaded_layer_bytes, on_demand_weights_share
from hrm.cost.latency.prefill import prefill_resources
from hrm.engines.engine import IDEAL, load_engine
from hrm.engines.mechanisms import without
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.machine.rates import rates_from_profile

DS = load_engine("deepspeed-zero")


def _mixtral_layer_params_by_hand() -> float:
    """One Mixtral-8x7B layer (config.json: hidden 4096, 32 query and 8 KV heads of 128,
    8 experts of intermediate 14336): Q and O 4096², K and V 4096×1024, 8 experts × 3
    matrices, the router 4096×8, two RMSNorms."""
    hidden, kv, inter, experts = 4096, 8 * 128, 14336, 8
    return 2 * hidden**2 + 2 * hidden * kv + experts * 3 * hidden * inter + hidden * experts + 2 * hidden


def test_the_on_demand_share_is_the_layer_beyond_one_hidden_squared():
    model = load_model("mixtral")
    layer_bytes = offloaded_layer_bytes(model, DS, moe=True)
    share = float(on_demand_weights_share(model, DS, layer_bytes))
    assert DS.prefetch_bucket_hidden_sq == 1.0
    assert share == pytest.approx(1 - 4096**2 / _mixtral_layer_params_by_hand(), rel=1e-3)
    assert float(on_demand_weights_share(model, IDEAL, layer_bytes)) == 0.0


def _rates(model):
    hw = load_hardware("l4")
    return rates_from_profile(hw, ModelOptions().for_model(model))


@pytest.mark.parametrize("mu", [1, 64, 512])
def test_decode_gpu_waits_for_the_weights_beyond_the_bucket(mu):
    model = load_model("mixtral")
    rates = _rates(model)
    lanes = decode_resources(model, rates, mu, 512, 1.0, 1.0, engine=DS)
    share = float(on_demand_weights_share(model, DS, offloaded_layer_bytes(model, DS, moe=True)))
    load_s = float(lanes["h2d"].per_layer_offloaded_weights_s)
    expected = float(lanes["gpu"].time_s(1, 0.0, 1.0)) + share * load_s
    assert float(lanes["gpu+weights"].time_s(1, 0.0, 1.0)) == pytest.approx(expected, rel=1e-12)
    # all weights on the GPU: nothing is fetched, the bound is the GPU chain
    assert float(lanes["gpu+weights"].time_s(1, 1.0, 1.0)) == pytest.approx(float(lanes["gpu"].time_s(1, 1.0, 1.0)))
    # switched off (every weight prefetched): no such bound
    assert "gpu+weights" not in decode_resources(model, rates, mu, 512, 1.0, 1.0,
                                                         engine=without(DS, "prefetch_bucket_hidden_sq"))


def test_prefill_gpu_waits_for_the_weights_beyond_the_bucket():
    model = load_model("mixtral")
    rates = _rates(model)
    lanes = prefill_resources(model, rates, 8, 512, engine=DS)
    share = float(on_demand_weights_share(model, DS, offloaded_layer_bytes(model, DS, moe=True)))
    gpu = lanes["gpu"]
    bound = lanes["gpu+weights"]
    assert float(np.asarray(bound.per_micro_batch_s)) == pytest.approx(float(np.asarray(gpu.per_micro_batch_s)))
    assert float(np.asarray(bound.per_layer_offloaded_weights_s)) == pytest.approx(
        share * float(np.asarray(lanes["h2d"].per_layer_offloaded_weights_s)), rel=1e-12)
