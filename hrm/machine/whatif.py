"""What-if transforms of a hardware profile (paper §6.3: the hardware ablation).

Each returns a new, validated profile whose name records the change, so a plan made on it
can never be mistaken for one made on the measured machine (its sha256 differs too).
"""

from __future__ import annotations

from ..errors import HRMError
from .hardware import HardwareProfile

FLOPS_KEYS = ("fp32", "fp16", "bf16", "int8")


def _rebuild(hw: HardwareProfile, data: dict, suffix: str) -> HardwareProfile:
    data["name"] = f"{hw.name}{suffix}"
    return HardwareProfile.model_validate(data)


def with_link_bandwidth(hw: HardwareProfile, h2d_gbps: float, d2h_gbps: float | None = None) -> HardwareProfile:
    """The CPU↔GPU link set to ``h2d_gbps`` (and ``d2h_gbps``, default the same: PCIe and
    NVLink-C2C are symmetric)."""
    if hw.link is None:
        raise HRMError(f"{hw.name}: a CPU-only profile has no CPU-GPU link to change")
    if h2d_gbps <= 0 or (d2h_gbps is not None and d2h_gbps <= 0):
        raise HRMError(f"link bandwidth must be positive, got {h2d_gbps} / {d2h_gbps}")
    data = hw.model_dump(exclude_none=True)
    data["link"].update(h2d_gbps=h2d_gbps, d2h_gbps=d2h_gbps if d2h_gbps is not None else h2d_gbps)
    data.pop("efficiency", None)  # measured link curves describe the old link
    return _rebuild(hw, data, f"@link{h2d_gbps:g}GBps")


def with_cpu_scaled(hw: HardwareProfile, ratio: float, memory: bool = True) -> HardwareProfile:
    """The paper's "CPU scaling ratio": CPU FLOP/s (every dtype), memory bandwidth and —
    with ``memory`` — memory capacity multiplied by ``ratio`` (docs/facts.md: base CPU 100 GB/s,
    200 GB, 1.6 TFLOP/s scaled together). Measured CPU curves and the emulated-tier rates
    of a CPU-only profile are dropped (they describe the old CPU)."""
    if ratio <= 0:
        raise HRMError(f"CPU scaling ratio must be positive, got {ratio}")
    data = hw.model_dump(exclude_none=True)
    cpu = data["cpu"]
    cpu["memory_bandwidth_gbps"] *= ratio
    if memory:
        cpu["memory_gib"] *= ratio
    cpu["tflops"] = {k: v * ratio for k, v in cpu["tflops"].items()}
    # measured rates of the old CPU would override the scaled peaks: drop them. The
    # per-call dispatch α stays (a fixed software cost, not a rate the ratio describes).
    data.pop("emulation", None)
    if data.get("efficiency"):  # measured CPU curves describe the old CPU
        data["efficiency"].pop("cpu_matmul_tflops_vs_m", None)
    return _rebuild(hw, data, f"@cpu×{ratio:g}")
