"""MoE-Lightning artifact (caoshiyi/artifacts ``fastmoe``): a server, then the mtbench client.

The server takes no policy: at launch it reads the GPU's name and runs its own optimizer
(:mod:`hrm.engines.moe_lightning`), so an export prints the flags the server plans from
(the workload, the CPU bandwidth, the GPU count) and the policy is the one the server WILL
pick; the client (``benchmarks/mtbench/bench.py``, run from its folder) is sized to send at
least the batch the server runs. ``--ubs``/``--n-ub`` are the client's only: they set how
many prompts it sends. Every flag, its type, default and what the server does with it:
:data:`FLAG_FACTS` and docs/engines/moe_lightning.md. Its policy space: the shipped
``moe-lightning`` engine, narrowed to the server's pick.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from pydantic import BaseModel, ConfigDict

from .. import bounds
from ..engines.rules import moe_lightning_launch_flags
from ..errors import HRMError
from ..engines.moe_lightning import (CPU_MEMORY_CAP, GPU_MEMORY_CAP, RECOGNISED_GPUS, ServerChoice, ServerFlags,
    artifact_model_class, server_choice)
from ..policy import Policy
from ..workload import Workload
from .target import Context, EngineFlags, FlagSpec
from .values import float_value, int_value

MOE_LIGHTNING_VERSION = "caoshiyi/artifacts@6bc86009 (branch asplos25)"
_ARGS = "fastmoe/serve/server_args.py"
_BENCH = "benchmarks/mtbench/bench.py"
SERVER = "python -m fastmoe.serve.launch_server"
#: bench.py opens ./question.jsonl (bench.py:26): it runs from its own folder
CLIENT = "cd benchmarks/mtbench && python bench.py"
#: bench.py sends its question file ubs x n_ub // 80 times (bench.py:27-30): 80 is MT-bench's
#: question count, the prompts it sends a multiple of it
MTBENCH_QUESTIONS = 80
#: what a float flag may look like (argparse's float(): digits, a point, an exponent)
_FLOAT = r"\d*\.?\d+([eE][+-]?\d+)?"


class FlagFact(BaseModel):
    """One argparse flag of the server or the client, as read at the pinned commit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    program: str  # "server" or "client"
    kind: str  # int, float, str, switch, ints / strs (nargs)
    default: object
    source: str
    effect: str


def _fact(program, kind, default, line, effect) -> FlagFact:
    return FlagFact(program=program, kind=kind, default=default, effect=effect,
                    source=f"{_ARGS if program == 'server' else _BENCH}:{line}")


#: every flag of ``fastmoe.serve.launch_server`` (server_args.py:47-185; parsed at
#: serve/launch_server.py:6-9, only the dataclass fields kept, server_args.py:187-190) and of
#: ``bench.py`` (bench.py:8-14), with what the code does with it
FLAG_FACTS: dict[str, FlagFact] = {
    "--model-path": _fact("server", "str", None, "49-54", "required; config.json's architectures must be "
                          "Mixtral or DBRX (backend/model_runner.py:30-44)"),
    "--tokenizer-path": _fact("server", "str", None, "55-60", "defaults to --model-path (server_args.py:31-32)"),
    "--host": _fact("server", "str", "127.0.0.1", "61", "HTTP address; bench.py's --host: the server's URL, "
                    "http://127.0.0.1 (bench.py:9)"),
    "--port": _fact("server", "int", 30000, "62", "HTTP port; bench.py's --port too, 30000 (bench.py:10)"),
    "--additional-ports": _fact("server", "ints", [], "64-70", "ports of the worker processes"),
    "--load-format": _fact("server", "str", "auto", "71-86", "weight file format"),
    "--tokenizer-mode": _fact("server", "str", "auto", "87-95", "fast or slow tokenizer"),
    "--chat-template": _fact("server", "str", None, "96-101", "OpenAI API only"),
    "--trust-remote-code": _fact("server", "switch", False, "102-106", "passed to transformers"),
    "--cpu-mem-bdw": _fact("server", "float", None, "107-112", "GiB/s (x 2^30, backend/utils.py:44,55); read only "
                           "when the GPU's name contains L4 or T4, and required there"),
    "--avg-prompt-len": _fact("server", "int", None, "113-118", "the optimizer's s and the KV line per micro-batch "
                              "(execution_engine.py:482,498); no default: None fails in the optimizer"),
    "--gen-len": _fact("server", "int", None, "119-124", "the optimizer's n and the decode steps run "
                       "(model_rpc.py:165: gen_len - 1); no default: None fails in the optimizer"),
    "--mem-fraction-static": _fact("server", "float", None, "125-130", "stored, never used "
                                   "(backend/model_runner.py:59)"),
    "--max-prefill-num-token": _fact("server", "int", None, "131-136", "never used"),
    "--tp-size": _fact("server", "int", 1, "137-142", "tensor parallel ranks; the optimizer multiplies GPU memory, "
                       "bandwidth and FLOP/s by it only on an L4 or T4 (backend/utils.py:102-107)"),
    "--model-mode": _fact("server", "strs", [], "143-150", "parsed, then dropped (not a ServerArgs field)"),
    "--schedule-conservativeness": _fact("server", "float", 1.0, "151-156", "never used"),
    "--random-seed": _fact("server", "int", 42, "157-162", "sampling seed"),
    "--stream-interval": _fact("server", "int", 8, "163-168", "streaming only"),
    "--log-level": _fact("server", "str", "info", "169-174", "uvicorn log level"),
    "--disable-log-stats": _fact("server", "switch", False, "175-179", "never used"),
    "--log-stats-interval": _fact("server", "int", 10, "180-185", "never used"),
    "--max-new-tokens": _fact("client", "int", 32, "11", "tokens asked per request; bench.py counts a request "
                              "only if it returned exactly this many (bench.py:63-65)"),
    "--ubs": _fact("client", "int", 0, "12", "with --n-ub, how many prompts bench.py sends (bench.py:28); the "
                   "server never sees it"),
    "--n-ub": _fact("client", "int", 0, "13", "with --ubs, how many prompts bench.py sends (bench.py:28)"),
}

def _spec(flag: str, field: str, form: str = r"\d+") -> FlagSpec:
    return FlagSpec(flag=flag, policy_field=field, value_form=form, source=FLAG_FACTS[flag].source)


def server_flags(values: Optional[dict[str, list[str]]], ctx: Context) -> ServerFlags:
    """The server's launch flags: read from a command (``values``), or those an export prints
    for ``ctx`` (the workload's lengths, the profile's CPU bandwidth in GiB/s, one rank per GPU)."""
    if values is None:
        if ctx.hardware is None:
            return ServerFlags(avg_prompt_len=ctx.workload.prompt_len, gen_len=ctx.workload.gen_len,
                               tp_size=ctx.gpu_count)
        return moe_lightning_launch_flags(ctx.hardware, ctx.workload)
    return ServerFlags(avg_prompt_len=int_value(values, "--avg-prompt-len", bounds.TOKENS),
                       gen_len=int_value(values, "--gen-len", bounds.GEN_TOKENS),
                       cpu_mem_bdw_gib_s=float_value(values, "--cpu-mem-bdw", bounds.BANDWIDTH_GBPS),
                       tp_size=int_value(values, "--tp-size", bounds.GPU_COUNT, 1))


def _check_machine(choice: ServerChoice, ctx: Context, flags: ServerFlags) -> None:
    """One-line HRMError when the server's pick cannot run on ``ctx``'s machine as planned."""
    hw, tp, planned = ctx.hardware, ctx.gpu_count, choice.hardware
    if planned.tp_size != tp:
        raise HRMError(f"moe-lightning: {tp} GPUs named {hw.gpu.name!r}: the server recognises only L4 and T4 and "
                       "otherwise plans and sizes its buffers for one rank (fastmoe/backend/utils.py:60-61; "
                       "execution_engine.py:504,519) while --tp-size shards the model; plan for one GPU")
    gen_len = flags.gen_len if flags.gen_len is not None else ctx.workload.gen_len
    if choice.policy.num_micro_batches == 1 and gen_len > 2:
        raise HRMError("moe-lightning: the server's optimizer picks one micro-batch, and with one it decodes a "
                       "single step (fastmoe/serve/router/model_rpc.py:165): no run generates --gen-len tokens")
    # what the optimizer lets itself use (its caps times the memory it assumes) against the
    # machine: a GPU it does not recognise is planned as 24 GiB, its host as 192 GiB
    gpu_gib, host_gib = float(hw.gpu.memory_gib) * tp, float(hw.cpu.memory_gib)
    planned_gpu = GPU_MEMORY_CAP * planned.gpu_gib * planned.tp_size
    planned_cpu = CPU_MEMORY_CAP * planned.cpu_gib
    if planned_gpu > gpu_gib:
        raise HRMError(f"moe-lightning: the server plans up to {planned_gpu:.2f} GiB of GPU memory "
                       f"({planned.label}) on {gpu_gib:g} GiB (fastmoe/backend/utils.py:22-34, optimizer.py:158)")
    if planned_cpu > host_gib:
        raise HRMError(f"moe-lightning: the server plans up to {planned_cpu:.1f} GiB of CPU memory "
                       f"({planned.label}) on a host of {host_gib:g} GiB (fastmoe/backend/optimizer.py:168)")


def choice_for(ctx: Context, values: Optional[dict[str, list[str]]] = None) -> ServerChoice:
    """The server's pick for ``ctx`` (and a command's flags), after the start-up checks."""
    artifact_model_class(ctx.model)
    if ctx.hardware is None or getattr(ctx.hardware, "gpu", None) is None:
        raise HRMError("moe-lightning: the server picks its policy from the GPU it finds at launch; give --hw "
                       "(a profile with a GPU)")
    flags = server_flags(values, ctx)
    if flags.tp_size != ctx.gpu_count:
        raise HRMError(f"--tp-size {flags.tp_size}: the hardware profile has {ctx.gpu_count} GPU(s)")
    choice = server_choice(ctx.hardware, ctx.model, ctx.workload, flags)
    _check_machine(choice, ctx, flags)
    return choice


def client_counts(batch: int, micro_batch: int) -> tuple[int, int]:
    """(--ubs, --n-ub) for bench.py to send at least ``batch`` prompts: it sends the question
    file ubs x n_ub // 80 times (bench.py:28), so --ubs is the server's micro-batch and --n-ub
    the fewest micro-batches whose prompts reach the batch."""
    repeats = math.ceil(batch / MTBENCH_QUESTIONS)
    return micro_batch, math.ceil(repeats * MTBENCH_QUESTIONS / micro_batch)


def prompts_sent(ubs: int, n_ub: int) -> int:
    """The prompts bench.py sends for --ubs and --n-ub (bench.py:27-30)."""
    return (ubs * n_ub // MTBENCH_QUESTIONS) * MTBENCH_QUESTIONS


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the server runs the policy its optimizer picks, whatever the plan's
    return [choice_for(ctx).policy]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    # no flag carries a policy: the server runs its pick, whatever ``policy``
    choice = choice_for(ctx)
    flags = server_flags(None, ctx)
    out = {"--model-path": ["MODEL"], "--avg-prompt-len": [str(flags.avg_prompt_len)],
           "--gen-len": [str(flags.gen_len)]}
    if choice.hardware.label in RECOGNISED_GPUS:  # read (and required) on an L4 or T4 only
        out["--cpu-mem-bdw"] = [f"{flags.cpu_mem_bdw_gib_s:.1f}"]
    if flags.tp_size > 1:
        out["--tp-size"] = [str(flags.tp_size)]
    # the client sends enough prompts for the largest batch the server may pick (ties: its
    # solver's rounding picks); the server aborts what it does not run
    largest = max(c.batch for c in choice.tied)
    ubs, n_ub = client_counts(largest, choice.candidate.micro_batch)
    out.update({"--max-new-tokens": [str(flags.gen_len)], "--ubs": [str(ubs)], "--n-ub": [str(n_ub)]})
    return out


#: model families in a --model-path the server serves (its model classes) and some it does not
_SERVED_FAMILIES = ("mixtral", "dbrx")
_OTHER_FAMILIES = ("llama", "deepseek", "qwen", "olmoe", "opt-", "gpt", "phi", "gemma", "falcon", "mistral-7b")


def _model_path_refusal(path: str, model) -> Optional[str]:
    """Why ``--model-path`` names another model than ``model`` (None: the same, or unknown)."""
    text, ours = path.lower(), str(model.name).lower()
    family = next((f for f in _SERVED_FAMILIES if f in text), None)
    if family is None:
        other = next((f for f in _OTHER_FAMILIES if f in text), None)
        return None if other is None else (f"--model-path {path}: the artifact serves Mixtral and DBRX only "
                                           "(backend/model_runner.py:40-44 refuses other architectures)")
    if family not in ours:
        return f"--model-path {path} is a {family} model, not --model {model.name}"
    size, our_size = re.findall(r"\d+x\d+b", text), re.findall(r"\d+x\d+b", ours)
    if size and our_size and size[0] != our_size[0]:
        return f"--model-path {path} is {size[0]}, not --model {model.name}"
    return None


def _workload(values: Optional[dict[str, list[str]]], ctx: Context) -> Workload:
    """The workload the server plans for and bench.py sends: the command's --avg-prompt-len
    and --gen-len (the plan's when exporting), prompts never padded (bench.py:47,58 sends
    max_padding_length 0; tokenizer_manager.py:121-122)."""
    flags = server_flags(values, ctx)
    base = ctx.workload
    prompt = flags.avg_prompt_len if flags.avg_prompt_len is not None else base.prompt_len
    gen = flags.gen_len if flags.gen_len is not None else base.gen_len
    return Workload(prompt_len=prompt, max_prompt_len=max(prompt, base.max_prompt_len), gen_len=gen, padding=False)


def _server_notes(values: dict[str, list[str]], ctx: Context) -> list[str]:
    """Refusals of a server command that would not start, and notes on what is assumed."""
    if "--model-path" not in values:
        return ["moe-lightning: no server command (--model-path): assumed the server the export prints, "
                f"--avg-prompt-len {ctx.workload.prompt_len} --gen-len {ctx.workload.gen_len}"]
    refusal = _model_path_refusal(values["--model-path"][0], ctx.model)
    if refusal:
        raise HRMError(f"moe-lightning: {refusal}")
    for flag in ("--avg-prompt-len", "--gen-len"):
        if flag not in values:
            raise HRMError(f"moe-lightning: give {flag}: it has no default and the server's optimizer fails on None "
                           f"at launch ({FLAG_FACTS[flag].source}; fastmoe/backend/optimizer.py:91-92)")
    return []


def _client_policy(choice: ServerChoice, values: dict[str, list[str]], gen_len: int) -> tuple[Policy, list[str]]:
    """What the server runs when bench.py sends the prompts its flags give."""
    if not any(flag in values for flag in ("--ubs", "--n-ub", "--max-new-tokens")):
        return choice.policy, ["moe-lightning: no client command: assumed bench.py sends the server's batch"]
    ubs = int_value(values, "--ubs", bounds.Range(0, bounds.MAX_BATCH_SIZE, integer=True), 0)
    n_ub = int_value(values, "--n-ub", bounds.Range(0, bounds.MAX_BATCH_SIZE, integer=True), 0)
    asked = int_value(values, "--max-new-tokens", bounds.GEN_TOKENS, 32)
    sent, policy = prompts_sent(ubs, n_ub), choice.policy
    if sent == 0:
        raise HRMError(f"moe-lightning: --ubs {ubs} x --n-ub {n_ub} < {MTBENCH_QUESTIONS}: bench.py sends no prompt "
                       f"({_BENCH}:28)")
    if asked != gen_len:
        raise HRMError(f"moe-lightning: --max-new-tokens {asked} != the server's --gen-len {gen_len}: every request "
                       f"gets --gen-len tokens (model_rpc.py:165, execution_engine.py:374) and bench.py counts only "
                       f"those with --max-new-tokens ({_BENCH}:63-65)" + ("; above it the client waits forever"
                                                                          if asked > gen_len else ""))
    if sent < policy.micro_batch_size:
        raise HRMError(f"moe-lightning: bench.py sends {sent} prompts, fewer than the server's micro-batch "
                       f"{policy.micro_batch_size}: it runs them as one batch and decodes one step "
                       "(execution_engine.py:115-116, model_rpc.py:165)")
    if sent < policy.batch_size:
        mu = sent // policy.num_micro_batches
        note = (f"moe-lightning: bench.py sends {sent} prompts for the server's {policy.batch_size}: its "
                f"{policy.num_micro_batches} micro-batches hold about {mu} each (execution_engine.py:118-153)")
        return policy.model_copy(update={"batch_size": mu * policy.num_micro_batches, "micro_batch_size": mu}), [note]
    extra = sent - policy.batch_size
    return policy, ([f"moe-lightning: bench.py sends {sent} prompts; the server runs {policy.batch_size} and aborts "
                     f"{extra} (execution_engine.py:128-150)"] if extra else [])


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    notes = _server_notes(values, ctx)
    workload = _workload(values if "--model-path" in values else None, ctx)
    run = ctx.model_copy(update={"workload": workload})
    choice = choice_for(run, values if "--model-path" in values else None)
    policy, client = _client_policy(choice, values, workload.gen_len)
    ignored = [f for f in ("--mem-fraction-static", "--max-prefill-num-token", "--schedule-conservativeness",
                           "--model-mode") if f in values]
    if "--cpu-mem-bdw" in values and choice.hardware.label not in RECOGNISED_GPUS:
        ignored.append("--cpu-mem-bdw")
    if ignored:
        notes.append(f"moe-lightning: the server does not read {', '.join(ignored)} here (docs/engines/moe_lightning.md)")
    if (workload.prompt_len, workload.gen_len) != (ctx.workload.prompt_len, ctx.workload.gen_len):
        notes.append(f"moe-lightning: the server plans for --avg-prompt-len {workload.prompt_len} --gen-len "
                     f"{workload.gen_len}, not the workload's {ctx.workload.prompt_len}/{ctx.workload.gen_len}")
    return policy, notes + list(choice.notes) + client


def _export_notes(policy: Policy, ctx: Context) -> list[str]:
    # the server's own notes on its pick (a GPU it does not recognise, ties) and what it makes
    # of the prompts the printed client sends (those beyond its batch are aborted)
    choice, values = choice_for(ctx), _render(policy, ctx)
    return list(choice.notes) + _client_policy(choice, values, int(values["--gen-len"][0]))[1]


MOE_LIGHTNING = EngineFlags(
    name="moe-lightning", version=MOE_LIGHTNING_VERSION,
    engines=("moe-lightning",), hrm_engine=lambda p: "moe-lightning",
    description="MoE-Lightning artifact (fastmoe): the server picks its policy at launch; the mtbench client sends "
                "the batch",
    programs=(SERVER, CLIENT),
    import_programs=("python3 -m fastmoe.serve.launch_server", "python bench.py", "python3 bench.py",
                     "python benchmarks/mtbench/bench.py", "python3 benchmarks/mtbench/bench.py"),
    client_flags=("--max-new-tokens", "--ubs", "--n-ub"),
    flags=(
        _spec("--model-path", "(model)", r"\S+"),
        _spec("--avg-prompt-len", "workload.prompt_len"),
        _spec("--gen-len", "workload.gen_len"),
        _spec("--cpu-mem-bdw", "(hardware: CPU memory bandwidth, GiB/s; read on L4/T4 only)", _FLOAT),
        _spec("--tp-size", "(hardware: GPU count)"),
        _spec("--max-new-tokens", "workload.gen_len (client)"),
        _spec("--ubs", "(client: prompts sent, with --n-ub)"),
        _spec("--n-ub", "(client: prompts sent, with --ubs)"),
        FlagSpec(flag="--additional-ports", policy_field="(ports)", until_next_flag=True,
                 source=FLAG_FACTS["--additional-ports"].source),
        FlagSpec(flag="--model-mode", policy_field="(dropped by the server)", value_form=r"flashinfer|no-cache",
                 until_next_flag=True, source=FLAG_FACTS["--model-mode"].source),
    ),
    passthrough={"--host": 1, "--port": 1, "--tokenizer-path": 1, "--load-format": 1, "--tokenizer-mode": 1,
                 "--chat-template": 1, "--trust-remote-code": 0, "--mem-fraction-static": 1,
                 "--max-prefill-num-token": 1, "--schedule-conservativeness": 1, "--random-seed": 1,
                 "--stream-interval": 1, "--log-level": 1, "--disable-log-stats": 0, "--log-stats-interval": 1},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "weights_gpu_ratio", "kv_gpu_ratio"),
    caveats=("moe-lightning: the server picks its own policy at launch (fastmoe/backend/execution_engine.py:488); "
             "the exported policy is the one it will pick, bench.py's --ubs/--n-ub only size the prompts it sends",
             "moe-lightning: start the server first (its weights load for minutes), then the client from "
             "benchmarks/mtbench (bench.py:26 opens ./question.jsonl)"),
    workload=_workload, server_picks_policy=True, notes=_export_notes,
    nearest=_nearest, render=_render, parse=_parse,
)
