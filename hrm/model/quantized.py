"""Quantized weights: their bytes (payload plus scales) and the cost of the dequantizing kernel.

Two registries, both data with a source per number (docs/model.md §4.8):

- :data:`WEIGHT_FORMATS` — how many bits a stored weight takes, scales and mins included:
  GGUF block types from ggml's block structs (``block_q4_K`` = 144 bytes per 256 weights =
  4.5 bits), llama.cpp's mixtures (Q4_K_M) and group-quantized int4 (GPTQ/AWQ/Marlin). A
  model names its format in :attr:`hrm.model.spec.ModelSpec.weight_format`; None keeps today's
  count, the packed payload only (:func:`hrm.cost.costs.weight_bytes_per_param`).
- :data:`QUANT_KERNELS` — a kernel family that multiplies fp16 activations by quantized
  weights, dequantizing in the kernel, with two fractions per GPU architecture measured
  against the fp16 (cuBLAS) GEMM on the same GPU and shape:

  - ``bandwidth_fraction``: at small M (memory-bound) the share of the fp16 kernel's memory
    rate the kernel reaches on its own (quantized) bytes: measured speedup over fp16 ÷ the
    ideal speedup (fp16 bytes ÷ quantized bytes);
  - ``compute_fraction``: at large M (compute-bound) its FLOP rate ÷ the fp16 GEMM's.

  A family may also carry the pair for its CPU kernels (``cpu_bandwidth_fraction``,
  ``cpu_compute_fraction``: llama.cpp computes offloaded experts with its CPU backend), of
  the CPU tier's memory rate and FLOP rate; a family without them leaves the CPU at its
  roofline on the format's bytes.

  An engine names its family in :attr:`hrm.engines.engine.Engine.quant_kernel` (None: no family,
  today's model — the fp16 roofline on the quantized bytes). The time of a GEMM on
  quantized weights in that family (:func:`hrm.cost.latency.ops.gpu_time_s`, eq. 14's roofline
  :func:`hrm.cost.latency.ops.op_time_s` at the scaled rates) is the roofline

      t = max(FLOPs / (R_fp16(M) · c_arch), bytes / (B_fp16 · b_arch))

  with R_fp16(M) and B_fp16 the rates the fp16 path uses for the same op (peaks, achieved
  efficiencies, the FLOP/s-vs-M curve of a measured profile): never faster than the fp16
  compute roof, nor than the memory roof of its own bytes (c, b ∈ (0, 1]). On the CPU the
  same roofline takes the CPU tier's rates and the family's CPU pair.

Overrides: ``QUANT_KERNELS`` and ``WEIGHT_FORMATS`` are plain dicts (add or replace an entry
from Python); an engine YAML picks its family by name; a model picks its format by name.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightFormat(_Frozen):
    """A stored weight format: ``parts`` are (share of the weights, bytes per block, weights
    per block) — one part for a block type, several for a mixture of types."""

    parts: tuple[tuple[float, float, int], ...]
    source: str

    @model_validator(mode="after")
    def _shares(self):
        if abs(sum(share for share, _, _ in self.parts) - 1.0) > 1e-9:
            raise ValueError("weight format parts: shares must sum to 1")
        if any(b <= 0 or n <= 0 for _, b, n in self.parts):
            raise ValueError("weight format parts: bytes and weights per block must be positive")
        return self

    @property
    def bits_per_weight(self) -> float:
        return sum(share * 8.0 * block_bytes / weights for share, block_bytes, weights in self.parts)


# ggml block sizes: ggml-org/llama.cpp@0c1e5709 (the llama.cpp vendored by llama_cpp_python
# 0.3.36) ggml/src/ggml-common.h, each struct's static_assert on its size (line cited per type
# in GGML_BLOCK_SOURCES); QK_K = 256 weights per K-quant super-block (ggml-common.h:89).
QK_K = 256
Q4_0_BLOCK = (2 + 32 // 2, 32)  # block_q4_0: ggml_half d + 16 bytes of nibbles
Q8_0_BLOCK = (2 + 32, 32)  # block_q8_0: ggml_half d + 32 int8 quants
Q4_K_BLOCK = (2 * 2 + 12 + QK_K // 2, QK_K)  # block_q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes
Q5_K_BLOCK = (2 * 2 + 12 + QK_K // 2 + QK_K // 8, QK_K)  # block_q5_K: as q4_K + 32 bytes of high bits
Q6_K_BLOCK = (2 + QK_K // 16 + 3 * QK_K // 4, QK_K)  # block_q6_K: d, 16 int8 scales, 192 bytes of quants
#: every ggml tensor type (ggml/include/ggml.h enum ggml_type at 0c1e5709) as (bytes per block,
#: weights per block), by its GGUF name: the quantized types from their block structs, each
#: term one struct member; the float and integer types one element a block (ggml.c type_traits)
GGML_BLOCKS: dict[str, tuple[float, int]] = {
    "F32": (4, 1), "F16": (2, 1), "BF16": (2, 1), "F64": (8, 1),
    "I8": (1, 1), "I16": (2, 1), "I32": (4, 1), "I64": (8, 1),
    "Q1_0": (2 + 128 // 8, 128),  # d + 1 bit per weight (QK1_0 = 128)
    "Q2_0": (2 + 64 // 4, 64),  # d + 2 bits per weight (QK2_0 = 64)
    "Q4_0": Q4_0_BLOCK, "Q4_1": (2 * 2 + 32 // 2, 32), "Q5_0": (2 + 4 + 32 // 2, 32),
    "Q5_1": (2 * 2 + 4 + 32 // 2, 32), "Q8_0": Q8_0_BLOCK, "Q8_1": (2 * 2 + 32, 32),
    "MXFP4": (1 + 32 // 2, 32),  # one E8M0 scale + 32 E2M1 nibbles (QK_MXFP4 = 32)
    "NVFP4": (64 // 16 + 64 // 2, 64),  # four UE4M3 scales (one per 16) + 64 E2M1 nibbles
    "TQ1_0": (2 + QK_K // 64 + (QK_K - 4 * QK_K // 64) // 5, QK_K),  # d, 4 bytes of 4 trits, 48 of 5
    "TQ2_0": (2 + QK_K // 4, QK_K),  # d + 2 bits per weight
    "Q2_K": (2 * 2 + QK_K // 16 + QK_K // 4, QK_K), "Q3_K": (2 + QK_K // 4 + QK_K // 8 + 12, QK_K),
    "Q4_K": Q4_K_BLOCK, "Q5_K": Q5_K_BLOCK, "Q6_K": Q6_K_BLOCK, "Q8_K": (4 + QK_K + QK_K // 16 * 2, QK_K),
    "IQ2_XXS": (2 + QK_K // 8 * 2, QK_K), "IQ2_XS": (2 + QK_K // 8 * 2 + QK_K // 32, QK_K),
    "IQ2_S": (2 + QK_K // 4 + QK_K // 16, QK_K), "IQ3_XXS": (2 + 3 * (QK_K // 8), QK_K),
    "IQ3_S": (2 + 13 * (QK_K // 32) + QK_K // 64, QK_K), "IQ1_S": (2 + QK_K // 8 + QK_K // 16, QK_K),
    "IQ1_M": (QK_K // 8 + QK_K // 16 + QK_K // 32, QK_K), "IQ4_NL": (2 + 32 // 2, 32),
    "IQ4_XS": (2 + 2 + QK_K // 64 + QK_K // 2, QK_K),
}
#: where each block size is stated: the static_assert under its struct (ggml-common.h) or the
#: type_traits entry (ggml.c), at ggml-org/llama.cpp@0c1e5709
GGML_BLOCK_SOURCES: dict[str, str] = {
    "F32": "ggml.c:663", "F16": "ggml.c:669", "BF16": "ggml.c:886", "F64": "ggml.c:657", "I8": "ggml.c:633",
    "I16": "ggml.c:639", "I32": "ggml.c:645", "I64": "ggml.c:651",
    "Q1_0": "ggml-common.h:185", "Q2_0": "ggml-common.h:192", "Q4_0": "ggml-common.h:199",
    "Q4_1": "ggml-common.h:212", "MXFP4": "ggml-common.h:219", "NVFP4": "ggml-common.h:227",
    "Q5_0": "ggml-common.h:235", "Q5_1": "ggml-common.h:249", "Q8_0": "ggml-common.h:256",
    "Q8_1": "ggml-common.h:269", "TQ1_0": "ggml-common.h:281", "TQ2_0": "ggml-common.h:288",
    "Q2_K": "ggml-common.h:309", "Q3_K": "ggml-common.h:321", "Q4_K": "ggml-common.h:338",
    "Q5_K": "ggml-common.h:356", "Q6_K": "ggml-common.h:368", "Q8_K": "ggml-common.h:376",
    "IQ2_XXS": "ggml-common.h:385", "IQ2_XS": "ggml-common.h:393", "IQ2_S": "ggml-common.h:402",
    "IQ3_XXS": "ggml-common.h:411", "IQ3_S": "ggml-common.h:422", "IQ1_S": "ggml-common.h:430",
    "IQ1_M": "ggml-common.h:438", "IQ4_NL": "ggml-common.h:452", "IQ4_XS": "ggml-common.h:460",
}
#: the type ids of ggml/include/ggml.h (enum ggml_type, lines 390-433 at 0c1e5709): a GGUF
#: tensor stores its type as this number
GGML_TYPE_IDS: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
    12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0", 42: "Q2_0",
}
#: ggml types that hold floats or integers (no block scales): a tensor in one is not quantized
GGML_PLAIN_TYPES = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})


def ggml_bits_per_weight(ggml_type: str) -> float:
    """Bits per weight of a ggml tensor type (its GGUF name: Q4_K, F16, ...); KeyError if unknown."""
    block_bytes, weights = GGML_BLOCKS[ggml_type.upper()]
    return 8.0 * block_bytes / weights


#: llama.cpp's Q4_K_M on a SwiGLU expert: gate and up in Q4_K; down in Q6_K on the layers
#: ``use_more_bits`` picks (the first and last eighth and every third between: half of
#: them), Q4_K on the rest (src/llama-quant.cpp, llama_tensor_get_type: ffn_down with
#: LLAMA_FTYPE_MOSTLY_Q4_K_M && use_more_bits -> GGML_TYPE_Q6_K)
Q4_K_M_DOWN_Q6_SHARE = 0.5

#: the OCP Microscaling format MXFP4 (OCP Microscaling Formats (MX) v1.0 spec, Sept 2023,
#: https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf, table 1:
#: block size 32, E2M1 elements, one E8M0 shared scale): 32 x 4 + 8 bits per 32 weights = 4.25
#: bits; ggml's block_mxfp4 stores exactly that (GGML_BLOCKS["MXFP4"]: 17 bytes per 32)
MXFP4_BLOCK = (32 * 4 // 8 + 1, 32)
#: fp8 weights with one fp32 scale per 128 x 128 block (DeepSeek-V3's and Kimi-K2's checkpoints:
#: config.json quantization_config weight_block_size [128, 128]; README_WEIGHTS.md of
#: deepseek-ai/DeepSeek-V3: "weight_scale_inv ... float32 Tensor ... (128x128 weight block)")
FP8_BLOCK = 128
FP8_BLOCK128 = (FP8_BLOCK * FP8_BLOCK + 4, FP8_BLOCK * FP8_BLOCK)

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    # every quantized ggml type by its lower-cased GGUF name (q4_k, iq1_s, tq1_0, mxfp4, ...)
    **{name.lower(): WeightFormat(parts=((1.0, *GGML_BLOCKS[name]),),
                                  source=f"ggml {GGML_BLOCK_SOURCES[name]} @0c1e5709: "
                                         f"{GGML_BLOCKS[name][0]} bytes per {GGML_BLOCKS[name][1]} weights")
       for name in GGML_BLOCKS if name not in GGML_PLAIN_TYPES},
    "q4_k_m": WeightFormat(
        parts=((2 / 3 + (1 - Q4_K_M_DOWN_Q6_SHARE) / 3, *Q4_K_BLOCK), (Q4_K_M_DOWN_Q6_SHARE / 3, *Q6_K_BLOCK)),
        source="llama.cpp src/llama-quant.cpp: Q4_K_M = Q4_K, ffn_down in Q6_K on half the layers "
               "(use_more_bits); on a SwiGLU expert 4.84 bits per weight"),
    # int4 with one fp16 scale per group of 128 (symmetric: no zeros), the Marlin/GPTQ layout:
    # "the 0.125 bits storage overhead of the group scales" (IST-DASLab/marlin README, Benchmarks)
    "int4-g128": WeightFormat(parts=((1.0, 128 // 2 + 2, 128),),
                              source="IST-DASLab/marlin README: 4 bits + 0.125 bits of fp16 group scales (group 128)"),
    "int8-channelwise": WeightFormat(parts=((1.0, 1.0, 1),),
                                     source="one scale per output channel: < 0.01% of the bytes, not counted"),
    # kt-kernel's AMXINT4 CPU experts: n·k/2 bytes of nibbles + one fp32 scale per output row
    # (kvcache-ai/ktransformers@95009ea6 kt-kernel/operators/amx/la/amx_buffers.hpp:499-514)
    "int4-channelwise": WeightFormat(parts=((1.0, 0.5, 1),),
                                     source="int4, one scale per output channel (kt-kernel AMXINT4): the scales, "
                                            "32 bits per row of k weights (1% at k = 768), not counted"),
    "fp8-block128": WeightFormat(parts=((1.0, *FP8_BLOCK128),),
                                 source="fp8 e4m3 + one fp32 scale per 128x128 block (DeepSeek-V3 README_WEIGHTS.md)"),
}
WEIGHT_FORMATS["mxfp4"] = WeightFormat(parts=((1.0, *MXFP4_BLOCK),),
                                       source="OCP MX v1.0 MXFP4: 32 E2M1 + one E8M0 scale = 4.25 bits; ggml "
                                              f"block_mxfp4 ({GGML_BLOCK_SOURCES['MXFP4']}) the same 17 bytes per 32")

#: a per-tensor mixture of ggml types, as a GGUF file holds it (Unsloth's UD files, llama.cpp's
#: _M/_L mixes): ``mix:TYPE*ELEMENTS,TYPE*ELEMENTS`` — each type's weight count, so the name is
#: exact and a plan made from a file reloads without the file (:func:`mix_format_name`)
MIX_PREFIX = "mix:"


def mix_format_name(elements_by_type: dict[str, int]) -> str:
    """The weight format name of tensors holding ``elements_by_type`` weights per ggml type."""
    items = sorted((t.lower(), int(n)) for t, n in elements_by_type.items() if n > 0)
    return MIX_PREFIX + ",".join(f"{t}*{n}" for t, n in items)


def _mix_format(name: str) -> WeightFormat:
    parts, total = [], 0
    for item in name[len(MIX_PREFIX):].split(","):
        kind, _, count = item.partition("*")
        if kind.upper() not in GGML_BLOCKS or not count.isdigit() or int(count) <= 0:
            raise ValueError(f"unknown weight format {name!r} (a mix is {MIX_PREFIX}TYPE*WEIGHTS,...: a ggml type "
                             f"and a positive weight count, e.g. {MIX_PREFIX}q4_k*1000,q6_k*500)")
        parts.append((int(count), *GGML_BLOCKS[kind.upper()]))
        total += int(count)
    return WeightFormat(parts=tuple((n / total, b, w) for n, b, w in parts),
                        source="a per-tensor mix of ggml types (a GGUF file's tensors)")


def is_weight_format(name: str) -> bool:
    """Whether ``name`` is a known weight format (a name in WEIGHT_FORMATS or a valid mix)."""
    try:
        weight_format(name)
    except ValueError:
        return False
    return True


def weight_format(name: str) -> WeightFormat:
    if isinstance(name, str) and name.startswith(MIX_PREFIX):
        return _mix_format(name)
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {name!r} (one of {', '.join(WEIGHT_FORMATS)}, or a "
                         f"{MIX_PREFIX}TYPE*WEIGHTS,... mix)")
    return WEIGHT_FORMATS[name]


def bits_per_weight(name: str) -> float:
    """Bits per stored weight of format ``name``, scales and mins included."""
    return weight_format(name).bits_per_weight


def quantized_dtype(name: str) -> str:
    """The quantized weight dtype a stored format implies: ``int8`` from 8 bits per weight up
    (q8_0, fp8 blocks), else ``int4`` (q4_K, q6_K, mxfp4, IQ types, mixes): the same for a GGUF's
    header, a file's name and ``--weight-format`` alone."""
    return "int8" if bits_per_weight(name) >= 8 else "int4"


class QuantKernel(_Frozen):
    """A dequantizing GEMM family: per GPU architecture (``default`` for the rest) the
    fraction of the fp16 kernel's memory rate (small M) and FLOP rate (large M) it reaches,
    the kernel microbenchmarks they come from, and optionally the same pair for the
    family's CPU kernels (None: no CPU measurement)."""

    bandwidth_fraction: dict[str, float]
    compute_fraction: dict[str, float]
    source: str
    cpu_bandwidth_fraction: Optional[float] = None
    cpu_compute_fraction: Optional[float] = None
    cpu_source: Optional[str] = None

    @model_validator(mode="after")
    def _fractions(self):
        for name, table in (("bandwidth_fraction", self.bandwidth_fraction),
                            ("compute_fraction", self.compute_fraction)):
            if "default" not in table:
                raise ValueError(f"{name} needs a 'default' entry")
            if any(not 0 < v <= 1 for v in table.values()):
                raise ValueError(f"{name}: fractions must lie in (0, 1]")
        cpu = (self.cpu_bandwidth_fraction, self.cpu_compute_fraction)
        if (cpu[0] is None) != (cpu[1] is None) or (cpu[0] is None) != (self.cpu_source is None):
            raise ValueError("cpu_bandwidth_fraction, cpu_compute_fraction and cpu_source go together")
        if cpu[0] is not None and any(not 0 < v <= 1 for v in cpu):
            raise ValueError("cpu fractions must lie in (0, 1]")
        return self

    def fractions(self, architecture: str | None) -> tuple[float, float]:
        """(compute fraction, bandwidth fraction) on ``architecture``."""
        arch = architecture or "default"
        return (self.compute_fraction.get(arch, self.compute_fraction["default"]),
                self.bandwidth_fraction.get(arch, self.bandwidth_fraction["default"]))

    def cpu_fractions(self) -> tuple[float, float] | None:
        """(compute fraction, bandwidth fraction) of the family's CPU kernels; None: unmeasured."""
        if self.cpu_compute_fraction is None:
            return None
        return self.cpu_compute_fraction, self.cpu_bandwidth_fraction


#: Marlin int4 (group 128) x fp16 on an Ampere GPU (vLLM PR #2497, comment of 2024-01-24,
#: IST-DASLab/marlin bench.py): speedup over torch fp16 3.12 at M=1 (3.10-3.20 up to M=16)
#: against the ideal 3.87 (README: 16 / 4.125 bits) -> 3.12 / 3.87; 0.60 at M=2048 (141.4
#: TFLOP/s, 0.61 at M=4000) -> 0.60 of the fp16 GEMM's FLOP rate.
MARLIN_AMPERE_BANDWIDTH = 3.12 / 3.87
MARLIN_AMPERE_COMPUTE = 0.60
#: Marlin w4a16 (channelwise) on H100 (inclusionAI/humming PR #2, n = k = 8192): 4.98 vs
#: 2.30 TFLOP/s for torch fp16 at M=1 (2.17x; 2.14x at M=4) against an ideal 4x.
MARLIN_HOPPER_BANDWIDTH = (4.98 / 2.30) / 4.0
#: llama.cpp's dequantize-to-f16 + BLAS path for a quantized matmul (its path with the
#: MMQ/MMA kernels off) vs f16 BLAS, m=4096 n=512 k=14336 (PR #14624, "MMA Disabled (cublas
#: path)", a CDNA3 GPU): q4_0 55.61 vs f16 74.02 TFLOP/s.
GGUF_DEQUANT_BLAS_COMPUTE = 55.61 / 74.02
#: llama.cpp's ggml-cuda quantized matmul (MMVQ for <= 8 tokens, MMQ above: ggml-cuda.cu
#: ggml_cuda_mul_mat / ggml_cuda_mul_mat_id) vs the 16-bit BLAS GEMM on the same GPU,
#: test-backend-ops MUL_MAT m=4096 n=512 k=14336, "master" column. No such table for an
#: NVIDIA GPU is public (docs/model.md §4.8): the measured architectures are AMD ones,
#: running ggml-cuda's sources through HIP (at ggml-org/llama.cpp@0c1e5709 both dispatch
#: these types to MMQ, mmq.cu:408-435; the PRs' own commits are older and the tables do
#: not name the kernel).
#: RDNA4 (llama.cpp PR #17437, zhang-hui-yulo, PR description): q3_K 68.80 vs bf16 91.95 TFLOP/s.
GGML_CUDA_RDNA4_COMPUTE = 68.80 / 91.95
#: RDNA3 (llama.cpp PR #17879, zhang-hui-yulo, comment 1): q5_1 44.47 vs bf16 60.03 TFLOP/s.
GGML_CUDA_RDNA3_COMPUTE = 44.47 / 60.03
#: the family's default: the K-quant measurement (Q4_K_M is K-quants), RDNA4; no NVIDIA
#: architecture was measured, and the three AMD ones agree to 1% (0.741-0.751 with CDNA3's
#: dequantize + BLAS path, GGUF_DEQUANT_BLAS_COMPUTE)
GGML_CUDA_DEFAULT_COMPUTE = GGML_CUDA_RDNA4_COMPUTE
#: memory-bound (n=1): no usable measurement. Every public n=1 row found (m=4096, k=14336:
#: q4_0 = 33 MB) runs from a last-level cache larger than the matrix, above DRAM speed
#: (RDNA4 PR #17437: q4_0 4.05 TFLOP/s = 1.14 TB/s of its bytes, above any RDNA4 card's <= 0.64
#: TB/s DRAM), so the
#: bandwidth fraction stays 1: the roofline on the format's own bytes.
GGML_CUDA_DEFAULT_BANDWIDTH = 1.0

QUANT_KERNELS: dict[str, QuantKernel] = {
    "marlin": QuantKernel(
        bandwidth_fraction={"default": MARLIN_AMPERE_BANDWIDTH, "ampere": MARLIN_AMPERE_BANDWIDTH,
                            "hopper": MARLIN_HOPPER_BANDWIDTH},
        compute_fraction={"default": MARLIN_AMPERE_COMPUTE},
        source="vLLM PR #2497 (Marlin bench.py sweep: 3.12x at M=1 vs ideal 3.87x, 0.60x at M=2048); "
               "inclusionAI/humming PR #2 (H100, M=1: 4.98 vs 2.30 TFLOP/s fp16)"),
    "gguf-dequant-blas": QuantKernel(
        bandwidth_fraction={"default": 1.0},
        compute_fraction={"default": GGUF_DEQUANT_BLAS_COMPUTE},
        source="llama.cpp PR #14624 (test-backend-ops MUL_MAT q4_0 vs f16, n=512, MMA disabled: dequantize + "
               "BLAS, CDNA3): 55.61 / 74.02; no public memory-bound measurement: bandwidth fraction 1"),
    "ggml-cuda-mmq": QuantKernel(
        bandwidth_fraction={"default": GGML_CUDA_DEFAULT_BANDWIDTH},
        compute_fraction={"default": GGML_CUDA_DEFAULT_COMPUTE, "rdna4": GGML_CUDA_RDNA4_COMPUTE,
                          "rdna3": GGML_CUDA_RDNA3_COMPUTE},
        source="llama.cpp test-backend-ops MUL_MAT m=4096 n=512 k=14336 through ggml-cuda's HIP build: PR #17437 "
               "(RDNA4, q3_K 68.80 vs bf16 91.95 TFLOP/s), PR #17879 (RDNA3, q5_1 44.47 vs bf16 60.03); no NVIDIA "
               "table public; n=1 rows are cache-resident: bandwidth fraction 1; no CPU measurement"),
}


def quant_kernel(name: str) -> QuantKernel:
    if name not in QUANT_KERNELS:
        raise ValueError(f"unknown quantized kernel {name!r} (one of {', '.join(QUANT_KERNELS)})")
    return QUANT_KERNELS[name]
