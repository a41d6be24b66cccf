"""The consumer parts catalog (hrm.machine.parts): counts the issue asks for, peaks by hand from the
spec-sheet numbers, the composed profile, its priors checked against the committed measurements,
and one-line refusals."""

from pathlib import Path

import pytest

from hrm.errors import HRMError
from hrm.machine.hardware import load_hardware
from hrm.machine.parts import GGML_OVER_STREAM, LINK_EFFICIENCY, catalog, compose_profile

ROOT = Path(__file__).resolve().parents[1]


def test_catalog_covers_the_issue():
    cat = catalog()
    assert len(cat.gpus) >= 20 and len(cat.cpus) >= 10
    for key in ("rtx-3060-12gb", "rtx-4060-ti-16gb", "rtx-4090", "rtx-5090", "rx-7900-xtx"):
        assert key in cat.gpus
    classes = {c.class_ for c in cat.cpus.values()}
    assert {"desktop-ddr4-2ch", "desktop-ddr5-2ch", "hedt-ddr5-4to8ch", "server-ddr5-8to12ch"} <= classes
    assert any(c.max_sockets == 2 for c in cat.cpus.values())
    assert {c.channels for c in cat.cpus.values()} >= {2, 4, 8, 12}
    for part in list(cat.gpus.values()) + list(cat.cpus.values()):
        assert part.source.startswith("https://"), part.key


def test_peaks_by_hand():
    g = catalog().gpus["rtx-4090"]
    # NVIDIA's page: 16384 cores, 2.52 GHz, 384-bit at 21 Gbps; Ada whitepaper: 82.6 / 165.2 TFLOPS, 1008 GB/s
    assert g.memory_bandwidth_gbps == pytest.approx(1008.0)
    assert g.peak_fp32_tflops == pytest.approx(82.6, abs=0.05)
    assert g.peak_fp16_tflops == pytest.approx(165.2, abs=0.1)
    # GA102 whitepaper: RTX 3090 71 TFLOPS fp16 (fp32 accumulate), 35.6 fp32, 936 GB/s
    g = catalog().gpus["rtx-3090"]
    assert g.peak_fp16_tflops == pytest.approx(71.0, rel=0.01)
    assert g.memory_bandwidth_gbps == pytest.approx(936.0)
    c = catalog().cpus["epyc-9654"]
    assert c.datasheet_gbps == pytest.approx(12 * 4800 * 8 / 1000)  # 460.8 GB/s per socket


def test_composed_profile():
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    assert hw.gpu.memory_gib == 24 and hw.gpu.architecture == "ada"
    assert hw.cpu.cores == 16 and hw.cpu.memory_gib == 64
    assert hw.cpu.memory_bandwidth_gbps == pytest.approx(2 * 5200 * 8 / 1000 * 0.78, rel=1e-4)
    # PCIe 4.0 x16: 16 lanes x 16 GT/s x 128/130 / 8 x the H100's measured share
    assert hw.link.h2d_gbps == pytest.approx(16 * 16 * 128 / 130 / 8 * LINK_EFFICIENCY, rel=1e-3)
    two = compose_profile(None, "epyc-9654", 768, sockets=2)
    assert two.gpu is None and two.cpu.cores == 192 and two.cpu.numa_nodes == 2
    assert two.cpu.memory_bandwidth_gbps == pytest.approx(2 * 460.8 * 0.78, rel=1e-4)
    assert compose_profile(None, "epyc-9654", 64, stream_fraction=0.5).cpu.memory_bandwidth_gbps == \
        pytest.approx(460.8 * 0.5, rel=1e-4)


def test_priors_match_the_committed_measurements():
    # LINK_EFFICIENCY: the measured H100 box's pinned copy over PCIe 5 x16's raw rate
    h100 = load_hardware(str(ROOT / "docs/validation/h100-measured.yaml"))
    assert LINK_EFFICIENCY == pytest.approx(h100.link.h2d_gbps / (16 * 32 * 128 / 130 / 8))
    # GGML_OVER_STREAM: llama.cpp's q4_K MUL_MAT_ID at one row on all threads vs the STREAM triad
    host = load_hardware(str(ROOT / "docs/validation/runs/this-host-llamacpp.yaml"))
    kernels = [k for k in host.ggml_cpu.kernels if k.type == "q4_K" and k.op == "mmid" and k.threads == 2
               and k.pool_mib is None]
    first = min(kernels[0].s_per_elem_vs_rows, key=lambda p: p.x)
    ggml_gbps = 4.5 / 8 / first.y / 1e9  # q4_K: 144 bytes per 256 weights
    assert ggml_gbps / host.cpu.memory_bandwidth_gbps == pytest.approx(GGML_OVER_STREAM, abs=0.05)


@pytest.mark.parametrize("kwargs, text", [
    (dict(gpu="rtx-4909", cpu="ryzen-9-7950x", ram_gib=64), "did you mean 'rtx-4090'"),
    (dict(gpu=None, cpu="ryzen-9-7950x", ram_gib=64, sockets=2), "--sockets 2"),
    (dict(gpu=None, cpu="nope", ram_gib=64), "--cpu nope"),
    (dict(gpu=None, cpu="ryzen-9-7950x", ram_gib=1e9), "--ram"),
])
def test_refusals(kwargs, text):
    with pytest.raises(HRMError, match=text.replace("'", ".")):
        compose_profile(**kwargs)
