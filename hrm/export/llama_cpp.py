"""llama.cpp ``llama-server``: experts kept on the CPU per whole layer, the KV cache on the
GPU or (``-nkvo``) in host memory. Its policy space: the shipped ``llama.cpp`` and
``llama.cpp-nkvo`` engines. Every flag, default, start-up limit and placement rule used here
is a fact of ``docs/engines/llama_cpp.md`` (file:line at the pinned commit); tests:
``tests/test_llama_cpp_truth.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from ..model.quantized import GGML_BLOCKS, WEIGHT_FORMATS, quantized_dtype
from .llama_overrides import cpu_blocks, experts_gpu_ratio
from .target import Context, EngineFlags, FlagSpec
from .values import (CONTEXT, HTTP_SERVER_FLAGS, LAYERS, context_tokens, int_value, make_policy, moe_layers,
                     nearest_counts, served_model_notes, shown_word, with_fields)

LLAMA_CPP_VERSION = "ggml-org/llama.cpp@0c1e5709 (vendored by llama-cpp-python 0.3.36)"
_ARG = "common/arg.cpp"
_CTX = "src/llama-context.cpp"
#: n_seq_max (the server's slots, -np) must be <= 256 (src/llama-cparams.h:7; src/llama-context.cpp:100-103)
LLAMA_MAX_SEQ = 256
#: the context is padded up to a multiple of 256, and so is each slot's share of it without
#: a unified KV cache (src/llama-context.cpp:290,295-305)
CTX_PAD_TOKENS = 256
#: -b and -ub defaults (common/common.h:454-455)
DEFAULT_BATCH, DEFAULT_UBATCH = 2048, 512
#: llama-server with no -np (default -1, auto: common/arg.cpp:1403) runs 4 slots sharing one
#: KV cache (tools/server/server.cpp:156-160); one user's requests still run one at a time, at
#: batch 1 (:func:`_users`). llama-cli and llama-bench decode one sequence (n_parallel = 1,
#: common/common.h:457).
AUTO_SLOTS = 4
#: --fit (on by default, common/common.h:478) may shrink an unset -c, never below 4096 (:480)
FIT_MIN_CTX = 4096
#: a switch's off values (common/arg.cpp:1334-1344)
_OFF = ("off", "disabled", "false", "0")
#: flags llama-server no longer takes at the pinned commit (their value counts in older
#: versions): read with a note (--mlock and --no-mmap became --load-mode, common/arg.cpp:2691)
_LEGACY = {"--no-mmap": 0, "--mlock": 0}


def ctx_pad(tokens: int) -> int:
    """GGML_PAD(tokens, 256): up to a multiple of 256."""
    return -(-int(tokens) // CTX_PAD_TOKENS) * CTX_PAD_TOKENS


def slot_context(ctx_size: int, slots: int, unified: bool) -> tuple[int, int]:
    """(n_ctx, n_ctx_seq): the KV cache's tokens and each slot's context, as llama.cpp sizes
    them from -c and -np (src/llama-context.cpp:290-305): n_ctx padded to 256; unified, each
    slot may use all of it; otherwise each slot gets n_ctx / slots padded up to 256 and the
    cache holds slots x that."""
    n_ctx = ctx_pad(ctx_size)
    if unified:
        return n_ctx, n_ctx
    per_slot = ctx_pad(n_ctx // slots)
    return per_slot * slots, per_slot


def _cpu_moe_layers(policy: Policy, ctx: Context) -> int:
    """MoE layers whose experts stay on the CPU (whole layers: --n-cpu-moe)."""
    layers = moe_layers(ctx)
    return layers if not policy.ffn_on_gpu else round((1.0 - policy.weights_gpu_ratio) * layers)


def _engine_runs(num_micro_batches: int) -> bool:
    """HRM's ``llama.cpp`` / ``llama.cpp-nkvo`` engines run one ubatch per step; policies of
    several ubatches are estimated with the plan's engine."""
    return num_micro_batches == 1


def _hrm_engine(policy: Policy) -> str | None:
    """KV cache and attention on the GPU: ``llama.cpp``; -nkvo (in host memory): ``llama.cpp-nkvo``."""
    if not _engine_runs(policy.num_micro_batches):
        return None
    return "llama.cpp" if policy.attn_on_gpu else "llama.cpp-nkvo"


def _layers_policy(policy: Policy, ctx: Context, cpu_layers: int, attn_gpu: bool) -> Policy | None:
    layers = moe_layers(ctx)
    rw = experts_gpu_ratio(cpu_layers, layers)
    fields = with_fields(policy, attn_on_gpu=attn_gpu, kv_gpu_ratio=1.0 if attn_gpu else 0.0, weights_gpu_ratio=rw)
    # the llama.cpp engine's ffn=gpu with r_w = share of GPU layers (r_w = 0: every layer's
    # experts computed on the CPU); elsewhere every layer on the CPU is ffn=cpu
    fields["ffn_on_gpu"] = rw > 0 or _engine_runs(fields["num_micro_batches"])
    return make_policy(**fields)


def _within_slots(policy: Policy) -> Policy:
    """The policy with at most LLAMA_MAX_SEQ sequences (slots): N and mu cut to 256, n kept
    where the cut N still holds whole micro-batches."""
    if policy.batch_size <= LLAMA_MAX_SEQ:
        return policy
    mu = min(policy.micro_batch_size, LLAMA_MAX_SEQ)
    n = LLAMA_MAX_SEQ // mu
    return make_policy(**with_fields(policy, batch_size=mu * n, micro_batch_size=mu, num_micro_batches=n)) or policy


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the KV cache is on the GPU whole (attention there) or, with -nkvo, in host memory
    # (attention on the CPU): rc is 1 or 0; at most 256 slots
    policy = _within_slots(policy)
    layers = moe_layers(ctx)
    counts = nearest_counts(layers if not policy.ffn_on_gpu else (1.0 - policy.weights_gpu_ratio) * layers)
    tiers = [True, False] if policy.attn_on_gpu and policy.kv_gpu_ratio < 1 else [policy.attn_on_gpu]
    return [p for p in (_layers_policy(policy, ctx, c, a) for a in tiers for c in counts) if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    if policy.batch_size > LLAMA_MAX_SEQ:
        raise HRMError(f"llama.cpp: N={policy.batch_size} slots: llama.cpp refuses more than {LLAMA_MAX_SEQ} "
                       "(n_seq_max, src/llama-cparams.h:7)")
    cpu_layers = _cpu_moe_layers(policy, ctx)  # exact for a policy from _nearest
    # --n-cpu-moe N matches blk.0 .. blk.N-1: dense first layers (DeepSeek) count as blocks
    blocks = cpu_layers + int(ctx.model.first_dense_layers) if cpu_layers else 0
    mu = policy.micro_batch_size
    out = {"-m": ["MODEL.gguf"],
           "-ngl": [str(int(ctx.model.num_layers) + 1)],  # every block and the output layer
           "--n-cpu-moe": [str(blocks)],
           "-np": [str(policy.batch_size)],
           "-c": [str(policy.batch_size * context_tokens(ctx))],  # the slots share -c
           # -ub above -b is cut to -b (src/llama-context.cpp:248): -b printed, never below -ub
           "-b": [str(max(DEFAULT_BATCH, mu))],
           "-ub": [str(mu)],
           "--fit": ["off"]}  # keep these values (--fit on would adjust unset ones to memory)
    # a KV stream per slot, never -kvu: one stream the slots share makes each query tile compute
    # every slot's cells (measured on the CPU, ground_truth.md §1.14; fattn-common.cuh:671-723 on
    # CUDA), which HRM's GPU engines do not price; a stream per slot costs its padding, which the
    # engines' memory counts (memory.kv_tokens_multiple)
    if not policy.attn_on_gpu:
        out["-nkvo"] = []
    return out


def _notes(policy: Policy, ctx: Context) -> list[str]:
    """What an export's KV cache is: a stream per slot, each padded to 256 tokens (the
    estimate's KV cache counts the padding: ``memory.kv_tokens_multiple`` of the llama.cpp engines)."""
    n, longest = policy.batch_size, context_tokens(ctx)
    total, per_slot = slot_context(n * longest, n, False)
    where = "in host memory (-nkvo)" if not policy.attn_on_gpu else "on the GPU"
    return [f"llama.cpp: a KV stream per slot (no -kvu: one stream the slots share would make every decode step's "
            f"attention compute every slot's cells, not priced on the GPU): each slot's context is padded to "
            f"{per_slot} tokens ({_CTX}:295-305), the KV cache {where} holds {total} tokens, "
            f"{total / (n * longest):.3g}x the plan's {n} x {longest}; the estimate counts the padding"]


# --- import --------------------------------------------------------------------------------

def ngl_word(values: dict[str, list[str]]) -> str:
    """-ngl as llama.cpp reads it: ``auto`` (absent, ``auto`` or -1), ``all`` (``all`` or -2 and
    below), else the number as given (common/arg.cpp:2787-2801; common/common.h:475)."""
    text = values.get("-ngl", ["auto"])[0].strip()
    try:
        number = int(text)
    except ValueError:
        return text
    return "auto" if number == -1 else "all" if number <= -2 else text


def _check_all_layers_on_gpu(values: dict[str, list[str]], model) -> list[str]:
    """-ngl below the layer count puts whole layers on the CPU: outside HRM's policy space."""
    text = ngl_word(values)
    if text == "auto":
        return [f"llama.cpp: -ngl auto (the default, {_ARG}:2787-2801): every layer on the GPU where it fits, else "
                "--fit (on by default) moves the first layers' experts to the CPU (hrm import estimates that placement)"]
    if text != "all":
        ngl = int_value(values, "-ngl", LAYERS)
        if ngl < model.num_layers:
            raise HRMError(f"-ngl {ngl}: {model.num_layers - ngl} whole layers on the CPU are outside HRM's "
                           f"policy space (give -ngl {model.num_layers + 1} or all)")
    return []


def _slots(values: dict[str, list[str]]) -> tuple[int, bool]:
    """(slots, unified KV): -np (absent or -1: 4 slots, unified; at most 256), -kvu / -no-kvu."""
    text = values.get("-np", ["-1"])[0]
    try:
        np_value = int(text)
    except ValueError:
        raise HRMError(f"-np {shown_word(text)}: expected an integer") from None
    if np_value > LLAMA_MAX_SEQ:
        raise HRMError(f"-np {shown_word(text)}: llama.cpp refuses more than {LLAMA_MAX_SEQ} slots at start-up "
                       f"(n_seq_max must be <= {LLAMA_MAX_SEQ}: src/llama-cparams.h:7, {_CTX}:100-103)")
    auto = np_value == -1
    slots = AUTO_SLOTS if auto else bounds.SEQUENCES.check(np_value, "-np")
    unified = ("-kvu" in values or auto) and "-no-kvu" not in values
    return slots, unified


def _users(values: dict[str, list[str]], slots: int) -> int:
    """The sequences decoded together: -np's slots when -np is given, else one user at batch 1
    (the server's auto slots, tools/server/server.cpp:156-160, wait for requests a single user
    does not send; llama-cli runs one sequence, common/common.h:457 n_parallel = 1)."""
    return slots if "-np" in values and values["-np"][0] != "-1" else 1


def _ctx_size(values: dict[str, list[str]], ctx: Context) -> int:
    """-c (absent or 0: the model's training context, n_ctx_train)."""
    size = int_value(values, "-c", CONTEXT, 0)
    if size:
        return size
    if ctx.model.max_context_len is None:  # llama.cpp takes n_ctx_train from the GGUF; HRM's config states none
        raise HRMError(f"llama.cpp: no -c (or -c 0) runs the model's training context, and {ctx.model.name}'s config "
                       "states none (max_position_embeddings): give -c")
    return int(ctx.model.max_context_len)


def kv_context(values: dict[str, list[str]], ctx: Context) -> tuple[int, int]:
    """(n_ctx, n_ctx_seq): the KV cache's tokens and each slot's context as llama.cpp sizes them
    for the command (:func:`slot_context`): -c as given; with no -c (or -c 0) the model's trained
    context, which --fit (on by default) gives to every KV stream — one when unified, else one per
    slot (common/fit.cpp:197, 267-272; then shrunk to fit memory, not below FIT_MIN_CTX a stream) —
    and --fit off gives once, split among the slots (src/llama-context.cpp:290-305)."""
    slots, unified = _slots(values)
    size = _ctx_size(values, ctx)
    return slot_context(size * slots if fit_sizes_context(values) and not unified else size, slots, unified)


def fit_sizes_context(values: dict[str, list[str]]) -> bool:
    """No -c (or -c 0) and --fit on, its default (common/common.h:478): --fit sizes the context."""
    return int_value(values, "-c", CONTEXT, 0) == 0 and values.get("--fit", ["on"])[0].lower() not in _OFF


def slot_limit(per_slot: int, model) -> int:
    """The tokens one request may hold: its slot's context, capped at the model's trained context
    (server-context.cpp:4007-4015)."""
    train = model.max_context_len
    return min(per_slot, int(train)) if train else per_slot


def command_workload(values: Optional[dict[str, list[str]]], ctx: Context):
    """The workload a command serves: the HRM workload when every slot's context holds its
    longest sequence (and, with a shared KV cache, all slots' together), else a one-line
    refusal naming -c. An export (``values`` None) runs the plan's workload."""
    workload = ctx.workload
    if values is None:
        return workload
    predict = int_value(values, "-n", bounds.GEN_TOKENS_OR_UNLIMITED, -1)
    if predict > 0:  # -n N: each request generates N tokens (common/arg.cpp:1657-1667; -1 infinity, -2 context filled)
        workload = workload.model_copy(update={"gen_len": predict})
        ctx = ctx.model_copy(update={"workload": workload})
    slots, unified = _slots(values)
    size = _ctx_size(values, ctx)
    total, per_slot = kv_context(values, ctx)
    limit = slot_limit(per_slot, ctx.model)
    longest = context_tokens(ctx)
    if longest > limit:
        given = f"-c {size}" if int_value(values, "-c", CONTEXT, 0) else f"no -c (the model's {size} tokens)"
        raise HRMError(f"llama.cpp: {given} with {slots} slots gives each {limit} tokens of context "
                       f"({_CTX}:290-305), below the workload's longest sequence, --max-prompt-len + --gen-len = "
                       f"{longest}: the server rejects those requests; give -c {ctx_pad(slots * longest)} or a "
                       "shorter workload")
    users = _users(values, slots)
    if unified and users * longest > total:
        raise HRMError(f"llama.cpp: the {users} slots share one KV cache of {total} tokens (-c {size}, unified), below "
                       f"{users} x {longest} for the workload's longest sequences: requests fail with the context "
                       f"exceeded; give -c {users * longest} or more")
    return workload


def _batch_notes(values: dict[str, list[str]], slots: int, n_ctx: int) -> tuple[int, list[str]]:
    """(the ubatch llama.cpp runs, notes): -ub cut to -b, -b cut to the context (causal
    attention) (src/llama-context.cpp:246-248)."""
    b = int_value(values, "-b", bounds.SEQUENCES, DEFAULT_BATCH)
    ub = int_value(values, "-ub", bounds.SEQUENCES, DEFAULT_UBATCH)
    b_run = min(b, n_ctx)
    ub_run = min(ub, b_run)
    notes = [f"llama.cpp: -ub {ub} above -b {b_run}: llama.cpp runs ubatches of {ub_run} ({_CTX}:246-248)"] \
        if ub_run < ub else []
    mu = min(ub_run, slots)
    if slots > b_run and b_run % mu:
        raise HRMError(f"-b {b_run} is not a multiple of -ub {mu}: the server splits a step of {slots} tokens into "
                       "uneven ubatches (tools/server/server-context.cpp:2848-2856)")
    return mu, notes


def _legacy_notes(values: dict[str, list[str]]) -> list[str]:
    notes = [f"llama.cpp: {flag}: an older llama-server's switch (the pinned version has --load-mode instead, "
             f"{_ARG}:2691); no policy field" for flag in _LEGACY if flag in values]
    if values.get("-fa") == []:
        notes.append(f"llama.cpp: bare -fa: an older llama-server's switch; the pinned version takes -fa on|off|auto "
                     f"({_ARG}:1754)")
    return notes


#: a local GGUF file name that names no model (llama.cpp's own examples: models/7B/ggml-model.gguf)
GENERIC_GGUF_NAME = re.compile(r"(?i)^(ggml-)?model([-_.][^/]*)?\.gguf$")


#: GGUF file-name quant tags: llama-quantize's mixture names (tools/quantize/quantize.cpp) as the
#: weight format of their main type, and every ggml type HRM has a weight format for by its own
#: name (Q6_K, IQ1_S, MXFP4, ...); the weight dtype follows the format
#: (:func:`hrm.model.quantized.quantized_dtype`, as a GGUF header read would give)
GGUF_NAME_FORMATS = {
    "Q4_K_M": "q4_k_m", "Q4_K_S": "q4_k", "Q5_K_M": "q5_k", "Q5_K_S": "q5_k",
    **{name.upper(): name for name in WEIGHT_FORMATS if name.upper() in GGML_BLOCKS},
}


def model_files(command: str) -> list[str]:
    """The model files a command's -m / --model (or --model=) name, in order; none when it cannot
    be split."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return []
    return [words[i + 1] if word in ("-m", "--model") else word.split("=", 1)[1]
            for i, word in enumerate(words)
            if (word in ("-m", "--model") and i + 1 < len(words)) or word.startswith("--model=")]


def gguf_name_format(command: str) -> tuple[str, str, str] | None:
    """(tag, weight dtype, weight format) of the GGUF a command's -m names by its file name
    (``Qwen3-30B-A3B-Q4_K_M.gguf``: Q4_K_M -> int4, q4_k_m); None without one."""
    for name in model_files(command):
        base = name.rstrip("/").split("/")[-1].upper()
        for tag in sorted(GGUF_NAME_FORMATS, key=len, reverse=True):
            if re.search(rf"(?<![A-Z0-9]){tag}(?![A-Z0-9_])", base.replace(".GGUF", "")):
                return tag, quantized_dtype(GGUF_NAME_FORMATS[tag]), GGUF_NAME_FORMATS[tag]
    return None


def gguf_model_notes(path, ctx: Context) -> list[str]:
    """A local GGUF matched against the model being planned by its header (hrm.model.gguf.read_gguf):
    the block count and the routed expert count and top-k must agree (one-line refusal
    otherwise), whatever the file is called."""
    from ..model.gguf import read_gguf

    arch, meta, _ = read_gguf(path)
    m = ctx.model
    facts = {"layers": (meta.get(f"{arch}.block_count"), int(m.num_layers)),
             "experts": (meta.get(f"{arch}.expert_count"), int(m.num_experts)),
             "top-k": (meta.get(f"{arch}.expert_used_count"), int(m.top_k))}
    wrong = [f"{k} {int(v[0])} vs {v[1]}" for k, v in facts.items() if v[0] is not None and int(v[0]) != v[1]]
    if wrong:
        raise HRMError(f"llama.cpp: -m {path.name}: its GGUF header ({arch}) is not {m.name} ({', '.join(wrong)}); give "
                       "HRM's --model the file's own model")
    return [f"llama.cpp: -m {path.name}: its GGUF header ({arch}: {facts['layers'][0]} blocks, "
            f"{facts['experts'][0]} experts, top-{facts['top-k'][0]}) matches {m.name}"]


def _model_notes(values: dict[str, list[str]], ctx: Context, priced_from_file: bool = False) -> list[str]:
    """Refuse (one line) a model the command names that is not the model being planned — a
    Hugging Face repo (-hf) or a GGUF file (-m) named after another model, as every target
    does (:func:`served_model_notes`); note a file whose name names no model, and a quantised
    file (the estimate is for the model's own weight type) unless ``priced_from_file`` (the CPU
    step model reads the file's own tensor types)."""
    flag = "-m" if values.get("-m") else "-hf"
    named = (values.get("-m") or values.get("-hf") or [None])[0]
    if named is None or named == "MODEL.gguf":
        return []
    base = named.rstrip("/").split("/")[-1].lower()
    if flag == "-m" and base.endswith(".gguf"):
        from pathlib import Path

        path = Path(named).expanduser()
        if path.is_file():  # the file is here: match it by what it is, not by its name
            return gguf_model_notes(path, ctx)
    if flag == "-m" and (GENERIC_GGUF_NAME.match(base) or set(base) <= {"."}):  # "-m ...": a path left out
        return [f"llama.cpp: {named}: the file's name names no model: read as {ctx.model.name}"]
    served_model_notes(named, ctx, "llama.cpp", flag)
    quant = re.search(r"(?i)(?<![a-z0-9])i?q\d(_[a-z0-9]+)*", base)
    if quant and ctx.model.weight_format is None and not priced_from_file:
        return [f"llama.cpp: {named}: {quant.group(0).upper()} weights; the estimate is for "
                f"{ctx.model.weight_dtype}"]
    return []


#: ik_llama.cpp's own flags (ikawrakow/ik_llama.cpp@8337e4cd common/common.cpp): -rtr repacks
#: tensors at load (:2225), -amb caps attention's compute buffer (:1964), -mla picks its MLA kernel
#: (:1942); -fmoe (fused up/gate experts) is its older switch, on by default there (-no-fmoe,
#: :1973). ggml-org/llama.cpp@0c1e5709 has none of them (common/arg.cpp), and HRM's llama.cpp
#: engines model ggml-org's kernels: refused in one line rather than read as llama.cpp's
IK_LLAMA_FLAGS = {"-rtr": ":2225 run-time repack", "--run-time-repack": ":2225 run-time repack",
                  "-fmoe": ":1973 fused MoE", "--fused-moe": ":1973 fused MoE", "-amb": ":1964 attention max batch",
                  "--attention-max-batch": ":1964 attention max batch", "-mla": ":1942 MLA kernel",
                  "--mla-use": ":1942 MLA kernel"}


def _refuse_unmodelled(values: dict[str, list[str]], ctx: Context) -> None:
    """One line for ik_llama.cpp's flags and for --numa on a machine of several NUMA nodes (the
    engine places no memory per node: numa_aware false in hrm/data/engines/llama.cpp.yaml)."""
    ik = [f for f in values if f in IK_LLAMA_FLAGS]
    if ik:
        f = ik[0]
        raise HRMError(f"llama.cpp: {f}: an ik_llama.cpp flag (ikawrakow/ik_llama.cpp@8337e4cd common/common.cpp"
                       f"{IK_LLAMA_FLAGS[f]}), not ggml-org/llama.cpp's; HRM's llama.cpp engines model ggml-org's "
                       "kernels, not ik_llama.cpp's: drop it to estimate the command as llama.cpp runs it")
    if "--numa" in values:
        nodes = getattr(getattr(ctx.hardware, "cpu", None), "numa_nodes", None) or 1
        if nodes > 1:
            raise HRMError(f"llama.cpp: --numa {values['--numa'][0]}: the profile has {nodes} NUMA nodes and HRM's "
                           "llama.cpp engine does not model where threads and host buffers sit across them "
                           f"(--numa only places threads, {_ARG}:2723-2736; numa_aware false); drop --numa, or "
                           "plan with a one-node profile")


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    model = ctx.model
    _refuse_unmodelled(values, ctx)
    notes = _model_notes(values, ctx) + _check_all_layers_on_gpu(values, model)
    slots, unified = _slots(values)
    n_ctx, _ = kv_context(values, ctx)
    if "-np" not in values:
        notes.append(f"llama.cpp: no -np: one user at batch 1 (a server's {AUTO_SLOTS} auto slots share one KV cache, "
                     "tools/server/server.cpp:156-160, and wait for parallel requests; llama-cli decodes one sequence, "
                     "common/common.h:457); give -np N for N parallel users")
    slots = _users(values, slots)
    if unified and slots > 1:
        where = "the CPU's (-nkvo)" if "-nkvo" in values else "the GPU's"
        notes.append(f"llama.cpp: -kvu with {slots} slots: one KV stream, each decode step's tokens interleaved in it, so "
                     f"{where} flash attention computes every slot's cells for each token (measured on the CPU: 1.2-2.9x "
                     "the decode of a stream per sequence at 64, docs/validation/ground_truth.md §1.14; CUDA: "
                     "ggml-cuda/fattn-common.cuh:671-723); not priced here: drop -kvu for a stream per slot, whose "
                     "256-token padding the estimate counts")
    if int_value(values, "-c", CONTEXT, 0) == 0:
        fit_off = values.get("--fit", ["on"])[0].lower() in _OFF
        per = ("" if fit_off or unified else
               f" for each of the {_slots(values)[0]} slots' KV streams "
               "(--fit, common/fit.cpp:197,267-272)")
        notes.append(f"llama.cpp: no -c (or -c 0): the model's context, {model.max_context_len} tokens{per}" +
                     ("" if fit_off else f"; --fit (on by default) may shrink it to fit memory, not below {FIT_MIN_CTX}"))
    mu, batch_notes = _batch_notes(values, slots, n_ctx)
    if slots % mu:
        raise HRMError(f"-np {slots} is not a multiple of -ub {mu}: HRM's batch is N = mu x n micro-batches")
    cpu_layers = len(cpu_blocks(values, ctx))
    policy = _layers_policy(Policy(batch_size=slots, micro_batch_size=mu, num_micro_batches=slots // mu), ctx,
                            cpu_layers, "-nkvo" not in values)
    return policy, notes + batch_notes + _legacy_notes(values)


def thread_count(values: dict[str, list[str]], flags: tuple[str, ...]) -> Optional[int]:
    """The thread count the first of ``flags`` given sets; None when none is, or -1 (llama.cpp's
    own count: common/common.cpp:144-145). One line for anything but a positive count or -1."""
    for flag in flags:
        if flag in values:
            text = values[flag][0]
            if not re.fullmatch(r"-?\d+", text) or int(text) == 0 or int(text) < -1:
                raise HRMError(f"llama.cpp: {flag} {text}: a positive thread count (or -1)")
            return None if int(text) == -1 else int(text)
    return None


def cpu_threads_field(values: dict[str, list[str]], ctx: Context) -> dict:
    """-t N: the threads the CPU-kept experts run on (common/arg.cpp:1516; -1, the default,
    leaves llama.cpp's own count)."""
    threads = thread_count(values, ("-t", "--threads"))
    return {} if threads is None else {"cpu_threads": threads}


def prefill_pass_tokens(values: dict[str, list[str]], ctx: Context) -> int:
    """The prompt tokens one forward pass takes: n_ubatch = min(-ub, n_batch), n_batch =
    min(-b, n_ctx) (src/llama-context.cpp:246-248), -b 2048 and -ub 512 when absent
    (common/common.h:454-455). A prompt runs in ceil(tokens / it) ubatches, each copying the
    used experts of the CPU layers to the GPU again (ggml/src/ggml-backend.cpp:1709-1775)."""
    slots, unified = _slots(values)
    n_ctx, _ = kv_context(values, ctx)
    b_run = min(int_value(values, "-b", bounds.SEQUENCES, DEFAULT_BATCH), n_ctx)
    return min(int_value(values, "-ub", bounds.SEQUENCES, DEFAULT_UBATCH), b_run)


def gpu_split_fields(values: dict[str, list[str]], ctx: Context) -> dict:
    """How the command uses the profile's GPUs: -sm layer (the default, common/common.h:485)
    runs each GPU's block of layers in turn (the engine's ``gpu_split: layers``); -sm row or
    tensor split each weight across them (``gpu_split: tensor``, common/arg.cpp:2807-2822)."""
    mode = values.get("-sm", ["layer"])[0]
    if mode == "none" and ctx.gpu_count > 1:
        raise HRMError(f"llama.cpp: -sm none runs on one GPU only ({_ARG}:2807-2822); the profile has "
                       f"{ctx.gpu_count}: plan with a one-GPU profile")
    return {"gpu_split": "tensor"} if mode in ("row", "tensor") else {}


def command_engine_fields(values: dict[str, list[str]], ctx: Context) -> dict:
    """The engine fields a llama-server / llama-cli command sets: -t (:func:`cpu_threads_field`),
    the prompt's pass (-ub, -b: ``prefill.max_tokens_per_pass``, :func:`prefill_pass_tokens`)
    and the GPU split (-sm: :func:`gpu_split_fields`)."""
    unified = {"memory.kv_tokens_multiple": 1} if _slots(values)[1] else {}  # one stream: no per-slot padding
    return {**cpu_threads_field(values, ctx), "prefill.max_tokens_per_pass": prefill_pass_tokens(values, ctx),
            **gpu_split_fields(values, ctx), **unified}


def _switch(flag: str, aliases: tuple[str, ...], field: str, lines: str) -> FlagSpec:
    return FlagSpec(flag=flag, aliases=aliases, policy_field=field, values=0, source=f"{_ARG}:{lines}")


def fit_margins(values: dict[str, list[str]], ctx: Context) -> Optional[float]:
    """The free memory llama.cpp's --fit (on by default, common/common.h:478) leaves on the GPUs
    when it places the weights (:func:`fit_margins_bytes`), None when the command places them:
    -ngl given (not auto) or a tensor placement (-ts, -ot, --n-cpu-moe, --cpu-moe), where
    common/fit.cpp:463-485 aborts the fit."""
    if values.get("--fit", ["on"])[0].lower() in _OFF or ngl_word(values) != "auto":
        return None
    if any(flag in values for flag in ("--n-cpu-moe", "-cmoe", "-ot", "-ts", "--tensor-split")):
        return None
    gpus = ctx.hardware.gpu.count if ctx.hardware is not None and ctx.hardware.gpu is not None else 1
    return fit_margins_bytes(values, gpus)


def fit_margins_bytes(values: dict[str, list[str]] | None, gpus: int) -> float:
    """The free memory --fit leaves on the GPUs together: FIT_TARGET_BYTES each, or --fit-target's
    MiB (one value for every device, or one per device: common/arg.cpp:2895-2919)."""
    text = (values or {}).get("--fit-target")
    if not text:
        return gpus * FIT_TARGET_BYTES
    mib = [int(v) for v in re.split(r"[,/]+", text[0]) if v]
    per_gpu = mib * gpus if len(mib) == 1 else (mib + [FIT_TARGET_BYTES // 2**20] * gpus)[:gpus]
    return sum(per_gpu) * 2**20


def fit_target_limits(limits, margins_bytes: float):
    """The memory --fit fills: the GPUs' less their free-memory margins (:func:`fit_margins_bytes`;
    common/fit.cpp:648-652 targets = free - margins)."""
    from ..cost.memory import MemoryLimits

    return MemoryLimits(limits.gpu_bytes - margins_bytes, limits.cpu_bytes, limits.shared)


def fitted_cpu_layers(estimate_with, layers: int, limits, margins_bytes: float) -> Optional[int]:
    """The experts of how many MoE layers --fit leaves on the CPU: the fewest whole layers (the
    first ones, as --n-cpu-moe places them) that leave each GPU its margin (:func:`fit_target_limits`).
    The fit fills the GPUs back to front with the dense weights, then with the experts
    (common/fit.cpp:664-760), so the GPU keeps the last layers' experts; a partly placed layer
    (its overflow) is counted whole. ``estimate_with(cpu_layers)`` is the estimate of that
    placement. None: even every layer's experts on the CPU leave too little (the fit would move
    dense weights too, outside HRM's policy space)."""
    target = fit_target_limits(limits, margins_bytes)
    for cpu_layers in range(layers + 1):
        if estimate_with(cpu_layers).fits(target):
            return cpu_layers
    return None


LLAMA_CPP = EngineFlags(
    name="llama.cpp", version=LLAMA_CPP_VERSION, programs=("llama-server",),
    # "server" was llama-server's name before ggml-org/llama.cpp PR #7809 (June 2024), with the
    # same -m/-c/-np/-ngl/-ub flags; "main" (now llama-cli) runs one prompt and has no slots
    # llama-cli (named main before PR #7809) takes the same model, placement and batch flags
    # (common/arg.cpp) and decodes one sequence: read as one user at batch 1 (_users)
    # llama-completion is the pinned version's one-prompt program (tools/completion, the old main)
    import_programs=("llama-server.exe", "server", "server.exe", "llama-cli", "llama-cli.exe", "main", "main.exe",
                     "llama-completion", "llama-completion.exe"),
    engines=("llama.cpp", "llama.cpp-nkvo"), hrm_engine=_hrm_engine,
    description="llama.cpp llama-server: experts kept on the CPU per whole layer, KV on the GPU or the host",
    flags=(
        FlagSpec(flag="-m", aliases=("--model",), policy_field="(model)", value_form=r"\S+", source=f"{_ARG}:3035"),
        FlagSpec(flag="-hf", aliases=("-hfr", "--hf-repo"), policy_field="(model)", value_form=r"\S+",
                 source=f"{_ARG}:3060"),
        FlagSpec(flag="-ngl", aliases=("--gpu-layers", "--n-gpu-layers"), policy_field="(all layers on the GPU)",
                 value_form=r"-?\d+|all|auto", source=f"{_ARG}:2787-2801"),
        FlagSpec(flag="--n-cpu-moe", aliases=("-ncmoe",), policy_field="weights_gpu_ratio, ffn_on_gpu (whole layers)",
                 source=f"{_ARG}:2766-2775; common/common.h:1198-1217"),
        _switch("-cmoe", ("--cpu-moe",), "ffn_on_gpu (all experts on the CPU)", "2759-2765"),
        FlagSpec(flag="-ot", aliases=("--override-tensor",), policy_field="weights_gpu_ratio (first match, =CPU)",
                 value_form=r"[^,]+=[A-Za-z0-9_]+(,[^,]+=[A-Za-z0-9_]+)*", repeatable=True,
                 source=f"{_ARG}:2753-2758,252-284; src/llama-model-loader.cpp:1235-1259"),
        _switch("-nkvo", ("--no-kv-offload",), "attn_on_gpu, kv_gpu_ratio (KV in host memory)", "2413-2420"),
        _switch("-nr", ("--no-repack",), "(none beside a GPU: the CPU experts sit in the GPU's host buffer, "
                "never repacked, src/llama-model.cpp make_cpu_buft_list)", "2421-2428"),
        _switch("-kvu", ("--kv-unified",), "(the slots share one KV cache)", "1723-1730"),
        _switch("-no-kvu", ("--no-kv-unified",), "(a KV cache per slot)", "1723-1730"),
        FlagSpec(flag="-np", aliases=("--parallel",), policy_field="batch_size (server slots, <= 256)",
                 source=f"{_ARG}:2544-2552,1403"),
        FlagSpec(flag="-ub", aliases=("--ubatch-size",), policy_field="micro_batch_size (cut to -b)",
                 source=f"{_ARG}:1675-1681"),
        FlagSpec(flag="-b", aliases=("--batch-size",), policy_field="(logical batch >= -ub)",
                 source=f"{_ARG}:1668-1674"),
        FlagSpec(flag="-sm", aliases=("--split-mode",), policy_field="gpu_split (layer: in turn; row, tensor: at once)",
                 value_form=r"none|layer|row|tensor", source=f"{_ARG}:2807-2822"),
        FlagSpec(flag="-c", aliases=("--ctx-size",), policy_field="(workload: each slot's context)",
                 source=f"{_ARG}:1638-1648"),
        FlagSpec(flag="-n", aliases=("--predict", "--n-predict"), policy_field="(workload: tokens generated per request)",
                 value_form=r"-?\d+", source=f"{_ARG}:1657-1667"),
        FlagSpec(flag="--fit", aliases=("-fit",), policy_field="(off: keep the given values)",
                 value_form=r"on|off|enabled|disabled|true|false|1|0", source=f"{_ARG}:2867-2880,1334-1340"),
        FlagSpec(flag="--fit-target", aliases=("-fitt",), policy_field="(--fit's free margin per GPU, MiB)",
                 value_form=r"\d+([,/]\d+)*", source=f"{_ARG}:2895-2919"),
        FlagSpec(flag="--fit-ctx", aliases=("-fitc",), policy_field="(the least context --fit sets)",
                 value_form=r"\d+", source=f"{_ARG}:2920-2926"),
        FlagSpec(flag="-fa", aliases=("--flash-attn",), policy_field="(none: flash attention)",
                 value_form=r"on|off|auto|enabled|disabled|true|false|1|0", until_next_flag=True,
                 source=f"{_ARG}:1754-1765"),
    ),
    # flags with no policy field and their value counts (common/arg.cpp: a flag with a value
    # hint takes one token, a switch none)
    passthrough={**HTTP_SERVER_FLAGS, **_LEGACY, "-t": 1, "--threads": 1, "-tb": 1, "--threads-batch": 1,
                 "-ctk": 1, "--cache-type-k": 1, "-ctv": 1, "--cache-type-v": 1, "--jinja": 0,
                 "--temp": 1, "--temperature": 1, "--top-k": 1, "--top-p": 1, "--min-p": 1, "--repeat-penalty": 1,
                 "-s": 1, "--seed": 1, "-ts": 1, "--tensor-split": 1, "--ignore-eos": 0,
                 "-mg": 1, "--main-gpu": 1, "-dev": 1, "--device": 1,
                 "-a": 1, "--alias": 1, "--api-key": 1, "--chat-template": 1, "--reasoning-format": 1,
                 "-cb": 0, "--cont-batching": 0, "--metrics": 0, "--no-warmup": 0, "-v": 0, "--verbose": 0,
                 "--numa": 1, "--log-file": 1,
                 # --repack: repacking on, llama.cpp's default (the positive form of -nr, common/arg.cpp:2421-2428)
                 "--repack": 0, "-lm": 1, "--load-mode": 1, "-kvo": 0, "--kv-offload": 0,
                 "-mm": 1, "--mmproj": 1,
                 # llama-cli's own (common/arg.cpp:1770 -p, 1777 -sys, 1801 -f, 1902-1903 -cnv/-no-cnv,
                 # 1913 -st, 1922 -i): the prompt and chat mode, no policy field
                 "-p": 1, "--prompt": 1, "-sys": 1, "--system-prompt": 1, "-f": 1, "--file": 1, "-cnv": 0,
                 "--conversation": 0, "-no-cnv": 0, "--no-conversation": 0, "-st": 0, "--single-turn": 0,
                 "-i": 0, "--interactive": 0,
                 # ik_llama.cpp's, refused in one line by _parse (IK_LLAMA_FLAGS)
                 "-rtr": 0, "--run-time-repack": 0, "-fmoe": 0, "--fused-moe": 0, "-amb": 1,
                 "--attention-max-batch": 1, "-mla": 1, "--mla-use": 1},
    caveats=("re-estimated with HRM's llama.cpp engine (llama.cpp-nkvo with -nkvo: experts of CPU layers run on the "
             "CPU below 32 tokens per ubatch, their used experts copied to the GPU above) when one ubatch holds "
             "the batch; several ubatches are estimated with the plan's engine",
             "-ub is also the prefill chunk: a small micro-batch slows the prompt phase"),
    workload=command_workload, notes=_notes, nearest=_nearest, render=_render, parse=_parse,
    engine_fields=command_engine_fields, fit_margins=fit_margins,
)


#: flags that place layers, tensors or the KV cache on a GPU: on a CPU-only machine nothing moves
_GPU_PLACEMENT_FLAGS = ("-ngl", "--n-cpu-moe", "-cmoe", "-ot", "-nkvo", "-sm", "-ts", "--tensor-split", "-mg",
                        "--main-gpu", "-dev", "--device")


@dataclass(frozen=True)
class CpuOnlyRun:
    """A llama-server / llama-cli command on a machine without a GPU, as the CPU step model
    (:mod:`hrm.cost.ggml_cpu`) runs it: ``run`` (its sequences, threads, batch sizes, buffer),
    the KV cache's tokens llama.cpp allocates (``kv_tokens``: -c as sized for the slots), the
    workload the command serves, and notes on what it reads differently from a GPU machine;
    ``slots``: the server's slots (-np; 4 when absent, tools/server/server.cpp:156-160), which a
    load's requests share (:func:`serve_cpu_only`)."""

    run: object
    kv_tokens: int
    workload: object
    notes: tuple[str, ...]
    slots: int = 1


def cpu_only_run(values: dict[str, list[str]], program: str, model, workload, hardware,
                 default_threads: int) -> CpuOnlyRun:
    """A llama-server / llama-cli command on a CPU-only machine: one step-model run of the
    workload's prompt then its generated tokens for each user (-np slots, else one user:
    :func:`_users`), on -t threads for one-token steps and -tb for larger ones (absent or -1:
    ``default_threads``; -tb defaults to -t, common/common.h cpuparams_batch), ubatches of
    min(-ub, -b, n_ctx) (:func:`prefill_pass_tokens`), a KV stream per slot unless unified
    (:func:`_slots`), weights repacked unless -nr. The GPU placement flags place nothing here.
    ``values``: the command's flags as the llama.cpp target reads them (:func:`hrm.export.importing.split_flags`);
    ``program``: the program that runs them (llama-server, llama-cli ...)."""
    from .llama_tools import ToolRun

    ctx = Context(model=model, workload=workload, hardware=hardware)
    _refuse_unmodelled(values, ctx)
    notes = _model_notes(values, ctx, priced_from_file=True)
    served = command_workload(values, ctx)
    ctx = ctx.model_copy(update={"workload": served})
    slots, unified = _slots(values)
    users = _users(values, slots)
    n_ctx, _ = kv_context(values, ctx)
    threads = thread_count(values, ("-t", "--threads")) or default_threads
    threads_batch = thread_count(values, ("-tb", "--threads-batch")) or threads
    ub = prefill_pass_tokens(values, ctx)
    b = max(min(int_value(values, "-b", bounds.SEQUENCES, DEFAULT_BATCH), n_ctx), ub)
    placed = [f for f in _GPU_PLACEMENT_FLAGS if f in values]
    if placed:
        notes.append(f"llama.cpp: {', '.join(placed)}: the profile has no GPU, so every layer and the KV cache stay on "
                     "the CPU (llama.cpp places nothing without a GPU backend)")
    if "-np" not in values:
        notes.append("llama.cpp: no -np: one user at batch 1 (give -np N for N parallel users)")
    kv_types = {values[f][0].lower() for f in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v") if f in values}
    if kv_types - {"f16"}:
        notes.append(f"llama.cpp: a {'/'.join(sorted(kv_types))} KV cache: the CPU step model prices an f16 cache "
                     "(hrm.cost.ggml_cpu.KV_ELEMENT_TYPE), as measured")
    if values.get("-fa", ["auto"])[0].lower() in _OFF:
        notes.append("llama.cpp: -fa off: the CPU step model prices flash attention (llama.cpp's default -fa auto "
                     "runs it on the CPU backend)")
    prompt, gen = int(served.effective_prompt_len), int(served.gen_len)
    # the first token is sampled from the prompt's logits and the last is never decoded: a request
    # of N tokens runs N - 1 decode steps (tools/completion/completion.cpp:544,642-648,667-683)
    run = ToolRun(program, values.get("-m", ["MODEL.gguf"])[0], threads, threads_batch, prompt, gen - 1, users, 0, b,
                  ub, unified, False, f"{users} x (pp{prompt} + {gen} generated)", repack="-nr" not in values)
    return CpuOnlyRun(run, n_ctx, served, tuple(notes), slots)


@dataclass(frozen=True)
class CpuOnlyEstimate:
    """A llama-server / llama-cli command on a machine without a GPU: the run it serves, its
    predicted times (:class:`hrm.cost.ggml_cpu.RunTimes`), and the bytes llama.cpp holds in the
    machine's memory for it (the weights, and the KV cache of ``kv_tokens``; compute buffers not
    counted), against the machine's memory."""

    served: CpuOnlyRun
    times: object
    memory_bytes: float
    fits: bool


#: --fit's free-memory target per device, the host's when there is no GPU (common/common.h:483:
#: 1024 MiB; --fit-target overrides it)
FIT_TARGET_BYTES = 1024 * 2**20


def fit_min_ctx(values: dict[str, list[str]]) -> int:
    """The least context --fit sets a KV stream: --fit-ctx, else FIT_MIN_CTX (common/arg.cpp:2920-2926)."""
    text = values.get("--fit-ctx")
    return int(text[0]) if text else FIT_MIN_CTX


def fitted_kv_tokens(values: dict[str, list[str]], run, weight_bytes: float, kv_bytes_per_token: float,
                     memory_bytes: float, kv_tokens: int) -> tuple[int, list[str]]:
    """The KV cache's tokens llama.cpp allocates on a machine without a GPU, from ``kv_tokens``
    (:func:`kv_context`: -c as given, or, where --fit sizes the context, the trained context per KV
    stream): --fit's host step shrinks the latter when the weights and that cache leave less than
    its margin of the host's memory (:func:`fit_margins_bytes`), linearly toward --fit-ctx per stream
    (common/fit.cpp:317-327, 393-432), in steps of 256 per stream. Compute buffers are not
    counted here, as nowhere in this estimate."""
    if not fit_sizes_context(values):
        return kv_tokens, []
    streams = 1 if run.kv_unified else run.sequences
    n_max, n_min = kv_tokens, fit_min_ctx(values) * streams
    margin = fit_margins_bytes(values, 1)
    target = memory_bytes - margin
    used_max, used_min = weight_bytes + kv_bytes_per_token * n_max, weight_bytes + kv_bytes_per_token * n_min
    if used_max <= target or n_max <= n_min:
        return n_max, [f"llama.cpp: no -c: --fit (on by default) gives each of {streams} KV stream(s) the model's "
                       f"context, {n_max} tokens in all (common/fit.cpp:267-272)"]
    n = n_min + int((n_max - n_min) * max(target - used_min, 0) / (used_max - used_min))
    align = 256 * streams
    n = max(n - n % align, n_min)
    return n, [f"llama.cpp: no -c: --fit (on by default) shrinks the context from {n_max} to {n} tokens to leave "
               f"{margin / 2**20:,.0f} MiB of the machine's memory (common/fit.cpp:380-432)"]


def estimate_cpu_only(values: dict[str, list[str]], program: str, model, workload, hardware,
                      inventory) -> CpuOnlyEstimate:
    """:func:`cpu_only_run` on the CPU step model, from ``inventory`` (the GGUF's tensors) and the
    profile's measured ggml kernels; llama.cpp's default threads are the profile's (its
    ``ggml_cpu.default_threads``, else its cores)."""
    from ..cost.ggml_cpu import kv_bytes_per_token, resident_bytes
    from ..units import GIB
    from .llama_tools import predict, unified_stream_note

    section = hardware.ggml_cpu
    if section is None:
        raise HRMError(f"--hw {hardware.name}: no ggml_cpu section: measure this machine's llama.cpp kernels with "
                       "hrm profile --llama-cpp DIR")
    served = cpu_only_run(values, program, model, workload, hardware,
                          section.default_threads or int(hardware.cpu.cores))
    per_token, host = kv_bytes_per_token(inventory), hardware.cpu.memory_gib * GIB
    kv_tokens, fit_notes = fitted_kv_tokens(values, served.run, inventory.weight_bytes, per_token, host,
                                            served.kv_tokens)
    served = replace(served, kv_tokens=kv_tokens, notes=served.notes + tuple(fit_notes))
    run, longest = served.run, context_tokens(Context(model=model, workload=served.workload))
    # a stream per slot holds one sequence, a unified cache all of them: either way users x longest
    if fit_notes and kv_tokens < run.sequences * longest:  # requests rejected (command_workload's -c check)
        from ..errors import InfeasibleError

        raise InfeasibleError(f"llama.cpp: --fit shrinks the context to {kv_tokens} tokens to fit {hardware.name}'s memory, "
                       f"below the {run.sequences} user(s) x {longest} tokens of the workload's longest sequences: "
                       "requests would fail; give a shorter workload or more memory")
    memory = resident_bytes(inventory, kv_tokens)
    times = predict(served.run, inventory, section)
    note = unified_stream_note(served.run, times, inventory, section)
    if note:
        served = replace(served, notes=served.notes + (note,))
    return CpuOnlyEstimate(served, times, memory, memory <= host)


@dataclass(frozen=True)
class CpuOnlyLoad:
    """A llama-server command on a machine without a GPU under a load of requests: the command's
    one-request estimate (its memory, KV cache and notes) and the load as the server's continuous
    batching serves it (:func:`hrm.cost.ggml_server.serve`)."""

    estimate: CpuOnlyEstimate
    load: object


def server_setup(served: CpuOnlyRun):
    """The slots and batching a served command runs a load with (:class:`hrm.cost.ggml_server.ServerSetup`)."""
    from ..cost.ggml_cpu import HOST_BUFFER
    from ..cost.ggml_server import ServerSetup

    run = served.run
    return ServerSetup(slots=served.slots, kv_unified=run.kv_unified, n_batch=run.n_batch, n_ubatch=run.n_ubatch,
                       threads=run.threads, threads_batch=run.threads_batch, kv_cells=served.kv_tokens,
                       buffer=None if run.repack else HOST_BUFFER)


def serve_cpu_only(values: dict[str, list[str]], program: str, model, workload, hardware, inventory,
                   requests: list) -> CpuOnlyLoad:
    """A llama-server command (or ollama's) on a CPU-only machine serving ``requests``
    (:class:`hrm.cost.ggml_server.Request`): :func:`estimate_cpu_only` for its memory and context,
    each request checked against a slot's context, then the load through the server's loop."""
    from ..cost.ggml_server import serve

    if program in ("llama-cli", "llama-completion"):
        raise HRMError(f"{program} runs one prompt and exits: a load of requests needs llama-server")
    est = estimate_cpu_only(values, program, model, workload, hardware, inventory)
    per_slot = est.served.kv_tokens if est.served.run.kv_unified else est.served.kv_tokens // max(est.served.slots, 1)
    limit = slot_limit(per_slot, model)
    for i, r in enumerate(requests):
        if r.prompt_tokens + r.gen_tokens > limit:
            raise HRMError(f"request {i + 1}: {r.prompt_tokens} prompt + {r.gen_tokens} generated tokens exceed a "
                           f"slot's {limit}-token context: the server rejects it; raise -c or shorten it")
    return CpuOnlyLoad(est, serve(requests, server_setup(est.served), inventory, hardware.ggml_cpu))
