"""What the web planner's worker processes run: one request (:class:`hrm_cli.web.inputs.Request`)
through the CLI's own functions (:func:`hrm_cli.search.run_search`,
:func:`hrm_cli.estimate.run_estimate`, :func:`hrm_cli.fit.run_fit`) and the API's analyses
(:func:`solver.analyses.compare_engines`), answered as ``(status, body)``: 200 and what
``--json`` prints, or an HTTP status and ``{"error": one line}``. No web framework is
imported here: a worker needs only the planner.

Status codes: 400 bad input (:class:`hrm.errors.HRMError`, and values no check caught);
422 infeasible (:class:`hrm.errors.InfeasibleError`: no policy fits, the line names the
binding limit; an estimated policy that does not fit physical memory); 500 only for a bug.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
from contextlib import contextmanager

from hrm.errors import HRMError, InfeasibleError

from .inputs import MODEL_UPLOADS, UPLOAD_PREFIX, Request, one_line

#: exceptions that a value no check caught can raise deep in the model: bad input, not a bug
INPUT_ERRORS = (ValueError, TypeError, ArithmeticError, KeyError, IndexError, UnicodeError, RecursionError)


def answer(request: Request, action: str | None = None) -> tuple[int, object]:
    """``(status, body)`` of ``request`` (``action``: a key of :data:`ENDPOINTS`, default the
    request's endpoint); never raises (a worker's answer is always sent)."""
    try:
        with (_fit_inputs if request.endpoint == "fit" else _machine)(request) as (args, machine):
            return 200, ENDPOINTS[action or request.endpoint](args, machine)
    except InfeasibleError as exc:
        return 422, answer_estimate_body(exc)
    except HRMError as exc:
        return 400, {"error": one_line(exc)}
    except SystemExit as exc:  # an argparse path not routed through parser.error
        return 400, {"error": f"bad arguments (exit {exc.code})"}
    except INPUT_ERRORS as exc:
        return 400, {"error": one_line(f"invalid input: {type(exc).__name__}: {exc}")}
    except Exception as exc:  # noqa: BLE001 - a bug: still one line, never a traceback
        return 500, {"error": one_line(f"internal error: {type(exc).__name__}: {exc}")}


@contextmanager
def _machine(request: Request):
    """(parsed args, (hw, model)) of ``request``: shipped names through the CLI's loaders,
    uploads written to a private temporary folder and read by the same loaders (strict YAML,
    the config.json normaliser); an error naming the temporary path names the upload."""
    from hrm_cli.common import machine_from_args

    args = argparse.Namespace(**vars(request.args))  # a copy: the names below are the worker's own
    up = request.uploads
    given = (args.hw, args.model)
    with tempfile.TemporaryDirectory(prefix="hrm-web-") as folder:
        names = {}
        # shipped names are read from the package's data, never from the server's working folder
        if "hw_yaml" not in up:
            args.hw = str(shipped_profile(args.hw))
        if "model_config" not in up:
            from hrm.model.spec import catalog_config_path

            args.model = str(catalog_config_path(args.model))
        if "hw_yaml" in up:
            args.hw = _written_profile(folder, up, names)
        if "model_config" in up:
            args.model = _written_model(folder, up, names)
        try:
            hw, model = machine_from_args(args)
        except HRMError as exc:
            raise _upload_named(exc, names, folder) from None
        # the names the plan records: as given (as the CLI records them), uploads by their file name
        args.hw = f"{UPLOAD_PREFIX}{up['hw_name']}" if "hw_yaml" in up else given[0]
        args.model = f"{UPLOAD_PREFIX}{up['model_name']}" if "model_config" in up else given[1]
        hw = _what_if(hw, request.whatif)
        if request.whatif:
            args.hw = hw.name
        yield args, (hw, model)


def _written_profile(folder: str, up: dict, names: dict) -> str:
    """The path of the uploaded profile written in ``folder``, recorded in ``names``."""
    path = os.path.join(folder, f"{up['hw_name']}.yaml")
    _write(path, up["hw_yaml"])
    names[path] = f"upload {up['hw_name']}.yaml"
    return path


def _written_model(folder: str, up: dict, names: dict) -> str:
    """The path of the uploaded model written in ``folder`` (FOLDER/NAME/config.json: the loader
    names the model NAME; a GGUF's head as FOLDER/NAME.gguf), recorded in ``names``."""
    if "model_gguf" in up:
        path = os.path.join(folder, f"{up['model_name']}.gguf")
        with open(path, "wb") as handle:
            handle.write(up["model_gguf"])
        names[path] = f"upload {up['model_name']}.gguf"
        return path
    os.mkdir(os.path.join(folder, up["model_name"]))
    path = os.path.join(folder, up["model_name"], "config.json")
    _write(path, up["model_config"])
    names[path] = f"upload {up['model_name']}"
    return path


def _upload_named(exc: HRMError, names: dict, folder: str) -> HRMError:
    """``exc`` with each upload's temporary path replaced by the upload's name."""
    message = str(exc)
    for path, name in names.items():
        message = message.replace(path, name)
    return type(exc)(message.replace(folder, "upload"))


@contextmanager
def _fit_inputs(request: Request):
    """(``hrm fit``'s parsed args, (the model path its command names, the uploads as the URL
    names them)) of ``request``: a shipped profile or catalog model read from the package's
    data, an upload from a private temporary folder (a GGUF's head also as ``--gguf``, the CPU-only
    search's tensors); the body runs inside, so an error naming the temporary path names the
    upload."""
    from hrm.analysis.fit import MODEL_PLACEHOLDER
    from hrm.model.spec import catalog_config_path

    args = argparse.Namespace(**vars(request.args))
    up = request.uploads
    with tempfile.TemporaryDirectory(prefix="hrm-web-") as folder:
        names: dict = {}
        model_path = MODEL_PLACEHOLDER
        if "hw_yaml" in up:
            args.hw = _written_profile(folder, up, names)
        elif args.hw:
            args.hw = str(shipped_profile(args.hw))
        if any(key in up for key in MODEL_UPLOADS):
            args.model = _written_model(folder, up, names)
            if "model_gguf" in up:
                args.gguf, model_path = args.model, f"{up['model_name']}.gguf"
        elif args.model:
            args.model = str(catalog_config_path(args.model))
        try:
            # what the shareable URL says in place of an upload (hw=upload:NAME, model=upload:NAME)
            shared = {key: f"{UPLOAD_PREFIX}{up[f'{key}_name']}" for key in ("hw", "model") if f"{key}_name" in up}
            yield args, (model_path, shared)
        except HRMError as exc:
            raise _upload_named(exc, names, folder) from None


def fit(args, model: tuple[str, dict]) -> dict:
    """``hrm fit --json`` (:func:`hrm.analysis.fit.fit_json`), the lines ``hrm fit`` prints
    (``report``: :func:`hrm.analysis.fit.fit_report`) and the upload the URL names; ``model``:
    what :func:`_fit_inputs` yields. With a load (``rate_per_s``, ``requests``): the load fit's JSON
    (:func:`hrm.analysis.fit_load.load_fit_json`) and its lines (``report.lines``)."""
    from dataclasses import asdict

    from hrm.analysis.fit import fit_json, fit_report
    from hrm_cli.fit import run_fit

    model_path, uploads = model
    if args.rate_per_s is not None or args.requests is not None:  # a server's load: hrm fit --rate-per-s
        from hrm.analysis.fit_load import load_fit_json, load_fit_lines
        from hrm_cli.fit import run_load_fit

        hw, load = run_load_fit(args)
        return {**load_fit_json(load, hw.name, model_path),
                "report": {"lines": load_fit_lines(load, hw.name, model_path), "notes": list(load.notes)},
                "uploads": uploads}
    hw, result = run_fit(args)
    return {**fit_json(result, hw.name, model_path), "report": asdict(fit_report(result, hw.name, model_path)),
            "uploads": uploads}


def shipped_profile(name: str):
    """The shipped profile file of ``name`` (``l4`` or ``l4.yaml``) in the package's data."""
    from hrm.machine.hardware import list_profiles, profile_dirs

    stem = name[:-5] if name.endswith(".yaml") else name[:-4] if name.endswith(".yml") else name
    for folder in profile_dirs():
        for candidate in (folder / f"{stem}.yaml", folder / f"{stem}.yml"):
            if candidate.is_file():
                return candidate
    raise HRMError(f"hardware profile '{name}' not found (shipped: {', '.join(list_profiles())})")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _what_if(hw, whatif: dict):
    """The profile with the page's what-ifs (hrm.machine.whatif): link bandwidth, CPU scaling."""
    from pydantic import ValidationError

    from hrm.errors import pydantic_message
    from hrm.machine.whatif import with_cpu_scaled, with_link_bandwidth

    try:
        if whatif.get("link_gbps") is not None:
            hw = with_link_bandwidth(hw, whatif["link_gbps"])
        if whatif.get("cpu_scale") is not None:
            hw = with_cpu_scaled(hw, whatif["cpu_scale"])
    except ValidationError as exc:
        raise HRMError(pydantic_message(f"what-if on {hw.name}", exc)) from None
    return hw


def search(args, machine) -> dict:
    """``hrm-search --json``."""
    from hrm_cli.search import run_search, search_json

    return search_json(run_search(args, machine))


export = search  # ``hrm-search --export ENGINE --json``: {"plan": ..., "export": ...}


def compare(args, machine) -> dict:
    """``hrm-search --compare --json``: :func:`solver.analyses.compare_engines` on the request's inputs."""
    from hrm_cli.search import compare_json, search_inputs
    from solver.analyses import compare_engines

    inputs = search_inputs(args, machine)
    return compare_json(compare_engines(inputs.hw, inputs.model, inputs.workload, **inputs.search_kwargs))


def estimate(args, machine) -> dict:
    """``hrm estimate --json`` (422 with the estimate beside the line when the policy does not fit)."""
    from hrm_cli.estimate import run_estimate

    run = run_estimate(args, machine)
    if not run.fits_physical:
        raise _Infeasible(run.infeasible_line(), run.json)
    return run.json


class _Infeasible(InfeasibleError):
    def __init__(self, message: str, body: dict):
        super().__init__(message)
        self.body = body


def exports(args, machine) -> dict:
    """Every export target's command line(s) of the plan (the page's export section): per
    target ``{"commands", "exact", "notes"}`` or ``{"error": one line}`` where it refuses."""
    from hrm.export import EXPORTERS
    from hrm_cli.search import run_search
    from solver.retarget import export_for_target

    run = run_search(args, machine)
    out = {}
    for target in EXPORTERS:
        try:
            done = export_for_target(run.result.plan, target, run.options, hw=run.hw, model=run.model).export
            out[target] = {"commands": list(done.commands), "exact": done.exact, "notes": list(done.notes)}
        except HRMError as exc:
            out[target] = {"error": one_line(exc)}
    return out


def view(args, machine) -> dict:
    """What the page shows first: the plan (``hrm-search --json``), ``--explain`` of its policy,
    the memory per tier against capacity and the alternatives (the exports: :func:`exports`)."""
    from hrm.analysis.explain import explain
    from hrm_cli.search import run_search, search_json

    run = run_search(args, machine)
    best = run.result.best
    est = best.estimate
    uploaded_model = args.model.startswith(UPLOAD_PREFIX)
    try:
        why = explain(run.hw, run.model, run.workload, best.policy, run.engine, run.options,
                      run.common["limits"]).as_dict()
    except HRMError as exc:
        why = {"error": one_line(exc)}
    tiers = ([("host", est.gpu_peak_bytes + est.cpu_peak_bytes, est.cpu_limit_bytes)] if est.shared_memory else
             [("GPU", est.gpu_peak_bytes, est.gpu_limit_bytes), ("CPU", est.cpu_peak_bytes, est.cpu_limit_bytes)])
    return {
        "plan": search_json(run),
        "title": f"{args.model if uploaded_model else run.model.name} on {run.hw.name}: prompt {run.workload.effective_prompt_len} "
                 f"(max {run.workload.max_prompt_len}), gen {run.workload.gen_len}, engine {run.engine.name}",
        "policy": best.policy.short(),
        "tpot_ms": est.per_token_latency_s * 1e3,
        "ttft_s": est.prefill_latency_s,
        "utilization": dict(est.utilization),
        "binding_memory": est.binding_memory,
        "memory": [{"tier": t, "used_bytes": used, "capacity_bytes": cap} for t, used, cap in tiers],
        "alternatives": [{"policy": c.policy.short(), "generation_throughput_tok_s": c.estimate.generation_throughput_tok_s,
                          "bottleneck": c.estimate.bottleneck} for c in run.result.alternatives],
        "notes": [*run.result.stats.notes, *est.notes],
        "explain": why,
        "solve_s": run.result.seconds,
        # what the shareable URL says in place of an upload (hw=upload:NAME, model=upload:NAME)
        "uploads": {key: value for key, value in (("hw", args.hw), ("model", args.model))
                    if value.startswith(UPLOAD_PREFIX)},
    }


def plot(args, machine, kind: str) -> str:
    """The roofline (MoE FFN at the best policy's micro-batch) or the decode timeline of the
    best policy, drawn by :mod:`hrm.plots` as SVG text."""
    from hrm.plots import plot_roofline, plot_timeline, roofline_data
    from hrm.pipelines import decode_timeline
    from hrm.problem import make_problem
    from hrm.workload import mean_decode_context
    from hrm_cli.search import run_search

    run = run_search(args, machine)
    policy = run.result.best.policy
    if kind == "roofline":
        sizes = sorted({16, 64, 256, 1024, policy.batch_size})
        fig = plot_roofline(roofline_data(run.hw, run.model, "moe-ffn", 512, policy.micro_batch_size, sizes,
                                          options=run.options))
    else:
        context = mean_decode_context(run.workload)
        problem = make_problem(run.hw, run.model, run.workload, run.engine, run.options)
        timeline = decode_timeline(problem, policy, context=context)
        fig = plot_timeline(timeline, f"{run.model.name} on {run.hw.name}, {policy.short()}, context {context:.0f}")
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    return buffer.getvalue()


ENDPOINTS = {"search": search, "export": export, "compare": compare, "estimate": estimate, "view": view,
             "exports": exports, "fit": fit,
             "plot/roofline": lambda a, m: plot(a, m, "roofline"), "plot/timeline": lambda a, m: plot(a, m, "timeline")}


def answer_estimate_body(exc: InfeasibleError) -> dict:
    """The 422 body of an estimate that does not fit: the line and the estimate."""
    body = {"error": one_line(exc)}
    if isinstance(exc, _Infeasible):
        body["estimate"] = exc.body
    return body
