"""The pages (Jinja2, server-rendered): the planner (``/``) and hrm fit (``/fit``), each a form
with every input, prefilled from the URL's query string (the shareable URL), and the empty
result sections that ``static/planner.js`` and ``static/fit.js`` fill from the JSON API."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hrm.errors import HRMError

from .inputs import ENDPOINT_FIELDS, EXTRA_FIELDS, MAX_GGUF_HEAD_BYTES, one_line, parse_request


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"),
                       autoescape=select_autoescape(["html"]))


@lru_cache(maxsize=1)
def choices() -> dict:
    """The options of the page's selects: shipped profiles, catalog models, engines, presets,
    objectives, dtypes and export targets."""
    from hrm.engines.engine import list_engines
    from hrm.export import EXPORTERS
    from hrm.machine.hardware import list_profiles
    from hrm.model.spec import list_catalog
    from hrm.engines.schedules import SCHEDULES
    from hrm.units import DTYPES
    from hrm.workload import PRESETS
    from hrm.engines.engine import DEFAULT_ENGINE
    from solver.search import OBJECTIVES

    return {"hw": list_profiles(), "model": list_catalog(), "engine": list_engines(), "schedule": list(SCHEDULES),
            "workload": list(PRESETS), "presets": PRESETS, "objective": list(OBJECTIVES), "dtype": list(DTYPES),
            "targets": list(EXPORTERS), "default_engine": DEFAULT_ENGINE}


@lru_cache(maxsize=1)
def fit_choices() -> dict:
    """The options of the fit page's selects: shipped profiles, the parts catalog's GPUs and CPU
    platforms, catalog models, weight dtypes and GGUF weight formats."""
    from hrm.machine.hardware import list_profiles
    from hrm.machine.parts import catalog
    from hrm.model.quantized import WEIGHT_FORMATS
    from hrm.model.spec import list_catalog
    from hrm.units import DTYPES

    parts = catalog()
    return {"hw": list_profiles(), "gpu": {k: p.name for k, p in parts.gpus.items()},
            "cpu": {k: p.name for k, p in parts.cpus.items()}, "model": list_catalog(), "dtype": list(DTYPES),
            "weight_format": list(WEIGHT_FORMATS), "gguf_head_bytes": MAX_GGUF_HEAD_BYTES}


#: page -> (its endpoint, template, the form's values without a URL, its choices): the planner
#: at /, hrm fit at /fit (prefilled with the README's hrm fit example)
PAGES = {
    "view": ("view", "index.html", {"hw": "l4", "model": "mixtral", "workload": "mtbench", "objective": "generation"},
             choices),
    "fit": ("fit", "fit.html", {"gpu": "rtx-4090", "cpu": "ryzen-9-7950x", "ram": "64", "model": "mixtral",
                                "weight_dtype": "int4", "weight_format": "q4_k_m", "context": "4096"}, fit_choices),
}


def render_page(query: dict, page: str = "view") -> str:
    """The page (``view``: the planner; ``fit``: hrm fit); ``query`` (the URL's fields) prefills
    the form. A bad URL still renders the page, with its one-line error shown, and does not run."""
    endpoint, template, defaults, options = PAGES[page]
    # the fit page's URL holds no upload fields (the planner's never read them either: refused later)
    allowed = [k for k in ENDPOINT_FIELDS[endpoint] if page == "view" or k not in EXTRA_FIELDS]
    problem = None
    fields = {k: v for k, v in query.items() if k in allowed}
    unknown = [k for k in query if k not in allowed]
    try:
        if unknown:
            raise HRMError(f"unknown URL field '{one_line(unknown[0], 40)}'")
        if fields:
            parse_request(endpoint, fields)
    except HRMError as exc:
        problem = one_line(exc)
    # the planner's defaults are the CLI's own; hrm fit has none, so a URL's fields stand alone
    values = {**defaults, **fields} if page == "view" or not fields else fields
    return _environment().get_template(template).render(
        values=values, choices=options(), error=problem, autorun=bool(fields) and problem is None)
