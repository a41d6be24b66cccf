"""``hrm-search`` / ``hrm search``: the best policy, its prediction, and a plan file."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hrm_cli.parser import ArgumentParser
from hrm_cli.common import (add_engine_args, add_machine_args, add_memory_args, add_workload_args, console,
                            engine_from_args, gib, limits_from_args, machine_from_args, options_from_args, policy_cell,
                            short, tpot_in_words, TPOT_LABEL, workload_from_args)
from hrm.errors import HRMError
from hrm import bounds
from hrm.cost.memory import physical_limits
from hrm.plan import check_output_path, save_plan
from hrm.policy import parse_assignments, policy_refusal

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
    problem = policy_refusal(fixed)
    if problem:
        raise HRMError(f"--fix: {problem}")
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


def search_inputs(args, machine=None) -> tuple:
    """(hw, model, workload, options, limits, common) of parsed ``hrm-search`` flags; ``machine``
    = (hw, model) already loaded (the web planner's uploads), else --hw/--model are loaded."""
    hw, model = machine if machine is not None else machine_from_args(args)
    workload = workload_from_args(args)
    options = options_from_args(args)
    limits = limits_from_args(hw, options, args)
    fixed = parse_fix(args.fix)
    latency_limits = LatencyLimits(args.max_tpot_ms / 1e3 if args.max_tpot_ms is not None else None, args.max_ttft_s)
    common = dict(objective=args.objective, fixed=fixed, max_batch=args.max_batch, options=options, limits=limits,
                  latency_limits=latency_limits, time_limit_s=args.time_limit_s,
                  solver=args.solver, hw_name=args.hw, model_name=args.model)
    return hw, model, workload, options, limits, common


def run_search(args, machine=None) -> SearchRun:
    """The search of parsed ``hrm-search`` flags (not --compare), the server's pick beside it,
    and the --export rendering: everything ``main`` prints, nothing printed or written."""
    hw, model, workload, options, limits, common = search_inputs(args, machine)
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


def compare_json(rows) -> dict:
    """What ``hrm-search --compare --json`` prints, as data: each label's plan or the one-line
    reason it has none, best first."""
    import json

    return {s: (r if isinstance(r, str) else json.loads(r.plan.model_dump_json())) for s, r in rows}


def run_compare(args, machine=None) -> tuple:
    """(hw, model, workload, rows) of ``hrm-search --compare`` (rows: :func:`compare_engines`)
    of parsed flags; HRMError when no engine admits a policy."""
    hw, model, workload, _, _, common = search_inputs(args, machine)
    rows = compare_engines(hw, model, workload, common, bool(getattr(args, "with_reference", False)))
    if not any(not isinstance(r, str) for _, r in rows):
        raise HRMError("no engine admits a policy: " + "; ".join(f"{s}: {r}" for s, r in rows))
    return hw, model, workload, rows


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
    headroom = _ideal_bound(hw, model, workload, engine, run.common) if not args.json else None
    routing = routing_effect(hw, model, workload, engine, run.common, result.best) if not args.json else None
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


def _ideal_bound(hw, model, workload, engine, common) -> str | None:
    """The ideal machine's best throughput under the same inputs, beside the engine's: the
    headroom no engine's mechanisms leave (None for engine ideal itself, or when ideal has
    no policy either)."""
    if engine.name == "ideal":
        return None
    try:
        ideal = search(hw, model, workload, top=0, engine="ideal", **common).best.estimate
    except HRMError:
        return None
    return f"{ideal.generation_throughput_tok_s:,.1f} tok/s (engine ideal, the roofline bound on this machine)"


def routing_effect(hw, model, workload, engine, common, best) -> str | None:
    """With ``--routing``: the routing planned with, and what it does to the chosen policy
    against uniform routing (one more estimate, not a search); None without it."""
    if model.routing is None:
        return None
    from hrm.estimate import estimate

    uniform = estimate(hw, model.with_routing(None), workload, best.policy, options=common["options"],
                       limits=common["limits"], engine=engine)
    planned_tok_s, uniform_tok_s = best.estimate.generation_throughput_tok_s, uniform.generation_throughput_tok_s
    line = (f"{model.routing.label()}: {planned_tok_s:,.1f} tok/s vs {uniform_tok_s:,.1f} tok/s with uniform routing "
            f"on the same policy")
    if not math.isclose(planned_tok_s, uniform_tok_s, rel_tol=SAME_THROUGHPUT_REL):
        return line
    return f"{line} (unchanged: {routing_unchanged_reason(model, engine, best.policy)})"


#: throughputs closer than this (relative) are "the same" when --routing is compared with
#: uniform: float noise of two estimates, far below any modelled effect (our choice)
SAME_THROUGHPUT_REL = 1e-6


def routing_unchanged_reason(model, engine, policy) -> str:
    """Why a routing leaves the policy's estimate as uniform routing has it: every expert of a
    layer is active in each micro-batch under both, or the engine's cost at this policy does
    not depend on which experts are chosen."""
    from hrm.model.routing import expected_distinct_experts, routing_reach, uniform

    reach = routing_reach(engine, model.num_experts, model.top_k)
    if not reach.can_change_plan:
        return reach.reason
    tokens = policy.micro_batch_size  # one decode token per sequence of a micro-batch
    active = [float(expected_distinct_experts(r, tokens)) for r in
              (model.routing, uniform(model.num_experts, model.top_k))]
    if min(active) >= model.num_experts - ALL_EXPERTS_MARGIN:
        return (f"at mu={tokens} tokens per micro-batch all {model.num_experts} experts of a layer are active under "
                "either routing, so every layer moves and computes the same experts")
    return (f"{reach.reason}; none of these binds at this policy ({min(active):.1f}-{max(active):.1f} of "
            f"{model.num_experts} experts active per micro-batch)")


#: fewer than this many expected inactive experts per layer counts as "all active" (our choice:
#: a hundredth of an expert changes no estimate visibly)
ALL_EXPERTS_MARGIN = 0.01


def no_alternatives_reason(result: SearchResult, pinned_placement: bool = False) -> str:
    """Why a search shows no alternative (the best policy of every other placement)."""
    from solver.lanes.terms import allowed_placements

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
    limits = result.stats.latency_limits
    if limits:
        met = []
        if limits.tpot_s is not None:
            met.append(f"TPOT {best.per_token_latency_s * 1e3:,.4g} ms <= {limits.tpot_s * 1e3:g} ms")
        if limits.ttft_s is not None:
            met.append(f"TTFT {best.prefill_latency_s:,.4g} s <= {limits.ttft_s:g} s")
        table.add_row("latency limits", ", ".join(met))
    for note in [*result.stats.notes, *best.notes]:
        table.add_row("note", note)
    if best.defaulted:
        table.add_row("defaulted rates", ", ".join(best.defaulted))
    if best.shared_memory:
        table.add_row("host memory", f"{gib(best.gpu_peak_bytes + best.cpu_peak_bytes)} / {gib(best.cpu_limit_bytes)}")
    else:
        table.add_row("GPU memory", f"{gib(best.gpu_peak_bytes)} / {gib(best.gpu_limit_bytes)}")
        table.add_row("CPU memory", f"{gib(best.cpu_peak_bytes)} / {gib(best.cpu_limit_bytes)}")
        if best.disk_bytes > 0:  # the disk tier (docs/model.md §4.9)
            table.add_row("disk (weights)", f"{gib(best.disk_bytes)} beyond host memory, read every pass")
    proven = "optimal" if result.plan.solver.optimal else "best found (not proven optimal)"
    table.add_row("solve", f"{result.seconds:.2f} s, {proven} over {result.stats.search_space}")
    if result.verified is not None:
        opened, total = result.stats.verify_modes_enumerated, result.stats.verify_modes_total
        table.add_row("verifier", f"{'agrees' if result.verified else 'DISAGREES'}: optimum {result.verify_objective:,.3f} "
                                  f"in {result.verify_seconds:.2f} s ({opened} of {total} modes enumerated and "
                                  f"MILP-certified, the rest bounded per step)")
    out = console()
    out.print(table)
    if not result.alternatives and top > 0:
        out.print(f"alternatives: none: {no_alternatives_reason(result, pinned_placement)}", markup=False)
    if result.alternatives:
        alt = Table(title="alternatives (the best policy of every other placement)")
        for col in ("policy", "gen tok/s", "vs best", "bottleneck", "binding memory"):
            # numbers whole on one line; text wraps between words (never cut with '…')
            alt.add_column(col, no_wrap=col in ("gen tok/s", "vs best"), overflow="fold")
        for cand in result.alternatives:
            est = cand.estimate
            alt.add_row(policy_cell(cand.policy), f"{est.generation_throughput_tok_s:,.1f}",
                        f"{est.generation_throughput_tok_s / best.generation_throughput_tok_s:.2f}x",
                        est.bottleneck, est.binding_memory)
        out.print(alt)


def server_pick_in_words(pick, best_tok_s: float) -> str:
    """The engine's own pick (:class:`hrm.plan.ServerPick`) in one line, beside the search's best."""
    if pick.unavailable is not None:
        return f"none: {pick.unavailable}"
    return (f"{pick.policy.short()}  {pick.generation_throughput_tok_s:,.1f} tok/s (what `{pick.program}` runs; "
            f"HRM's best in its space: {best_tok_s:,.1f})")


#: the reference runtime (runtime/, ``hrm run``): it runs the plain model (no engine
#: mechanism), so on a datasheet profile it ties ``ideal`` row for row; it is not a serving
#: engine, and --compare lists it only when asked (--with-reference), under this label
REFERENCE_ENGINES = {"hrm-runtime": "hrm-runtime (reference runtime)"}


def compare_engines(hw, model, workload, common, with_reference: bool = False) -> list[tuple[str, object]]:
    """Every shipped engine (and ideal's other schedules) at its own best policy: a list of
    (label, SearchResult or the one-line reason it has none), best first. The reference
    runtime (:data:`REFERENCE_ENGINES`) only ``with_reference``, labelled as such."""
    from hrm.engines.engine import list_engines, load_engine
    from hrm.engines.schedules import SCHEDULES

    runs = [(REFERENCE_ENGINES.get(name, name), load_engine(name)) for name in list_engines()
            if with_reference or name not in REFERENCE_ENGINES]
    runs += [(f"ideal/{s}", load_engine("ideal").with_schedule(s)) for s in SCHEDULES if s != "cgopipe"]
    rows = []
    for label, engine in runs:
        try:
            rows.append((label, search(hw, model, workload, top=0, engine=engine, **common)))
        except HRMError as exc:
            rows.append((label, str(exc)))
    rows.sort(key=lambda r: _rank(r[1], common.get("objective", "generation")))
    return rows


def _rank(result, objective: str) -> float:
    """Sort key of a --compare row: best first by the objective, engines without a policy last."""
    if isinstance(result, str):
        return float("inf")
    from solver.search import objective_score

    return -objective_score(result.best.estimate, objective)


def _compare(args) -> int:
    import json

    from rich.table import Table
    from rich.text import Text

    hw, model, workload, rows = run_compare(args)
    ok = [r for _, r in rows if not isinstance(r, str)]
    ref = next((r for s, r in rows if s == "ideal" and not isinstance(r, str)), ok[0])
    ref_tput = ref.best.estimate.generation_throughput_tok_s
    if args.json:
        print(json.dumps(compare_json(rows), indent=2))
        return 0
    routing = f", routing {model.routing.label()}" if model.routing is not None else ""
    # the policy (or the reason there is none) under the engine's name, numbers whole on one
    # line under two-line headers, text wrapped between words: readable at 80 columns
    table = Table(title=f"{model.name} on {hw.name}{routing}: every engine at its own best policy", show_lines=True)
    table.add_column("engine\npolicy", overflow="fold")
    for col in ("gen\ntok/s", "decode\ntok/s", "vs\nideal", "TPOT/seq\nms", "TTFT\ns"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("bottleneck", overflow="fold")
    for label, res in rows:
        name = label.replace("/", " / ")  # ideal / flexgen-cpu-attn wraps after ideal
        if isinstance(res, str):
            table.add_row(Text(f"{name}\n") + Text(res, style="red"), "-", "-", "-", "-", "-", "-")
            continue
        est = res.best.estimate
        table.add_row(f"{name}\n{policy_cell(res.best.policy)}", short(est.generation_throughput_tok_s),
                      short(est.decode_throughput_tok_s), f"{est.generation_throughput_tok_s / ref_tput:.2f}x",
                      short(est.per_token_latency_s * 1e3), short(est.prefill_latency_s), est.bottleneck)
    console().print(table)
    console().print("TPOT/seq: per sequence, one decode step of its engine's whole batch N (TTFT: the batch's "
                    "prefill)", markup=False)
    if args.plot:
        from hrm.plots import compare_table, plot_compare, save_png

        title = (f"{model.name} on {hw.name}, prompt {workload.effective_prompt_len}, gen {workload.gen_len}: "
                 f"every engine at its best policy ({args.objective})")
        save_png(plot_compare(compare_table(rows), title), args.plot)
        print(f"plot written to {args.plot}")
    return 0
