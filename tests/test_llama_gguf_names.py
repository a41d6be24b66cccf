"""A GGUF file name's quant tag sets the weight format hrm import estimates (issue 35)."""

from __future__ import annotations

import json
import subprocess
import sys

from hrm.export.llama_cpp import gguf_name_format


def test_tags_map_to_formats():
    assert gguf_name_format("-m Qwen3-30B-A3B-Q4_K_M.gguf -np 1") == ("Q4_K_M", "int4", "q4_k_m")
    assert gguf_name_format("--model=/m/mixtral.Q8_0.gguf") == ("Q8_0", "int8", "q8_0")
    assert gguf_name_format("-m x-q4_k_s.gguf") == ("Q4_K_S", "int4", "q4_k")
    assert gguf_name_format("-m mixtral-f16.gguf") is None
    assert gguf_name_format("-np 4") is None


def test_import_estimates_the_files_weights_and_says_so():
    cmd = [sys.executable, "-m", "hrm_cli", "import", "--from", "llama.cpp", "--hw", "rtx3090", "--model", "mixtral",
           "--json", "-m mixtral-8x7b-instruct-v0.1.Q4_K_M.gguf -np 1 -c 4096 --n-cpu-moe 16"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert any("Q4_K_M" in n and "--weight-format q4_k_m" in n for n in data["notes"])
    # the same command with --weight-dtype fp16 keeps fp16: more bytes, a different estimate
    out16 = subprocess.run(cmd[:-2] + ["--weight-dtype", "fp16", "--json", cmd[-1]], capture_output=True, text=True)
    assert out16.returncode in (0, 3), out16.stderr
    if out16.returncode == 0:
        est16 = json.loads(out16.stdout)["estimate"]
        assert est16 != data["estimate"]


def test_a_files_name_gives_the_dtype_its_header_would():
    """Every ggml type by its own name (IQ1_S, MXFP4, Q6_K, ...), with the dtype a GGUF header
    read gives the same type (hrm.model.gguf: one rule, hrm.model.quantized.quantized_dtype)."""
    from hrm.model.gguf import _dtypes

    for name, fmt in (("DeepSeek-R1-UD-IQ1_S", "iq1_s"), ("gpt-oss-120b-mxfp4-00001-of-00003", "mxfp4"),
                      ("Qwen3-30B-A3B-128K-Q6_K", "q6_k"), ("m.IQ4_XS", "iq4_xs"), ("x.Q8_0", "q8_0")):
        tag, dtype, got = gguf_name_format(f"-m {name}.gguf")
        assert got == fmt and dtype == _dtypes(fmt, None)["weight_dtype"]
    assert gguf_name_format("-m Qwen3-UD-Q2_K_XL.gguf") is None  # an Unsloth dynamic mix: read its header
