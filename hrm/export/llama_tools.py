"""llama.cpp's benchmark tools as the runs they make: ``llama-bench`` (one user: a prompt test
and a generation test per parameter combination, a sweep when a flag lists values) and
``llama-batched-bench`` (``-npl`` parallel sequences: a shared prefill, then one token per
sequence per step). Every flag, default and list rule is a fact of ggml-org/llama.cpp@0c1e5709
(vendored by llama-cpp-python 0.3.36): tools/llama-bench/llama-bench.cpp:387-417 (defaults),
:293-330 (``first-last+step`` / ``*mult`` ranges, comma lists), and common/arg.cpp (batched-bench:
-npp/-ntg/-npl at :3262-3285, -pps at :3248, -kvu at :1724; -b/-ub defaults common/common.h:454-455).

A run here is what the CPU step model (:mod:`hrm.cost.ggml_cpu`) predicts: its model file, threads,
prompt tokens, generated tokens, parallel sequences, depth, and batch sizes. Flags that change
neither the CPU graph nor its speed are read and ignored with a note; flags that change it in a
way the model does not cover are refused in one line.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, replace

from ..errors import HRMError

#: llama-bench's defaults (tools/llama-bench/llama-bench.cpp:387-417)
BENCH_DEFAULTS = {"n_prompt": 512, "n_gen": 128, "n_depth": 0, "n_batch": 2048, "n_ubatch": 512}
#: llama-batched-bench / common defaults (common/common.h:454-455 -b/-ub; -c 0 = the model's)
BATCHED_DEFAULTS = {"n_batch": 2048, "n_ubatch": 512}
TOOLS = ("llama-bench", "llama-batched-bench")


@dataclass(frozen=True)
class ToolRun:
    """One measured test of a benchmark tool: ``sequences`` prompts of ``prompt_len`` tokens
    after ``depth`` cached ones, then ``gen_len`` steps (llama-bench's pp test has gen 0, its tg
    test prompt 0)."""

    tool: str
    model_path: str
    threads: int
    threads_batch: int
    prompt_len: int
    gen_len: int
    sequences: int = 1
    depth: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    kv_unified: bool = False
    shared_prompt: bool = False
    label: str = ""
    #: llama-bench -ngl (default -1: every layer, tools/llama-bench/llama-bench.cpp:398) and
    #: -ncmoe (default 0, :400; read at :731-737): what a GPU machine's prediction places
    n_gpu_layers: int = -1
    n_cpu_moe: int = 0
    #: the weights repacked for the CPU's kernels where it can (llama.cpp's default); False: the
    #: plain CPU buffer's kernels (llama-bench --repack 0, -nr/--no-repack)
    repack: bool = True


def int_list(flag: str, text: str) -> list[int]:
    """A llama-bench value list: ``a,b``, ``first-last``, ``first-last+step``, ``first-last*mult``."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?", part.strip())
        if not m:
            raise HRMError(f"{flag} {text}: not a list of integers or first-last[+step|*mult] ranges")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        op, step = m.group(3) or "+", int(m.group(4) or 1)
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise HRMError(f"{flag} {text}: a range that does not grow")
            i = nxt
            if len(out) > 4096:
                raise HRMError(f"{flag} {text}: more than 4096 values")
    return out


#: flags read (their value parsed), by tool: name -> (key, kind)
_BENCH_FLAGS = {
    "-m": ("model", "str"), "--model": ("model", "str"),
    "-p": ("n_prompt", "ints"), "--n-prompt": ("n_prompt", "ints"),
    "-n": ("n_gen", "ints"), "--n-gen": ("n_gen", "ints"),
    "-pg": ("pg", "pairs"),
    "-d": ("n_depth", "ints"), "--n-depth": ("n_depth", "ints"),
    "-b": ("n_batch", "ints"), "--batch-size": ("n_batch", "ints"),
    "-ub": ("n_ubatch", "ints"), "--ubatch-size": ("n_ubatch", "ints"),
    "-t": ("n_threads", "ints"), "--threads": ("n_threads", "ints"),
    "-ngl": ("n_gpu_layers", "ints"), "--n-gpu-layers": ("n_gpu_layers", "ints"),
    "-ncmoe": ("n_cpu_moe", "ints"), "--n-cpu-moe": ("n_cpu_moe", "ints"),
    # --repack 0|1 (a list: each value a run; default 1, tools/llama-bench/llama-bench.cpp:413,488,912-918):
    # 0 keeps every weight in the plain CPU buffer (llama_model_params.use_extra_bufts, :1255)
    "--repack": ("repack", "ints"),
}
_BATCHED_FLAGS = {
    "-m": ("model", "str"), "--model": ("model", "str"),
    "-npp": ("npp", "ints"), "-ntg": ("ntg", "ints"), "-npl": ("npl", "ints"),
    "-b": ("n_batch", "int"), "--batch-size": ("n_batch", "int"),
    "-ub": ("n_ubatch", "int"), "--ubatch-size": ("n_ubatch", "int"),
    "-t": ("n_threads", "int"), "--threads": ("n_threads", "int"),
    "-tb": ("n_threads_batch", "int"), "--threads-batch": ("n_threads_batch", "int"),
    "-c": ("ctx", "int"), "--ctx-size": ("ctx", "int"),
}
#: flags that change neither the CPU graph's work nor its speed on a CPU-only build (reporting,
#: repetitions, output format, GPU-only placement with no GPU)
_IGNORED_WITH_VALUE = {"-r", "--repetitions", "-o", "--output", "-oe", "--output-err", "--output-format",
                       "--delay", "--prio", "-ngld", "-mg", "--main-gpu", "-sm",
                       "--split-mode", "-fa", "--flash-attn", "-lm", "--load-mode", "-mmp", "--mmap",
                       "--seed", "-s", "--poll"}
_IGNORED_SWITCHES = {"-v", "--verbose", "--progress", "--no-warmup", "--no-mmap", "--mlock", "--log-disable"}
#: switches that change the graph or the cache in a way the CPU model reads
_SWITCHES = {"-kvu": "kv_unified", "--kv-unified": "kv_unified", "-pps": "shared_prompt",
             # common/arg.cpp:2421-2428: -nr/--no-repack sets no_extra_bufts (weights not repacked)
             "-nr": "no_repack", "--no-repack": "no_repack"}


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise HRMError(f"llama.cpp: cannot split the command: {exc}") from None
    if not words:
        raise HRMError("llama.cpp: empty command")
    return words


def tool_of(command: str) -> str | None:
    """``llama-bench`` or ``llama-batched-bench`` when the command runs one (by file name);
    None otherwise (an empty or unsplittable command is the server reader's to refuse)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words:
        return None
    name = words[0].rsplit("/", 1)[-1]
    return name if name in TOOLS else None


def _read(words: list[str], flags: dict, tool: str) -> tuple[dict, list[str]]:
    values: dict = {}
    notes: list[str] = []
    i = 1
    while i < len(words):
        word = words[i]
        flag, _, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if flag in _IGNORED_SWITCHES:
            i += 1
            continue
        if flag in _SWITCHES:
            values[_SWITCHES[flag]] = True
            i += 1
            continue
        if flag in flags or flag in _IGNORED_WITH_VALUE:
            if inline:
                value = inline
            else:
                if i + 1 >= len(words):
                    raise HRMError(f"{tool}: {flag}: needs a value")
                value = words[i + 1]
                i += 1
            i += 1
            if flag in _IGNORED_WITH_VALUE:
                continue
            key, kind = flags[flag]
            if kind == "str":
                values[key] = value
            elif kind == "int":
                values[key] = int_list(flag, value)[0] if re.fullmatch(r"\d+", value) else _bad(tool, flag, value)
            elif kind == "ints":
                values.setdefault(key, []).extend(int_list(flag, value))
            else:  # -pg pp,tg pairs
                m = re.fullmatch(r"(\d+),(\d+)", value)
                if not m:
                    raise HRMError(f"{tool}: -pg {value}: not pp,tg")
                values.setdefault(key, []).append((int(m.group(1)), int(m.group(2))))
            continue
        raise HRMError(f"{tool}: {word}: not a flag this CPU prediction reads (known: "
                       f"{', '.join(sorted(set(flags) | _IGNORED_WITH_VALUE | _IGNORED_SWITCHES | set(_SWITCHES)))})")
    if "model" not in values:
        raise HRMError(f"{tool}: -m MODEL.gguf is required")
    return values, notes


def _bad(tool: str, flag: str, value: str):
    raise HRMError(f"{tool}: {flag} {value}: not a non-negative integer")


def bench_runs(command: str, default_threads: int) -> tuple[list[ToolRun], list[str]]:
    """Every test a ``llama-bench`` command runs, in its order (each parameter combination,
    then its pp, tg and pg tests), or every point of a ``llama-batched-bench`` command
    (-npp × -ntg × -npl). ``default_threads``: this host's default -t
    (common/common.cpp:144-145: the cores, halved above 4)."""
    words = _words(command)
    tool = tool_of(command)
    if tool == "llama-bench":
        v, notes = _read(words, _BENCH_FLAGS, tool)
        runs = []
        for threads, n_batch, n_ubatch, depth, ngl, ncmoe, repack in itertools.product(
                v.get("n_threads", [default_threads]), v.get("n_batch", [BENCH_DEFAULTS["n_batch"]]),
                v.get("n_ubatch", [BENCH_DEFAULTS["n_ubatch"]]), v.get("n_depth", [BENCH_DEFAULTS["n_depth"]]),
                v.get("n_gpu_layers", [-1]), v.get("n_cpu_moe", [0]), v.get("repack", [1])):
            base = ToolRun(tool, v["model"], threads, threads, 0, 0, 1, depth, n_batch, n_ubatch,
                           n_gpu_layers=ngl, n_cpu_moe=ncmoe, repack=bool(repack))
            where = f" ngl{ngl} ncmoe{ncmoe}" if ("n_gpu_layers" in v or "n_cpu_moe" in v) else ""
            where += "" if "repack" not in v else f" repack{int(bool(repack))}"
            for p in v.get("n_prompt", [BENCH_DEFAULTS["n_prompt"]]):
                if p:
                    runs.append(replace(base, prompt_len=p, label=f"pp{p}" + (f" @ d{depth}" if depth else "") + where))
            for n in v.get("n_gen", [BENCH_DEFAULTS["n_gen"]]):
                if n:
                    runs.append(replace(base, gen_len=n, label=f"tg{n}" + (f" @ d{depth}" if depth else "") + where))
            for p, n in v.get("pg", []):
                runs.append(replace(base, prompt_len=p, gen_len=n, label=f"pp{p}+tg{n}" + where))
        return runs, notes
    if tool == "llama-batched-bench":
        v, notes = _read(words, _BATCHED_FLAGS, tool)
        threads = v.get("n_threads", default_threads)
        missing = [f for f in ("npp", "ntg", "npl") if not v.get(f)]
        if missing:
            raise HRMError(f"llama-batched-bench: -{'/-'.join(missing)}: required (empty by default, "
                           f"common/common.h:703-705: the tool would run nothing)")
        runs = []
        for npp, ntg, npl in itertools.product(v["npp"], v["ntg"], v["npl"]):
            runs.append(ToolRun(tool, v["model"], threads, v.get("n_threads_batch", threads), npp, ntg, npl, 0,
                                v.get("n_batch", BATCHED_DEFAULTS["n_batch"]),
                                v.get("n_ubatch", BATCHED_DEFAULTS["n_ubatch"]), bool(v.get("kv_unified")),
                                bool(v.get("shared_prompt")), f"pp{npp} tg{ntg} x{npl}",
                                repack=not v.get("no_repack")))
        return runs, notes
    raise HRMError(f"llama.cpp: {words[0]}: not llama-bench or llama-batched-bench")


def predict(run: ToolRun, inventory, section):
    """The run's prefill and decode seconds on the CPU step model (:func:`hrm.cost.ggml_cpu.run_times`),
    in one KV stream where the run is unified (-kvu). A shared prompt (-pps) is prefilled once for all
    sequences (its cells, which every sequence shares, priced as a stream per sequence)."""
    from ..cost.ggml_cpu import HOST_BUFFER, run_times

    buffer = None if run.repack else HOST_BUFFER
    if run.shared_prompt and run.sequences > 1:
        pre = run_times(inventory, section, run.threads, 1, run.prompt_len, 0, run.depth, run.n_batch, run.n_ubatch,
                        run.threads_batch, buffer)
        dec = run_times(inventory, section, run.threads, run.sequences, 0, run.gen_len, run.depth + run.prompt_len,
                        run.n_batch, run.n_ubatch, run.threads_batch, buffer)
        return replace(dec, prefill_s=pre.prefill_s, prompt_tokens=pre.prompt_tokens)
    return run_times(inventory, section, run.threads, run.sequences, run.prompt_len, run.gen_len, run.depth,
                     run.n_batch, run.n_ubatch, run.threads_batch, buffer, run.kv_unified)


#: a -kvu run's decode slower than its stream-per-sequence twin by more than this is worth a note
#: (the model's own resolution: ground_truth.md's one-window medians sit within ~5% of measured)
UNIFIED_NOTE_SLOWDOWN = 1.05


def unified_stream_note(run: ToolRun, times, inventory, section) -> str | None:
    """A note where ``run`` keeps its sequences in one KV stream (-kvu) and that costs its decode:
    FA_TILE_QUERIES or more sequences decode as one tiled-kernel op over every sequence's cells
    (docs/validation/ground_truth.md §1.14); the same run with a stream each, for comparison."""
    from ..cost.ggml_cells import FA_TILE_QUERIES

    if not run.kv_unified or run.sequences < FA_TILE_QUERIES or not run.gen_len:
        return None
    apart = predict(replace(run, kv_unified=False), inventory, section)
    slowdown = times.decode_s / apart.decode_s
    if slowdown <= UNIFIED_NOTE_SLOWDOWN:
        return None
    return (f"llama.cpp: -kvu with {run.sequences} sequences: each decode step's {run.sequences} rows run the tiled "
            f"flash-attention kernel over every sequence's cells (docs/validation/ground_truth.md §1.14): decode "
            f"{slowdown:.2f}x slower than with a KV stream per sequence (drop -kvu: {apart.decode_tok_s:,.1f} tok/s)")


def gpu_estimate(run: ToolRun, hw, model):
    """One llama-bench test on a machine with a GPU, by HRM's ``llama.cpp`` engine: one
    sequence (llama-bench runs one), ``-ncmoe`` blocks' experts on the CPU (the MoE layers among
    blocks 0..N-1: common/common.h:1198-1217), the prompt in passes of ``-ub`` tokens
    (``prefill.max_tokens_per_pass``), the CPU experts on ``-t`` threads. ``-ngl`` below every
    layer moves attention too, which the engine's policy space (experts only) cannot express:
    refused in one line. Returns (prefill tok/s, decode tok/s, fits physical memory)."""
    from ..engines.engine import load_engine
    from ..engines.mechanisms import with_fields
    from ..estimate import estimate
    from ..cost.memory import physical_limits
    from ..policy import Policy
    from .llama_overrides import experts_gpu_ratio
    from ..workload import make_workload

    total = int(model.num_layers) + 1
    if run.n_gpu_layers not in (-1,) and run.n_gpu_layers < total:
        raise HRMError(f"llama-bench: -ngl {run.n_gpu_layers}: below every layer ({total} with the output) puts whole "
                       "layers, attention included, on the CPU; HRM's llama.cpp engine keeps attention on the GPU and "
                       "moves experts only (-ncmoe / -ot): give -ngl 99 with -ncmoe")
    layers = max(int(model.num_moe_layers), 1)
    cpu_layers = min(max(run.n_cpu_moe - int(model.first_dense_layers), 0), layers)
    policy = Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                    weights_gpu_ratio=experts_gpu_ratio(cpu_layers, layers), kv_gpu_ratio=1.0)
    engine = with_fields(load_engine("llama.cpp"), {"cpu_threads": run.threads,
                                                    "prefill.max_tokens_per_pass": min(run.n_ubatch, run.n_batch)})
    limits = physical_limits(hw, engine)
    work = make_workload(None, prompt_len=max(run.depth + run.prompt_len, 1), gen_len=max(run.gen_len, 1))
    r = estimate(hw, model, work, policy, limits=limits, engine=engine)
    prefill = (run.depth + run.prompt_len) / r.prefill_latency_s if run.prompt_len and r.prefill_latency_s else 0.0
    return prefill, r.decode_throughput_tok_s if run.gen_len else 0.0, r.fits(limits)
