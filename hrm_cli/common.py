"""Argument groups shared by the CLI subcommands (hardware, model, workload, memory), and the
printing they share (memory in GiB, the memory rows of a result table)."""

from __future__ import annotations

from hrm import bounds
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.quantized import WEIGHT_FORMATS
from hrm.units import DTYPES, GIB
from hrm.workload import PRESETS, make_workload


def add_machine_args(parser, hw_required: bool = True) -> None:
    parser.add_argument("--hw", required=hw_required, help="hardware profile: a YAML path or a shipped name (l4, t4, ...)")
    parser.add_argument("--model", required=hw_required, help="catalog name/alias (mixtral, dbrx, ...) or a config.json path")
    parser.add_argument("--weight-dtype", choices=list(DTYPES), help="override the weight dtype")
    parser.add_argument("--kv-dtype", choices=list(DTYPES), help="override the KV-cache dtype")
    parser.add_argument("--weight-format", choices=list(WEIGHT_FORMATS),
                        help="how the weights are stored (a GGUF type or int4-g128): their bits per weight with scales; "
                             "alone it also sets the weight dtype its bits imply (default: the dtype's packed payload)")
    add_routing_arg(parser)


def add_routing_arg(parser) -> None:
    parser.add_argument("--routing", metavar="uniform|zipf:S|trace:FILE",
                        help="which experts tokens choose: uniform (default), zipf:S (expert popularity ~ 1/rank^S), "
                             "or trace:FILE (per-layer expert counts, e.g. from hrm run --routing-trace)")


def routed_model(model, routing: str | None):
    """``model`` with the ``--routing`` distribution (unchanged without one)."""
    if routing is None:
        return model
    from hrm.model.routing import parse_routing

    return model.with_routing(parse_routing(routing, model.num_experts, model.top_k, model.name))


def add_workload_args(parser) -> None:
    parser.add_argument("--workload", default="mtbench", choices=list(PRESETS),
                        help="workload preset (default mtbench: prompt avg 77 / max 418, gen 128)")
    parser.add_argument("--prompt-len", type=bounds.TOKENS.flag("--prompt-len"), help="average prompt length (tokens)")
    parser.add_argument("--max-prompt-len", type=bounds.TOKENS.flag("--max-prompt-len"),
                        help="maximum prompt length (tokens)")
    parser.add_argument("--gen-len", type=bounds.GEN_TOKENS.flag("--gen-len"), help="tokens generated per request")
    parser.add_argument("--padding", action="store_true", help="pad prompts to the maximum (FlexGen style)")


#: the one default engine is hrm.engines.engine.DEFAULT_ENGINE (the API's too); the CLI reads it there
ENGINE_DEFAULT_HELP = ("default {engine} on a GPU profile, ideal on a CPU-only one or with --schedule "
                       "(hrm.engines.engine.DEFAULT_ENGINE)")


def engine_default_help() -> str:
    from hrm.engines.engine import DEFAULT_ENGINE

    return ENGINE_DEFAULT_HELP.format(engine=DEFAULT_ENGINE)


def add_engine_args(parser, schedule_default=None, bound_note: bool = False) -> None:
    """--engine NAME|FILE.yaml (no default here: :func:`engine_from_args` resolves a missing one
    with hrm.engines.engine.default_engine_name) and --schedule (the lane structure of engine ideal)."""
    from hrm.engines.engine import list_engines
    from hrm.engines.schedules import SCHEDULES

    default_help = engine_default_help() + ("; ideal's bound is printed beside it as the headroom" if bound_note else "")
    parser.add_argument("--engine", default=None, metavar="NAME|FILE.yaml",
                        help=f"engine that runs the plan: {', '.join(list_engines())}, or an engine YAML file "
                             f"({default_help})")
    parser.add_argument("--schedule", default=schedule_default, choices=list(SCHEDULES),
                        help="lane structure of --engine ideal (default cgopipe)")


def engine_from_args(args, hw=None):
    """The engine of --engine/--schedule; with no --engine (None) the default for ``hw``
    (hrm.engines.engine.default_engine_name: DEFAULT_ENGINE, ideal on a CPU-only profile or with --schedule)."""
    from hrm.engines.engine import resolve_engine

    return resolve_engine(getattr(args, "engine", None), getattr(args, "schedule", None), hw)


def add_memory_args(parser) -> None:
    parser.add_argument("--gpu-mem", type=bounds.TOTAL_GPU_MEMORY_GIB.flag("--gpu-mem"), metavar="GIB",
                        help=f"override total GPU memory (GiB; at most {bounds.MAX_GPU_MEMORY_GIB:g} per GPU)")
    parser.add_argument("--cpu-mem", type=bounds.CPU_MEMORY_GIB.flag("--cpu-mem"), metavar="GIB",
                        help=f"override CPU memory (GiB, {bounds.CPU_MEMORY_GIB.describe()})")
    parser.add_argument("--gpu-util", type=bounds.MEMORY_UTILIZATION.flag("--gpu-util"),
                        help=f"usable fraction of GPU memory, {bounds.MEMORY_UTILIZATION.describe()} (default 0.86)")
    parser.add_argument("--cpu-util", type=bounds.MEMORY_UTILIZATION.flag("--cpu-util"),
                        help=f"usable fraction of CPU memory, {bounds.MEMORY_UTILIZATION.describe()} (default 0.8)")


def machine_from_args(args):
    hw = load_hardware(args.hw)
    model = load_model(args.model, getattr(args, "weight_dtype", None), getattr(args, "kv_dtype", None))
    model = with_format_args(model, getattr(args, "weight_format", None), getattr(args, "weight_dtype", None))
    return hw, routed_model(model, getattr(args, "routing", None))


def with_format_args(model, weight_format: str | None, weight_dtype: str | None):
    """``model`` with ``--weight-format``: alone, it also sets the dtype its bits imply (q4_k_m:
    int4, q8_0: int8; :func:`hrm.model.quantized.quantized_dtype`); beside ``--weight-dtype``,
    that dtype stands (and a float one is refused)."""
    if not weight_format:
        return model
    return model.with_stored_format(weight_format) if weight_dtype is None else model.with_weight_format(weight_format)


def workload_from_args(args):
    return make_workload(args.workload, args.prompt_len, args.max_prompt_len, args.gen_len, args.padding)


def options_from_args(args):
    """ModelOptions from --gpu-util/--cpu-util (ranges: the flags' and the model's, hrm.bounds)."""
    from hrm.model.options import ModelOptions

    update = {}
    for flag, key in (("gpu_util", "gpu_memory_utilization"), ("cpu_util", "cpu_memory_utilization")):
        value = getattr(args, flag, None)
        if value is not None:
            update[key] = bounds.MEMORY_UTILIZATION.check(value, f"--{flag.replace('_', '-')}")
    return ModelOptions(**update)


def check_input_file(path: str | None, flag: str, allow_dir: bool = False) -> None:
    """Fail fast on an input path that is missing or not a regular file (a FIFO would block;
    a directory is allowed only where ``allow_dir``)."""
    import os
    import stat

    from hrm.errors import HRMError, file_kind

    if path is None:
        return
    if not str(path).strip():
        raise HRMError(f"{flag}: empty path")
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise HRMError(f"{flag} {path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if stat.S_ISREG(info.st_mode) or (allow_dir and stat.S_ISDIR(info.st_mode)):
        return
    raise HRMError(f"{flag} {path}: {file_kind(info.st_mode)}, not a regular file")


def limits_from_args(hw, options, args):
    from hrm.cost.memory import memory_limits

    return memory_limits(hw, options, getattr(args, "gpu_mem", None), getattr(args, "cpu_mem", None))


def gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:,.2f} GiB"


def add_memory_rows(table, result, host_label: str = "host memory") -> None:
    """An estimate's memory rows: host memory (``host_label``) when the tiers share it, else
    GPU and CPU memory, and the disk tier's weights when some spill (docs/model.md §4.9)."""
    if result.shared_memory:
        table.add_row(host_label, f"{gib(result.gpu_peak_bytes + result.cpu_peak_bytes)} / {gib(result.cpu_limit_bytes)}")
        return
    table.add_row("GPU memory", f"{gib(result.gpu_peak_bytes)} / {gib(result.gpu_limit_bytes)}")
    table.add_row("CPU memory", f"{gib(result.cpu_peak_bytes)} / {gib(result.cpu_limit_bytes)}")
    if result.disk_bytes > 0:
        table.add_row("disk (weights)", f"{gib(result.disk_bytes)} beyond host memory, read every pass")


def console(stderr: bool = False):
    """The rich Console every command prints with. Markup and emoji codes are off: a name, path
    or note from the user (``[bold]x[/x]``, ``[link=...]``, ``:smile:``, a backslash) reaches
    tables, titles and lines as written, never as a style or a MarkupError. Styles are given
    as ``rich.text.Text`` styles, not markup."""
    from rich.console import Console

    return Console(stderr=stderr, markup=False, emoji=False)


def policy_cell(policy) -> str:
    """``policy.short()`` with a space after each comma, so a narrow table wraps it between
    fields instead of cutting a number (``--fix`` and ``--policy`` read it as it is)."""
    return policy.short().replace(",", ", ")


def compact(value: float, digits: int = 4) -> str:
    """A number in few characters for narrow tables: ``digits`` significant digits, the
    exponent without ``+`` and leading zeros (3.222e9, 1.65e12, 62.39, 0)."""
    text = f"{value:.{digits}g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def short(value: float) -> str:
    """3 significant digits, no exponent: 0.0123, 4.56, 789, 12,345."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def tpot_ms(per_token_latency_s: float) -> str:
    """The per-token latency (TPOT) as every view prints it, in ms (TTFT is printed in s)."""
    return f"{short(per_token_latency_s * 1e3)} ms"


#: the row name of the per-token latency in every view: it is per sequence
TPOT_LABEL = "TPOT (per sequence)"


def tpot_in_words(per_token_latency_s: float, batch_size: int) -> str:
    """TPOT per sequence with the batch's decode step beside it: every sequence of the batch
    gets one token per decode step, so a sequence waits the whole step for each token."""
    step = per_token_latency_s
    return (f"{tpot_ms(step)}: one decode step of the whole batch, which gives each of its "
            f"{batch_size:,} sequences one token ({short(step / batch_size * 1e3)} ms of the step per token)")


def progress_bar(label: str):
    """(a rich progress bar on stderr, ``update(done, total)``) for sweeps; silent when
    stderr is not a terminal."""
    import sys

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), transient=True, disable=not sys.stderr.isatty(),
                        console=console(stderr=True))
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def rate_and_requests_refusal(args) -> str | None:
    """Why a load's --rate-per-s and --requests (hrm import, hrm fit) cannot be read: one without
    the other (how fast, and how many); None when both or neither are given."""
    if (args.rate_per_s is None) != (args.requests is None):
        return "--rate-per-s and --requests go together (how fast requests arrive, and how many)"
    return None


def check_rate_and_requests(parser, args) -> None:
    """:func:`rate_and_requests_refusal` as a usage error (exit 2)."""
    refusal = rate_and_requests_refusal(args)
    if refusal:
        parser.error(refusal)
