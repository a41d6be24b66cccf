"""HRM turning points (paper eqs. 9-11) on a hand-made two-level machine."""

import pytest

from hrm.cost.roofline import attainable, hrm_from_profile, turning_points

from conftest import two_level_machine


def test_turning_points_by_hand():
    hrm = hrm_from_profile(two_level_machine())
    # GPU: P=100e12 (fp16), B=1000e9; CPU: P=1e12 (fp32), B=100e9; link 10e9
    tp = turning_points(hrm, intensity_i=50.0, intensity_j=4.0)
    # eq. 9: min(1e12, 100e9·4) / 10e9 = 40
    assert tp.p1_intensity == pytest.approx(40.0)
    # eq. 10: min(100e12, 1000e9·50) / 10e9 = 5000
    assert tp.p2_intensity == pytest.approx(5000.0)
    # eq. 11: 1000e9·50 / 10e9 = 5000 (memory roof of GPU meets the link roof)
    assert tp.balance_intensity == pytest.approx(5000.0)
    assert tp.p1_flops == pytest.approx(40.0 * 10e9)


def test_attainable_is_min_of_roofs():
    hrm = hrm_from_profile(two_level_machine())
    assert attainable(hrm, "gpu", 10.0) == pytest.approx(1000e9 * 10)
    assert attainable(hrm, "gpu", 1e6) == pytest.approx(100e12)
    assert attainable(hrm, "gpu", 1e6, "cpu", 3.0) == pytest.approx(10e9 * 3)


def test_tensor_parallel_scales_gpu_roofs():
    one = hrm_from_profile(two_level_machine())
    two = hrm_from_profile(two_level_machine(gpu={"name": "g", "count": 2, "memory_gib": 16,
                                                  "memory_bandwidth_gbps": 1000, "tflops": {"fp32": 100, "fp16": 100},
                                                  "gpu_to_gpu_gbps": 50}))
    assert two.level("gpu").peak_flops == 2 * one.level("gpu").peak_flops
    assert two.cross_bandwidth[("cpu", "gpu")] == 2 * one.cross_bandwidth[("cpu", "gpu")]
