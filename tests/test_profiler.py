"""Profiler tests: tiny sizes and budgets (the whole file runs in a few seconds), the GPU
branch driven by a fake device, and one-line CLI errors."""

from __future__ import annotations

import dataclasses
import os
import re
import time
import types

import pytest
import yaml

from hrm.errors import HRMError
from hrm.machine.hardware import dump_hardware_yaml, load_hardware, parse_hardware
from hrm_cli import profile as profiler_cli
from profiler import cpu as cpu_mod
from profiler.compare import comparison_rows
from profiler.config import MIB, AttentionShape, ProfileConfig
from profiler.gpu import GpuInfo, clamp_bytes, open_cuda_device
from profiler.progress import NullReporter
from profiler.runner import run_profile
from profiler.timing import Budget, Stats, measure

TINY = ProfileConfig(
    label="tiny", budget_s=20.0, warmup=1, repeats=3,
    stream_bytes=4 * MIB, copy_sizes_bytes=(256 * 1024,), memcpy_bytes=32 * MIB,
    matmul_k=128, matmul_n=128, matmul_ms=(1, 16, 64), cpu_torch_dtypes=(),
    attention_contexts=(64, 256), attention_kv_bytes=2 * MIB, attention=AttentionShape(2, 2, 32),
    disk_bytes=1 * MIB,
    gpu_matmul_k=1024, gpu_matmul_n=1024, gpu_matmul_ms=(1, 64, 4096), gpu_dtypes=("fp32", "fp16", "bf16", "int8"),
    gpu_copy_bytes=64 * MIB, transfer_sizes_bytes=(64 * 1024, 1 * MIB, 256 * MIB), peer_bytes=16 * MIB,
    dispatch_repeats=1, emulation_ms=(1, 16), emulation_k=128, emulation_n=128, emulation_copy_bytes=1 * MIB,
)
SPREAD = re.compile(r"spread \d+(\.\d+)?%")


class FakeGpu:
    """A GpuDevice with analytic timings: matmul = max(compute, memory), copies = bytes / bandwidth."""

    PEAK_TFLOPS = {"fp32": 50.0, "fp16": 400.0, "bf16": 400.0}
    MEMORY_GBPS = 2000.0
    LINK_GBPS = 25.0
    PAGEABLE_GBPS = 10.0
    PEER_GBPS = 100.0
    LATENCY_S = 10e-6

    def __init__(self, count: int = 2, fail_on: str | None = None):
        self.count = count
        self.fail_on = fail_on
        self.released = 0

    def _check(self, what: str) -> None:
        if self.fail_on == what:
            raise RuntimeError(f"CUDA error: fake failure in {what}\nsecond line")

    def info(self) -> GpuInfo:
        return GpuInfo(name="FakeGPU 80GB", count=self.count, memory_bytes=80 * 2**30)

    def supports(self, dtype: str) -> bool:
        return dtype in self.PEAK_TFLOPS

    def matmul_op(self, m, k, n, dtype):
        self._check("matmul")
        compute_s = 2.0 * m * k * n / (self.PEAK_TFLOPS[dtype] * 1e12)
        memory_s = (m * k + k * n + m * n) * 2 / (self.MEMORY_GBPS * 1e9)
        return lambda: max(compute_s, memory_s)

    def copy_op(self, nbytes):
        self._check("copy")
        return lambda: 2.0 * nbytes / (self.MEMORY_GBPS * 1e9)

    def transfer_op(self, nbytes, direction, pinned):
        self._check("transfer")
        gbps = self.LINK_GBPS if pinned else self.PAGEABLE_GBPS
        return lambda: self.LATENCY_S + nbytes / (gbps * 1e9)

    def peer_op(self, nbytes, src, dst):
        self._check("peer")
        return lambda: nbytes / (self.PEER_GBPS * 1e9)

    def peer_access(self) -> bool:
        self._check("peer_access")
        return True

    EAGER_OP_S = 8e-6      # host seconds per tiny eager op
    ROUND_TRIP_S = 36e-6   # host seconds per x.add_(1).sum().item()
    DMA_GBPS = 20.0        # pinned H2D while the host reads

    def launch_op(self, ops):
        self._check("launch")
        return lambda: self.EAGER_OP_S

    def sync_op(self, ops):
        self._check("launch")
        return lambda: self.ROUND_TRIP_S

    def dma_while(self, nbytes, func):
        return func(), self.DMA_GBPS * 1e9

    def release(self) -> None:
        self.released += 1


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("disk")
    return run_profile(TINY, device="cpu", torch_module=None, disk_folder=folder)


@pytest.fixture(scope="module")
def gpu_run():
    return run_profile(TINY, device="cuda", gpu_device=FakeGpu(count=2), torch_module=None)


# --- timing primitives ------------------------------------------------------------------

def test_stats_median_and_spread():
    stats = Stats(samples_s=(1.0, 2.0, 4.0), warmup=1)
    assert stats.median_s == 2.0
    assert stats.spread_pct() == pytest.approx(150.0)
    assert stats.median_rate(8.0) == pytest.approx(4.0)


def test_measure_warms_up_and_stops_on_expired_budget():
    calls = []
    clock = iter(range(0, 1000, 10)).__next__  # each clock read advances 10 s
    budget = Budget(5.0, clock=clock)
    stats = measure(lambda: calls.append(1) or 0.5, warmup=2, repeats=10, budget=budget, min_repeats=2)
    assert stats.repeats == 2 and stats.warmup == 2 and len(calls) == 4


def test_matmul_curve_stops_when_next_point_would_not_fit():
    """A slow dtype stops before a point predicted to overrun the budget (first point kept)."""
    clock_s = [0.0]
    budget = Budget(10.0, clock=lambda: clock_s[0])

    def factory(m):
        def op():
            clock_s[0] += m * 0.5  # 0.5 s per row: M=1 fits, M=64 (~96 s predicted) does not
            return m * 0.5
        return op

    curve = cpu_mod.measure_matmul_curve(factory, (1, 64, 1024), 8, 8, 1, 3, budget, "slow")
    assert list(curve) == [1]
    assert cpu_mod.fits_budget(1, 0.5, 4, 3, None)


def test_chunk_bounds_cover_the_range():
    bounds = cpu_mod.chunk_bounds(10, 3)
    assert bounds[0][0] == 0 and bounds[-1][1] == 10
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert cpu_mod.chunk_bounds(1, 4) == [(0, 1)]


def test_host_parsers():
    assert cpu_mod.cpu_model_name("processor : 0\nmodel name\t: AMD EPYC 9B45\n") == "AMD EPYC 9B45"
    assert cpu_mod.memory_total_bytes("MemTotal:       24684128 kB\n") == 24684128 * 1024
    assert cpu_mod.parse_cache_size_bytes("32768K\n") == 32 * 2**20
    assert cpu_mod.stream_array_bytes(32 * 2**20, 24.0) == 256 * 2**20
    assert cpu_mod.stream_array_bytes(32 * 2**20, 1.0) == 2**30 // 16


# --- CPU-only profile -------------------------------------------------------------------

def test_cpu_profile_is_valid_and_round_trips(cpu_run, tmp_path):
    profile = cpu_run.profile
    path = tmp_path / "measured.yaml"
    path.write_text(profiler_cli.profile_yaml(profile))
    loaded = load_hardware(str(path))
    assert loaded == profile
    assert dump_hardware_yaml(loaded) == dump_hardware_yaml(profile)
    assert profile.source.kind == "measured"
    assert profile.source.date and profile.source.host and profile.source.tool_version.startswith("hrm-profile")


def test_cpu_only_profile_has_no_gpu_section_and_says_why(cpu_run):
    profile = cpu_run.profile
    assert profile.gpu is None and profile.link is None and profile.cpu_only
    assert "skipped" in profile.source.methods["gpu"]
    assert any("GPU skipped" in note for note in cpu_run.notes)


def test_cpu_values_positive_and_curves_kept(cpu_run):
    profile = cpu_run.profile
    cpu = profile.cpu
    assert cpu.cores >= 1 and cpu.memory_gib > 0
    assert cpu.memory_bandwidth_gbps > 0 and cpu.tflops.fp32 > 0
    eff = profile.efficiency
    curve = eff.cpu_matmul_tflops_vs_m["fp32"]
    assert [p.x for p in curve] == [1.0, 16.0, 64.0]
    assert max(p.y for p in curve) == pytest.approx(cpu.tflops.fp32)  # peak = best point
    methods = profile.source.methods  # copy and attention points are notes (the model reads no curve of them)
    assert "MiB: " in methods["cpu.stream_copy_gbps_vs_bytes"]
    assert {"cpu.decode_attention.context_64", "cpu.decode_attention.context_256"} <= set(methods)
    assert profile.disk is not None and profile.disk.read_gbps > 0


def test_spread_recorded_for_every_measured_number(cpu_run):
    methods = cpu_run.profile.source.methods
    for key in ("cpu.memory_bandwidth_gbps", "cpu.stream_copy_gbps", "cpu.tflops.fp32", "disk.read_gbps",
                "efficiency.cpu_matmul_tflops_vs_m.fp32", "cpu.stream_copy_gbps_vs_bytes",
                "cpu.decode_attention.context_64"):
        assert key in methods, key
        assert SPREAD.search(methods[key]) or "spread (max-min)/median per point" in methods[key], key
    assert "write-allocate not counted" in methods["cpu.memory_bandwidth_gbps"]
    assert "2 reads + 1 write" in methods["cpu.memory_bandwidth_gbps"]


def test_stream_counts_bytes_like_stream(monkeypatch):
    """Copy counts 16 B/element, triad 24 B/element: with a fixed op time the ratio is 2:3."""
    monkeypatch.setattr(cpu_mod, "copy_op", lambda *a, **k: (lambda: 1.0))
    monkeypatch.setattr(cpu_mod, "triad_op", lambda *a, **k: (lambda: 1.0))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        result = cpu_mod.measure_stream(1 * MIB, (), 1, pool, 0, 2, None)
    assert result.copy.value == pytest.approx(2 * MIB / 1e9)
    assert result.triad.value == pytest.approx(3 * MIB / 1e9)


def test_optional_steps_skipped_when_budget_spent(tmp_path):
    reporter = NullReporter()
    run = run_profile(TINY, device="cpu", torch_module=None, disk_folder=tmp_path, reporter=reporter,
                      clock=iter(range(0, 10**6, 100)).__next__)
    assert run.profile.cpu.tflops.fp32 > 0  # required steps still ran
    assert any("skipped (time budget" in note for note in run.notes)
    assert run.profile.disk is None
    assert len(reporter.labels) == 6  # STREAM, matmul, memcpy, DRAM read, attention, disk
    assert run.profile.cpu.memcpy_one_thread_gbps is None  # optional: skipped with the rest
    assert run.profile.cpu.numa_nodes >= 1  # a host fact, not a timed step


# --- GPU branch on a fake device --------------------------------------------------------

def test_fake_gpu_numbers_flow_into_profile(gpu_run, tmp_path):
    profile = gpu_run.profile
    gpu, link, eff = profile.gpu, profile.link, profile.efficiency
    assert gpu.name == "FakeGPU 80GB" and gpu.count == 2 and gpu.memory_gib == pytest.approx(80.0)
    assert gpu.memory_bandwidth_gbps == pytest.approx(FakeGpu.MEMORY_GBPS, rel=1e-3)
    assert gpu.tflops.fp16 == pytest.approx(max(p.y for p in eff.gpu_matmul_tflops_vs_m["fp16"]))
    assert 0.9 * FakeGpu.PEAK_TFLOPS["fp16"] < gpu.tflops.fp16 <= FakeGpu.PEAK_TFLOPS["fp16"]
    assert gpu.tflops.int8 is None  # unsupported by the fake: skipped and said so
    assert any("int8" in note for note in gpu_run.notes)
    assert gpu.gpu_to_gpu_gbps == pytest.approx(FakeGpu.PEER_GBPS, rel=1e-3)
    assert link.h2d_gbps == pytest.approx(FakeGpu.LINK_GBPS, rel=0.01)
    assert link.d2h_gbps == pytest.approx(FakeGpu.LINK_GBPS, rel=0.01)
    assert link.h2d_pageable_gbps == pytest.approx(FakeGpu.PAGEABLE_GBPS, rel=0.01)
    assert link.d2h_pageable_gbps == pytest.approx(FakeGpu.PAGEABLE_GBPS, rel=0.01)
    assert link.p2p is True and "can_device_access_peer" in profile.source.methods["link.p2p"]
    assert gpu.architecture is None and "gpu.architecture" not in profile.source.methods  # no capability
    assert gpu.memory_stream_efficiency is None and gpu.gemm_efficiency is None  # peaks are already achieved
    assert "not set" in profile.source.methods["gpu.memory_stream_efficiency"]
    h2d = [float(v) for v in re.findall(r"MiB: ([0-9.e+-]+) ", profile.source.methods["link.h2d_gbps_vs_bytes"])]
    assert len(h2d) >= 2 and h2d[0] < h2d[-1]  # latency bites small sizes
    m_curve = eff.gpu_matmul_tflops_vs_m["fp32"]
    assert m_curve[0].y < m_curve[-1].y
    assert "spread" in profile.source.methods["link.d2h_pageable_gbps_vs_bytes"]
    for key in ("gpu.tflops.fp32", "gpu.memory_bandwidth_gbps", "link.h2d_gbps", "link.d2h_gbps",
                "gpu.gpu_to_gpu_gbps", "link.h2d_gbps_vs_bytes", "link.d2h_gbps_vs_bytes",
                "link.d2h_pageable_gbps"):
        assert key in profile.source.methods, key
    path = tmp_path / "gpu.yaml"
    path.write_text(profiler_cli.profile_yaml(profile))
    assert load_hardware(str(path)) == profile


def test_old_profile_with_unread_curves_loads_and_keeps_its_hash(tmp_path):
    """Profiles measured before the h2d / CPU-copy / CPU-attention curves were dropped still
    load, and hash as they did (plans made with them still run)."""
    old = {
        "name": "old-measured",
        "cpu": {"name": "x", "cores": 4, "memory_gib": 16, "memory_bandwidth_gbps": 20, "tflops": {"fp32": 0.2}},
        "efficiency": {
            "cpu_matmul_tflops_vs_m": {"fp32": [{"x": 1, "y": 0.02}, {"x": 64, "y": 0.2}]},
            "h2d_gbps_vs_bytes": [],
            "cpu_copy_gbps_vs_bytes": [{"x": 1048576, "y": 16.68}, {"x": 268435456.0, "y": 36.21}],
            "cpu_attention_gbps_vs_context": [{"x": 256, "y": 13.58}],
        },
    }
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    profile = load_hardware(str(path))
    assert profile.efficiency.cpu_matmul_tflops_vs_m["fp32"][1].y == 0.2
    assert "cpu_copy_gbps_vs_bytes" not in profile.efficiency.model_dump()
    # the sha256 the code before the removal gave this profile
    assert profile.sha256() == "bff9c8f32b4a33dad0a076336050ea57a70efc83a1f544e26f49678ff65da7c6"
    with pytest.raises(HRMError, match="cpu_copy_gbps_vs_bytes"):
        old["efficiency"]["cpu_copy_gbps_vs_bytes"] = [{"x": 0, "y": 1}]  # still validated
        parse_hardware(old)


@pytest.mark.parametrize("fail_on", ["matmul", "copy", "transfer"])
def test_fake_gpu_failure_auto_gives_cpu_only_profile(fail_on):
    run = run_profile(TINY, device="auto", gpu_device=FakeGpu(fail_on=fail_on), torch_module=None)
    assert run.profile.gpu is None and run.profile.link is None
    assert any("GPU skipped" in note and "fake failure" in note for note in run.notes)
    assert "GPU skipped" in run.profile.source.methods["gpu"]


def test_fake_gpu_failure_with_device_cuda_is_a_user_error():
    with pytest.raises(HRMError, match="failed") as info:
        run_profile(TINY, device="cuda", gpu_device=FakeGpu(fail_on="transfer"), torch_module=None)
    assert "\n" not in str(info.value)


def test_cuda_probe_guarded_without_torch_or_gpu():
    device, why = open_cuda_device(None)
    assert device is None and "torch" in why
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0))
    device, why = open_cuda_device(fake_torch)
    assert device is None and "is_available" in why
    with pytest.raises(HRMError, match="--device cuda"):
        run_profile(TINY, device="cuda", torch_module=None)


class _FakeTensor:
    def __init__(self, shape=(), dtype=None):
        self.shape, self.dtype = shape, dtype

    def copy_(self, other, non_blocking=False):
        return self


class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.at_s = 0.0

    def record(self):
        self.at_s = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):  # milliseconds, like torch.cuda.Event
        # + 1 ms: the fake does no work, and rates from microseconds are beyond any device (hrm.bounds)
        return (other.at_s - self.at_s) * 1e3 + 1.0


def make_fake_torch():
    """Just enough of the torch API for TorchCudaDevice and the CPU bf16 path (no real GPU)."""
    tensor = lambda shape, *args, dtype=None, **kwargs: _FakeTensor(shape, dtype)  # noqa: E731
    matmul_flags = types.SimpleNamespace(allow_tf32=True)
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, is_bf16_supported=lambda: True,
        get_device_properties=lambda index: types.SimpleNamespace(name="FakeTorchGPU", total_memory=16 * 2**30,
                                                                  major=8, minor=9),
        synchronize=lambda index=None: None, empty_cache=lambda: None, Event=_FakeEvent)
    return types.SimpleNamespace(
        __version__="0.0-fake", float32="f32", float16="f16", bfloat16="bf16", int8="i8", uint8="u8",
        full=tensor, ones=tensor, empty=tensor, empty_like=lambda t: _FakeTensor(t.shape, t.dtype),
        matmul=lambda a, b, out=None: out, _int_mm=lambda a, b: _FakeTensor(), get_num_threads=lambda: 2,
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul_flags)), cuda=cuda)


def test_torch_cuda_device_plumbing_with_a_fake_torch():
    """TorchCudaDevice and the CPU torch path wired end to end against a stand-in torch module."""
    fake_torch = make_fake_torch()
    cfg = dataclasses.replace(TINY, cpu_torch_dtypes=("bf16",), disk_bytes=0,
                              transfer_sizes_bytes=(64 * 1024, 1 * MIB, 16 * MIB))  # a link slower than the fake HBM
    run = run_profile(cfg, device="cuda", torch_module=fake_torch)
    profile = run.profile
    assert profile.gpu.name == "FakeTorchGPU" and profile.gpu.count == 1
    assert profile.gpu.tflops.int8 > 0 and profile.gpu.tflops.bf16 > 0
    assert any("int8 matmul M=1" in note for note in run.notes)  # _int_mm needs M > 16
    assert profile.cpu.tflops.bf16 > 0 and "torch 0.0-fake" in profile.source.methods["cpu.tflops.bf16"]
    assert fake_torch.backends.cuda.matmul.allow_tf32 is True  # the user's TF32 flag is restored
    assert profile.link.h2d_pageable_gbps > 0 and profile.link.d2h_pageable_gbps > 0
    assert profile.gpu.architecture == "ada" and "8.9" in profile.source.methods["gpu.architecture"]
    assert profile.link.p2p is None  # one GPU: nothing to query


def test_clamp_bytes_fits_device_memory():
    assert clamp_bytes(2**30, 2**30, 2) == 2**28
    assert clamp_bytes(1000, 2**30, 2) == 1000


# --- CLI --------------------------------------------------------------------------------

@pytest.mark.parametrize("out", ["{tmp}/missing/dir/p.yaml", "{tmp}", "{tmp}/afile/p.yaml"])
def test_bad_out_path_is_one_line_error(out, tmp_path, capsys):
    from hrm_cli import main

    (tmp_path / "afile").write_text("x")
    code = main(["profile", "--quick", "--out", out.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error:") and err.count("\n") == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_folder_is_one_line_error(tmp_path, capsys):
    from hrm_cli import main

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["profile", "--out", str(locked / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "not writable" in err and err.count("\n") == 1


def test_unwritable_out_folder_detected(tmp_path, monkeypatch):
    """The writability check itself (root bypasses permissions, so fake os.access)."""
    monkeypatch.setattr(profiler_cli.os, "access", lambda path, mode: False)
    with pytest.raises(HRMError, match="not writable"):
        profiler_cli.check_out_path(str(tmp_path / "p.yaml"))


def test_bad_compare_profile_is_one_line_error(capsys):
    from hrm_cli import main

    assert main(["profile", "--compare", "no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1


def test_cli_writes_profile_and_compares(monkeypatch, tmp_path, capsys):
    from hrm_cli import main

    monkeypatch.setattr(profiler_cli, "quick_config", lambda: TINY)
    out = tmp_path / "me.yaml"
    code = main(["profile", "--quick", "--device", "cpu", "--no-progress", "--out", str(out),
                 "--compare", "l4", "--disk-dir", str(tmp_path), "--name", "my-box"])
    assert code == 0
    profile = load_hardware(str(out))
    assert profile.name == "my-box" and profile.source.kind == "measured"
    table = capsys.readouterr().out
    assert "cpu.memory_bandwidth_gbps" in table and "link.h2d_gbps" in table
    assert not list(tmp_path.glob(".hrm-disk-probe.*"))  # probe file cleaned up


def test_cli_prints_yaml_on_stdout_without_out(monkeypatch, capsys):
    from hrm_cli import main

    monkeypatch.setattr(profiler_cli, "quick_config", lambda: TINY)
    assert main(["profile", "--quick", "--device", "cpu", "--no-progress", "--no-disk"]) == 0
    text = capsys.readouterr().out
    assert "kind: measured" in text and "memory_bandwidth_gbps" in text


def test_comparison_rows_ratio(cpu_run):
    reference = load_hardware("cpu-only")
    rows = {name: (a, b, ratio) for name, a, b, ratio in comparison_rows(cpu_run.profile, reference)}
    a, b, ratio = rows["cpu.memory_bandwidth_gbps"]
    assert ratio == pytest.approx(a / b)
    assert rows["cpu.name"][2] is None


@pytest.mark.parametrize("which", ["cpu_run", "gpu_run"])
def test_measured_profile_drives_hrm_search(which, request, tmp_path, capsys):
    """`hrm search --hw measured.yaml` accepts the profile unchanged (CPU-only and with a GPU)."""
    pytest.importorskip("hrm_cli.search")
    from hrm_cli import main

    path = tmp_path / "measured.yaml"
    path.write_text(profiler_cli.profile_yaml(request.getfixturevalue(which).profile))
    assert main(["search", "--hw", str(path), "--model", "tiny-mixtral"]) == 0, capsys.readouterr().err


def test_optional_runtime_measurement_failure_is_a_note():
    from profiler.runner import optional_measurement

    notes: list[str] = []
    assert optional_measurement(lambda: 1 / 0, "dispatch overhead", notes) is None
    assert len(notes) == 1 and notes[0].startswith("dispatch overhead not measured:") and "division" in notes[0]
    assert optional_measurement(lambda: 7, "x", notes) == 7 and len(notes) == 1


def test_tiny_profile_has_dispatch_and_emulation_sections():
    """A CPU-only profile measures the runtime's emulated tier and its dispatch α."""
    # a budget no loaded CI machine reaches: this test is about the sections, not the budget
    run = run_profile(dataclasses.replace(TINY, disk_bytes=0, cpu_torch_dtypes=(), budget_s=600.0), device="cpu")
    profile = run.profile
    if cpu_mod.optional_torch() is None:
        pytest.skip("torch not installed")
    assert profile.emulation is not None and profile.emulation.threads == 1
    assert profile.emulation.copy_gbps > 0
    assert profile.emulation.memory_bandwidth_gbps == pytest.approx(2 * profile.emulation.copy_gbps, rel=1e-3)
    assert [p.x for p in profile.emulation.matmul_tflops_vs_m["fp32"]] == [1.0, 16.0]
    d = profile.cpu.dispatch
    assert d is not None, run.notes  # the step's failure is a note: show it
    assert d.pre_attn_s > 0 and d.copy_s > 0 and d.task_s >= 0
    assert "probe Mixtral layer" in profile.source.methods["cpu.dispatch.pre_attn_s"]
    assert load_hardware_roundtrip(profile) == profile


def load_hardware_roundtrip(profile):
    from hrm.machine.hardware import parse_hardware

    import yaml

    return parse_hardware(yaml.safe_load(dump_hardware_yaml(profile)))


def test_emulation_measures_each_runtime_dtype():
    """The emulated tier's F.linear curve is measured per dtype the runtime may compute in
    (fp32 first); a dtype the profile lacks falls back to fp32 for both peak and curve."""
    torch = pytest.importorskip("torch")
    from hrm.machine.hardware import parse_hardware
    from hrm.machine.rates import rates_from_profile
    from profiler.emulation import measure_emulation

    result = measure_emulation(torch, 1, (1, 4), 64, 64, 1 << 20, 1 << 16, warmup=1, repeats=2, budget=None,
                               dtypes=("fp16", "fp32", "bf16"))
    assert list(result.matmul) == ["fp32", "fp16", "bf16"]
    assert all(len(curve) == 2 and all(m.value > 0 for m in curve.values()) for curve in result.matmul.values())
    curve = [{"x": 1, "y": 0.01}, {"x": 64, "y": 0.05}]
    hw = parse_hardware({"name": "h", "cpu": {"name": "c", "cores": 2, "memory_gib": 8, "memory_bandwidth_gbps": 20,
                                              "tflops": {"fp32": 0.1}},
                         "emulation": {"threads": 1, "tflops": {"fp32": 0.05}, "memory_bandwidth_gbps": 10,
                                       "copy_gbps": 5, "matmul_tflops_vs_m": {"fp32": curve}}})
    rates = rates_from_profile(hw)  # default device dtype fp16: not measured -> fp32 peak and curve
    assert rates.gpu_peak_flops == pytest.approx(0.05e12)
    assert rates.gpu_flops(1) == pytest.approx(0.01e12)


# --- achieved-rate fields (memcpy, NUMA, pageable d2h, p2p, architecture) -----------------

def test_cpu_profile_has_memcpy_and_numa(cpu_run):
    """The host copy on one thread and on all threads (bytes moved/s) and the NUMA node count."""
    cpu, methods = cpu_run.profile.cpu, cpu_run.profile.source.methods
    assert cpu.memcpy_one_thread_gbps > 0 and cpu.memcpy_all_threads_gbps > 0
    # (how the two rates compare is a measurement, for benchmarks/profiler_bench.py, not a unit
    # test: on a shared 2-core machine one thread can out-copy two contending ones)
    assert cpu.numa_nodes >= 1
    for key in ("cpu.memcpy_one_thread_gbps", "cpu.memcpy_all_threads_gbps"):
        assert SPREAD.search(methods[key]) and "counted once" in methods[key], key
    assert "1 thread" in methods["cpu.memcpy_one_thread_gbps"]
    assert f"{cpu.cores} threads" in methods["cpu.memcpy_all_threads_gbps"]
    assert "/sys/devices/system/node" in methods["cpu.numa_nodes"]
    assert load_hardware_roundtrip(cpu_run.profile) == cpu_run.profile


def test_memcpy_counts_bytes_moved_once(monkeypatch):
    """A copy of S bytes that takes 1 s is S bytes/s (not 2 S, read + write)."""
    monkeypatch.setattr(cpu_mod, "wall_timed", lambda func: (lambda: 1.0))
    monkeypatch.setattr(cpu_mod, "copy_op", lambda *a, **k: (lambda: 0.5))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        result = cpu_mod.measure_memcpy(1 * MIB, 2, pool, 0, 2, None)
    assert result.one_thread.value == pytest.approx(MIB / 1e9)
    assert result.all_threads.value == pytest.approx(2 * MIB / 1e9)


def test_memcpy_failure_is_a_note(monkeypatch):
    def fail(*args, **kwargs):
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(cpu_mod, "measure_memcpy", fail)
    cfg = dataclasses.replace(TINY, disk_bytes=0, attention_contexts=())
    run = run_profile(cfg, device="cpu", torch_module=None)
    assert run.profile.cpu.memcpy_one_thread_gbps is None and run.profile.cpu.memcpy_all_threads_gbps is None
    assert any(n.startswith("host memcpy not measured: MemoryError") for n in run.notes)
    assert "cpu.memcpy_one_thread_gbps" not in run.profile.source.methods


def test_numa_node_count(tmp_path):
    for name in ("node0", "node1", "nodeX"):
        (tmp_path / name).mkdir()
    (tmp_path / "possible").write_text("0-1\n")
    assert cpu_mod.numa_node_count(tmp_path) == 2
    assert cpu_mod.numa_node_count(tmp_path / "absent") == 1


def test_p2p_unknown_is_a_note():
    """A device that cannot say whether peer access works leaves link.p2p unset, with a note."""
    class NoPeerQuery(FakeGpu):
        peer_access = None

    run = run_profile(TINY, device="cuda", gpu_device=NoPeerQuery(count=2), torch_module=None)
    assert run.profile.link.p2p is None and "link.p2p" not in run.profile.source.methods
    assert any("link.p2p not queried" in note for note in run.notes)
    run = run_profile(TINY, device="cuda", gpu_device=FakeGpu(count=2, fail_on="peer_access"), torch_module=None)
    assert run.profile.gpu is not None and run.profile.link.p2p is None
    assert any("link.p2p not queried: RuntimeError" in note for note in run.notes)


def test_architecture_of_compute_capability():
    from profiler.gpu import architecture_of

    assert architecture_of(None) is None
    assert [architecture_of(c) for c in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (7, 0))] == [
        "turing", "ampere", "ampere", "ada", "hopper", "blackwell", "blackwell", "other"]


def test_comparison_rows_no_ratio_for_booleans(gpu_run):
    rows = {name: (a, b, ratio) for name, a, b, ratio in comparison_rows(gpu_run.profile, gpu_run.profile)}
    assert rows["link.p2p"] == (True, True, None)
    assert rows["link.d2h_pageable_gbps"][2] == pytest.approx(1.0)


# --- what the lanes use: DRAM with every core, eager launches, host syncs (issue 32) --------

def test_dram_read_counts_bytes_read_once(monkeypatch):
    """Every core reading S bytes in 0.5 s is 2 S bytes/s."""
    monkeypatch.setattr(cpu_mod, "read_op", lambda *a, **k: (lambda: 0.5))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        got = cpu_mod.measure_dram_read(1 * MIB, 2, pool, 0, 2, None)
    assert got.value == pytest.approx(2 * MIB / 1e9) and "bytes read per second" in got.how


def test_dram_read_really_reads_every_chunk():
    """The read op touches every element (a sum over the chunks equals the array's)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    src = np.arange(1000, dtype=np.float64)
    seen = []
    with ThreadPoolExecutor(2) as pool:
        real = cpu_mod.np.add.reduce
        cpu_mod.np.add.reduce = lambda chunk: seen.append(float(chunk.sum()))  # noqa: E731
        try:
            cpu_mod.read_op(src, pool, 3)()
        finally:
            cpu_mod.np.add.reduce = real
    assert sum(seen) == pytest.approx(999 * 1000 / 2) and len(seen) == 3


def test_cpu_op_is_seconds_per_op(monkeypatch):
    """2,000 tiny ops in 4 ms: 2 us per op."""
    torch = cpu_mod.optional_torch()
    if torch is None:
        pytest.skip("torch not installed")
    monkeypatch.setattr(cpu_mod, "wall_timed", lambda func: (lambda: 4e-3))
    got = cpu_mod.measure_cpu_op(torch, 0, 2, None, ops=2000)
    assert got.value == pytest.approx(2e-6) and "c.add_(1)" in got.how


def test_cpu_profile_measures_dram_read_and_a_cpu_op():
    run = run_profile(dataclasses.replace(TINY, disk_bytes=0, attention_contexts=(), emulation_ms=(),
                                          dispatch_repeats=0), device="cpu")
    cpu, methods = run.profile.cpu, run.profile.source.methods
    stream_copy = float(re.search(r"median ([0-9.e+-]+) GB/s", methods["cpu.stream_copy_gbps"]).group(1))
    assert cpu.dram_gbps >= stream_copy * (1 - 1e-3)  # the most traffic measured, STREAM copy included
    assert "the most host DRAM traffic measured" in methods["cpu.dram_gbps"] and SPREAD.search(methods["cpu.dram_gbps"])
    if cpu_mod.optional_torch() is not None:
        assert 0 < cpu.eager_op_s < 1e-3 and "c.add_(1)" in methods["cpu.eager_op_s"]
    assert load_hardware_roundtrip(run.profile) == run.profile


def test_fake_gpu_launch_sync_and_dma_flow_into_profile(gpu_run):
    """eager op 8 us as measured; sync bubble = 36 us round trip - 2 x 8 us = 20 us; DRAM: every
    core's read plus the 20 GB/s the DMA moved meanwhile, or STREAM copy if that is more."""
    profile = gpu_run.profile
    gpu, cpu, methods = profile.gpu, profile.cpu, profile.source.methods
    assert gpu.eager_op_s == pytest.approx(8e-6) and gpu.sync_bubble_s == pytest.approx(20e-6)
    assert "less 2 eager ops" in methods["gpu.sync_bubble_s"]
    assert cpu.dram_gbps > FakeGpu.DMA_GBPS
    assert load_hardware_roundtrip(profile) == profile


def test_measured_dispatch_names_its_owner():
    """hrm profile's dispatch is the reference runtime's own (owner hrm-runtime)."""
    run = run_profile(dataclasses.replace(TINY, disk_bytes=0, cpu_torch_dtypes=(), attention_contexts=()),
                      device="cpu")
    if cpu_mod.optional_torch() is None:
        pytest.skip("torch not installed")
    assert run.profile.cpu.dispatch.owner == "hrm-runtime"
    assert "reference runtime" in run.profile.source.methods["cpu.dispatch.owner"]


def test_stream_memcpy_and_dram_read_share_one_stock_of_touched_arrays():
    """The three steps stream arrays of one size: the stock hands the same pages on (no second
    fault-in), makes only what it lacks, and a parallel first touch fills every element."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    stock: list = []
    with ThreadPoolExecutor(2) as pool:
        a, b, c = cpu_mod.stocked_arrays(4096, 3, pool, 2, stock)
        src, dst = cpu_mod.stocked_arrays(4096, 2, pool, 2, stock)
        (other,) = cpu_mod.stocked_arrays(1024, 1, pool, 2, stock)
        filled = cpu_mod.touched_array(1001, 3.0, pool=pool, threads=2)
    assert src is a and dst is b and len(stock) == 4 and other.size == 1024
    assert np.all(filled == 3.0) and np.all(a == 1.0)
