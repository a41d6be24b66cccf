"""The mechanism switch: an engine with some of its fields set (:func:`with_fields`), with one
mechanism switched off to the ``ideal`` engine's value (:func:`without`, what ``hrm estimate
--explain`` does to each of :data:`MECHANISMS` in turn), the mechanisms an engine has on
(:func:`active_mechanisms`), and the mechanisms a command's own flags set
(:func:`flag_engine`, from the engine's ``flags``).

Every result is validated again as an :class:`hrm.engines.engine.Engine`, so a switch the
engine's pipeline cannot model is refused as a file with that value would be.
"""

from __future__ import annotations

from .engine import IDEAL, Engine


#: Mechanisms ``--explain`` switches off one at a time (dotted field paths): every engine
#: field that is not the engine's identity or policy space (a test checks the coverage).
MECHANISMS: dict[str, str] = {
    "decode.weight_path": "decode weight path",
    "decode.kv_cache": "decode host-KV path (pinned/pageable)",
    "decode.offloaded_experts": "experts not on the GPU: run on the CPU or fetched as cache misses",
    "host_dram": "host DRAM shared by copies, DMA and CPU attention",
    "achieved_gpu_rates": "achieved GPU memory/GEMM rates",
    "moe_kernel": "MoE kernel efficiency",
    "quant_kernel": "dequantizing kernel of quantized weights",
    "moe_reads_all_experts": "MoE kernel reads every resident expert",
    "cpu_attention": "CPU attention through an fp32 workspace (FlexGen's host passes)",
    "cpu_kernels": "CPU experts at ggml's measured kernel rates",
    "cpu_threads": "threads of the CPU experts (-t)",
    "sync": "host synchronisation (pipeline drains)",
    "prefill.weight_path": "prefill weight path",
    "prefill.weights_overlap": "prefill weight-load overlap",
    "prefill.kv_cache": "prefill KV write-back path",
    "prefill.offloaded_experts": "prefill: experts not on the GPU run on the CPU or fetched as misses",
    "prefill.kv_reserved_gen_slots": "prefill writes reserved KV slots",
    "prefill.hidden_round_trip": "prefill hidden-state round trip",
    "prefill.max_tokens_per_pass": "chunked prefill (each pass re-reads offloaded weights)",
    "copy_threads": "staging-copy thread team",
    "numa_aware": "NUMA placement of pinned buffers",
    "tensor_parallel.host_shared": "ranks share host PCIe uplinks",
    "tensor_parallel.allreduce": "all-reduce path",
    "gpu_split": "GPUs run their blocks of layers one after another",
    "offloaded_weights": "every layer weight offloaded, not only experts",
    "prefetch_bucket_hidden_sq": "ZeRO-3 prefetch bucket (the rest of a layer fetched on demand)",
    "pads_prompts": "every prompt padded to the longest",
    "static_experts": "static experts kept in whole units (r_w snapped)",
    "op_offload_min_tokens": "CPU-kept experts copied to the GPU from a token count",
    "offload_min_tokens_per_expert": "missed experts copied to the GPU from tokens per expert",
    "memory.gpu_weight_buffer_layers": "GPU weight buffer (layers)",
    "memory.pinned_staging_layers": "pinned CPU staging buffer (layers)",
    "memory.cpu_holds_all_experts": "CPU tensor holds every expert",
    "launches": "per-op launch and Python dispatch on the host",
    "memory.disk_weights": "weights beyond host memory read from disk",
    "memory.kv_tokens_multiple": "each sequence's KV cache padded to the engine's slot size (llama.cpp: 256)",
}


def _field_value(obj, path: str):
    """The value of the dotted field ``path`` of ``obj``."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def with_fields(engine: Engine, values: dict) -> Engine:
    """``engine`` with fields (dotted paths, e.g. ``prefill.max_tokens_per_pass``) set to
    ``values``, validated again."""
    data = engine.model_dump()
    for path, value in values.items():
        parts = path.split(".")
        target = data
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = value
    return Engine.model_validate(data)


def without(engine: Engine, mechanism: str) -> Engine:
    """``engine`` with one mechanism switched to its ideal value."""
    return with_fields(engine, {mechanism: _field_value(IDEAL, mechanism)})


def active_mechanisms(engine: Engine) -> list[str]:
    """Mechanisms whose value differs from ideal."""
    return [m for m in MECHANISMS if _field_value(engine, m) != _field_value(IDEAL, m)]


def flag_engine(engine: Engine, words: dict[str, str]) -> tuple[Engine, dict]:
    """``engine`` as a command with the flag values ``words`` (flag -> canonical word) runs
    it: the fields its :class:`hrm.engines.engine.EngineFlag` entries set, and those fields (for a note).
    Flags apply in the engine file's order, so a later entry's field overrides an earlier one's
    (FlexGen: ``--overlap false`` runs nothing overlapped, whatever ``--sep-layer`` says)."""
    fields: dict = {}
    for flag, spec in engine.flags.items():
        if flag in words:
            fields.update(spec.fields(words[flag]))
    return (with_fields(engine, fields) if fields else engine), fields
