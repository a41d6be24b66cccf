"""``hrm-search`` / ``hrm search``: the best policy, its prediction, and a plan file."""

from __future__ import annotations

from dataclasses import dataclass

from hrm_cli.parser import ArgumentParser
from hrm_cli.common import (add_engine_args, add_memory_rows, add_machine_args, add_memory_args, add_workload_args, console,
                            engine_from_args, limits_from_args, machine_from_args, options_from_args, policy_cell,
                            short, tpot_in_words, TPOT_LABEL, workload_from_args)
from hrm.errors import HRMError
from hrm import bounds
from hrm.cost.memory import physical_limits
from hrm.plan import check_output_path, save_plan
from hrm.policy import parse_assignments, policy_refusal

from solver.analyses import EngineBest, RoutingEffect, compare_engines, ideal_bound_tok_s, routing_effect
from solver.request import server_pick, with_note, with_server_pick
from solver.search import OBJECTIVES, SearchResult, search
from solver.lanes.terms import LatencyLimits
from solver.lanes.terms import DEFAULT_MAX_BATCH


#: the policy fields that, pinned together with two of N, mu and n, leave the search nothing to choose
PINNED_FIELDS = ("attn_on_gpu", "ffn_on_gpu", "weights_gpu_ratio", "kv_gpu_ratio")


def fully_pinned(fixed: dict) -> bool:
    """Whether ``--fix`` pins the whole policy (hrm estimate's case, through the search)."""
    sizes = sum(k in fixed for k in ("batch_size", "micro_batch_size", "num_micro_batches"))
    return sizes >= 2 and all(k in fixed for k in PINNED_FIELDS)


def parse_fix(items: list[str] | None) -> dict:
    """``--fix`` pins: Policy fields, the policy rules of :func:`hrm.policy.policy_refusal`
    applied to what is given; N with n gives mu."""
    if items is not None and not " ".join(items).strip():
        raise HRMError("--fix: empty: give KEY=VALUE pins, e.g. --fix N=64 attn=cpu")
    fixed = parse_assignments(" ".join(items or []), what="--fix")
    refusal = policy_refusal(fixed)
    if refusal:
        raise HRMError(f"--fix: {refusal}")
    big, mu, n = (fixed.get(k) for k in ("batch_size", "micro_batch_size", "num_micro_batches"))
    if big and n and not mu:
        fixed["micro_batch_size"] = big // n
    return fixed


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm-search", description=(
        "Find the offloading policy with the highest throughput, exact over every integer micro-batch size "
        "(branch and bound; --verify re-proves it with per-step bounds, enumeration and the MILP). "
        "Default workload: mtbench (prompt avg 77, max 418, gen 128), no padding."))
    add_machine_args(parser)
    add_workload_args(parser)
    add_memory_args(parser)
    add_engine_args(parser, bound_note=True)
    parser.add_argument("--objective", default="generation", choices=list(OBJECTIVES),
                        help="maximise end-to-end generation throughput (default) or decode throughput, or minimise "
                             "the per-token latency (TPOT) at the batch pinned with --fix N=")
    parser.add_argument("--max-tpot-ms", type=bounds.LATENCY_MS.flag("--max-tpot-ms"), metavar="MS",
                        help="only policies whose mean time per output token (decode time / decode steps) is at most MS")
    parser.add_argument("--max-ttft-s", type=bounds.BUDGET_S.flag("--max-ttft-s"), metavar="S",
                        help="only policies whose time to the first token of the batch's last request (the batch's "
                             "prefill) is at most S")
    parser.add_argument("--fix", nargs="+", metavar="KEY=VALUE",
                        help="pin part of the policy: N=, mu=, n=, attn=cpu|gpu, ffn=cpu|gpu, rw=, rc=")
    parser.add_argument("--max-batch", type=bounds.SEARCH_BATCH.flag("--max-batch"), default=DEFAULT_MAX_BATCH,
                        help=f"cap on the batch size N (sequences, {bounds.SEARCH_BATCH.describe()})")
    parser.add_argument("--top", type=bounds.TOP.flag("--top"), default=3, help="alternatives to show (the best policy of every other attn/ffn placement)")
    parser.add_argument("--solver", default="auto", choices=["auto", "cbc", "highs"],
                        help="MILP backend of the --verify certificate: auto = HiGHS when highspy is installed, else CBC")
    parser.add_argument("--verify", action="store_true", help="also run the exhaustive verifier and compare")
    parser.add_argument("--time-limit", dest="time_limit_s", type=bounds.BUDGET_S.flag("--time-limit"), default=None,
                        metavar="S", help="seconds a branch and bound (engine klotski) may run before it returns its "
                                          "best, marked not proven optimal (default 10)")
    parser.add_argument("--compare", action="store_true",
                        help="every shipped engine at its own best policy, ranked (and ideal's other schedules)")
    parser.add_argument("--with-reference", action="store_true",
                        help="with --compare: also list hrm-runtime, the reference runtime (the plain model, not a "
                             "serving engine; it ties ideal on a datasheet profile)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="with --compare: also draw every engine's throughput and per-token latency")
    parser.add_argument("--json", action="store_true", help="print the plan (docs/model.md §6) as JSON")
    parser.add_argument("--out", help="write the plan to this file (atomically; checked before the search)")
    from hrm.export import EXPORTERS

    parser.add_argument("--export", choices=list(EXPORTERS), metavar="ENGINE",
                        help=f"also print the plan as ENGINE's command line ({', '.join(EXPORTERS)}); with --json "
                             "the output is {\"plan\": ..., \"export\": ...}")
    return parser


@dataclass
class SearchRun:
    """What one ``hrm-search`` (no --compare) computes before it prints: the search result
    (with the server's pick), its inputs, and the export (``--export``) when asked for."""

    result: SearchResult
    hw: object
    model: object
    workload: object
    engine: object
    options: object
    limits: object
    common: dict
    export: object = None


@dataclass(frozen=True)
class SearchInputs:
    """What parsed ``hrm-search`` flags search: machine, model, workload, and the keywords of
    :func:`solver.search.search` (and of the analyses of :mod:`solver.analyses`)."""

    hw: object
    model: object
    workload: object
    #: the model options (dtypes, routing) of the flags
    options: object
    #: the planning memory limits of the flags (--gpu-mem, --gpu-util, ...)
    limits: object
    #: :func:`solver.search.search`'s keywords but engine and top: objective, pins, caps, limits, names
    search_kwargs: dict


def search_inputs(args, machine=None) -> SearchInputs:
    """The inputs of parsed ``hrm-search`` flags; ``machine`` = (hw, model) already loaded (the
    web planner's uploads), else --hw/--model are loaded."""
    hw, model = machine if machine is not None else machine_from_args(args)
    workload = workload_from_args(args)
    options = options_from_args(args)
    limits = limits_from_args(hw, options, args)
    fixed = parse_fix(args.fix)
    latency_limits = LatencyLimits(args.max_tpot_ms / 1e3 if args.max_tpot_ms is not None else None, args.max_ttft_s)
    search_kwargs = dict(objective=args.objective, fixed=fixed, max_batch=args.max_batch, options=options,
                         limits=limits, latency_limits=latency_limits, time_limit_s=args.time_limit_s,
                         solver=args.solver, hw_name=args.hw, model_name=args.model)
    return SearchInputs(hw, model, workload, options, limits, search_kwargs)


def run_search(args, machine=None) -> SearchRun:
    """The search of parsed ``hrm-search`` flags (not --compare), the server's pick beside it,
    and the --export rendering: everything ``main`` prints, nothing printed or written."""
    inputs = search_inputs(args, machine)
    hw, model, workload, options, limits = inputs.hw, inputs.model, inputs.workload, inputs.options, inputs.limits
    common = dict(inputs.search_kwargs)
    engine = engine_from_args(args, hw)
    fixed = common["fixed"]
    if fully_pinned(fixed):
        # a pinned policy may use physical memory less the engine's reserve, not the planning caps
        common["limits"] = physical_limits(hw, engine, args.gpu_mem, args.cpu_mem)
    result = search(hw, model, workload, top=args.top, verify=args.verify, engine=engine, **common)
    if fully_pinned(fixed) and not result.best.estimate.fits(limits):
        result = with_note(result, "the pinned policy is above the planning caps (--gpu-util/--cpu-util): it fits "
                                   "physical memory less the engine's reserve, the search would not choose it")
    # an engine that picks its own policy at launch: its pick beside the search's best,
    # checked against physical memory like a pinned policy (it is not the search's choice)
    pick = server_pick(hw, model, workload, engine, options, physical_limits(hw, engine, args.gpu_mem, args.cpu_mem))
    result = with_server_pick(result, pick)
    # the export first: a target that refuses the plan leaves no plan file behind
    export = _export(result, hw, model, workload, engine, options, args.export) if args.export else None
    return SearchRun(result, hw, model, workload, engine, options, limits, common, export)


def search_json(run: SearchRun) -> dict:
    """What ``hrm-search --json`` prints, as data: the plan, or {"plan": ..., "export": ...}
    with --export."""
    import json

    plan = json.loads(run.result.plan.model_dump_json())
    return plan if run.export is None else {"plan": plan, "export": run.export.export.to_json()}


def compare_json(rows: list[EngineBest]) -> dict:
    """What ``hrm-search --compare --json`` prints, as data: each label's plan or the one-line
    reason it has none, best first (rows: :func:`solver.analyses.compare_engines`)."""
    import json

    return {row.label: (row.refusal if row.result is None else json.loads(row.result.plan.model_dump_json()))
            for row in rows}


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.out is not None:
        check_output_path(args.out, "--out")
    if args.plot is not None:
        if not args.compare:
            raise HRMError("--plot draws the --compare table: add --compare")
        check_output_path(args.plot, "--plot")
    if args.compare:
        return _compare(args)
    run = run_search(args)
    result, hw, model, workload, engine = run.result, run.hw, run.model, run.workload, run.engine
    headroom = routing = None
    if not args.json:
        headroom = ideal_bound_in_words(ideal_bound_tok_s(hw, model, workload, engine, **run.common))
        routing = routing_effect_in_words(routing_effect(hw, model, workload, engine, result.best,
                                                         run.common["options"], run.common["limits"]))
    export = run.export
    if args.out:
        save_plan(result.plan, args.out)
    if args.json:
        import json

        data = search_json(run)
        print(json.dumps(data, indent=2) if export is not None else result.plan.model_dump_json(indent=2))
    else:
        render(result, f"{model.name} on {hw.name}: prompt {workload.effective_prompt_len}"
                       f" (max {workload.max_prompt_len}), gen {workload.gen_len}, engine {engine.name}"
                       f" (schedule {engine.schedule})", headroom, routing, args.top,
               any(pin.split("=")[0].strip() in ("attn", "ffn", "rw", "rc")
                   for pin in " ".join(args.fix or []).replace(",", " ").split()))
        if args.out:
            print(f"plan written to {args.out}")
        if export is not None:
            from hrm_cli.export import print_export

            print(f"{export.export.engine} ({export.export.version}):")
            print_export(export, "text")
    if result.verified is False:
        raise HRMError(f"verifier disagrees: search {result.stats.objective_value:.6g} vs verifier {result.verify_objective:.6g}")
    return 0


def _export(result: SearchResult, hw, model, workload, engine, options, target: str):
    """The plan as ``target``'s command line, re-planned inside the target's space when the
    target does not run it as it is (:func:`solver.retarget.export_for_target`)."""
    from solver.retarget import export_for_target

    return export_for_target(result.plan, target, options, hw=hw, model=model)


def ideal_bound_in_words(bound_tok_s: float | None) -> str | None:
    """The ideal machine's bound (:func:`solver.analyses.ideal_bound_tok_s`) as the table's row."""
    if bound_tok_s is None:
        return None
    return f"{bound_tok_s:,.1f} tok/s (engine ideal, the roofline bound on this machine)"


def routing_effect_in_words(effect: RoutingEffect | None) -> str | None:
    """With ``--routing``: the routing planned with and what it does to the chosen policy
    against uniform routing (:func:`solver.analyses.routing_effect`); None without it."""
    if effect is None:
        return None
    line = (f"{effect.routing_label}: {effect.planned_tok_s:,.1f} tok/s vs {effect.uniform_tok_s:,.1f} tok/s with "
            "uniform routing on the same policy")
    return line if effect.unchanged_reason is None else f"{line} (unchanged: {effect.unchanged_reason})"


def no_alternatives_reason(result: SearchResult, pinned_placement: bool = False) -> str:
    """Why a search shows no alternative (the best policy of every other placement)."""
    from hrm.engines.space import allowed_placements

    engine = result.stats.engine
    if engine.schedule == "klotski":
        return (f"engine {engine.name} runs one placement (Klotski's expert-level pipeline); --compare shows "
                "every engine at its best")
    places = allowed_placements(engine)
    if len(places) <= 1:
        where = ", ".join(f"attn={'gpu' if a else 'cpu'} ffn={'gpu' if f else 'cpu'}" for a, f in places)
        return f"engine {engine.name} runs one placement only ({where}); --compare shows every engine at its best"
    if pinned_placement:
        return "--fix pins the placement (attn=, ffn=, or a static share that implies it)"
    return (f"no other placement engine {engine.name} runs admits a policy under these memory and latency "
            "limits")


def render(result: SearchResult, title: str, headroom: str | None = None, routing: str | None = None,
           top: int = 3, pinned_placement: bool = False) -> None:
    """Print a search's result: the table of its best policy (:func:`result_table`), then the
    alternatives, or why there are none when ``top`` asked for some."""
    out = console()
    out.print(result_table(result, title, headroom, routing))
    if not result.alternatives and top > 0:
        out.print(f"alternatives: none: {no_alternatives_reason(result, pinned_placement)}", markup=False)
    if result.alternatives:
        out.print(alternatives_table(result))


def result_table(result: SearchResult, title: str, headroom: str | None = None, routing: str | None = None):
    """The rich table of the best policy: prediction, the server's own pick, the ideal bound
    (``headroom``), the routing's effect, bottleneck, limits, notes, memory and the solve."""
    from rich.table import Table

    best = result.best.estimate
    table = Table(title=title, show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value")
    p = result.best.policy
    pick = result.plan.server_pick
    table.add_row("policy" if pick is None else "policy (HRM's best)", f"N={p.batch_size}  mu={p.micro_batch_size}  n={p.num_micro_batches}  "
                            f"attn={'gpu' if p.attn_on_gpu else 'cpu'}  ffn={'gpu' if p.ffn_on_gpu else 'cpu'}  "
                            f"rw={p.weights_gpu_ratio:.4f}  rc={p.kv_gpu_ratio:.4f}")
    table.add_row("generation throughput", f"{best.generation_throughput_tok_s:,.1f} tok/s")
    if pick is not None:
        table.add_row("server's own pick", server_pick_in_words(pick, best.generation_throughput_tok_s))
        for note in pick.notes:
            table.add_row("server pick note", note)
    if headroom:
        table.add_row("ideal machine bound", headroom)
    table.add_row("decode throughput", f"{best.decode_throughput_tok_s:,.1f} tok/s")
    table.add_row(TPOT_LABEL, tpot_in_words(best.per_token_latency_s, p.batch_size))
    table.add_row("decode layer latency", f"{best.decode_layer_latency_s * 1e3:.3f} ms")
    table.add_row("TTFT (prefill)", f"{best.prefill_latency_s:.2f} s")
    if routing:
        table.add_row("routing", routing)
    table.add_row("bottleneck", best.bottleneck + "  (" + ", ".join(
        f"{k} {v:.0%}" for k, v in best.utilization.items()) + " busy)")
    table.add_row("binding memory", best.binding_memory)
    if result.stats.latency_limits:
        table.add_row("latency limits", latency_limits_met(result.stats.latency_limits, best))
    for note in [*result.stats.notes, *best.notes]:
        table.add_row("note", note)
    if best.defaulted:
        table.add_row("defaulted rates", ", ".join(best.defaulted))
    add_memory_rows(table, best)
    _add_solve_rows(table, result)
    return table


def latency_limits_met(limits: LatencyLimits, best) -> str:
    """How the best policy meets each latency limit, in one line."""
    met = []
    if limits.tpot_s is not None:
        met.append(f"TPOT {best.per_token_latency_s * 1e3:,.4g} ms <= {limits.tpot_s * 1e3:g} ms")
    if limits.ttft_s is not None:
        met.append(f"TTFT {best.prefill_latency_s:,.4g} s <= {limits.ttft_s:g} s")
    return ", ".join(met)


def _add_solve_rows(table, result: SearchResult) -> None:
    """The solve row (time, optimality, space) and, with --verify, the verifier's."""
    proven = "optimal" if result.plan.solver.optimal else "best found (not proven optimal)"
    table.add_row("solve", f"{result.seconds:.2f} s, {proven} over {result.stats.search_space}")
    if result.verified is not None:
        opened, total = result.stats.verify_modes_enumerated, result.stats.verify_modes_total
        table.add_row("verifier", f"{'agrees' if result.verified else 'DISAGREES'}: optimum {result.verify_objective:,.3f} "
                                  f"in {result.verify_seconds:.2f} s ({opened} of {total} modes enumerated and "
                                  f"MILP-certified, the rest bounded per step)")


def alternatives_table(result: SearchResult):
    """The rich table of the alternatives (the best policy of every other placement) beside the best."""
    from rich.table import Table

    best = result.best.estimate
    alt = Table(title="alternatives (the best policy of every other placement)")
    for col in ("policy", "gen tok/s", "vs best", "bottleneck", "binding memory"):
        # numbers whole on one line; text wraps between words (never cut with '…')
        alt.add_column(col, no_wrap=col in ("gen tok/s", "vs best"), overflow="fold")
    for cand in result.alternatives:
        est = cand.estimate
        alt.add_row(policy_cell(cand.policy), f"{est.generation_throughput_tok_s:,.1f}",
                    f"{est.generation_throughput_tok_s / best.generation_throughput_tok_s:.2f}x",
                    est.bottleneck, est.binding_memory)
    return alt


def server_pick_in_words(pick, best_tok_s: float) -> str:
    """The engine's own pick (:class:`hrm.plan.ServerPick`) in one line, beside the search's best."""
    if pick.unavailable is not None:
        return f"none: {pick.unavailable}"
    return (f"{pick.policy.short()}  {pick.generation_throughput_tok_s:,.1f} tok/s (what `{pick.program}` runs; "
            f"HRM's best in its space: {best_tok_s:,.1f})")


def _compare(args) -> int:
    import json

    inputs = search_inputs(args)
    rows = compare_engines(inputs.hw, inputs.model, inputs.workload, with_reference=args.with_reference,
                           **inputs.search_kwargs)
    if args.json:
        print(json.dumps(compare_json(rows), indent=2))
        return 0
    console().print(compare_rich_table(rows, inputs.hw, inputs.model))
    console().print("TPOT/seq: per sequence, one decode step of its engine's whole batch N (TTFT: the batch's "
                    "prefill)", markup=False)
    if args.plot:
        from hrm.plots import compare_table, plot_compare, save_png

        workload = inputs.workload
        title = (f"{inputs.model.name} on {inputs.hw.name}, prompt {workload.effective_prompt_len}, gen "
                 f"{workload.gen_len}: every engine at its best policy ({args.objective})")
        save_png(plot_compare(compare_table(rows), title), args.plot)
        print(f"plot written to {args.plot}")
    return 0


def compare_rich_table(rows: list[EngineBest], hw, model):
    """The rich table of ``hrm-search --compare``: the policy (or the reason there is none)
    under the engine's name, numbers whole on one line under two-line headers, text wrapped
    between words (readable at 80 columns); "vs ideal" against ideal's row, or the best row
    when ideal has no policy."""
    from rich.table import Table
    from rich.text import Text

    ref = next((row for row in rows if row.label == "ideal" and row.result is not None),
               next(row for row in rows if row.result is not None))
    ref_tput = ref.result.best.estimate.generation_throughput_tok_s
    routing = f", routing {model.routing.label()}" if model.routing is not None else ""
    table = Table(title=f"{model.name} on {hw.name}{routing}: every engine at its own best policy", show_lines=True)
    table.add_column("engine\npolicy", overflow="fold")
    for col in ("gen\ntok/s", "decode\ntok/s", "vs\nideal", "TPOT/seq\nms", "TTFT\ns"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("bottleneck", overflow="fold")
    for row in rows:
        name = row.label.replace("/", " / ")  # ideal / flexgen-cpu-attn wraps after ideal
        if row.result is None:
            table.add_row(Text(f"{name}\n") + Text(row.refusal, style="red"), "-", "-", "-", "-", "-", "-")
            continue
        est = row.result.best.estimate
        table.add_row(f"{name}\n{policy_cell(row.result.best.policy)}", short(est.generation_throughput_tok_s),
                      short(est.decode_throughput_tok_s), f"{est.generation_throughput_tok_s / ref_tput:.2f}x",
                      short(est.per_token_latency_s * 1e3), short(est.prefill_latency_s), est.bottleneck)
    return table
