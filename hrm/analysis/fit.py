"""``hrm fit``: the fastest llama.cpp command for a machine, a model and a context length, for
one user (batch 1) or N parallel users, searched over the command's own knobs with the existing
estimators (no second model):

- a machine with a GPU (a profile, or parts composed by :mod:`hrm.machine.parts`) and a model spec:
  every ``--n-cpu-moe`` (0 .. the MoE layers), the KV cache on the GPU or in host memory
  (``-nkvo``), ``-ub`` (the prefill's pass: the engine's ``prefill.max_tokens_per_pass``, each
  pass reads the layers' weights again, from GPU memory and the CPU layers' experts over PCIe)
  and, where the profile measured llama.cpp's CPU kernels,
  ``-t``; each candidate estimated by :func:`hrm.estimate.estimate` under the shipped
  ``llama.cpp`` / ``llama.cpp-nkvo`` engines, within the machine's physical memory less the
  engine's reserve (:func:`hrm.cost.memory.physical_limits`);
- a CPU-only machine whose profile has a ``ggml_cpu`` section, and a GGUF (its tensors):
  ``-t`` (decode steps), ``-tb`` and ``-ub`` (prefill), each candidate predicted by the CPU step
  model :func:`hrm.cost.ggml_cpu.run_times`.

The best is the one that finishes the users' requests first (prefill + decode of ``gen``
tokens), or by ``objective`` the fastest decode or prefill. llama.cpp's defaults are among the
candidates, so the answer also says what it gains over them. The same answer is then given for
ollama (:mod:`hrm.analysis.fit_ollama`), vLLM and SGLang + kTransformers
(:mod:`hrm.analysis.fit_vllm`, :mod:`hrm.analysis.fit_sglang`): each engine's best command in its
own policy space, or one line saying why it cannot run the model there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

from ..errors import HRMError
from ..units import GIB

Objective = Literal["latency", "decode", "prefill"]
OBJECTIVES = ("latency", "decode", "prefill")
#: -ub values searched: powers of two from llama.cpp's ubatch floor for its BLAS path
#: (common/common.h:454 "must be >=32 to use BLAS") to the logical batch's default 2048 and
#: one step above; the default 512 (common/common.h:454) is always among them
UBATCHES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_UBATCH, DEFAULT_BATCH = 512, 2048
#: llama.cpp's default -t on Linux: one thread per physical core (common/common.cpp:77-103 at
#: ggml-org/llama.cpp@0c1e5709 counts distinct thread_siblings; a profile's cpu.cores are the
#: usable CPUs, the physical cores of a catalog part); the halving fallback of :144-145
#: (hrm.machine.rates.default_llama_threads) is for hosts where that count fails
def linux_default_threads(hw) -> int:
    return int(hw.cpu.cores)


#: the KV cache element type llama.cpp uses unless -ctk/-ctv say otherwise (common/common.h
#: cache_type_k/v = F16); the only one the estimators price (hrm.cost.ggml_cpu.KV_ELEMENT_TYPE)
KV_TYPE = "f16"
RUNNERS_UP = 5


@dataclass(frozen=True)
class Candidate:
    """One command: its flags (in order), predicted rates and memory per device."""

    flags: tuple[tuple[str, str], ...]
    prefill_tok_s: float
    decode_tok_s: float
    total_s: float
    memory_bytes: dict = field(default_factory=dict)
    fits: bool = True
    knobs: dict = field(default_factory=dict)
    bottleneck: str = ""

    def args(self) -> str:
        return " ".join(f"{k} {v}".strip() for k, v in self.flags)

    def command(self, program: str = "llama-server", model_path: str = "MODEL.gguf") -> str:
        return f"{program} -m {model_path} {self.args()}"


@dataclass(frozen=True)
class FitResult:
    best: Candidate
    runners_up: tuple[Candidate, ...]
    default: Optional[Candidate]
    why: tuple[str, ...]
    notes: tuple[str, ...]
    searched: int
    infeasible: int
    objective: str
    users: int
    context_tokens: int
    gen_tokens: int
    path: str
    #: the answer's ollama form (hrm.analysis.fit_ollama.OllamaAnswer; machines with a GPU)
    ollama: Optional[object] = None
    #: vLLM's and SGLang's answers (hrm.analysis.fit_server.ServerAnswer: a command, or why not)
    servers: tuple = ()

    def to_json(self) -> dict:
        def c(x: Candidate | None):
            if x is None:
                return None
            return {"args": x.args(), "prefill_tok_s": x.prefill_tok_s, "decode_tok_s": x.decode_tok_s,
                    "total_s": x.total_s, "memory_bytes": x.memory_bytes, "knobs": x.knobs, "bottleneck": x.bottleneck}
        return {"best": c(self.best), "runners_up": [c(x) for x in self.runners_up], "llama_cpp_defaults": c(self.default),
                "why": list(self.why), "notes": list(self.notes), "searched": self.searched,
                "infeasible": self.infeasible, "objective": self.objective, "users": self.users,
                "context_tokens": self.context_tokens, "gen_tokens": self.gen_tokens, "path": self.path,
                "ollama": self.ollama.to_json() if self.ollama is not None else None,
                "servers": [answer.to_json() for answer in self.servers]}


def _score(c: Candidate, objective: str) -> float:
    """Smaller is better."""
    if objective == "decode":
        return -c.decode_tok_s
    if objective == "prefill":
        return -c.prefill_tok_s
    return c.total_s


def _check(context: int, gen: int, users: int, objective: str) -> int:
    if objective not in OBJECTIVES:
        raise HRMError(f"--objective {objective}: one of {', '.join(OBJECTIVES)}")
    if users < 1 or users > 256:
        raise HRMError(f"--users {users}: 1 to 256 (llama.cpp's n_seq_max limit, src/llama-cparams.h:7)")
    if gen < 1 or context <= gen:
        raise HRMError(f"--context {context} --gen {gen}: the context must hold the prompt and the {gen} generated "
                       "tokens (context > gen >= 1)")
    return context - gen


def useful_ubatches(ubatches: tuple[int, ...], tokens: int) -> list[int]:
    """The -ub values that differ for a prefill of ``tokens``: those below it, and the smallest
    at or above it (any larger one runs the same single pass), and the default 512 (llama.cpp's
    own choice is always a candidate)."""
    out = {u for u in ubatches if u < tokens}
    above = [u for u in ubatches if u >= tokens]
    out |= {min(above)} if above else set()
    out |= {DEFAULT_UBATCH} & set(ubatches)
    return sorted(out)


#: significant digits at which two candidates' scores are the same prediction (below them: float noise)
SAME_SCORE_DIGITS = 9


def _same_score(c: Candidate, objective: str) -> float:
    """The score to :data:`SAME_SCORE_DIGITS` digits: equal for commands the estimate does not tell apart."""
    return float(f"{_score(c, objective):.{SAME_SCORE_DIGITS}g}")


def _from_default(c: Candidate, default_threads: int | None) -> tuple:
    """How far a command is from llama.cpp's own defaults, for ties: -t and -tb from the default
    threads, -ub from 512 (in powers of two), then each non-default switch (KV in host memory,
    -kvu, -nr), then its memory. A knob the estimate does not price is no reason to change it."""
    k = c.knobs
    threads = sum(abs(k[key] - default_threads) for key in ("threads", "threads_batch")
                  if k.get(key) is not None and default_threads is not None)
    ub = abs(math.log2(k["ubatch"] / DEFAULT_UBATCH)) if k.get("ubatch") else 0.0
    switches = (k.get("kv") == "host") + bool(k.get("kv_unified")) + (k.get("repack") is False)
    return threads, ub, switches, sum(c.memory_bytes.values())


def _ranked(cands: list[Candidate], objective: str, default_threads: int | None = None) -> list[Candidate]:
    """Fitting candidates, best first; among commands predicted the same, the one nearest
    llama.cpp's defaults (:func:`_from_default`), then by flags."""
    return sorted((c for c in cands if c.fits),
                  key=lambda c: (_same_score(c, objective), _from_default(c, default_threads), c.args()))


def _prediction(c: Candidate) -> tuple[str, str, str]:
    """A command's rates as printed: two commands with the same are one answer to the user."""
    return f"{c.prefill_tok_s:,.1f}", f"{c.decode_tok_s:,.2f}", f"{c.total_s:.2f}"


def differing_flags(a: Candidate, b: Candidate) -> list[tuple[str, str]]:
    """``b``'s flags that ``a`` lacks or sets otherwise, as (flag, value)."""
    mine = dict(a.flags)
    return [(k, v) for k, v in b.flags if k not in mine or mine[k] != v]


def tied_flags(best: Candidate, ties: list[Candidate]) -> str:
    """The other values of each flag among commands predicted the same as ``best``
    (``-ub 128/256/1024, -t 2/4/8, -nkvo``), in the best's flag order."""
    values: dict[str, list[str]] = {}
    for c in ties:
        for k, v in differing_flags(best, c):
            if v not in values.setdefault(k, []):
                values[k].append(v)

    def order(v: str):
        return (0, int(v)) if v.isdigit() else (1, v)
    return ", ".join(f"{k} {'/'.join(sorted(vs, key=order))}".strip() for k, vs in values.items())


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old > 0 else "n/a"


def _result(cands: list[Candidate], default: Candidate | None, objective: str, users: int, context: int, gen: int,
            path: str, why_of, notes: list[str]) -> FitResult:
    ranked = _ranked(cands, objective, default.knobs.get("threads") if default is not None else None)
    if not ranked:
        from ..errors import InfeasibleError

        raise InfeasibleError(f"hrm fit: none of the {len(cands)} llama.cpp commands searched fits this machine's "
                              f"memory at context {context} for {users} user(s); lower --context or pick more memory")
    best = ranked[0]
    # runners-up: the next commands with a prediction of their own; one that prints the same rates
    # as the best or a listed one is another spelling of that answer (the best's are named in why)
    shown, runners, ties = {_prediction(best)}, [], []
    for c in ranked[1:]:
        p = _prediction(c)
        if p == _prediction(best):
            ties.append(c)
        elif p not in shown and len(runners) < RUNNERS_UP:
            shown.add(p)
            runners.append(c)
    why = why_of(best, ranked, default)
    if ties:
        why = [*why, f"the same prediction with {tied_flags(best, ties)}: the estimate does not tell these apart, so "
                     "the command nearest llama.cpp's defaults is printed"]
    return FitResult(best, tuple(runners), default, tuple(why), tuple(notes), len(cands),
                     sum(not c.fits for c in cands), objective, users, context, gen, path)


# --- a machine with a GPU: the lanes estimate under HRM's llama.cpp engines ------------------

def _gpu_threads(hw, threads: tuple[int, ...] | None) -> tuple[tuple[int, ...], int, list[str]]:
    """(the -t values searched, llama.cpp's default -t, notes): the given ones, else the thread
    counts of the profile's measured ggml kernels up to its cores, else the default alone."""
    measured = sorted({k.threads for k in hw.ggml_cpu.kernels}) if hw.ggml_cpu is not None else []
    default_t = (hw.ggml_cpu.default_threads if hw.ggml_cpu is not None and hw.ggml_cpu.default_threads
                 else linux_default_threads(hw))
    if threads is None:
        # without measured ggml kernels the CPU roofline has no thread count: llama.cpp's default
        threads = tuple(t for t in measured if t <= hw.cpu.cores) or (default_t,)
    notes = []
    if hw.ggml_cpu is not None and hw.ggml_cpu.prior:
        notes.append(f"-t {', '.join(map(str, threads))} searched on a prior of llama.cpp's CPU expert kernels (this "
                     "project's measured cycles per weight per ggml type, scaled to these cores' SIMD width and boost "
                     "clock: hrm.machine.ggml_prior); hrm profile --llama-cpp DIR on the machine measures them")
    if not measured:
        notes.append(f"-t {default_t}: llama.cpp's default on {hw.cpu.cores} physical cores (common/common.cpp:77-103); this "
                     "profile has no measured ggml kernels (hrm profile --llama-cpp), so the CPU layers run at its "
                     "DRAM rate whatever -t is, and -t is not searched")
    return threads, default_t, notes


def _gpu_flags(model, users: int, context: int, knobs: dict) -> tuple[tuple[str, str], ...]:
    """The llama-server flags of one GPU candidate (``knobs``: n_cpu_moe, kv, ubatch, threads)."""
    ub = knobs["ubatch"]
    flags = [("-ngl", str(int(model.num_layers) + 1)), ("--n-cpu-moe", str(knobs["n_cpu_moe"])),
             ("-c", str(users * context)), ("-np", str(users)), ("-b", str(max(DEFAULT_BATCH, ub))),
             ("-ub", str(ub)), ("-t", str(knobs["threads"])), ("-fa", "on"), ("-ctk", KV_TYPE), ("-ctv", KV_TYPE)]
    # a KV stream per user, never -kvu (a shared stream's masked compute is not priced on the GPU);
    # the llama.cpp engines count each stream's padding to 256 (memory.kv_tokens_multiple)
    if knobs["kv"] == "host":
        flags.append(("-nkvo", ""))
    flags.append(("--fit", "off"))
    return tuple(flags)


def _gpu_candidate(hw, model, workload, policy, engine, prefill_tokens: int, flags, knobs: dict) -> Candidate:
    """One command estimated under ``engine`` within the machine's physical memory less its reserve."""
    from ..cost.memory import physical_limits
    from ..estimate import estimate
    from ..model.options import DEFAULT_OPTIONS

    from ..export.llama_cpp import fit_margins_bytes, fit_target_limits

    limits = physical_limits(hw, engine)
    r = estimate(hw, model, workload, policy, options=DEFAULT_OPTIONS, limits=limits, engine=engine)
    prefill_tok_s = prefill_tokens / r.prefill_latency_s if r.prefill_latency_s else 0.0
    # a command fits where llama.cpp's own --fit would place it: each GPU keeps --fit's margin free
    # (1 GiB: the compute buffers and allocations an estimate can miss), so the pick is never more
    # aggressive with memory than llama.cpp's fit, and a gain over it is not one of memory
    target = fit_target_limits(limits, fit_margins_bytes(None, hw.gpu.count))
    return Candidate(flags, prefill_tok_s, r.decode_throughput_tok_s, r.total_time_s,
                     {"gpu": r.gpu_peak_bytes, "cpu": r.cpu_peak_bytes}, r.fits(target), knobs, r.bottleneck)


def fit_gpu(hw, model, context: int, gen: int = 128, users: int = 1, objective: str = "latency",
            ubatches: tuple[int, ...] = UBATCHES, threads: tuple[int, ...] | None = None) -> FitResult:
    """Every (``--n-cpu-moe``, KV on GPU or ``-nkvo``, ``-ub``, ``-t``) estimated; see the module."""
    from ..engines.engine import load_engine
    from ..engines.mechanisms import with_fields
    from ..policy import Policy
    from ..export.llama_overrides import experts_gpu_ratio, n_cpu_moe_value
    from ..workload import make_workload

    if hw.gpu is None:
        raise HRMError(f"hrm fit: {hw.name} has no GPU: give a GGUF (--gguf) and a profile with a ggml_cpu section "
                       f"(hrm profile --llama-cpp) for the CPU-only search")
    prompt = _check(context, gen, users, objective)
    window = model.max_context_len
    if window is not None and context > window:  # in hrm fit's own flags, not the workload's
        raise HRMError(f"--context {context} exceeds the context window of model {model.name} ({window} tokens, "
                       f"max_position_embeddings)")
    workload = make_workload(None, prompt_len=prompt, gen_len=gen)
    layers = max(int(model.num_moe_layers), 1)
    threads, default_t, notes = _gpu_threads(hw, threads)
    cands: list[Candidate] = []
    default = None
    for attn_gpu in (True, False):
        base = load_engine("llama.cpp" if attn_gpu else "llama.cpp-nkvo")
        # one validated engine per (-t, -ub), shared by every --n-cpu-moe
        engines = {(t, ub): with_fields(base, {"cpu_threads": t, "prefill.max_tokens_per_pass": ub})
                   for t in threads for ub in useful_ubatches(ubatches, prompt * users)}
        for cpu_layers in range(layers + 1):
            rw = experts_gpu_ratio(cpu_layers, layers)
            policy = Policy(batch_size=users, micro_batch_size=users, num_micro_batches=1, attn_on_gpu=attn_gpu,
                            ffn_on_gpu=True, weights_gpu_ratio=rw, kv_gpu_ratio=1.0 if attn_gpu else 0.0)
            for t in threads:
                for ub in useful_ubatches(ubatches, prompt * users):
                    engine = engines[(t, ub)]
                    knobs = {"n_cpu_moe": n_cpu_moe_value(cpu_layers, model),
                             "cpu_layers": cpu_layers, "kv": "gpu" if attn_gpu else "host", "ubatch": ub, "threads": t}
                    c = _gpu_candidate(hw, model, workload, policy, engine, users * prompt,
                                       _gpu_flags(model, users, context, knobs), knobs)
                    cands.append(c)
                    if attn_gpu and ub == DEFAULT_UBATCH and t == (default_t if default_t in threads else threads[0]):
                        # llama.cpp's own memory fit keeps the KV on the GPU and moves whole
                        # layers' experts to the CPU until the rest leaves each GPU its margin
                        # (hrm.export.llama_cpp.fitted_cpu_layers, as hrm import reads -ngl auto):
                        # the fewest such CPU layers, at the default -ub and -t
                        if c.fits and (default is None or cpu_layers < default.knobs["cpu_layers"]):
                            default = c
    result = _result(cands, default, objective, users, context, gen, "gpu", _why_gpu(layers), notes)
    return with_servers(with_ollama(result, cands, model), hw, model, workload)


def with_ollama(result: FitResult, cands: list[Candidate], model) -> FitResult:
    """``result`` with its ollama form (hrm.analysis.fit_ollama)."""
    from dataclasses import replace

    from .fit_ollama import ollama_answer

    return replace(result, ollama=ollama_answer(result.best, _ranked(cands, result.objective), model))


def with_servers(result: FitResult, hw, model, workload) -> FitResult:
    """``result`` with vLLM's and SGLang + kTransformers' answers for the same machine, model,
    workload, users and objective (:mod:`hrm.analysis.fit_vllm`, :mod:`hrm.analysis.fit_sglang`);
    ``model`` None on a CPU-only machine, which neither runs."""
    from dataclasses import replace

    from .fit_sglang import sglang_answer
    from .fit_vllm import vllm_answer

    return replace(result, servers=tuple(answer(hw, model, workload, result.users, result.objective)
                                         for answer in (vllm_answer, sglang_answer)))


def _why_gpu(layers: int):
    def why(best: Candidate, ranked: list[Candidate], default: Candidate | None) -> list[str]:
        k = best.knobs
        out = [f"--n-cpu-moe {k['n_cpu_moe']}: {k['cpu_layers']} of {layers} MoE layers' experts on the CPU; "
               f"GPU {best.memory_bytes['gpu'] / GIB:.2f} GiB, host {best.memory_bytes['cpu'] / GIB:.2f} GiB; "
               f"bottleneck: {best.bottleneck}"]
        fewer = [c for c in ranked if c.knobs["cpu_layers"] < k["cpu_layers"] and c.knobs["kv"] == k["kv"]]
        if k["cpu_layers"] and not fewer:
            out.append(f"{k['cpu_layers'] - 1} CPU layers or fewer do not fit the GPU with this KV cache and -ub "
                       "(leaving llama.cpp's --fit margin, 1 GiB a GPU)")
        same = [c for c in ranked if c.knobs["cpu_layers"] == k["cpu_layers"] and c.knobs["kv"] == k["kv"]
                and c.knobs["threads"] == k["threads"] and c.knobs["ubatch"] == DEFAULT_UBATCH]
        if same and k["ubatch"] != DEFAULT_UBATCH:
            out.append(f"-ub {k['ubatch']}: prefill {best.prefill_tok_s:,.0f} tok/s vs {same[0].prefill_tok_s:,.0f} at the "
                       f"default -ub 512 ({_pct(best.prefill_tok_s, same[0].prefill_tok_s)}): fewer passes, each "
                       "re-reading the layers' weights from GPU memory"
                       + (" and the CPU layers' experts over PCIe" if k["cpu_layers"] else ""))
        if default is not None and default is not best:
            out.append(f"vs llama.cpp's own fit (fewest CPU layers that fit, -ub 512): {default.args()}: decode "
                       f"{_pct(best.decode_tok_s, default.decode_tok_s)}, prefill "
                       f"{_pct(best.prefill_tok_s, default.prefill_tok_s)}, request {_pct(default.total_s, best.total_s)} "
                       "faster")
        elif default is best:
            out.append("it is what llama.cpp's own fit picks (fewest CPU layers at the default -ub)")
        return out
    return why


# --- a CPU-only machine: the ggml CPU step model on the GGUF's own tensors --------------------

def measured_ubatch(section, inventory, threads: int, ubatch: int) -> bool:
    """Whether a prefill pass of ``ubatch`` tokens stays within the rows the profile's matmul
    curves were measured at (dense MUL_MAT rows = ubatch; MUL_MAT_ID rows per touched expert =
    ubatch x top-k / expected touched experts). Past them hrm.cost.ggml_cpu extrapolates linearly, and
    that extrapolation is what docs/validation/fit.md measured wrong on this project's host
    (-ub 2048 ran 8-15% slower than -ub 512 where the model predicted 1-2% faster), so hrm fit does
    not pick such a -ub."""
    from ..cost.costs import uniform_distinct_experts

    def reach(op):
        xs = [k.last_rows for k in section.kernels if k.op == op and k.threads == threads]
        return max(xs) if xs else 0.0
    touched = float(uniform_distinct_experts(inventory.num_experts, inventory.top_k, ubatch))
    expert_rows = ubatch * inventory.top_k / touched if inventory.num_experts > 1 else 0.0
    return ubatch <= reach("mm") and expert_rows <= (reach("mmid") if inventory.num_experts > 1 else 0.0) + 1e-9


def repacked_ops(section, inventory, threads: int) -> dict[tuple[str, str], bool]:
    """The model's (weight type, op) pairs a CPU-only llama.cpp repacks at ``threads`` (a kernel of
    another buffer than the plain one is measured), each with whether its plain-buffer kernel is
    measured too (``hrm profile --llama-cpp``; profiler.ggml_cpu ``plain_buffer``)."""
    from ..cost.ggml_cpu import HOST_BUFFER, probe_type

    ops = {(probe_type(t.ggml_type), "mmid" if t.is_expert else "mm") for t in inventory.matmul_tensors()}
    buffers: dict[tuple[str, str], set] = {}
    for k in section.kernels:
        if k.threads == threads:
            buffers.setdefault((k.type, k.op), set()).add(k.buffer)
    return {op: HOST_BUFFER in buffers[op] for op in ops if buffers.get(op, set()) - {HOST_BUFFER}}


def plain_kernels_measured(section, inventory, threads: int) -> bool:
    """Whether the profile prices ``--no-repack`` (``-nr``) at ``threads``: the model has a weight type
    llama.cpp repacks, and the plain buffer's kernels of every such type are measured
    (:func:`repacked_ops`)."""
    return _no_repack_priced(repacked_ops(section, inventory, threads))


def _no_repack_priced(ops: dict[tuple[str, str], bool]) -> bool:
    return bool(ops) and all(ops.values())


def fit_cpu(hw, inventory, context: int, gen: int = 128, users: int = 1, objective: str = "latency",
            ubatches: tuple[int, ...] = UBATCHES, extrapolate: bool = False) -> FitResult:
    """Every (``-t``, ``-tb``, ``-ub``, repacking) on the CPU step model; see the module. ``-nr``
    (weights left in the plain CPU buffer: common/arg.cpp:2421-2428) is searched where the profile
    measured the plain buffer's kernels (:func:`plain_kernels_measured`): a prompt runs faster without
    repacking, a decode slower (docs/validation/ground_truth.md §1.8). A ``-ub`` past the measured
    rows (:func:`measured_ubatch`) is predicted and shown but not picked unless ``extrapolate``."""
    from ..cost.ggml_cpu import HOST_BUFFER, resident_bytes, run_times

    if hw.ggml_cpu is None:
        raise HRMError(f"hrm fit: {hw.name} has no ggml_cpu section: measure llama.cpp's kernels on this machine with "
                       "hrm profile --llama-cpp DIR")
    prompt = _check(context, gen, users, objective)
    section = hw.ggml_cpu
    threads = sorted({k.threads for k in section.kernels if k.threads <= hw.cpu.cores})
    default_t = linux_default_threads(hw)
    # None: repacked where llama.cpp repacks (its default); HOST_BUFFER: -nr, where measured at every -t and -tb
    repacked = {t: repacked_ops(section, inventory, t) for t in threads}
    buffers = [None] + ([HOST_BUFFER] if all(map(_no_repack_priced, repacked.values())) else [])
    decode = {(t, buf): run_times(inventory, section, t, users, 0, gen, prompt, threads_batch=t, buffer=buf)
              for t in threads for buf in buffers}
    cands: list[Candidate] = []
    default = None
    memory = {"cpu": resident_bytes(inventory, users * context)}
    fits = memory["cpu"] <= hw.cpu.memory_gib * GIB
    # several users: one KV stream for all (-kvu) or one each; at 64+ users decoding together one stream
    # costs attention over every user's cells (docs/validation/ground_truth.md §1.14)
    streams = (True, False) if users > 1 else (False,)
    for buf, tb, unified in ((buf, tb, u) for buf in buffers for tb in threads for u in streams):
        for ub in useful_ubatches(ubatches, users * prompt):
            b = max(DEFAULT_BATCH, ub)
            pre = run_times(inventory, section, tb, users, prompt, 0, 0, b, ub, tb, buffer=buf, kv_unified=unified)
            for t in threads:
                # one user's decode steps run on -t; several users' on -tb (src/llama-context.cpp:
                # n_threads for a one-token ubatch, n_threads_batch otherwise)
                dec = (decode[(t, buf)] if users == 1 else
                       run_times(inventory, section, t, users, 0, gen, prompt, threads_batch=tb, buffer=buf,
                                 kv_unified=unified))
                if users > 1 and t != tb:
                    continue  # -t does not act on batched decode: one candidate per -tb
                flags = [("-c", str(users * context)), ("-np", str(users)), ("-b", str(b)), ("-ub", str(ub)),
                         ("-t", str(t)), ("-tb", str(tb)), ("-fa", "on"), ("-ctk", KV_TYPE), ("-ctv", KV_TYPE)]
                if unified:
                    flags.append(("-kvu", ""))
                if buf is not None:
                    flags.append(("-nr", ""))
                within = measured_ubatch(section, inventory, tb, ub)
                c = Candidate(tuple(flags), pre.prefill_tok_s, dec.decode_tok_s, pre.prefill_s + dec.decode_s, memory,
                              fits and (within or extrapolate),
                              {"threads": t, "threads_batch": tb, "ubatch": ub, "batch": b, "measured_rows": within,
                               "repack": buf is None, "kv_unified": unified},
                              "cpu (ggml kernels)")
                cands.append(c)
                if t == default_t and tb == default_t and ub == DEFAULT_UBATCH and buf is None and not unified:
                    default = c
    notes = [f"CPU-only: every layer on the CPU (-ngl has nothing to place); KV cache {memory['cpu'] / GIB:.2f} GiB with "
             f"the weights, compute buffers not counted",
             "-fa on: the CPU step model prices flash attention only (hrm.cost.ggml_cpu), as llama.cpp's default -fa auto "
             "runs it on the CPU backend; -ctk/-ctv other than f16 are not priced"]
    past = sorted({c.knobs["ubatch"] for c in cands if not c.knobs["measured_rows"]})
    if past and not extrapolate:
        notes.append(f"-ub {', '.join(map(str, past))}: past the rows this profile's matmul curves were measured at; "
                     "not picked (hrm.analysis.fit.measured_ubatch: the extrapolation measured wrong, docs/validation/fit.md)")
    if default_t not in threads:
        notes.append(f"llama.cpp's default -t {default_t} was not measured in this profile (threads {threads})")
    if len(buffers) == 1 and any(not all(ops.values()) for ops in repacked.values()):
        notes.append("-nr (no repacking) not searched: this profile has no plain-buffer kernels for the repacked "
                     "weight types at every thread count (hrm profile --llama-cpp measures them)")
    result = _result(cands, default, objective, users, context, gen, "cpu", _why_cpu(default_t), notes)
    return with_servers(result, hw, None, None)


def _why_cpu(default_t: int):
    def why(best: Candidate, ranked: list[Candidate], default: Candidate | None) -> list[str]:
        k = best.knobs
        out = [f"-t {k['threads']}: decode {best.decode_tok_s:,.1f} tok/s; -tb {k['threads_batch']} -ub {k['ubatch']}: "
               f"prefill {best.prefill_tok_s:,.1f} tok/s"]
        if not k.get("repack", True):
            out.append("-nr: the repacked expert kernels take a prompt's rows one at a time (ggml-cpu/repack.cpp "
                       "forward_mul_mat_id); left unpacked, a prompt runs faster and a decode slower (measured: "
                       "docs/validation/ground_truth.md §1.8)")
        if default is not None and default is not best:
            out.append(f"vs llama.cpp's defaults (-t {default_t} -ub 512 -b 2048): decode "
                       f"{_pct(best.decode_tok_s, default.decode_tok_s)}, prefill "
                       f"{_pct(best.prefill_tok_s, default.prefill_tok_s)}; the request finishes "
                       f"{_pct(default.total_s, best.total_s)} sooner")
        elif default is best:
            out.append("llama.cpp's defaults are already the best command this model predicts")
        return out
    return why


def fit_summary(result: FitResult) -> dict:
    """The numbers a table of fits shows."""
    b, d = result.best, result.default
    gain = (d.total_s / b.total_s - 1) if d is not None and b.total_s else math.nan
    return {"args": b.args(), "decode_tok_s": b.decode_tok_s, "prefill_tok_s": b.prefill_tok_s,
            "predicted_gain_over_defaults": gain}


# --- what hrm fit prints and the web planner's fit page shows --------------------------------

#: the model path a command names when no GGUF file was given (a placeholder for the user's)
MODEL_PLACEHOLDER = "MODEL.gguf"


def program(users: int) -> str:
    """The llama.cpp program of the command: llama-cli for one user, llama-server (its -np
    slots) for several."""
    return "llama-server" if users > 1 else "llama-cli"


@dataclass(frozen=True)
class FitReport:
    """A :class:`FitResult` as text, one line each: ``hrm fit`` prints them, the web page shows them."""

    heading: str
    command: str
    predicted: str
    memory: str
    why: tuple[str, ...]
    runners_up: tuple[str, ...]
    notes: tuple[str, ...]
    #: the answer's ollama form (empty where none is made: CPU-only machines)
    ollama: tuple[str, ...] = ()
    #: vLLM's and SGLang's answers, each a command with its rates or one line saying why not
    servers: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What ``hrm fit`` prints on standard output (the notes go to standard error)."""
        out = [self.heading, f"  {self.command}", f"  {self.predicted}", f"  {self.memory}", "why:"]
        out += [f"  - {line}" for line in self.why]
        out += ["runners-up:"] + [f"  {line}" for line in self.runners_up] if self.runners_up else []
        return out + list(self.ollama) + list(self.servers)


def ollama_lines(answer) -> tuple[str, ...]:
    """The answer's ollama form (hrm.analysis.fit_ollama.OllamaAnswer): one line, the Modelfile, its rates."""
    out = [f"ollama: {answer.line}"] + [f"  {line}" for line in answer.modelfile.splitlines()]
    if answer.decode_tok_s is not None:
        out.append(f"  predicted: prefill {answer.prefill_tok_s:,.1f} tok/s, decode {answer.decode_tok_s:,.2f} tok/s")
    return tuple(out)


def fit_report(result: FitResult, hardware: str, model_path: str = MODEL_PLACEHOLDER) -> FitReport:
    """``result`` on ``hardware`` (its name) as text; the command names ``model_path``."""
    b = result.best
    eligible = ", or -ub past the measured rows" if result.path == "cpu" else ""
    heading = (f"best llama.cpp command on {hardware}, context {result.context_tokens}, {result.users} user(s), "
               f"objective {result.objective} ({result.searched} commands searched, {result.infeasible} not eligible: "
               f"over memory{eligible}):")
    predicted = (f"predicted: prefill {b.prefill_tok_s:,.1f} tok/s, decode {b.decode_tok_s:,.2f} tok/s"
                 f"{' (all users)' if result.users > 1 else ''}, request {b.total_s:.2f} s")
    memory = "memory: " + ", ".join(f"{dev} {v / GIB:.2f} GiB" for dev, v in b.memory_bytes.items())
    runners = tuple(f"{c.args()}  | prefill {c.prefill_tok_s:,.1f} decode {c.decode_tok_s:,.2f} tok/s, "
                    f"request {c.total_s:.2f} s" for c in result.runners_up)
    ollama = ollama_lines(result.ollama) if result.ollama is not None else ()
    servers = tuple(line for answer in result.servers for line in answer.lines())
    return FitReport(heading, b.command(program(result.users), model_path), predicted, memory, result.why, runners,
                     result.notes, ollama, servers)


def fit_json(result: FitResult, hardware: str, model_path: str = MODEL_PLACEHOLDER) -> dict:
    """What ``hrm fit --json`` prints: :meth:`FitResult.to_json`, the hardware's name and the command."""
    return {**result.to_json(), "hardware": hardware, "command": result.best.command(program(result.users), model_path)}


__all__ = ["Candidate", "FitResult", "fit_gpu", "fit_cpu", "fit_summary", "UBATCHES", "OBJECTIVES",
           "FitReport", "fit_report", "fit_json", "ollama_lines", "program", "MODEL_PLACEHOLDER"]
