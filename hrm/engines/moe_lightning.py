"""The MoE-Lightning artifact server's own policy optimizer, modelled in our words.

The artifact's server does not take a policy: at launch each rank builds hardware constants
from the GPU's name (:func:`recognised_hardware`) and calls its optimizer, then runs the
policy that comes back. Everything below is read from caoshiyi/artifacts@6bc86009 (branch
``asplos25``, :data:`ARTIFACT`), paths under ``fastmoe/``; the table of facts with their
lines is docs/engines/moe_lightning.md.

What runs at launch (``serve/router/model_rpc.py:75-79,91``; ``backend/execution_engine.py:
476-488``): the optimizer searches the decode stage with the server's ``--avg-prompt-len``
(s) and ``--gen-len`` (n), no batch given. The policy it returns sets the micro-batch size
(``ubs``), the micro-batch count (``n_ub``) and the experts kept on the GPU: ``int(E x wg)``
whole experts of every layer (``execution_engine.py:513``). Attention always runs on the
CPU over a KV cache in CPU memory (``backend/optimizer.py:17,77-82``: ``gattn = 0``).

The optimizer, in our words (``backend/optimizer.py``):

* For a micro-batch size g and a batch b = g x k it solves a linear program whose only
  free placement is wg, the share of the expert weights kept on the GPU. It minimises the
  decode time of one layer, T = max(link, GPU, CPU):
  link = (1 - wg) x W_E / B_link (:91-92; W_E: one layer's experts in fp16, :73);
  GPU = k x max(MoE FLOPs / F_g, MoE bytes / B_g) (:99-108; no GPU attention, :113-115);
  CPU = k x max(attention FLOPs / F_c, attention bytes / B_c) over a context of s + n
  tokens (:121-127). Subject to a GPU peak at most 0.86 x M_g (:141-158) and a CPU peak at
  most 0.8 x M_c (:160-168), both affine in wg. One free variable: the program is an
  interval in wg, solved here in closed form (:func:`solve_candidate`).
* Its throughput is b x n / (T x (n - 1) x L) (:183-185).
* The search (:256-293, :227-253): g = 1, 2, 3, 4, then +32 (36, 68, ...); for each g the
  largest feasible k (doubling, then bisection), then k = 1, 2, ... up to it, stopping at
  the first k whose throughput falls below the previous one; the best over every g and k,
  a tie going to the later candidate; the search ends at the first g for which k = 1 does
  not fit.

Hardware constants (``backend/utils.py:22-61``): a GPU whose name contains ``L4`` or ``T4``
gets that card's constants with the host's available memory (psutil, GiB) and
``--cpu-mem-bdw``; any other GPU gets the class defaults (``HardwareConfig.init`` returns
the class, not an instance, :60-61): a 24 GiB GPU, 192 GiB of CPU memory, 100 GiB/s of CPU
bandwidth and tp 1, whatever the machine and ``--tp-size``. GPU memory, bandwidth and
FLOP/s are multiplied by tp (:102,105,107); the link and the CPU are not.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from ..errors import HRMError
from ..policy import Policy
from ..units import GIB, TFLOPS

ARTIFACT = "caoshiyi/artifacts@6bc86009 (branch asplos25)"

#: the optimizer's planning caps: GPU peak <= 0.86 x GPU memory, CPU peak <= 0.8 x CPU memory
#: (backend/optimizer.py:158,168)
GPU_MEMORY_CAP = 0.86
CPU_MEMORY_CAP = 0.8
#: slack on the fused-MoE kernel's intermediate buffers (backend/optimizer.py:155)
MOE_BUFFER_SLACK = 1.2
#: micro-batch sizes tried: 1, 2, 3, 4 one by one, then steps of 32 (backend/optimizer.py:285-288)
FINE_MICRO_BATCH_LIMIT = 4
MICRO_BATCH_STEP = 32
#: bytes per element the optimizer counts everything in (fp16; its dtype_size default "f16",
#: backend/utils.py:131; the factors 2 in :147-149 and optimizer.py:72-73)
FP16_BYTES = 2
#: the model classes the server has (fastmoe/models/*.py EntryClass, looked up with "Off"
#: appended: backend/model_runner.py:30-44)
MODEL_CLASSES = {"mixtral": "MixtralForCausalLM", "dbrx": "DbrxForCausalLM"}


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerHardware(Frozen):
    """The hardware constants the optimizer plans with, per GPU before the tp scaling
    (backend/utils.py:22-61). GiB = 2^30 bytes, TFLOP/s = 1e12 FLOP/s (utils.py:7-8)."""

    label: str
    gpu_gib: float
    cpu_gib: float
    link_gib_s: float
    gpu_bandwidth_gib_s: float
    cpu_bandwidth_gib_s: float
    gpu_tflops: float
    cpu_tflops: float
    tp_size: int = 1


#: the cards the server recognises by a substring of the GPU's name, checked in this order
#: (backend/utils.py:38-59); CPU memory and bandwidth come from the host and --cpu-mem-bdw
RECOGNISED_GPUS = {
    "L4": {"gpu_gib": 24, "link_gib_s": 16, "gpu_bandwidth_gib_s": 285, "gpu_tflops": 104, "cpu_tflops": 1.6},
    "T4": {"gpu_gib": 15, "link_gib_s": 16, "gpu_bandwidth_gib_s": 300, "gpu_tflops": 65, "cpu_tflops": 0.8},
}
#: any other GPU: the class defaults, tp 1 whatever --tp-size (backend/utils.py:22-34,60-61)
FALLBACK_HARDWARE = ServerHardware(label="unrecognised GPU: the artifact's defaults", gpu_gib=24, cpu_gib=192,
                                   link_gib_s=16, gpu_bandwidth_gib_s=300, cpu_bandwidth_gib_s=100, gpu_tflops=104,
                                   cpu_tflops=13, tp_size=1)


class ServerModel(Frozen):
    """The model constants the optimizer reads from config.json (utils/model_config.py:24-35,
    backend/utils.py:90-100): layers L, hidden h, expert width I, heads, KV heads, experts E,
    top-k."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    experts: int
    top_k: int

    @property
    def kv_width(self) -> int:
        """Width of one token's K (or V) across the KV heads: h // (heads // KV heads)
        (optimizer.py:70-71, integer divisions)."""
        return self.hidden // (self.heads // self.kv_heads)

    @property
    def expert_layer_bytes(self) -> int:
        """W_E: one layer's experts, three matrices h x I each, in fp16 (optimizer.py:73)."""
        return FP16_BYTES * 3 * self.hidden * self.intermediate * self.experts

    @property
    def other_weight_bytes(self) -> int:
        """Attention projections of every layer in fp16 (optimizer.py:72): q and o are h x h,
        k and v h x h/group; embeddings, router and norms are not counted."""
        group = self.heads // self.kv_heads
        return (2 * FP16_BYTES * self.hidden ** 2 + 2 * FP16_BYTES * self.hidden ** 2 // group) * self.layers


class ServerFlags(Frozen):
    """The launch flags the optimizer reads (serve/server_args.py:107-142) and the host's
    available memory. None: the workload's lengths, the profile's CPU memory."""

    avg_prompt_len: Optional[int] = None
    gen_len: Optional[int] = None
    cpu_mem_bdw_gib_s: Optional[float] = None
    tp_size: int = 1
    #: psutil's available memory at launch, before the weights load (backend/model_runner.py:84,
    #: utils/utils.py:40-41); None: the profile's CPU memory, an upper bound
    available_cpu_gib: Optional[float] = None


class Candidate(Frozen):
    """One (micro-batch size, count) and the optimizer's answer for it."""

    micro_batch: int
    micro_batches: int
    #: the optimal wg: every value in [wg_low, wg_high] gives the least T (one value when the
    #: link binds); the server runs int(E x wg) experts per layer on the GPU
    wg_low: float
    wg_high: float
    layer_time_s: float
    throughput_tok_s: float

    @property
    def batch(self) -> int:
        return self.micro_batch * self.micro_batches


class ServerChoice(Frozen):
    """What the server will run: its hardware reading, the optimizer's pick, and the policy."""

    hardware: ServerHardware
    #: the modelled pick: the first of the tied candidates
    candidate: Candidate
    #: every candidate of the highest throughput (several: the solver's rounding picks)
    tied: tuple[Candidate, ...]
    gpu_experts_per_layer: int
    #: the counts of GPU experts the LP's optimal wg allow (several: the solver's pick decides)
    gpu_experts_possible: tuple[int, ...]
    policy: Policy
    notes: tuple[str, ...] = ()


def artifact_model_class(model) -> str:
    """The server's model class for ``model``, or a one-line HRMError: the artifact has a
    Mixtral and a DBRX class only (models/mixtral-offload.py:469, models/dbrx-offload.py:509),
    plain MoE layers in every block, an even layer count (execution_engine.py:414)."""
    name = str(getattr(model, "name", "")).lower()
    family = next((key for key in MODEL_CLASSES if key in name), None)
    plain = (not getattr(model, "is_mla", False) and not getattr(model, "shared_intermediate_size", 0)
             and not getattr(model, "first_dense_layers", 0) and int(getattr(model, "num_experts", 1)) > 1)
    if family is None or not plain:
        raise HRMError(f"moe-lightning: the artifact serves Mixtral and DBRX only (fastmoe/models/; "
                       f"backend/model_runner.py:40-44 refuses other architectures), not model {model.name}")
    if int(model.num_layers) % 2:
        raise HRMError(f"moe-lightning: model {model.name} has {model.num_layers} layers; the server needs an even "
                       "count (backend/execution_engine.py:414)")
    return MODEL_CLASSES[family]


def server_model(model) -> ServerModel:
    """The optimizer's model constants of an HRM :class:`~hrm.model.spec.ModelSpec`."""
    artifact_model_class(model)
    return ServerModel(layers=model.num_layers, hidden=model.hidden_size, intermediate=model.expert_intermediate_size,
                       heads=model.num_heads, kv_heads=model.num_kv_heads, experts=model.num_experts,
                       top_k=model.top_k)


def recognised_hardware(gpu_name: str, available_cpu_gib: float, cpu_mem_bdw_gib_s: Optional[float],
                        tp_size: int) -> ServerHardware:
    """The constants the server builds from the GPU's name (backend/utils.py:36-61). On an L4
    or T4 ``--cpu-mem-bdw`` is required: the server multiplies it by 2^30 (utils.py:44,55),
    and None fails at launch."""
    for key, constants in RECOGNISED_GPUS.items():
        if key in gpu_name:
            if cpu_mem_bdw_gib_s is None:
                raise HRMError(f"moe-lightning: --cpu-mem-bdw is required on a GPU named {gpu_name!r} "
                               "(fastmoe/backend/utils.py:44,55 multiply it by 2^30 at launch)")
            return ServerHardware(label=key, cpu_gib=available_cpu_gib, cpu_bandwidth_gib_s=cpu_mem_bdw_gib_s,
                                  tp_size=tp_size, **constants)
    return FALLBACK_HARDWARE


def optimizer_constants(hw: ServerHardware) -> dict[str, float]:
    """The server's hardware constants in SI as its optimizer uses them (the ``hw`` of
    :func:`largest_feasible_count`, :func:`best_candidates`): GPU memory, bandwidth and FLOP/s
    times tp (backend/utils.py:102,105,107); the link and the CPU as they are."""
    tp = hw.tp_size
    return {"gpu_bytes": hw.gpu_gib * GIB * tp, "cpu_bytes": hw.cpu_gib * GIB, "link": hw.link_gib_s * GIB,
            "gpu_bw": hw.gpu_bandwidth_gib_s * GIB * tp, "cpu_bw": hw.cpu_bandwidth_gib_s * GIB,
            "gpu_flops": hw.gpu_tflops * TFLOPS * tp, "cpu_flops": hw.cpu_tflops * TFLOPS, "tp": tp}


def gpu_peak_bytes(m: ServerModel, hw: dict, s: int, n: int, g: int, b: int) -> tuple[float, float]:
    """The GPU peak as (bytes at wg = 0, bytes per unit of wg) (optimizer.py:141-158): the
    attention weights, wg of every layer's experts, the larger of the decode state (hidden
    and residual of the batch) and the prefill state (hidden states of the batch, two of a
    micro-batch, a micro-batch's KV), the paged expert buffer (2 x (1 - wg) x W_E) and the
    fused-MoE kernel's intermediates."""
    tp, h, w_e = hw["tp"], m.hidden, m.expert_layer_bytes
    decode_state = 2 * FP16_BYTES * h * b * tp
    prefill_state = tp * (2 * FP16_BYTES * h * g * s + FP16_BYTES * h * b * s) + 2 * 2 * FP16_BYTES * s * m.kv_width * g
    kernel = FP16_BYTES * (g * m.top_k * h * tp * s + g * m.top_k * 3 * m.intermediate * s) * MOE_BUFFER_SLACK
    at_zero = m.other_weight_bytes + max(decode_state, prefill_state) + 2 * w_e + kernel
    return at_zero, m.layers * w_e - 2 * w_e


def cpu_peak_bytes(m: ServerModel, hw: dict, s: int, n: int, b: int) -> tuple[float, float]:
    """The CPU peak as (bytes at wg = 0, bytes per unit of wg) (optimizer.py:160-168): the
    experts not on the GPU, every layer's KV cache of s + n tokens, the batch's prompt hidden
    states, and the pinned expert staging (2 x (1 - wg) x W_E)."""
    w_e = m.expert_layer_bytes
    kv = 2 * FP16_BYTES * (s + n) * m.kv_width * b * m.layers
    hidden = FP16_BYTES * m.hidden * b * s * hw["tp"]
    return (m.layers + 2) * w_e + kv + hidden, -(m.layers + 2) * w_e


def _wg_interval(limits: list[tuple[float, float, float]]) -> Optional[tuple[float, float]]:
    """The wg in [0, 1] with at_zero + slope x wg <= cap for every (at_zero, slope, cap)."""
    low, high = 0.0, 1.0
    for at_zero, slope, cap in limits:
        room = cap - at_zero
        if slope > 0:
            high = min(high, room / slope)
        elif slope < 0:
            low = max(low, room / slope)
        elif room < 0:
            return None
    return (low, high) if low <= high else None


def compute_times_s(m: ServerModel, hw: dict, s: int, n: int, g: int, k: int) -> tuple[float, float]:
    """(GPU, CPU) time of one decode layer for k micro-batches of g (optimizer.py:99-127 with
    backend/utils.py:124-150): the MoE on the GPU, the larger of its FLOPs (2·g·h·I·3 per
    expert used) and its bytes (input, output and every expert); attention on the CPU over
    s + n cached tokens, the larger of its FLOPs and its bytes (query, K, V, output)."""
    h, inter, head_dim = m.hidden, m.intermediate, m.hidden / m.heads
    moe_flops = 2 * g * h * inter * 3 * m.top_k
    moe_bytes = FP16_BYTES * (g * h + g * inter + 3 * h * inter * m.experts)
    context = s + n
    attn_flops = 2 * g * context * m.heads * head_dim + 2 * g * context * m.heads
    attn_bytes = FP16_BYTES * (2 * g * m.heads * head_dim + 2 * g * context * m.kv_heads * head_dim)
    gpu_s = k * max(moe_flops / hw["gpu_flops"], moe_bytes / hw["gpu_bw"])
    cpu_s = k * max(attn_flops / hw["cpu_flops"], attn_bytes / hw["cpu_bw"])
    return gpu_s, cpu_s


def solve_candidate(m: ServerModel, hw: dict, s: int, n: int, g: int, k: int) -> Optional[Candidate]:
    """The linear program of one (g, k), in closed form; None when no wg fits memory."""
    b = g * k
    gpu = gpu_peak_bytes(m, hw, s, n, g, b)
    cpu = cpu_peak_bytes(m, hw, s, n, b)
    interval = _wg_interval([(*gpu, GPU_MEMORY_CAP * hw["gpu_bytes"]), (*cpu, CPU_MEMORY_CAP * hw["cpu_bytes"])])
    if interval is None:
        return None
    low, high = interval
    gpu_s, cpu_s = compute_times_s(m, hw, s, n, g, k)
    link_s_per_wc = m.expert_layer_bytes / hw["link"]
    layer_s = max(link_s_per_wc * (1 - high), gpu_s, cpu_s)
    # every wg whose link time stays within the least T is optimal too
    wg_low = max(low, 1 - layer_s / link_s_per_wc) if link_s_per_wc > 0 else low
    throughput = b * n / (layer_s * (n - 1) * m.layers)
    return Candidate(micro_batch=g, micro_batches=k, wg_low=min(wg_low, high), wg_high=high, layer_time_s=layer_s,
                     throughput_tok_s=throughput)


def largest_feasible_count(m: ServerModel, hw: dict, s: int, n: int, g: int) -> int:
    """The most micro-batches of g that fit (0: not even one): memory grows with the batch,
    so feasibility is monotone; doubling then bisection (optimizer.py:227-246)."""
    if solve_candidate(m, hw, s, n, g, 1) is None:
        return 0
    fits = 1
    while solve_candidate(m, hw, s, n, g, 2 * fits) is not None:
        fits *= 2
    misses = 2 * fits
    while misses - fits > 1:
        mid = (fits + misses) // 2
        fits, misses = (mid, misses) if solve_candidate(m, hw, s, n, g, mid) is not None else (fits, mid)
    return fits


def micro_batch_sizes():
    """1, 2, 3, 4, then 36, 68, ... (optimizer.py:285-288)."""
    g = 1
    while True:
        yield g
        g = g + 1 if g < FINE_MICRO_BATCH_LIMIT else g + MICRO_BATCH_STEP


#: throughputs this close (relative) are one value to the artifact: its linear program is
#: solved by CBC to about 1e-8 (measured: the artifact's own throughputs differ from ours by
#: under 1e-8 relative), so among equal candidates the solver's rounding picks
TIE_TOLERANCE = 1e-7


def _tied(a: float, b: float) -> bool:
    return abs(a - b) <= TIE_TOLERANCE * max(abs(a), abs(b))


def visited_candidates(m: ServerModel, hw: dict, s: int, n: int) -> list[Candidate]:
    """Every candidate the search evaluates, in its order (optimizer.py:256-289): for each
    micro-batch size g the counts k = 1, 2, ... up to the largest that fits, stopping after
    the first k whose throughput falls below the previous one (that one is not a pick)."""
    out: list[Candidate] = []
    for g in micro_batch_sizes():
        most = largest_feasible_count(m, hw, s, n, g)
        if most == 0:
            return out
        previous = 0.0
        for k in range(1, most + 1):
            cand = solve_candidate(m, hw, s, n, g, k)
            if cand.throughput_tok_s < previous and not _tied(cand.throughput_tok_s, previous):
                break
            previous = cand.throughput_tok_s
            out.append(cand)


def best_candidates(m: ServerModel, hw: dict, s: int, n: int) -> list[Candidate]:
    """The candidates of the highest throughput, in search order (empty: one sequence does
    not fit). The artifact keeps the later of two equal ones (optimizer.py:249-253), but
    equal here means equal up to its solver's rounding: when the time is the GPU's or the
    CPU's (T grows with k), every k from where that starts has one throughput, and which one
    the server runs is the solver's rounding (the first, most often)."""
    visited = visited_candidates(m, hw, s, n)
    if not visited:
        return []
    top = max(c.throughput_tok_s for c in visited)
    return [c for c in visited if _tied(c.throughput_tok_s, top)]


def optimizer_inputs(hw, workload, flags: ServerFlags) -> tuple[int, int, ServerHardware]:
    """What the server's optimizer starts from on the machine ``hw`` launched with ``flags``:
    (s, n, hardware): the prompt length s (``--avg-prompt-len``, else the workload's), the
    generation length n (``--gen-len``, else the workload's) and the hardware constants it
    builds from the GPU's name (:func:`recognised_hardware`). One-line HRMError where the
    server would not start (n < 2, no GPU)."""
    s = flags.avg_prompt_len if flags.avg_prompt_len is not None else int(workload.prompt_len)
    n = flags.gen_len if flags.gen_len is not None else int(workload.gen_len)
    if n < 2:
        raise HRMError(f"moe-lightning: --gen-len {n}: the optimizer divides by gen_len - 1 "
                       "(fastmoe/backend/optimizer.py:184-185); give at least 2")
    if hw is None or getattr(hw, "gpu", None) is None:
        raise HRMError("moe-lightning: the server picks its policy from the GPU it finds at launch; "
                       "give a hardware profile with a GPU")
    cpu_gib = flags.available_cpu_gib if flags.available_cpu_gib is not None else float(hw.cpu.memory_gib)
    return s, n, recognised_hardware(hw.gpu.name, cpu_gib, flags.cpu_mem_bdw_gib_s, flags.tp_size)


def server_choice(hw, model, workload, flags: ServerFlags = ServerFlags(),
                  hardware: Optional[ServerHardware] = None) -> ServerChoice:
    """The policy the artifact's server will choose on ``hw`` for ``flags`` (``hardware``
    overrides the constants it would build from the GPU's name). One-line HRMError when the
    server would not start or finds no policy."""
    m = server_model(model)
    s, n, recognised = optimizer_inputs(hw, workload, flags)
    server_hw = hardware or recognised
    tied = best_candidates(m, optimizer_constants(server_hw), s, n)
    if not tied:
        raise HRMError(f"moe-lightning: the server's optimizer finds no policy for {model.name} with "
                       f"--avg-prompt-len {s} --gen-len {n} on its reading of the GPU ({server_hw.label}); "
                       "it fails at launch (fastmoe/backend/execution_engine.py:495)")
    best, experts = tied[0], m.experts
    # execution_engine.py:513: int(num_local_experts * wg), the solver's wg as it comes. Where
    # several wg are optimal CBC returned the vertex where the link time equals T (the least
    # wg) in every case we ran (docs/engines/moe_lightning.md, the optimizer check)
    chosen = int(experts * best.wg_low + WHOLE_COUNT_TOLERANCE)
    possible = tuple(sorted({e for c in tied for e in range(int(experts * c.wg_low), int(experts * c.wg_high) + 1)}))
    policy = Policy(batch_size=best.batch, micro_batch_size=best.micro_batch, num_micro_batches=best.micro_batches,
                    attn_on_gpu=False, ffn_on_gpu=True, weights_gpu_ratio=chosen / experts, kv_gpu_ratio=0.0)
    return ServerChoice(hardware=server_hw, candidate=best, tied=tuple(tied), gpu_experts_per_layer=chosen,
                        gpu_experts_possible=possible, policy=policy, notes=_notes(server_hw, tied, possible, experts))


#: how close wg x E may come to a whole count before the solver's own rounding decides int()
WHOLE_COUNT_TOLERANCE = 1e-6


def _notes(server_hw: ServerHardware, tied: list[Candidate], possible: tuple[int, ...],
           experts: int) -> tuple[str, ...]:
    """What the user should know about the pick: the GPU not recognised, several optima."""
    notes = []
    if server_hw is FALLBACK_HARDWARE:
        notes.append("moe-lightning: the server does not recognise this GPU (only names containing L4 or T4, "
                     "fastmoe/backend/utils.py:38-61) and plans for a 24 GiB GPU, 192 GiB of CPU memory, "
                     "100 GiB/s and tp 1")
    if len(tied) > 1:
        first, last = tied[0], tied[-1]
        notes.append(f"moe-lightning: {len(tied)} batches tie in the optimizer's throughput (ubs {first.micro_batch}, "
                     f"n_ub {first.micro_batches} to {last.micro_batches}): its solver's rounding picks one, "
                     "most often the first")
    whole = experts * tied[0].wg_low
    if len(possible) > 1:
        notes.append(f"moe-lightning: several wg are optimal: {possible[0]} to {possible[-1]} GPU experts of "
                     f"{experts} per layer, whichever the CBC solver returns")
    elif round(whole) > 0 and abs(whole - round(whole)) < WHOLE_COUNT_TOLERANCE:
        notes.append(f"moe-lightning: wg x E = {whole:.7f} is at a whole count; the solver's rounding decides "
                     "the GPU experts per layer (int(), fastmoe/backend/execution_engine.py:513)")
    return tuple(notes)


def server_policy(hw, model, workload, flags: ServerFlags = ServerFlags()) -> Policy:
    """The policy the artifact's server will run (see :func:`server_choice`)."""
    return server_choice(hw, model, workload, flags).policy
