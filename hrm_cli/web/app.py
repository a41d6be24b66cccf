"""The web planner's FastAPI app: the page, the JSON API and the figures.

Routes (every JSON answer is what the CLI's ``--json`` prints, or ``{"error": one line}``):

- ``GET /healthz``;
- ``GET /`` the page (its query string: the fields, so a URL reproduces a plan);
  ``GET /fit`` the fit page (``hrm fit``: a machine, a model and a context; its URL likewise);
- ``POST /api/search | /api/estimate | /api/compare | /api/export`` (``hrm-search --json``,
  ``hrm estimate --json``, ``hrm-search --compare --json``, ``hrm-search --export ENGINE --json``);
- ``POST /api/fit``: ``hrm fit --json`` with the lines ``hrm fit`` prints (``report``);
- ``POST /api/view``: what the page shows first (the plan, ``--explain``, memory per tier);
  ``POST /api/exports``: every export target's command of that plan;
- ``POST /api/plot/{roofline,timeline}.svg`` and ``GET /plot/{roofline,timeline}.svg?FIELDS``.

Bodies are JSON objects, forms or multipart forms (uploads ``hw_file``, ``model_file``), at
most :data:`hrm_cli.web.inputs.MAX_BODY_BYTES` (``/api/fit``: a GGUF's head more). Each request runs in a worker process
(:mod:`hrm_cli.web.work`), off the event loop, and is answered within ``timeout_s`` (504
otherwise; the worker finishes its search in the background).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from hrm.errors import HRMError

from . import DEFAULT_TIMEOUT_S, DEFAULT_WORKERS, work
from .inputs import (GGUF_MAGIC, MAX_BODY_BYTES, MAX_FIT_BODY_BYTES, MAX_GGUF_HEAD_BYTES, MAX_UPLOAD_BYTES,
                     one_line, parse_request)

HERE = Path(__file__).resolve().parent
API = ("search", "estimate", "compare", "export", "view", "exports", "fit")
#: the body limit of an endpoint (the fit page uploads a GGUF's head); the rest: MAX_BODY_BYTES
BODY_LIMITS = {"fit": MAX_FIT_BODY_BYTES}
PLOTS = ("roofline", "timeline")


def _warm() -> None:
    """Import the planner in a fresh worker, so the first request does not pay for it."""
    import hrm_cli.search  # noqa: F401
    import solver.retarget  # noqa: F401


def error(status: int, message) -> JSONResponse:
    return JSONResponse({"error": one_line(message)}, status_code=status)


#: what the page loads beside a plan (every engine, the exports, the figures): a pool of their
#: own, so that they never queue in front of the next plan
BACKGROUND = ("compare", "exports", "plot/roofline", "plot/timeline")
#: seconds between checks that the client still waits for an answer
DISCONNECT_POLL_S = 0.1


class Planner:
    """The worker pools and the time bound of every request. Plans (search, view, estimate,
    export) and what the page loads beside them (:data:`BACKGROUND`) run in separate pools of
    ``workers`` together (one shared pool with a single worker), and a request whose client
    has gone (the page aborted it for a newer plan) is cancelled if it has not started."""

    def __init__(self, workers: int, timeout_s: float):
        self.workers, self.timeout_s = workers, timeout_s
        self.pools: dict[str, ProcessPoolExecutor] = {}

    @property
    def pool(self) -> ProcessPoolExecutor | None:
        return self.pools.get("plan")

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        plan = max(1, self.workers // 2)
        self.pools = {"plan": ProcessPoolExecutor(plan, mp_context=context, initializer=_warm)}
        rest = self.workers - plan
        self.pools["background"] = (ProcessPoolExecutor(rest, mp_context=context, initializer=_warm) if rest
                                    else self.pools["plan"])

    def stop(self) -> None:
        """Cancel what waits, end the workers (a search still running is not waited for)."""
        pools, self.pools = list({id(p): p for p in self.pools.values()}.values()), {}
        for pool in pools:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
            for process in processes:
                process.join(timeout=5)

    async def run(self, request, action: str, gone=None) -> tuple[int, object]:
        """``(status, body)`` of ``request``; ``gone``: an async callable, true once the client
        has closed the connection (the answer is then not computed if it has not started)."""
        if not self.pools:
            self.start()
        loop = asyncio.get_running_loop()
        pool = self.pools["background" if action in BACKGROUND else "plan"]
        future = loop.run_in_executor(pool, work.answer, request, action)
        deadline = loop.time() + self.timeout_s
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    future.cancel()
                    return 504, {"error": f"no answer within {self.timeout_s:g} s (the request's time bound); "
                                          "narrow the search (--fix, --max-batch)"}
                done, _ = await asyncio.wait({future}, timeout=min(left, DISCONNECT_POLL_S if gone else left))
                if done:
                    return future.result()
                if gone is not None and await gone():
                    future.cancel()  # not started: it never runs; started: it finishes unseen
                    return 499, {"error": "the client closed the request"}
        except BrokenProcessPool:
            self.stop()  # a worker died (out of memory?): fresh pools for the next request
            return 500, {"error": "a worker process died during the request; try again"}


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, refused (HRMError) past ``limit`` bytes whether or not it says its length."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise HRMError(f"request body larger than {limit >> 10} KiB")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HRMError(f"request body larger than {limit >> 10} KiB")
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # the form parser reads the cached body
    return body


def _refuse_constant(name: str):
    raise HRMError(f"{name} is not a finite number")


async def _upload_fields(key: str, upload) -> dict:
    """The fields of one uploaded file: a GGUF's head (``model_file`` that starts with the GGUF
    magic) as its bytes, any other file as its text."""
    data = await upload.read(MAX_GGUF_HEAD_BYTES + 1) if hasattr(upload, "read") else str(upload).encode()
    name_key = "hw_name" if key == "hw_file" else "model_name"
    name = {name_key: getattr(upload, "filename", None) or ""}
    if key == "model_file" and data.startswith(GGUF_MAGIC):
        return {"model_gguf": data, **name}  # its size is checked with the request (inputs._gguf_head)
    if len(data) > MAX_UPLOAD_BYTES:
        raise HRMError(f"{key}: larger than {MAX_UPLOAD_BYTES >> 10} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HRMError(f"{key}: not UTF-8 text") from None
    return {"hw_yaml" if key == "hw_file" else "model_config": text, **name}


async def request_fields(request: Request, limit: int = MAX_BODY_BYTES) -> dict:
    """The fields of a JSON, form or multipart body of at most ``limit`` bytes (uploads as their
    text, a GGUF's head as its bytes)."""
    body = await read_body(request, limit)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_files=2, max_fields=64)
        fields: dict = {}
        for key in form:
            values = form.getlist(key)
            if key in ("hw_file", "model_file"):
                uploaded = await _upload_fields(key, values[0])
                name_key = "hw_name" if key == "hw_file" else "model_name"
                fields.setdefault(name_key, uploaded.pop(name_key))
                fields.update(uploaded)
            elif any(hasattr(v, "read") for v in values):
                raise HRMError(f"{key}: a file where a field was expected (files: hw_file, model_file)")
            else:
                fields[key] = values if key == "fix" and len(values) > 1 else values[-1]
        return fields
    if not body.strip():
        return {}
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise HRMError("request body is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise HRMError(f"malformed JSON body ({one_line(exc, 80)})") from None


def create_app(workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S) -> FastAPI:
    """The web planner's app: the page, the JSON API and the figures, each request answered by
    a :class:`Planner` of ``workers`` processes within ``timeout_s``."""
    planner = Planner(workers, timeout_s)

    @asynccontextmanager
    async def lifespan(app):
        planner.start()
        try:
            yield
        finally:
            planner.stop()

    app = FastAPI(title="HRM web planner", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.planner = planner
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _add_error_handlers(app)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "workers": planner.workers, "timeout_s": planner.timeout_s}

    answer = _answerer(planner)
    _add_api_routes(app, answer)
    _add_plot_routes(app, answer)

    @app.get("/", response_class=HTMLResponse)
    async def page(request: Request):
        from .page import render_page

        return HTMLResponse(render_page(dict(request.query_params)))

    @app.get("/fit", response_class=HTMLResponse)
    async def fit_page(request: Request):
        from .page import render_page

        return HTMLResponse(render_page(dict(request.query_params), "fit"))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answered as ``{"error": one line}``: HTTP errors with their status, the rest 500."""
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return error(exc.status_code, exc.detail)

    @app.exception_handler(Exception)
    async def any_error(request, exc):
        return error(500, f"internal error: {type(exc).__name__}")


def _answerer(planner: Planner):
    """``answer(endpoint, action, fields_of, request)``: the request's fields (``fields_of``,
    async) checked for ``endpoint`` and run as ``action`` by ``planner``: a JSON answer, or the
    SVG of a figure."""
    async def answer(endpoint: str, action: str, fields_of, request: Request | None = None) -> Response:
        try:
            fields = await fields_of()
            req = parse_request(endpoint, fields)
        except HRMError as exc:
            return error(400, exc)
        status, body = await planner.run(req, action, request.is_disconnected if request is not None else None)
        if action.startswith("plot/") and status == 200:
            return Response(body, media_type="image/svg+xml", headers={"Cache-Control": "no-store"})
        return JSONResponse(body, status_code=status)
    return answer


def _add_api_routes(app: FastAPI, answer) -> None:
    """``POST /api/NAME`` for every name of :data:`API`."""
    def api(endpoint: str):
        async def handler(request: Request) -> Response:
            limit = BODY_LIMITS.get(endpoint, MAX_BODY_BYTES)
            return await answer(endpoint, endpoint, lambda: request_fields(request, limit), request)
        return handler

    for name in API:
        app.add_api_route(f"/api/{name}", api(name), methods=["POST"], name=f"api_{name}")


def _add_plot_routes(app: FastAPI, answer) -> None:
    """``POST /api/plot/KIND.svg`` (fields in the body) and ``GET /plot/KIND.svg`` (fields in
    the query string) for every kind of :data:`PLOTS`."""
    for kind in PLOTS:
        async def plot_post(request: Request, kind=kind):
            return await answer("plot", f"plot/{kind}", lambda: request_fields(request), request)

        async def plot_get(request: Request, kind=kind):
            async def fields_of():
                return dict(request.query_params)
            return await answer("plot", f"plot/{kind}", fields_of, request)

        app.add_api_route(f"/api/plot/{kind}.svg", plot_post, methods=["POST"], name=f"plot_post_{kind}")
        app.add_api_route(f"/plot/{kind}.svg", plot_get, methods=["GET"], name=f"plot_get_{kind}")
