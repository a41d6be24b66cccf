"""The planner page (Jinja2, server-rendered): the form with every input, prefilled from the
URL's query string (the shareable URL), and the empty result sections that
``static/planner.js`` fills from the JSON API."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hrm.errors import HRMError

from .inputs import ENDPOINT_FIELDS, one_line, parse_request


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


def render_page(query: dict) -> str:
    """The page; ``query`` (the URL's fields) prefills the form. A bad URL still renders the
    page, with its one-line error shown, and does not run."""
    problem = None
    fields = {k: v for k, v in query.items() if k in ENDPOINT_FIELDS["view"]}
    unknown = [k for k in query if k not in ENDPOINT_FIELDS["view"]]
    try:
        if unknown:
            raise HRMError(f"unknown URL field '{one_line(unknown[0], 40)}'")
        if fields:
            parse_request("view", fields)
    except HRMError as exc:
        problem = one_line(exc)
    values = {"hw": "l4", "model": "mixtral", "workload": "mtbench", "objective": "generation", **fields}
    return _environment().get_template("index.html").render(
        values=values, choices=choices(), error=problem, autorun=bool(fields) and problem is None)
