"""A target's command line as the HRM policy it runs and the workload it runs (``hrm import``)."""

from __future__ import annotations

import re
import shlex
from typing import Optional

from ..errors import HRMError
from ..policy import Policy
from ..workload import Workload
from .registry import import_source
from .target import Context, EngineFlags, FlagSpec, Frozen
from .values import shown_word


#: words that end one shell command and start the next
_SEPARATORS = ("&&", ";", "||", "&", "|")
#: a shell redirection word (its file is the next word when the word names none)
_REDIRECTION = re.compile(r"(\d*|&)(>>?|<)(&\d+)?(\S*)")
#: programs users put before the engine's that take only dash options (numactl
#: --interleave=all, nohup, time): dropped with their options
_WRAPPERS = ("numactl", "nohup", "time")
#: python's own options before -m (python -u -m ...)
_PYTHON_OPTION = re.compile(r"-[uOBsSEIqv]+")
#: characters of a command ``hrm import`` reads: real ones are a few hundred; a llama.cpp
#: command with one -ot per layer of a 128-layer model is ~6,000; beyond this it is not a
#: command someone typed (override: reassign hrm.export.importing.MAX_COMMAND_CHARS)
MAX_COMMAND_CHARS = 32_768


def _program_word(word: str) -> str:
    """A program word as it names a program: a path by its file name, python3(.x) as python."""
    name = word.rsplit("/", 1)[-1]
    return "python" if re.fullmatch(r"python3(\.\d+)?", name) else name


def _program_words(program: str) -> list[str]:
    """The words of a program's last command (``cd DIR && python bench.py``: python bench.py)."""
    words = shlex.split(program)
    cut = max((i for i, w in enumerate(words) if w in _SEPARATORS), default=-1)
    return [_program_word(w) for w in words[cut + 1:]]


def _shell_words(words: list[str]) -> list[str]:
    """One command's words less what the shell, not the engine, reads: redirections
    (``>> run.log 2>&1``) and a leading wrapper with its options (``numactl --interleave=all``)."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        match = _REDIRECTION.fullmatch(word)
        if match and (match.group(1) or match.group(2)):
            skip = not match.group(3) and not match.group(4)  # "> file": the file is the next word
            continue
        out.append(word)
    while out and _program_word(out[0]) in _WRAPPERS:
        out = out[1:]
        while out and out[0].startswith("-"):
            out = out[1:]
    return out


def _without_program(target: EngineFlags, words: list[str]) -> list[str]:
    """``words`` less a leading program name of ``target`` (``python3 -u -m ...``, a path);
    one line HRMError for a program of the engine that import refuses (``refused_programs``)."""
    if words and _program_word(words[0]) == "python":  # python's own options before -m: the leading run
        first = next((i for i, w in enumerate(words[1:], 1) if not _PYTHON_OPTION.fullmatch(w)), len(words))
        words = [words[0], *words[first:]]
    named = [_program_word(w) for w in words]
    if named and named[0] in target.refused_programs:
        raise HRMError(f"{target.name}: {words[0]}: {target.refused_programs[named[0]]}")
    for program in (*target.programs, *target.import_programs):
        prog = _program_words(program)
        if prog and named[:len(prog)] == prog:
            return words[len(prog):]
    return words


def _commands(target: EngineFlags, text: str) -> list[list[str]]:
    """The flag words of each command of ``text``: commands split at newlines and shell
    separators (a server and its client pasted together), ``cd DIR`` commands and leading
    VAR=value words dropped, a leading program name skipped. One-line HRMError for a command
    longer than :data:`MAX_COMMAND_CHARS` (before any parsing) or an empty one."""
    if len(text) > MAX_COMMAND_CHARS:
        raise HRMError(f"{target.name} flags: a command of {len(text):,} characters (at most MAX_COMMAND_CHARS = "
                       f"{MAX_COMMAND_CHARS:,})")
    try:
        words = shlex.split(text.replace("\\\n", " ").replace("\n", " ; "))
    except ValueError as exc:
        raise HRMError(f"{target.name} flags: {exc}") from None
    commands, current = [], []
    for word in [*words, ";"]:
        if word not in _SEPARATORS:
            current.append(word)
        elif current:
            commands.append(current)
            current = []
    out = []
    for command in commands:
        command = _shell_words(command)
        while command and re.fullmatch(r"[A-Za-z_]\w*=\S*", command[0]):
            command = command[1:]
        if command and command[0] != "cd":
            out.append(_without_program(target, command))
    if not out:  # nothing but blanks, separators, cd and VAR=value: no engine command at all
        raise HRMError(f"{target.name} flags: empty command; give the engine's command line or flags in one string")
    return out


def _unknown(target: EngineFlags, word: str, spellings) -> HRMError:
    import difflib

    close = difflib.get_close_matches(word, list(spellings) + list(target.passthrough), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    what = "unknown flag" if word.startswith("-") or word == "serve" else "unexpected word"
    return HRMError(f"{target.name}: {what} {shown_word(word)}{hint}")


def _values(target: EngineFlags, spec: FlagSpec | None, word: str, inline: str | None, rest: list[str]) -> list[str]:
    """The value tokens of flag ``word`` (``rest``: the words after it), in their documented form."""
    arity = spec.values if spec is not None else target.passthrough[word]
    if spec is not None and spec.until_next_flag and inline is None:
        end = 0
        while end < len(rest) and not rest[end].startswith("-"):
            end += 1
        args = rest[:end]
    elif inline is not None:
        args = [inline]
    else:
        args = rest[:arity]
        if len(args) < arity or any(a.startswith("-") and not re.fullmatch(r"-\d+", a) for a in args):
            raise HRMError(f"{target.name}: {word} needs {arity} value(s)")
    if spec is not None and args and spec.value_form:
        for arg in args:
            if not re.fullmatch(spec.value_form, arg):
                raise HRMError(f"{target.name}: {word} {shown_word(arg)} is not of the form {spec.value_form}")
    return args


def split_flags(target: EngineFlags, text: str) -> dict[str, list[str]]:
    """Engine flags (shell words, ``--flag=value`` too) as {canonical flag: value tokens}.
    A leading program name (``llama-server``, ``vllm serve`` ...) is skipped. One-line
    HRMError for an unknown flag, a missing value, or a flag given twice (except a
    repeatable one such as -ot)."""
    spell = {s: spec for spec in target.flags for s in spec.spellings}
    out: dict[str, list[str]] = {}
    for words in _commands(target, text):
        for key, args in _command_flags(target, spell, words).items():
            spec = spell.get(key)
            if key not in out:
                out[key] = args
            elif spec is not None and spec.repeatable:
                out[key] = out[key] + args
            elif key not in target.passthrough:  # a server's and its client's --port: the first kept
                raise HRMError(f"{target.name}: {key} given twice")
    return out


def _command_flags(target: EngineFlags, spell: dict, words: list[str]) -> dict[str, list[str]]:
    """One command's flags as {canonical flag: value tokens}."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        word, inline = words[i], None
        if word.startswith("--") and "=" in word:
            word, inline = word.split("=", 1)
        spec = spell.get(word)
        if spec is None and word not in target.passthrough:
            raise _unknown(target, word, spell)
        args = _values(target, spec, word, inline, words[i + 1:])
        key = spec.flag if spec is not None else word
        if key in out and not (spec is not None and spec.repeatable):
            raise HRMError(f"{target.name}: {word} given twice")
        out[key] = out.get(key, []) + args
        i += 1 + (len(args) if inline is None else 0)
    return out


class Imported(Frozen):
    """A command line read back: the policy it runs, notes on what HRM does not model, and
    the workload the command itself runs (which the estimate is for)."""

    policy: Policy
    notes: tuple[str, ...]
    workload: Workload
    #: HRM engine fields the command sets (the target's ``engine_fields`` hook): the estimate
    #: runs the target's engine with them (:func:`hrm.engines.mechanisms.with_fields`)
    engine_fields: dict = {}
    #: the model as the command stores its weights (the target's ``stored_model`` hook): the
    #: estimate is for it; None: the model given
    model: Optional[object] = None
    #: the free GPU memory the engine's own memory fit leaves when it places the weights (the
    #: target's ``fit_margins`` hook: llama.cpp's --fit with -ngl auto), None when the command
    #: places them; :func:`fitted_policy` gives the placement that fit reaches
    fit_margins_bytes: Optional[float] = None


#: ``hrm import``'s workload flags, by the :class:`~hrm.workload.Workload` field each sets
WORKLOAD_FLAGS = {"prompt_len": "--prompt-len", "max_prompt_len": "--max-prompt-len", "gen_len": "--gen-len",
                  "padding": "--padding"}


def _shown(workload) -> str:
    return (f"prompts of {workload.prompt_len} tokens (at most {workload.max_prompt_len}"
            f"{', every one padded to it' if workload.padding else ''}), {workload.gen_len} generated")


def check_workload_flags(target: EngineFlags, given: dict, run) -> None:
    """One-line HRMError when a workload flag given to ``hrm import`` (``given``: Workload
    field -> value) differs from what the command itself runs (``run``)."""
    clashes = [f"{WORKLOAD_FLAGS[key]}{'' if key == 'padding' else f' {value}'} (the command: "
               f"{getattr(run, key)})" for key, value in given.items() if getattr(run, key) != value]
    if clashes:
        raise HRMError(f"{target.name}: the command runs {_shown(run)}, which defines the estimate; hrm import was "
                       f"also given {', '.join(clashes)}: drop those flags or change the command")


def _read_values(engine_name: str, text: str, ctx: Context):
    """(frontend or None, target, the target's flag values, the frontend's notes) for ``text``."""
    frontend, target = import_source(engine_name)
    if frontend is None:
        return None, target, split_flags(target, text), []
    values, notes = frontend.translate(text, ctx)
    return frontend, target, values, notes


def _as_frontend(frontend, values: dict[str, list[str]], exc: HRMError) -> HRMError:
    """A target's refusal of a frontend's translated flags, said as the frontend's (one line)."""
    if frontend is None:
        return exc
    shown = " ".join(f"{flag} {' '.join(args)}".strip() for flag, args in values.items())
    return HRMError(f"{frontend.name}: as the {frontend.target} command it launches ({shown}): {exc}")


def read_command(engine_name: str, text: str, model, workload, hardware=None, gpu_memory_utilization: float = 0.86,
                 given: dict | None = None) -> Imported:
    """An engine's command line as the policy it runs on the workload it runs (its own flags,
    the engine's defaults where absent: the target's ``workload`` hook), with notes. ``given``:
    the workload fields the user set explicitly, each of which must agree with the command.
    A frontend's text (ollama's options) is read as the command it launches."""
    ctx = Context(model=model, workload=workload, hardware=hardware, gpu_memory_utilization=gpu_memory_utilization)
    frontend, target, values, front_notes = _read_values(engine_name, text, ctx)
    try:
        run, problem = target.run_workload(values, ctx), None
    except HRMError as exc:  # the command's refusal (another model ...) names the deeper problem: it goes first
        run, problem = workload, exc
    try:
        policy, notes = target.parse(values, ctx.model_copy(update={"workload": run}))
    except HRMError as exc:
        raise _as_frontend(frontend, values, exc) from None
    if problem is not None:
        raise _as_frontend(frontend, values, problem)
    if policy is None:
        raise HRMError(f"{target.name}: the flags give no valid policy")
    check_workload_flags(target, given or {}, run)
    stored, stored_notes = target.stored_model(values, ctx) if target.stored_model else (None, [])
    notes = [*front_notes, *notes, *stored_notes]
    if _shown(run) != _shown(workload):
        notes = [*notes, f"{target.name}: the command runs {_shown(run)}: the estimate is for that workload"]
    fields = target.engine_fields(values, ctx.model_copy(update={"workload": run})) if target.engine_fields else {}
    margins = target.fit_margins(values, ctx) if target.fit_margins else None
    return Imported(policy=policy, notes=tuple(notes), workload=run, engine_fields=fields,
                    model=None if stored is model else stored, fit_margins_bytes=margins)


def fitted_policy(imported: Imported, hardware, model, engine, limits, estimate_fn) -> tuple[Imported, Optional[int]]:
    """(``imported`` with the placement llama.cpp's --fit reaches, how many layers' experts it
    moved to the CPU): ``imported`` itself when the engine does not fit it or every weight fits
    the GPU as read (``-ngl auto``: all layers); the experts of the fewest first MoE layers that
    leave each GPU --fit's margin (:func:`hrm.export.llama_cpp.fitted_cpu_layers`), as
    ``--n-cpu-moe`` would place them. None layers: not even every expert on the CPU makes room."""
    from .llama_cpp import fitted_cpu_layers
    from .llama_overrides import experts_gpu_ratio, n_cpu_moe_value

    if imported.fit_margins_bytes is None or hardware.gpu is None:
        return imported, 0
    layers = max(int(model.num_moe_layers), 1)

    def placed(cpu_layers: int) -> Policy:
        return imported.policy.model_copy(update={"weights_gpu_ratio": experts_gpu_ratio(cpu_layers, layers)})

    cpu_layers = fitted_cpu_layers(lambda c: estimate_fn(placed(c)), layers, limits, imported.fit_margins_bytes)
    if not cpu_layers:
        return imported, cpu_layers
    policy, n_cpu_moe = placed(cpu_layers), n_cpu_moe_value(cpu_layers, model)
    note = (f"llama.cpp: --fit (on by default; -ngl, -ot and --n-cpu-moe unset) leaves "
            f"{imported.fit_margins_bytes / 2**20:,.0f} MiB of the GPU memory free and moves the experts of the first "
            "layers to the CPU until the rest fits "
            f"(common/fit.cpp:463-485, 615-760): estimated as --n-cpu-moe {n_cpu_moe}, {cpu_layers} of {layers} MoE "
            "layers' experts on the CPU (a partly moved layer counted whole)")
    return imported.model_copy(update={"policy": policy, "notes": (*imported.notes, note)}), cpu_layers


def import_command(engine_name: str, text: str, model, workload, hardware=None,
                   gpu_memory_utilization: float = 0.86) -> tuple[Policy, list[str]]:
    """An engine's flags as the HRM policy they run, with notes on what HRM does not model
    (:func:`read_command` without the workload)."""
    imported = read_command(engine_name, text, model, workload, hardware, gpu_memory_utilization)
    return imported.policy, list(imported.notes)


def import_flags(engine_name: str, text: str, model, workload=None, hardware=None) -> Policy:
    """An engine's flags as a :class:`~hrm.policy.Policy` (see :func:`import_command`)."""
    from ..workload import make_workload

    return import_command(engine_name, text, model, workload or make_workload(), hardware)[0]


def imported_engine(source: str, imported: Imported, engine_name: Optional[str] = None):
    """The engine an imported command is estimated with: ``engine_name``, else the source's closest
    shipped engine (ideal without one), with what the command sets of the engine itself."""
    from ..engines.engine import load_engine
    from ..engines.mechanisms import with_fields

    target = import_source(source)[1]
    engine = load_engine(engine_name or (target.hrm_engine(imported.policy) if target.hrm_engine else "ideal"))
    if imported.engine_fields and engine.name in target.engines:
        engine = with_fields(engine, imported.engine_fields)
    return engine


def _cpu_only_command(engine_name: str, text: str, ctx: Context):
    """(frontend, values, notes, program): a llama.cpp command, or ollama's settings read as the
    llama-server command ollama launches, for the CPU step model of a machine without a GPU."""
    frontend, target, values, front_notes = _read_values(engine_name, text, ctx)
    if target.name != "llama.cpp":
        raise HRMError(f"{engine_name}: only llama.cpp's commands (and ollama's settings) are predicted on the CPU "
                       "step model of a machine without a GPU")
    if frontend is not None:
        program = f"{frontend.name} (its llama-server)"
    else:
        first = (text.split() or ["llama-server"])[0].rsplit("/", 1)[-1]
        program = first if first in target.programs + target.import_programs else "llama-server"
    return frontend, values, front_notes, program


def estimate_without_gpu(engine_name: str, text: str, model, workload, hardware, inventory):
    """A llama.cpp command (llama-server, llama-cli, llama-completion), or ollama's settings read
    as the llama-server command ollama launches, on a machine without a GPU: the run it serves on
    the CPU step model from ``inventory`` (the GGUF's tensors) and the profile's measured ggml
    kernels (:func:`hrm.export.llama_cpp.estimate_cpu_only`), the frontend's notes first."""
    from dataclasses import replace

    from .llama_cpp import estimate_cpu_only

    frontend, values, front_notes, program = _cpu_only_command(engine_name, text,
                                                               Context(model=model, workload=workload, hardware=hardware))
    try:
        est = estimate_cpu_only(values, program, model, workload, hardware, inventory)
    except HRMError as exc:
        raise _as_frontend(frontend, values, exc) from None
    return replace(est, served=replace(est.served, notes=tuple(front_notes) + est.served.notes))


def serve_without_gpu(engine_name: str, text: str, model, workload, hardware, inventory, requests):
    """:func:`estimate_without_gpu`'s command as a server under a load of ``requests``
    (:class:`hrm.cost.ggml_server.Request`), through llama-server's continuous batching
    (:func:`hrm.export.llama_cpp.serve_cpu_only`)."""
    from dataclasses import replace

    from .llama_cpp import serve_cpu_only

    frontend, values, front_notes, program = _cpu_only_command(engine_name, text,
                                                               Context(model=model, workload=workload, hardware=hardware))
    try:
        served = serve_cpu_only(values, program, model, workload, hardware, inventory, requests)
    except HRMError as exc:
        raise _as_frontend(frontend, values, exc) from None
    est = served.estimate
    return replace(served, estimate=replace(est, served=replace(est.served, notes=tuple(front_notes) + est.served.notes)))
