"""Unit constants and dtype sizes. Human units in files, SI inside (bytes, seconds, FLOP/s)."""

GB = 1e9  # *_gbps keys: 1e9 bytes/s
GIB = 2**30  # *_gib keys: 2^30 bytes
MIB = 2**20  # 2^20 bytes (sizes in messages and measurement notes)
KIB = 2**10  # 2^10 bytes (cache sizes in /sys and /proc)
TFLOPS = 1e12  # *_tflops keys: 1e12 FLOP/s

# Bytes per element. int4 counts the packed payload only; a model that names its stored
# format (ModelSpec.weight_format, hrm.model.quantized.WEIGHT_FORMATS) counts its scales too.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "int8": 1.0,
    "int4": 0.5,
}
DTYPES = tuple(DTYPE_BYTES)
#: dtypes kernels compute in directly; int8/int4 weights are dequantised to fp16
FLOAT_DTYPES = ("fp32", "fp16", "bf16")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (one of fp32, fp16, bf16, int8, int4)."""
    return DTYPE_BYTES[dtype]
