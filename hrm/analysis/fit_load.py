"""``hrm fit --rate-per-s R --requests N`` on a CPU-only machine: the llama-server command that
serves a load of requests best — its slots (``-np``), one unified KV cache or a stream per slot
(``-kvu``), and threads — each candidate run through the server's loop
(:func:`hrm.cost.ggml_server.serve`, docs/model.md §4.11) on the CPU step model. The score is the
90th-percentile request latency (or the median, or the makespan). llama.cpp's own default,
``llama-server -m FILE -c C`` (4 slots sharing a unified cache, tools/server/server.cpp:156-160, on
its default threads), is among the candidates, so the answer says what it gains over it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HRMError
from ..units import GIB

#: -np values searched: llama-server's auto 4 and powers of two around it, up to this many
SLOTS = (1, 2, 4, 8, 16)
#: llama-server's slots when -np is absent or -1 (tools/server/server.cpp:156-160), unified
AUTO_SLOTS = 4
LOAD_OBJECTIVES = ("p90", "p50", "makespan")


@dataclass(frozen=True)
class LoadCandidate:
    """One llama-server command under the load: its knobs, the load as served, its memory."""

    slots: int
    kv_unified: bool
    threads: int
    context_tokens: int
    load: object
    memory_bytes: float
    fits: bool

    def args(self, default: bool = False) -> str:
        """Its flags; ``default``: llama.cpp's own default command (no -np, no -t)."""
        if default:
            return f"-c {self.context_tokens}"
        kv = " -kvu" if self.kv_unified and self.slots > 1 else ""
        return f"-c {self.context_tokens} -np {self.slots}{kv} -t {self.threads}"

    def score(self, objective: str) -> float:
        if objective == "makespan":
            return self.load.makespan_s
        return self.load.percentile("latency_s", 90 if objective == "p90" else 50)


@dataclass(frozen=True)
class LoadFit:
    best: LoadCandidate
    default: LoadCandidate
    ranked: tuple[LoadCandidate, ...]
    objective: str
    requests: int
    notes: tuple[str, ...]

    @property
    def gain(self) -> float:
        """The default's score over the best's (1.0: no gain)."""
        return self.default.score(self.objective) / self.best.score(self.objective)


def fit_cpu_load(hw, inventory, requests: list, objective: str = "p90") -> LoadFit:
    """Every (-np in SLOTS, unified or a stream per slot, -t = -tb over the measured threads) serving
    ``requests``; -c holds every slot's longest request (padded to 256)."""
    from ..cost.ggml_cpu import resident_bytes
    from ..cost.ggml_server import ServerSetup, serve
    from ..export.llama_cpp import ctx_pad
    from .fit import DEFAULT_BATCH, DEFAULT_UBATCH, linux_default_threads

    if objective not in LOAD_OBJECTIVES:
        raise HRMError(f"--objective {objective}: a load is scored by {', '.join(LOAD_OBJECTIVES)}")
    section = hw.ggml_cpu
    if section is None or section.prior:
        raise HRMError(f"hrm fit: {hw.name} has no measured ggml_cpu section: run hrm profile --llama-cpp DIR")
    longest = ctx_pad(max(r.prompt_tokens + r.gen_tokens for r in requests))
    threads = sorted({k.threads for k in section.kernels if k.threads <= hw.cpu.cores})
    default_t = min(threads, key=lambda t: abs(t - linux_default_threads(hw)))
    host = hw.cpu.memory_gib * GIB
    cands = []
    for slots in SLOTS:
        for unified in ((True, False) if slots > 1 else (True,)):
            ctx = longest * slots
            memory = resident_bytes(inventory, ctx)
            for t in threads:
                setup = ServerSetup(slots, unified, DEFAULT_BATCH, DEFAULT_UBATCH, t, t, ctx)
                cands.append(LoadCandidate(slots, unified, t, ctx, serve(requests, setup, inventory, section), memory,
                                           memory <= host))
    default = next(c for c in cands if c.slots == AUTO_SLOTS and c.kv_unified and c.threads == default_t)
    ranked = tuple(sorted((c for c in cands if c.fits), key=lambda c: c.score(objective)))
    if not ranked:
        raise HRMError(f"hrm fit: no llama-server command holds the weights and {longest}-token slots in "
                       f"{hw.cpu.memory_gib:g} GiB")
    notes = (f"each slot's context holds the longest request ({longest} tokens, padded to 256); -b {DEFAULT_BATCH} "
             f"-ub {DEFAULT_UBATCH} (llama.cpp's defaults); weights repacked; compute buffers not counted",
             "predicted by llama-server's loop on the CPU step model (hrm.cost.ggml_server): "
             "docs/validation/ground_truth.md §1.12 measured it on 768 real requests")
    return LoadFit(ranked[0], default, ranked, objective, len(requests), notes)


def load_fit_lines(fit: LoadFit, hardware: str, model_path: str, runners_up: int = 5) -> list[str]:
    """``fit`` as the lines ``hrm fit`` prints."""
    def row(c: LoadCandidate, default: bool = False) -> str:
        lat = c.load
        return (f"llama-server -m {model_path} {c.args(default)}: p50 {lat.percentile('latency_s', 50):.3f} s, "
                f"p90 {lat.percentile('latency_s', 90):.3f} s, TTFT p90 {lat.percentile('ttft_s', 90):.3f} s, "
                f"{lat.generated_tok_s:,.1f} generated tok/s, {c.memory_bytes / GIB:.2f} GiB")

    scored = "makespan" if fit.objective == "makespan" else f"{fit.objective} latency"
    lines = [f"best llama-server command on {hardware} for {fit.requests} requests (objective {scored}, "
             f"{len(fit.ranked)} commands fit):", "  " + row(fit.best)]
    lines.append(f"llama.cpp's default (-np auto: {AUTO_SLOTS} slots, one unified cache, its default threads):")
    lines.append("  " + row(fit.default, default=True))
    lines.append(f"gain over the default: {fit.gain:.2f}x ({fit.objective})")
    others = [c for c in fit.ranked[1:] if c is not fit.default][:runners_up]
    if others:
        lines.append("runners-up:")
        lines += ["  " + row(c) for c in others]
    return lines


def load_fit_json(fit: LoadFit, hardware: str, model_path: str) -> dict:
    def c(x: LoadCandidate, default: bool = False) -> dict:
        return {"command": f"llama-server -m {model_path} {x.args(default)}", "slots": x.slots,
                "kv_unified": x.kv_unified, "threads": x.threads, "context_tokens": x.context_tokens,
                "latency_p50_s": x.load.percentile("latency_s", 50), "latency_p90_s": x.load.percentile("latency_s", 90),
                "ttft_p90_s": x.load.percentile("ttft_s", 90), "generated_tok_s": x.load.generated_tok_s,
                "makespan_s": x.load.makespan_s, "memory_bytes": x.memory_bytes}
    return {"hardware": hardware, "objective": fit.objective, "requests": fit.requests, "best": c(fit.best),
            "llama_cpp_default": c(fit.default, default=True), "gain": fit.gain,
            "ranked": [c(x) for x in fit.ranked], "notes": list(fit.notes)}


__all__ = ["SLOTS", "AUTO_SLOTS", "LOAD_OBJECTIVES", "LoadCandidate", "LoadFit", "fit_cpu_load", "load_fit_lines",
           "load_fit_json"]
