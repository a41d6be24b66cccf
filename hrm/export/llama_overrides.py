"""llama.cpp's tensor overrides as HRM's placement: which MoE blocks' routed experts ``-ot``
(``--override-tensor``), ``-cmoe`` (``--cpu-moe``) and ``--n-cpu-moe`` keep on the CPU
(:func:`cpu_blocks`), matched as llama.cpp matches them (the first override whose regex a
tensor name holds wins) against the tensor names of the model's GGUF. A user's ``-ot``
regex is checked before it is matched (:func:`check_pattern`): Python's ``re`` has no
timeout. Facts: ``docs/engines/llama_cpp.md`` (file:line at the pinned commit).
"""

from __future__ import annotations

import re
from typing import Optional

from ..errors import HRMError
from .target import Context
from .values import LAYERS, int_value

#: the tensors --n-cpu-moe / --cpu-moe match (common/common.h:1198): one layer's routed experts
LLAMA_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: -ot patterns longer than this are refused: a user's regex is matched here with Python's
#: ``re`` (no timeout), against a few hundred tensor names only
MAX_PATTERN_CHARS = 500
#: unbounded repetitions (*, +, {n,}) in one -ot pattern: k of them backtrack in O(n^(k+1)) on a
#: tensor name of n (~40) characters that fails late; real patterns use one (``blk\.[0-4]\.ffn.*``)
MAX_PATTERN_REPEATS = 3
#: a device's buffer type name as -ot takes it (common/arg.cpp:255-278: the devices' default
#: buffer types by name, exact); CPU is the host
_GPU_BUFFER = re.compile(r"(CUDA|ROCm|Vulkan|SYCL|MUSA|CANN)(\d+)|Metal")
#: the expert tensors of one MoE block in a GGUF (three, as --n-cpu-moe's regex matches them)
EXPERT_PARTS = ("gate", "up", "down")
def check_pattern(pattern: str) -> re.Pattern:
    """A user's -ot regex, compiled, or a one-line refusal: too long, a repeated group that
    holds a repetition or an alternation (exponential backtracking), more than
    :data:`MAX_PATTERN_REPEATS` unbounded repetitions (polynomial backtracking), or no regular
    expression. Python's ``re`` has no timeout, so a pattern that could backtrack is refused
    before it is matched."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise HRMError(f"-ot: a tensor name pattern of {len(pattern)} characters (at most {MAX_PATTERN_CHARS})")
    nested, repeats = _pattern_risk(pattern)
    if nested:
        raise HRMError(f"-ot {pattern!r}: a repeated group that holds a repetition or an alternation (catastrophic "
                       "backtracking); write the pattern without nested repetition")
    if repeats > MAX_PATTERN_REPEATS:
        raise HRMError(f"-ot {pattern!r}: {repeats} unbounded repetitions (at most MAX_PATTERN_REPEATS = "
                       f"{MAX_PATTERN_REPEATS}: each multiplies the backtracking)")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise HRMError(f"-ot {pattern!r}: not a regular expression ({exc})") from None


def _class_end(pattern: str, i: int) -> int:
    """Index just past the character class opened at ``pattern[i] == '['`` (its own ']' first
    is literal, as are quantifiers and parentheses inside); the end of the pattern if unclosed."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _pattern_risk(pattern: str) -> tuple[bool, int]:
    """(whether a quantified group holds a quantifier or an alternation — ``(a+)+``, ``(.*)*``,
    ``(a|ab)*``, ``(a?){20}`` —, the number of unbounded repetitions ``*``, ``+``, ``{n,}``)
    of a regex, in one left-to-right pass (escapes and character classes skipped)."""
    stack, i, repeats = [False], 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i)
            continue
        if char == "(":
            stack.append(False)
            if pattern.startswith("(?", i):  # (?:  (?P<name>  (?=  ...: not a quantifier
                i += 1
        elif char == ")" and len(stack) > 1:
            inner = stack.pop()
            quantified = i + 1 < len(pattern) and pattern[i + 1] in "*+?{"
            if inner and quantified:
                return True, repeats
            stack[-1] = stack[-1] or inner or quantified
        elif char == "|":
            stack[-1] = True
        elif char in "*+?":
            stack[-1] = True
            repeats += char != "?"
            if i + 1 < len(pattern) and pattern[i + 1] in "?+":  # lazy / possessive modifier
                i += 1
        elif char == "{":
            close = pattern.find("}", i)
            body = pattern[i + 1:close] if close > 0 else ""
            if re.fullmatch(r"\d*(,\d*)?", body) and body:
                stack[-1] = True
                repeats += body.endswith(",")
                i = close
        i += 1
    return False, repeats


def _buffer_on_cpu(buffer: str, ctx: Context) -> bool:
    """-ot's buffer type: CPU (the host) or a GPU's; another name is refused as llama.cpp does
    ('unknown buffer type', common/arg.cpp:272-278)."""
    if buffer == "CPU":
        return True
    match = _GPU_BUFFER.fullmatch(buffer)
    if match is None:
        raise HRMError(f"-ot ...={buffer}: unknown buffer type (llama.cpp takes a device's name, exact: CPU, CUDA0 "
                       "...; common/arg.cpp:264-278)")
    if match.group(2) is not None and int(match.group(2)) >= ctx.gpu_count:
        raise HRMError(f"-ot ...={buffer}: the hardware profile has {ctx.gpu_count} GPU(s)")
    return False


def _overrides(values: dict[str, list[str]], ctx: Context) -> list[tuple[str, re.Pattern, bool]]:
    """The tensor overrides in llama.cpp's order (the flags' order, each -ot's comma-joined
    items in turn): (the flag's text, pattern, to the CPU). -cmoe and --n-cpu-moe add theirs
    (common/arg.cpp:2759-2774; common/common.h:1198-1217)."""
    out = []
    for flag, args in values.items():
        if flag == "-ot":
            for item in ",".join(args).split(","):
                if "=" not in item:
                    raise HRMError(f"-ot {item!r}: expected <tensor name pattern>=<buffer type>")
                pattern, buffer = item.split("=", 1)  # the first '=' splits (common/arg.cpp:265-270)
                out.append((item, check_pattern(pattern), _buffer_on_cpu(buffer, ctx)))
        elif flag == "-cmoe":
            out.append(("-cmoe", re.compile(LLAMA_EXPS_REGEX), True))
        elif flag == "--n-cpu-moe":
            out += [(f"--n-cpu-moe {args[0]}", re.compile(rf"blk\.{i}{LLAMA_EXPS_REGEX}"), True)
                    for i in range(int_value(values, flag, LAYERS))]
    return out


def _tensor_names(model) -> dict[int, dict[str, bool]]:
    """Each block's tensor names in the GGUF, True for a routed-expert tensor (the rest: the
    tensors HRM keeps on the GPU), and block -1: the model's own (embeddings, output)."""
    dense = int(model.first_dense_layers)
    names = {-1: {"token_embd.weight": False, "output_norm.weight": False, "output.weight": False}}
    for block in range(int(model.num_layers)):
        own = {f"blk.{block}.{part}.weight": False for part in ("attn_norm", "attn_q", "attn_k", "attn_v",
                                                                "attn_output", "ffn_norm")}
        if block < dense:
            own |= {f"blk.{block}.ffn_{p}.weight": False for p in EXPERT_PARTS}
        else:
            own[f"blk.{block}.ffn_gate_inp.weight"] = False
            own |= {f"blk.{block}.ffn_{p}_exps.weight": True for p in EXPERT_PARTS}
            if int(getattr(model, "shared_intermediate_size", 0) or 0):
                own |= {f"blk.{block}.ffn_{p}_shexp.weight": False for p in EXPERT_PARTS}
        names[block] = own
    return names


def _first_match(name: str, overrides) -> Optional[tuple[str, bool]]:
    """The first override whose pattern a tensor name matches (regex search, first wins:
    src/llama-model-loader.cpp:1235-1259): (its text, to the CPU), or None."""
    for text, pattern, cpu in overrides:
        if pattern.search(name):
            return text, cpu
    return None


def cpu_blocks(values: dict[str, list[str]], ctx: Context) -> set[int]:
    """MoE blocks whose experts the overrides keep on the CPU, whole blocks only: an override
    that moves part of a block's experts, or any other weight, to the CPU is refused."""
    overrides = _overrides(values, ctx)
    cpu = set()
    for block, names in _tensor_names(ctx.model).items():
        placed = {name: _first_match(name, overrides) for name in names}
        on_cpu = {name for name, hit in placed.items() if hit and hit[1]}
        for name in sorted(on_cpu):
            if not names[name]:
                raise HRMError(f"-ot/--n-cpu-moe: '{placed[name][0]}' keeps {name} on the CPU: only routed experts "
                               "on the CPU are in HRM's policy space")
        experts = {name for name, is_expert in names.items() if is_expert}
        if experts and on_cpu and on_cpu != experts:
            cpu_parts = ", ".join(sorted(n.split(".")[2] for n in on_cpu))
            gpu_parts = ", ".join(sorted(n.split(".")[2] for n in experts - on_cpu))
            raise HRMError(f"-ot: blk.{block} keeps {cpu_parts} on the CPU but {gpu_parts} on the GPU: HRM's llama.cpp "
                           "engines place a layer's experts whole; move all of them (e.g. 'ffn_.*_exps=CPU')")
        if experts and on_cpu:
            cpu.add(block)
    return cpu


def experts_gpu_ratio(cpu_layers: int, layers: int) -> float:
    """r_w of ``cpu_layers`` of ``layers`` MoE layers' experts on the CPU (--n-cpu-moe): the share
    whose experts stay on the GPU."""
    return (layers - cpu_layers) / layers


def n_cpu_moe_value(cpu_layers: int, model) -> int:
    """--n-cpu-moe's value for the experts of the first ``cpu_layers`` MoE layers: it counts
    blocks from 0, the dense first blocks included (common/common.h:1198-1217); 0 for none."""
    return cpu_layers + int(model.first_dense_layers) if cpu_layers else 0
