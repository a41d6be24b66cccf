"""Engines (docs/model.md §4.7): how a real system executes a plan, as data.

An engine is its schedule (lanes, overlap, launch order: :mod:`hrm.engines.schedules`) plus its
execution mechanisms. Every mechanism is one field whose value in the ``ideal`` engine
switches it off, so ``ideal`` is today's plain HRM roofline and ``hrm estimate --explain``
can switch each mechanism off in turn (:mod:`hrm.engines.mechanisms`). Shipped engines are
YAML files in ``hrm/data/engines/`` (a registry in package data); each cites the source lines
of the engine it describes. ``--engine FILE.yaml`` loads a user's own.

Mechanisms (field: what it models; ideal value):

- ``decode.weight_path`` / ``prefill.weight_path``: how offloaded weights reach the GPU —
  ``pinned`` (DMA from pinned memory; ideal), ``pageable-staged`` (a CPU thread team copies
  pageable → pinned, then DMA), ``pageable-relay`` (the issuing thread copies each tensor
  into a pinned relay with a team of ``copy_threads``, then DMAs it, and the next copy waits
  for the step's sync: copy and DMA in turn, FlexGen's ``pin_memory()`` relay),
  ``pageable-driver`` (``copy_`` from pageable memory: the driver stages it, at the pageable
  rate);
- ``decode.kv_cache`` / ``prefill.kv_cache``: the memory the host KV cache lives in, so
  the path of its write-back and its prefetch for GPU attention — ``pinned`` (async DMA;
  ideal) or ``pageable`` (driver-staged at the pageable rate; in prefill a device→pageable
  copy returns only when complete, so it blocks the GPU chain);
- ``host_dram``: charge host-DRAM traffic (CPU attention reads, staging copies, DMA reads
  and writes) against the host's bandwidth as a lane of its own (ideal: off);
- ``achieved_gpu_rates``: GPU memory at its streaming efficiency, GEMMs at their achieved
  fraction of tensor peak (ideal: datasheet peaks);
- ``moe_kernel``: a named kernel-efficiency entry (:data:`KERNELS`) for the routed-expert
  GEMMs (ideal: ``cublas``, factor 1);
- ``quant_kernel``: the dequantizing GEMM family (:data:`hrm.model.quantized.QUANT_KERNELS`) the
  engine runs quantized (int8/int4) weights in: such GEMMs pay the family's measured compute
  and bandwidth fractions of the fp16 GEMM, in place of ``moe_kernel``'s (ideal: none — the
  fp16 roofline on the quantized bytes);
- ``cpu_kernels``: ``ggml`` — CPU experts at the kernel rates ``hrm profile --llama-cpp``
  measured (docs/model.md §4.10), where the profile has them (ideal: the CPU roofline);
- ``cpu_attention``: how CPU attention runs — ``roofline`` (one pass over the host KV cache
  at the CPU's roofline; ideal) or ``fp32-workspace`` (FlexGen's ``--cpu-cache-compute``: per
  slot the KV prefix is widened to an fp32 workspace, expanded g-fold for GQA into fresh pages
  and read by one-row batched products: :mod:`hrm.cost.latency.workspace_attention`);
- ``moe_reads_all_experts``: the fused MoE kernel reads every resident expert of the layer
  per micro-batch, not only those the tokens touch (ideal: off);
- ``sync``: where the host synchronises — ``none`` (ideal), ``per-step`` (host syncs end
  each decode step: the pipeline drains and fills once per step), ``per-micro-batch``
  (every (layer, micro-batch) slot ends with a sync, so the next layer's weight load
  overlaps only one micro-batch's tasks: FlexGen's loop);
- ``prefill.weights_overlap``: ``full`` (the load overlaps the layer's compute; ideal),
  ``one-micro-batch`` (overlaps one micro-batch's work), ``next-block-one-micro-batch`` (the
  layer runs as two synced blocks: the FFN's weights load beside one micro-batch's attention,
  the attention's beside one micro-batch's FFN; FlexGen ``--sep-layer``),
  ``last-micro-batch-moe`` (issued after the last micro-batch was queued: overlaps only its
  MoE), ``none``;
  ``prefill.kv_reserved_gen_slots``: the prompt's KV write-back includes the slots of the
  tokens still to be generated; ``prefill.hidden_round_trip``: hidden states go to pinned
  CPU memory and back every layer; ``prefill.max_tokens_per_pass``: chunked prefill, at
  most that many prompt tokens per forward pass, each pass re-reading the offloaded
  weights (needs one micro-batch: the passes are per micro-batch);
- ``static_experts``: ``continuous`` (r_w any fraction; ideal), ``whole-experts-per-layer``
  (``int(E·r_w)`` experts of every layer stay on the GPU) or ``whole-layers`` (all experts
  of ``r_w·L`` layers, none of the others: llama.cpp's ``--n-cpu-moe``);
- ``decode.offloaded_experts`` / ``prefill.offloaded_experts``: what happens to the experts
  not kept on the GPU — ``streamed`` (copied to the GPU and computed there; ideal) or
  ``cpu`` (computed on the CPU where they are stored, hidden states there and back; a
  micro-batch of at least ``op_offload_min_tokens`` tokens instead has the experts it uses
  copied to the GPU first, synchronously: llama.cpp's op offload) or ``cached`` (the static
  experts are a GPU cache of each layer's hottest experts, r_w·E of them; each micro-batch
  loads the others it uses on demand: expected misses × expert bytes, a convex
  piecewise-linear term in r_w under skewed routing: MoE-Infinity) or ``cached-cpu`` (the
  same cache; a miss runs on the CPU below ``offload_min_tokens_per_expert`` tokens per
  expert and is copied from pageable memory above: Fiddler);
- ``offloaded_weights``: ``experts`` (non-expert weights always on the GPU; ideal) or
  ``all`` (r_w splits all layer weights, FlexGen's ``--percent``);
- ``copy_threads``: threads of the staging-copy team (``0`` = one per core);
- ``memory.disk_weights``: weights beyond host memory spill to the profile's disk and are
  read back through host memory every pass (the ``disk`` lane, :func:`hrm.cost.latency.lanes.disk_lanes`;
  ideal: off, a policy must fit host memory);
- ``numa_aware``: pinned buffers on the GPU's socket (ideal) or not;
- ``launches``: the host-side operator calls of a layer counted from the engine's source
  (:class:`hrm.machine.launches.Launches`): the host thread's issue time is a lane of its own and
  every host sync idles the GPU for a launch, at public per-op costs, where the profile has
  no measured dispatch (ideal: none, nothing charged);
- ``flags`` (not a mechanism itself): the engine's own command-line flags that choose a
  mechanism, as data: each flag's canonical value (``true``/``false``) maps to the engine
  fields it sets (:class:`EngineFlag`; FlexGen's ``--pin-weight 1`` sets
  ``decode.weight_path: pinned``). ``hrm import`` applies them, so the estimate runs the
  mechanism the command runs; the values the file itself models are its defaults;
- ``tensor_parallel.host_shared``: ranks share the host's PCIe uplinks as the profile's
  ``gpus_per_pcie_switch`` says (ideal: every GPU its own link);
  ``tensor_parallel.allreduce``: ``gpu-link`` (ideal: over ``gpu_to_gpu_gbps``) or ``nccl``
  (peer-to-peer when the profile has it, else through host memory, sharing the DMA links);
- ``gpu_split``: how the engine uses a profile's several GPUs — ``tensor`` (every layer's
  weights split across them, all reading at once: one tier of their summed rates, with the
  all-reduces above; ideal) or ``layers`` (each GPU holds a contiguous block of layers and
  runs them after the previous GPU's block: one GPU's rates, its share of the layers one
  after another, plus the hidden states' hop between GPUs; llama.cpp's ``-sm layer``);
  llama.cpp also pipelines a prompt's ubatches across the GPUs (src/llama-context.cpp:430-435);
  that is not modelled: it needs each pass's re-read of the GPU-resident weights, which the
  prefill roofline does not count yet, and without it the smallest ``-ub`` would look best.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

import numpy as np

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import bounds
from ..errors import HRMError, read_yaml_mapping, validated
from ..machine.launches import Launches
from .rules import CHOOSERS, KV_LEVELS, WEIGHT_LEVELS
from .schedules import PIPELINE_FIELDS, SCHEDULES

ENGINES_DIR = Path(__file__).resolve().parents[1] / "data" / "engines"

WeightPath = Literal["pinned", "pageable-staged", "pageable-relay", "pageable-driver"]
KvPath = Literal["pinned", "pageable"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kernel(_Frozen):
    """A routed-expert kernel's efficiency against a cuBLAS-class GEMM on the same GPU, with
    the public measurements it comes from:

    - ``fraction``: achieved fraction of the GEMM FLOP rate per GPU architecture
      (``default`` for the rest): the compute roof only;
    - ``slowdown_by_rows``: (rows per expert, time factor) points: the kernel's time — both
      roofs — over a tuned kernel's at that many tokens per touched expert, interpolated in
      log(rows) and held at the ends (an untuned fused-MoE config is slowest around 8 rows
      and costs nothing at prefill sizes); empty: factor 1."""

    fraction: dict[str, float]
    slowdown_by_rows: tuple[tuple[float, float], ...] = ()
    source: str

    @model_validator(mode="after")
    def _fractions(self):
        if "default" not in self.fraction:
            raise ValueError("kernel fraction needs a 'default' entry")
        if any(not 0 < v <= 1 for v in self.fraction.values()):
            raise ValueError("kernel fractions must lie in (0, 1]")
        rows = [r for r, _ in self.slowdown_by_rows]
        if rows != sorted(set(rows)) or any(r < 1 or not 1 <= f <= 10 for r, f in self.slowdown_by_rows):
            # a factor below 1 would make the tuned reference slower than the kernel
            raise ValueError("slowdown_by_rows: rows >= 1, increasing and unique; factors in [1, 10]")
        return self

    def factor(self, architecture: str | None) -> float:
        return self.fraction.get(architecture or "default", self.fraction["default"])

    def slowdown(self, rows):
        """The time factor at ``rows`` tokens per touched expert (array)."""
        rows = np.maximum(np.asarray(rows, dtype=float), 1.0)
        if not self.slowdown_by_rows:
            return np.ones(rows.shape)
        xs, ys = zip(*self.slowdown_by_rows)
        return np.interp(np.log(rows), np.log(xs), ys)


#: vLLM PR #44152 (comment of 2026-06-01): the Triton fused-MoE kernel with vLLM's default
#: config vs the tuned one, Mixtral's shape (E=8, N=14336, K=4096, top-2), bf16, H20: 1.31x
#: at M=1 token, 1.60x at 32, 1.10x at 128, 1.03x at 512, 0.99x at 2048. Rows per touched
#: expert under uniform top-2 of 8 (hrm.cost.latency.ops.expert_rows: M·k / E(1-(1-k/E)^M)):
#: 1, 8.0, 32, 128, 512. The 0.99x is taken as 1: the tuner keeps the default when nothing
#: beats it, so a tuned config is never slower (the 1% is the benchmark's noise).
UNTUNED_FUSED_MOE_SLOWDOWN = ((1.0, 1.31), (8.0, 1.60), (32.0, 1.10), (128.0, 1.03), (512.0, 1.0))

#: Named kernel efficiencies (relative to a tuned cuBLAS-class GEMM on the same GPU).
KERNELS: dict[str, Kernel] = {
    "cublas": Kernel(fraction={"default": 1.0}, source="reference: tuned vendor GEMM"),
    "triton-fused-moe-untuned": Kernel(
        fraction={"default": 1.0, "turing": 0.5},
        slowdown_by_rows=UNTUNED_FUSED_MOE_SLOWDOWN,
        source="vLLM PR #44152: default vs tuned fused-MoE config on the Mixtral shape, by tokens "
               "(UNTUNED_FUSED_MOE_SLOWDOWN); triton issue #189: Triton about half of cuBLAS's FLOP rate "
               "on Turing (RTX 2080, M=4096: 23.77 vs 46.49 TFLOP/s), the T4's generation"),
    # FlexGen's copy of vLLM's early-2024 fused_moe: one fixed config, 64/64/32 (16/32/64 when the
    # routed tokens are at most the experts), never tuned (lynnliu030/FlexGen@a80c8d15
    # flexgen/fused_moe.py:282-295); on Hopper it runs at FLEXGEN_FUSED_MOE_HOPPER_FRACTION
    "flexgen-fused-moe": Kernel(
        fraction={"default": 1.0, "turing": 0.5, "hopper": 0.242},
        slowdown_by_rows=UNTUNED_FUSED_MOE_SLOWDOWN,
        source="hopper: FlexGen's fused_moe (fused_moe.py:166-325, config :282-295) timed by the GPU harness's "
               "gpu_check.py on the lent H100 box at Mixtral-8x7B's shape, fp16, top-2 of 8, random routing: "
               "16384 tokens in 51.73 ms = 223 TFLOP/s, 0.242 of the box's measured fp16 GEMM peak 921.9 "
               "(docs/validation/runs/flexgen-h100.gpu_check.json, h100-flexgen-box.yaml); default, turing "
               "and the slowdown by rows as triton-fused-moe-untuned (the same untuned config)"),
}


class Phase(_Frozen):
    weight_path: WeightPath = "pinned"
    kv_cache: KvPath = "pinned"
    offloaded_experts: Literal["streamed", "cpu", "cached", "cached-cpu"] = "streamed"


class Prefill(Phase):
    weights_overlap: Literal["full", "one-micro-batch", "next-block-one-micro-batch", "last-micro-batch-moe",
                             "none"] = "full"
    kv_reserved_gen_slots: bounds.Flag = False
    hidden_round_trip: bounds.Flag = False
    #: chunked prefill: a forward pass takes at most this many prompt tokens (vLLM's
    #: --max-num-batched-tokens, SGLang's --chunked-prefill-size), so a micro-batch's prompts
    #: take ceil(tokens / it) passes, each reading the layer's offloaded weights again; None:
    #: one pass (ideal)
    max_tokens_per_pass: Optional[bounds.TOKENS.type] = None


class TensorParallel(_Frozen):
    host_shared: bounds.Flag = False
    allreduce: Literal["gpu-link", "nccl"] = "gpu-link"


class PolicySpace(_Frozen):
    """What the engine can run: placements, parts of the policy it fixes (e.g. ZeRO-
    Inference: one batch, all weights streamed, the KV cache on the GPU), and the most
    sequences it runs at once (``max_batch_size``: a start-up limit of the engine, e.g.
    llama-server's slots; None: no limit of its own). ``chosen_by``: the engine takes no
    policy but picks its own at launch with this optimizer (a name in
    :data:`hrm.engines.rules.CHOOSERS`); None: it runs the policy it is given.
    ``weights_levels``: the engine places weights only at some r_w (a placement rule in
    :data:`hrm.engines.rules.WEIGHT_LEVELS`: FlexGen's whole-tensor midpoint rule); the search
    considers those alone. None: any r_w its ``static_experts`` granularity allows."""

    attention: tuple[Literal["cpu", "gpu"], ...] = ("cpu", "gpu")
    ffn: tuple[Literal["cpu", "gpu"], ...] = ("gpu", "cpu")
    fixed: dict[str, float] = Field(default_factory=dict)
    max_batch_size: Optional[bounds.SEQUENCES.type] = None
    chosen_by: Optional[str] = None
    weights_levels: Optional[str] = None
    #: attention tiers the engine runs under another engine file (a shipped name), because the
    #: flag that selects the tier changes the schedule too (FlexGen's --cpu-cache-compute runs
    #: the same program with CPU attention not overlapped: engine flexgen-cpu-attn). A search of
    #: the engine searches those tiers with that engine as well and keeps the best
    attention_engines: dict[Literal["cpu", "gpu"], str] = Field(default_factory=dict)
    #: the engine splits a micro-batch's KV cache only at some r_c (a rule in
    #: :data:`hrm.engines.rules.KV_LEVELS`: FlexGen's whole rows); the search keeps the largest of
    #: them that fits. None: any r_c
    kv_gpu_shares: Optional[str] = None

    @model_validator(mode="after")
    def _known(self):
        if self.chosen_by is not None and self.chosen_by not in CHOOSERS:
            raise ValueError(f"policy.chosen_by: unknown '{self.chosen_by}' (one of {', '.join(CHOOSERS)})")
        if self.weights_levels is not None and self.weights_levels not in WEIGHT_LEVELS:
            raise ValueError(f"policy.weights_levels: unknown '{self.weights_levels}' "
                             f"(one of {', '.join(WEIGHT_LEVELS)})")
        if self.kv_gpu_shares is not None and self.kv_gpu_shares not in KV_LEVELS:
            raise ValueError(f"policy.kv_gpu_shares: unknown '{self.kv_gpu_shares}' (one of {', '.join(KV_LEVELS)})")
        allowed = {"num_micro_batches", "weights_gpu_ratio", "kv_gpu_ratio"}
        unknown = set(self.fixed) - allowed
        if unknown:
            raise ValueError(f"policy.fixed: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
        for key, value in self.fixed.items():
            refusal = (bounds.SEQUENCES if key == "num_micro_batches" else bounds.FRACTION).refusal(value)
            if refusal:
                raise ValueError(f"fixed.{key}: {refusal}")
        if not self.attention or not self.ffn:
            raise ValueError("policy: attention and ffn need at least one tier")
        for tier, name in self.attention_engines.items():
            if tier in self.attention:
                raise ValueError(f"policy.attention_engines: {tier} is a tier this engine runs itself")
            if bounds.name_refusal(name, identifier=True) or not (ENGINES_DIR / f"{name}.yaml").is_file():
                raise ValueError(f"policy.attention_engines.{tier}: {name!r} is no shipped engine")
        return self


class Memory(_Frozen):
    """The engine's own memory layout (ideal: the paper's appendix A.1 layout).

    - ``gpu_weight_buffer_layers``: layers of offloaded weights the GPU buffers (2 = double);
    - ``pinned_staging_layers``: layers of offloaded weights in pinned CPU staging;
    - ``cpu_holds_all_experts``: the CPU tensor holds every expert, static ones too;
    - ``disk_weights``: offloaded weights that do not fit host memory are kept on the disk
      (the profile's ``disk`` section) and read through host memory every time they are
      used (FlexGen's ``--percent``: the share 100 − wg − wc); ideal: off, nothing spills;
    - ``gpu_reserved_gib`` / ``host_reserved_gib``: memory the engine's process holds beside
      its tensors (the CUDA context per GPU; the process's host footprint). The search's
      planning caps (``--gpu-util``/``--cpu-util``) leave room for them; a pinned policy is
      checked against physical memory less them (:func:`hrm.cost.memory.physical_limits`);
    - ``kv_tokens_multiple``: the KV cache a sequence holds is its longest context rounded up to
      a multiple of this many tokens (llama.cpp: a KV stream per slot, each padded to 256;
      ideal: 1, exactly the context)."""

    gpu_weight_buffer_layers: bounds.BUFFER_LAYERS.type = 2.0
    pinned_staging_layers: bounds.BUFFER_LAYERS.type = 2.0
    cpu_holds_all_experts: bounds.Flag = False
    disk_weights: bounds.Flag = False
    gpu_reserved_gib: bounds.RESERVED_GIB.type = 0.0
    host_reserved_gib: bounds.RESERVED_GIB.type = 0.0
    kv_tokens_multiple: int = Field(default=1, ge=1, le=1 << 16)


#: canonical words of a flag's value (str2bool's spellings read as these, a bare switch as true)
FlagWord = Literal["true", "false"]


class EngineFlag(_Frozen):
    """One command-line flag of the engine that chooses a mechanism: for each value (true,
    false), the engine fields (dotted paths, e.g. ``decode.weight_path``, or ``schedule``) it
    sets; an empty one sets nothing (the engine file already models it: the flag's default).
    ``source``: where the flag and its effect were read (file:line at a commit)."""

    source: str
    when_true: dict[str, object] = Field(default_factory=dict)
    when_false: dict[str, object] = Field(default_factory=dict)

    def fields(self, word: FlagWord) -> dict[str, object]:
        return self.when_true if word == "true" else self.when_false


class Engine(_Frozen):
    name: bounds.Name
    description: str = ""
    schedule: str = "cgopipe"
    policy: PolicySpace = Field(default_factory=PolicySpace)
    decode: Phase = Field(default_factory=Phase)
    prefill: Prefill = Field(default_factory=Prefill)
    host_dram: bounds.Flag = False
    achieved_gpu_rates: bounds.Flag = False
    moe_kernel: str = "cublas"
    #: the dequantizing kernel family of quantized weights' GEMMs (hrm.model.quantized.QUANT_KERNELS);
    #: None: quantized GEMMs run at the fp16 roofline on their bytes
    quant_kernel: Optional[str] = None
    moe_reads_all_experts: bounds.Flag = False
    #: how CPU attention runs: ``roofline`` (ideal) or ``fp32-workspace`` (FlexGen's host passes,
    #: :mod:`hrm.cost.latency.workspace_attention`)
    cpu_attention: Literal["roofline", "fp32-workspace"] = "roofline"
    #: ``ggml``: the experts the engine runs on the CPU run in ggml's CPU kernels, at the rates
    #: a profile's ``ggml_cpu`` section measured (hrm profile --llama-cpp); None, or a profile
    #: without that section: the CPU roofline
    cpu_kernels: Optional[Literal["ggml"]] = None
    #: threads of those CPU kernels (a command's -t); None: the engine's default on the profile's
    #: cores (hrm.machine.rates.default_llama_threads)
    cpu_threads: Optional[bounds.CORES.type] = None
    sync: Literal["none", "per-step", "per-micro-batch"] = "none"
    static_experts: Literal["continuous", "whole-experts-per-layer", "whole-layers"] = "continuous"
    #: tokens from which a micro-batch's CPU-kept experts are copied to the GPU instead of
    #: computed on the CPU (``offloaded_experts: cpu``); None: never
    op_offload_min_tokens: Optional[bounds.SEQUENCES.type] = None
    #: ``offloaded_experts: cached-cpu``: tokens per touched expert from which a missed
    #: expert is copied to the GPU instead of run on the CPU; None: always on the CPU
    offload_min_tokens_per_expert: Optional[bounds.NON_NEGATIVE.type] = None
    offloaded_weights: Literal["experts", "all"] = "experts"
    #: ZeRO-3's ``stage3_prefetch_bucket_size`` in units of hidden² parameters: that much of
    #: the offloaded weights ahead is fetched while the GPU computes; the rest of a layer's
    #: is fetched on demand, serial with the GPU (:func:`hrm.cost.latency.offload.on_demand_weights_share`).
    #: None: a layer's offloaded weights are all prefetched
    prefetch_bucket_hidden_sq: Optional[bounds.NON_NEGATIVE.type] = None
    #: every prompt is padded to the workload's longest (FlexGen pads to --prompt-len): the
    #: engine runs the padded workload (:func:`hrm.problem.make_problem`)
    pads_prompts: bounds.Flag = False
    copy_threads: bounds.COPY_THREADS.type = 0
    numa_aware: bounds.Flag = True
    tensor_parallel: TensorParallel = Field(default_factory=TensorParallel)
    #: how several GPUs share the model: ``tensor`` (all at once) or ``layers`` (one after
    #: another, each its block of layers: :func:`hrm.machine.rates.rates_from_profile`)
    gpu_split: Literal["tensor", "layers"] = "tensor"
    memory: Memory = Field(default_factory=Memory)
    #: host-side operator calls per layer, counted from the engine's source (:mod:`hrm.machine.launches`);
    #: None: not charged (ideal; an engine that replays CUDA graphs or issues from C++)
    launches: Optional[Launches] = None
    #: the engine's flags that choose a mechanism, by flag (:class:`EngineFlag`; ``hrm import``)
    flags: dict[str, EngineFlag] = Field(default_factory=dict)
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_names(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: unknown '{self.schedule}' (one of {', '.join(SCHEDULES)})")
        if self.moe_kernel not in KERNELS:
            raise ValueError(f"moe_kernel: unknown '{self.moe_kernel}' (one of {', '.join(KERNELS)})")
        if self.quant_kernel is not None:
            from ..model.quantized import QUANT_KERNELS

            if self.quant_kernel not in QUANT_KERNELS:
                raise ValueError(f"quant_kernel: unknown '{self.quant_kernel}' (one of {', '.join(QUANT_KERNELS)})")
        per_micro_batch = {"cpu", "cached", "cached-cpu"} & {self.decode.offloaded_experts,
                                                             self.prefill.offloaded_experts}
        if per_micro_batch and self.policy.fixed.get("num_micro_batches") != 1:
            # the CPU work / cache misses of the offloaded experts are per micro-batch: the
            # lanes' per-layer offloaded term carries them exactly only for one micro-batch
            raise ValueError(f"offloaded_experts: {sorted(per_micro_batch)[0]} needs policy.fixed.num_micro_batches: 1")
        cached = [p for p in (self.decode, self.prefill) if p.offloaded_experts == "cached"]
        if any(p.weight_path != "pinned" for p in cached):
            raise ValueError("offloaded_experts: cached loads its misses over the pinned path (weight_path: pinned)")
        cpu_misses = "cached-cpu" in (self.decode.offloaded_experts, self.prefill.offloaded_experts)
        if cpu_misses and self.schedule != "sequential":
            # the misses' CPU, link and GPU work is one cost per miss: exact in one serial lane
            raise ValueError("offloaded_experts: cached-cpu needs schedule: sequential")
        if self.prefill.max_tokens_per_pass is not None and self.policy.fixed.get("num_micro_batches") != 1:
            # every pass of a chunked prefill reads the layer's offloaded weights: the lanes'
            # per-layer weight term carries that exactly only for one micro-batch
            raise ValueError("prefill.max_tokens_per_pass needs policy.fixed.num_micro_batches: 1")
        if self.launches is not None and len(self.policy.attention) != 1:
            # the counts are of one attention path (GPU kernels vs CPU ops differ between them)
            raise ValueError("launches: counts are per attention path; give policy.attention one tier")
        refusal = (unmodelled_field(self) or unrunnable_tier(self) or buffer_refusal(self)
                   or flag_refusal(self))
        if refusal:
            raise ValueError(f"{refusal} (schedule {self.schedule})")
        return self

    @property
    def kernel(self) -> Kernel:
        return KERNELS[self.moe_kernel]

    def with_schedule(self, schedule: str) -> "Engine":
        return Engine.model_validate({**self.model_dump(), "schedule": schedule})


#: fields that name, describe or bound the engine's policy space rather than a mechanism
#: of its pipeline (every pipeline honours the policy space through its search)
IDENTITY_FIELDS = ("name", "description", "schedule", "sources", "policy", "flags")
#: fields that bound the memory a pinned policy may use (not a time or a peak of the
#: pipeline: every pipeline honours them through :func:`hrm.cost.memory.physical_limits`)
LIMIT_FIELDS = ("memory.gpu_reserved_gib", "memory.host_reserved_gib")


#: sections that are one mechanism as a whole (switched off together: ideal's value None)
WHOLE_SECTIONS = ("launches",)


def _leaf_fields(model: BaseModel, prefix: str = ""):
    """(dotted name, value) of every leaf field of a pydantic model."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel) and f"{prefix}{name}" not in WHOLE_SECTIONS:
            yield from _leaf_fields(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


@lru_cache(maxsize=1)
def ideal_field_values() -> dict:
    """Every leaf field's default (ideal's) value by dotted name (built without validation, so
    the validator may call it)."""
    return dict(_leaf_fields(Engine.model_construct(name="ideal")))


def unmodelled_field(engine: "Engine") -> str | None:
    """The first field set away from ideal's value that ``engine``'s pipeline does not model
    (:data:`hrm.engines.schedules.PIPELINE_FIELDS`), in words; None when every field is modelled."""
    fields = PIPELINE_FIELDS[SCHEDULES[engine.schedule].pipeline]
    defaults = ideal_field_values()
    for field, value in _leaf_fields(engine):
        if field.split(".")[0] in IDENTITY_FIELDS or field in LIMIT_FIELDS or value == defaults.get(field):
            continue
        refusal = fields.refusal(field, value)
        if refusal:
            return refusal
    return None


def unrunnable_tier(engine: "Engine") -> str | None:
    """A tier the engine's policy space lists for attention or the FFN that its schedule
    cannot run (e.g. Klotski's attention on the CPU), in words; None when all can run. The
    default space (both tiers) is exempt: ``ideal`` with any schedule keeps it, and the
    search narrows it to the schedule's tiers."""
    schedule = SCHEDULES[engine.schedule]
    for part, runnable in (("attention", schedule.attention), ("ffn", schedule.ffn)):
        tiers = getattr(engine.policy, part)
        if tiers == PolicySpace.model_fields[part].default:
            continue
        bad = next((tier for tier in tiers if (tier == "gpu") not in runnable), None)
        if bad is not None:
            return f"policy.{part}: {bad} is a tier the schedule cannot run {part} on"
    return None


def buffer_refusal(engine: "Engine") -> str | None:
    """A schedule that overlaps (prefetches the next layer's weights while this one runs)
    copies streamed experts into the GPU weight buffer: an engine that streams them there
    needs one (``memory.gpu_weight_buffer_layers`` > 0). The serial schedule may read them
    in place from pinned host memory (vLLM's UVA: vllm.yaml), so it needs none."""
    streams = "streamed" in (engine.decode.offloaded_experts, engine.prefill.offloaded_experts)
    prefetches = SCHEDULES[engine.schedule].lanes != "serial"
    if streams and prefetches and engine.memory.gpu_weight_buffer_layers == 0:
        return ("memory.gpu_weight_buffer_layers: 0, but offloaded_experts: streamed prefetches experts into that "
                "buffer (give it a size, or offloaded_experts: cpu)")
    return None


def flag_refusal(engine: "Engine") -> str | None:
    """A flag effect naming a field no engine has (the effects are applied by
    :func:`hrm.engines.mechanisms.flag_engine`, which validates the result)."""
    known = set(ideal_field_values()) | {"schedule"}
    for flag, spec in engine.flags.items():
        for word in ("true", "false"):
            fields = spec.fields(word)
            bad = next((f for f in fields if f not in known and f.split(".")[0] not in WHOLE_SECTIONS), None)
            if bad is not None:
                return f"flags.{flag}.when_{word}: unknown engine field {bad!r}"
    return None


def attention_engine(engine: "Engine", attn_on_gpu: bool) -> "Engine":
    """The engine that runs attention on ``attn_on_gpu``'s tier for ``engine``: itself, or the
    engine its ``policy.attention_engines`` names for that tier."""
    name = engine.policy.attention_engines.get("gpu" if attn_on_gpu else "cpu")
    return load_engine(name) if name is not None else engine


IDEAL = Engine(name="ideal", description="the plain HRM roofline (paper eqs. 1-14) - an upper bound")

#: The engine a plan is made for when the caller names none: the API (``hrm.estimate.estimate``,
#: ``solver.search.search``), every CLI subcommand (``hrm-search``, ``hrm estimate``, ``hrm plot``,
#: a sweep grid's ``engines``) and the web planner resolve a missing engine here, through
#: :func:`default_engine_name` (override: ``engine=`` / ``--engine``). Why moe-lightning: its plan
#: is one a real engine runs (the MoE-Lightning artifact, the paper whose model HRM implements),
#: while ideal is the plain roofline, an upper bound no engine reaches (hrm-search prints it
#: beside the plan as the headroom). ideal stays the default where moe-lightning cannot run: a
#: CPU-only profile (its experts run on the GPU, ``policy.ffn: [gpu]``) and ``--schedule`` (the
#: lane structure of ideal).
DEFAULT_ENGINE = "moe-lightning"


def default_engine_name(hw=None, schedule: str | None = None) -> str:
    """The engine name used when none is given: :data:`DEFAULT_ENGINE`, or ``ideal`` on a
    CPU-only profile ``hw`` or with a ``schedule`` (ideal's lane structure)."""
    cpu_only = hw is not None and getattr(hw, "gpu", None) is None
    return "ideal" if cpu_only or schedule is not None else DEFAULT_ENGINE


def list_engines() -> list[str]:
    """The names of the shipped engines (``hrm/data/engines/*.yaml``), sorted."""
    return sorted(p.stem for p in ENGINES_DIR.glob("*.yaml"))


def load_engine(name_or_path: str | Engine | None) -> Engine:
    """A shipped engine by name, or an engine YAML file (None: :data:`DEFAULT_ENGINE`); HRMError
    (one line) otherwise."""
    if isinstance(name_or_path, Engine):
        return name_or_path
    if name_or_path is None:
        name_or_path = default_engine_name()
    if name_or_path == "ideal":
        return IDEAL
    path = engine_path(str(name_or_path))
    try:
        stat = path.stat()
    except OSError:  # missing or unreadable: read_input_text names it
        return _read_engine(str(path), None)
    return _read_engine(str(path), (stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=64)
def _read_engine(path: str, version: tuple[int, int] | None) -> Engine:
    """The engine file ``path`` parsed and validated, once per ``version`` (its mtime and size):
    a search or a fit reads the same few files thousands of times (a policy space per candidate),
    and an Engine is frozen. A refusal is raised, not cached."""
    return validated(Engine, read_yaml_mapping(path, "an engine YAML file", "engine fields"), path)


def engine_path(text: str) -> Path:
    """The YAML file ``--engine TEXT`` names: an existing file, or anything path-like (a
    folder separator, a .yaml/.yml suffix in any case) as given, even when missing (read_input_text
    then names it); else the shipped engine ``TEXT``; HRMError for an unknown name."""
    path = Path(text)
    path_like = "/" in text or os.sep in text or path.suffix.lower() in (".yaml", ".yml")
    if path_like or path.is_file():
        return path
    refusal = bounds.name_refusal(text, identifier=True)
    shipped = ENGINES_DIR / f"{text}.yaml"
    if refusal is None and shipped.is_file():
        return shipped
    raise HRMError(f"--engine: unknown engine {text!r} (shipped: {', '.join(list_engines())}; or a YAML file)")


def is_shipped(engine: Engine) -> bool:
    """Whether ``engine`` is a shipped engine as shipped (``ideal`` with any schedule): its
    name alone identifies it in a plan."""
    if engine.name == "ideal":
        return engine == IDEAL.with_schedule(engine.schedule)
    return engine.name in list_engines() and load_engine(engine.name) == engine


def resolve_engine(engine: str | Engine | None, schedule: str | None, hw=None) -> Engine:
    """The engine of ``--engine`` with ``--schedule``: the schedule is the lane structure of
    ``ideal``; another engine has its own (a different ``--schedule`` is refused). No engine
    (None): :func:`default_engine_name` for ``hw`` and ``schedule``."""
    eng = load_engine(default_engine_name(hw, schedule) if engine is None else engine)
    if schedule is None or schedule == eng.schedule:
        return eng
    if eng.name == "ideal":
        if schedule not in SCHEDULES:
            raise HRMError(f"--schedule: unknown '{schedule}' (one of {', '.join(SCHEDULES)})")
        return eng.with_schedule(schedule)
    raise HRMError(f"--schedule {schedule}: engine {eng.name} runs its own schedule ({eng.schedule}); "
                   f"--schedule applies to --engine ideal")


def as_engine(engine_or_schedule: "str | Engine | None") -> Engine:
    """An Engine from an Engine, a schedule name (engine ideal with that lane structure) or
    an engine name/file (API convenience for callers that held a schedule name)."""
    if isinstance(engine_or_schedule, Engine):
        return engine_or_schedule
    if engine_or_schedule in SCHEDULES:
        return IDEAL.with_schedule(engine_or_schedule)
    return load_engine(engine_or_schedule)
