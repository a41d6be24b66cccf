"""What a profile run measures: sizes, repeats and the time budget (quick and full presets).

Tests build tiny configs directly; the CLI picks :func:`quick_config` or :func:`full_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hrm.units import GIB, MIB


@dataclass(frozen=True)
class AttentionShape:
    """A GQA decode-attention layer: kv heads, query heads per kv head, head dim."""

    kv_heads: int = 8
    group: int = 4
    head_dim: int = 128


@dataclass(frozen=True)
class ProfileConfig:
    """Sizes and repeats of every measurement of one profile run."""

    label: str = "full"
    budget_s: float = 300.0
    warmup: int = 1
    repeats: int = 7
    # CPU memory bandwidth (STREAM-like). ``stream_bytes`` is one array; 0 = derive from
    # the last-level cache (8x LLC, at least 256 MiB, at most 1/16 of RAM).
    stream_bytes: int = 0
    #: the STREAM array in last-level caches when ``stream_bytes`` is 0 (profiler.cpu.STREAM_LLC_MULTIPLE)
    stream_llc_multiple: int = 8
    copy_sizes_bytes: tuple[int, ...] = (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB)
    # Host memcpy on one thread vs all threads (bytes moved/s): bytes per array; 0 = the
    # STREAM array size; < 0 = skip.
    memcpy_bytes: int = 0
    # CPU matmul curve: achieved FLOP/s of (M x K) @ (K x N) for each M.
    matmul_k: int = 4096
    matmul_n: int = 4096
    matmul_ms: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    cpu_torch_dtypes: tuple[str, ...] = ("bf16",)
    # CPU decode attention: contexts, total KV cache bytes per measurement.
    attention_contexts: tuple[int, ...] = (128, 512, 2048, 8192)
    attention_kv_bytes: int = 512 * MIB
    attention: AttentionShape = field(default_factory=AttentionShape)
    # Disk read (0 = skip).
    disk_bytes: int = 512 * MIB
    # Dispatch overhead per task / operator call (profiler.dispatch; needs torch): rounds
    # of probe runs of the reference runtime (0 = skip).
    dispatch_repeats: int = 3
    # Emulated device tier of a CPU-only host (profiler.emulation; needs torch): F.linear
    # curve vs M at (K, N) with cold weights per dtype the runtime may compute in (CPU
    # kernels differ widely: fp16 has no fast path on many CPUs), and a torch copy
    # (empty ms = skip).
    emulation_ms: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    emulation_dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    emulation_k: int = 2048
    emulation_n: int = 2048
    emulation_copy_bytes: int = 256 * MIB
    # GPU.
    gpu_matmul_k: int = 8192
    gpu_matmul_n: int = 8192
    gpu_matmul_ms: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096, 8192)
    gpu_dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")
    gpu_copy_bytes: int = 1 * GIB
    transfer_sizes_bytes: tuple[int, ...] = (64 * 1024, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1 * GIB)
    peer_bytes: int = 256 * MIB


def full_config() -> ProfileConfig:
    """The default run: fine curves, 7 repeats, five-minute budget."""
    return ProfileConfig()


def quick_config() -> ProfileConfig:
    """``--quick``: coarse curves, 5 repeats, 40 s budget (a few seconds on an idle 2-core VM)."""
    return ProfileConfig(
        label="quick",
        budget_s=40.0,
        stream_llc_multiple=4,  # STREAM's own minimum (profiler.cpu.STREAM_LLC_MULTIPLE)
        warmup=1,
        repeats=5,
        copy_sizes_bytes=(1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB),
        matmul_ms=(1, 4, 16, 64, 256, 1024),
        emulation_ms=(1, 2, 4, 8, 16, 32, 64, 256),
        attention_contexts=(256, 1024, 4096),
        attention_kv_bytes=256 * MIB,
        disk_bytes=64 * MIB,
        gpu_matmul_ms=(1, 16, 256, 4096),
        gpu_copy_bytes=256 * MIB,
        transfer_sizes_bytes=(1 * MIB, 16 * MIB, 256 * MIB),
        peer_bytes=64 * MIB,
    )
