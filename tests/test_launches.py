"""Per-op framework overhead (hrm.machine.launches): counts from the engines' YAML, costs from the
public figures, charged only where the profile has no measured dispatch. Expected numbers
are computed by hand from the counts written in the engine files."""

from __future__ import annotations

import json

import pytest
import yaml

from hrm.pipelines import expert_level_tasks as klotski
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.lane import lanes_time_s
from hrm.cost.latency.lanes import schedule_lanes
from hrm.cost.latency.prefill import prefill_resources
from hrm.engines.engine import IDEAL, Engine, load_engine
from hrm.engines.mechanisms import MECHANISMS, without
from hrm.errors import HRMError
from hrm.machine.hardware import Dispatch, load_hardware
from hrm.machine.launches import EAGER_CPU_OP_S, EAGER_GPU_OP_S, SYNC_BUBBLE_S
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.machine.rates import rates_from_profile

MIXTRAL = load_model("mixtral")


def _rates(hw_name="l4", **options):
    return rates_from_profile(load_hardware(hw_name), ModelOptions(**options).for_model(MIXTRAL))


def _distinct(tokens, experts=8, top_k=2):
    """Expected distinct experts of ``tokens`` tokens under uniform top-k routing, by hand."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def test_moe_lightning_host_lane_is_its_counted_ops_at_8us():
    """moe-lightning.yaml: 20 GPU kernels + 3 copies per layer per micro-batch, a fused MoE
    kernel (nothing per expert), 3 CPU ops on the CPU-attention thread, no syncs."""
    engine = load_engine("moe-lightning")
    rates = _rates()
    lanes = decode_resources(MIXTRAL, rates, 64, 512, 0.0, 1.0, engine=engine)
    assert float(lanes["host"].per_micro_batch_s) == pytest.approx(23 * 8e-6, rel=1e-12)
    assert float(lanes["host"].per_layer_s) == 0.0
    bare = decode_resources(MIXTRAL, rates, 64, 512, 0.0, 1.0, engine=without(engine, "launches"))
    assert "host" not in bare
    assert float(lanes["cpu"].per_micro_batch_s - bare["cpu"].per_micro_batch_s) == pytest.approx(3 * 2e-6, rel=1e-9)
    assert float(lanes["gpu"].per_micro_batch_s) == pytest.approx(float(bare["gpu"].per_micro_batch_s), rel=1e-12)


@pytest.mark.parametrize("mu", [1, 4, 64])
def test_deepspeed_counts_per_expert_per_layer_and_syncs(mu):
    """deepspeed-zero.yaml: 69 kernels + 8 syncs per batch, per touched expert 9 kernels +
    5 copies + 5 syncs, per layer 7 fetches each with its sync; the host waits out every sync
    too (one round trip each, as the GPU idles)."""
    engine = load_engine("deepspeed-zero")
    rates = _rates()
    d = _distinct(mu)
    lanes = decode_resources(MIXTRAL, rates, mu, 512, 1.0, 1.0, engine=engine)
    bare = decode_resources(MIXTRAL, rates, mu, 512, 1.0, 1.0, engine=without(engine, "launches"))
    assert float(lanes["host"].per_micro_batch_s) == pytest.approx(8e-6 * (69 + d * (9 + 5)) + 20e-6 * (8 + 5 * d),
                                                                   rel=1e-12)
    assert float(lanes["host"].per_layer_s) == pytest.approx(7 * 8e-6 + 7 * 20e-6, rel=1e-12)
    bubbles = lanes["gpu"].time_s(1, 0.0, 1.0) - bare["gpu"].time_s(1, 0.0, 1.0)
    assert float(bubbles) == pytest.approx(20e-6 * (8 + 5 * d) + 20e-6 * 7, rel=1e-9)


def test_a_measured_dispatch_replaces_the_counts():
    """A profile that measured its own dispatch (hrm profile) is charged that, not the counts."""
    hw = load_hardware("l4")
    measured = hw.model_copy(update={"gpu": hw.gpu.model_copy(update={"dispatch": Dispatch(task_s=1e-5)})})
    rates = rates_from_profile(measured, ModelOptions().for_model(MIXTRAL))
    assert rates.op_costs is None
    lanes = decode_resources(MIXTRAL, rates, 8, 512, 0.0, 1.0, engine=load_engine("moe-lightning"))
    assert "host" not in lanes


def test_no_charge_for_ideal_switched_off_or_a_cpu_only_host():
    rates = _rates()
    assert "host" not in decode_resources(MIXTRAL, rates, 8, 512, 0.0, 1.0, engine=IDEAL)
    off = _rates(use_dispatch_overhead=False)
    assert off.op_costs is None
    assert "host" not in decode_resources(MIXTRAL, off, 8, 512, 0.0, 1.0, engine=load_engine("moe-lightning"))
    cpu_only = rates_from_profile(load_hardware("cpu-only"), ModelOptions().for_model(MIXTRAL))
    assert "host" not in decode_resources(MIXTRAL, cpu_only, 8, 512, 0.0, 1.0,
                                                  engine=load_engine("moe-lightning"))


def test_options_override_the_per_op_costs():
    engine = load_engine("moe-lightning")
    rates = _rates(eager_gpu_op_s=1e-5, eager_cpu_op_s=0.0, sync_bubble_s=0.0)
    lanes = decode_resources(MIXTRAL, rates, 8, 512, 0.0, 1.0, engine=engine)
    assert float(lanes["host"].per_micro_batch_s) == pytest.approx(23 * 1e-5, rel=1e-12)
    assert (EAGER_GPU_OP_S, EAGER_CPU_OP_S, SYNC_BUBBLE_S) == (8e-6, 2e-6, 20e-6)


def test_prefill_charges_the_same_ops_per_micro_batch_and_bubbles_in_every_gpu_bound():
    engine = load_engine("deepspeed-zero")  # a prefetch bucket: a gpu+weights bound in prefill
    rates = _rates()
    lanes = prefill_resources(MIXTRAL, rates, 2, 100, engine=engine)
    bare = prefill_resources(MIXTRAL, rates, 2, 100, engine=without(engine, "launches"))
    d = _distinct(200)
    assert float(lanes["host"].per_micro_batch_s) == pytest.approx(8e-6 * (69 + d * 14) + 20e-6 * (8 + 5 * d), rel=1e-9)
    for name in ("gpu", "gpu+weights"):
        extra = lanes[name].time_s(1, 0.0, 1.0) - bare[name].time_s(1, 0.0, 1.0)
        assert float(extra) == pytest.approx(20e-6 * (8 + 5 * d + 7), rel=1e-9)


def test_small_batches_are_bound_by_the_host_when_the_weights_are_resident():
    """Fiddler at batch 1 with every expert on the GPU: the GPU's work per layer is a few
    hundred µs of weight reads at most, the host issues ~90 ops (0.36 ms) and waits out ~10
    syncs: the layer takes at least the host's time."""
    engine = load_engine("fiddler")
    rates = _rates("a100-80g")
    resources = decode_resources(MIXTRAL, rates, 1, 128, 1.0, 1.0, engine=engine)
    lanes = schedule_lanes(resources, engine, rates.shared_unit)
    host = 8e-6 * (67 + _distinct(1) * 11) + 20e-6 * (8 + _distinct(1) * 2)
    assert float(resources["host"].per_micro_batch_s) == pytest.approx(host, rel=1e-12)
    layer = float(lanes_time_s(lanes, 1, 1.0, 1.0))
    assert layer >= host


def test_klotski_charges_its_counts_per_task_serially():
    """klotski.yaml: per batch 54 kernels + 5 copies + 1 sync with the attention task; per
    (expert, batch) call 11 kernels + 2 copies + 3 syncs."""
    rates = _rates("rtx3090")
    alpha = klotski.task_dispatch_s(rates, load_engine("klotski"))
    assert alpha["attention"] == pytest.approx(8e-6 * 59 + 20e-6 * 1, rel=1e-12)
    assert alpha["expert"] == pytest.approx(8e-6 * 13 + 20e-6 * 3, rel=1e-12)
    assert alpha["copy"] == pytest.approx(8e-6)
    assert set(klotski.task_dispatch_s(rates, IDEAL).values()) == {0.0}


def test_explain_switches_the_launches_off_as_one_mechanism():
    engine = load_engine("fiddler")
    assert "launches" in MECHANISMS
    assert without(engine, "launches").launches is None


def test_counts_need_one_attention_path():
    data = load_engine("moe-lightning").model_dump()
    data["policy"]["attention"] = ["cpu", "gpu"]
    data["schedule"] = "cgopipe"
    with pytest.raises(ValueError, match="launches: counts are per attention path"):
        Engine.model_validate(data)


def test_bad_counts_are_refused_in_one_line(tmp_path):
    data = json.loads(load_engine("moe-lightning").model_dump_json())
    data["launches"]["gpu_ops"] = -1
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(HRMError) as err:
        load_engine(str(path))
    assert "launches.gpu_ops" in str(err.value) and "\n" not in str(err.value)


def test_every_counted_engine_and_every_uncounted_one_says_why():
    """Engines with launch counts cite op_counts.md; the others carry a comment saying why
    they have none (graphs, C++, a measured dispatch)."""
    from hrm.engines.engine import ENGINES_DIR, list_engines

    for name in list_engines():
        engine = load_engine(name)
        text = (ENGINES_DIR / f"{name}.yaml").read_text()
        if name == "ideal":
            assert engine.launches is None
        elif engine.launches is not None:
            assert "op_counts.md" in engine.launches.source
        else:
            assert "# launches: not counted" in text, name
