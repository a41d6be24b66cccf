"""``hrm serve``: the web planner (FastAPI + uvicorn) on loopback by default."""

from __future__ import annotations

from hrm import bounds
from hrm.errors import HRMError
from hrm_cli.parser import ArgumentParser

#: the address ``hrm serve`` binds unless --host says otherwise: this machine only
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def build_parser() -> ArgumentParser:
    from hrm_cli.web import DEFAULT_TIMEOUT_S, DEFAULT_WORKERS

    parser = ArgumentParser(prog="hrm serve", description=(
        "Serve the web planner: the planner in a browser and a JSON API (/api/search, /api/estimate, "
        "/api/compare, /api/export) with the CLI's field names, answering what --json prints."))
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=bounds.Range(1, 65535, integer=True).flag("--port"), default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--workers", type=bounds.Range(1, 64, integer=True).flag("--workers"),
                        default=DEFAULT_WORKERS, help=f"searches at once, one process each (default {DEFAULT_WORKERS})")
    parser.add_argument("--timeout-s", type=bounds.BUDGET_S.flag("--timeout-s"), default=DEFAULT_TIMEOUT_S,
                        help=f"seconds a request may take before it is answered 504 (default {DEFAULT_TIMEOUT_S:g})")
    return parser


def check_address(host: str, port: int) -> None:
    """One line (exit 2) for an address this machine cannot listen on (a port in use, a host
    that is not one of its addresses), before the server starts."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise HRMError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn

        from hrm_cli.web.app import create_app
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("hrm", "hrm_cli", "solver"):
            raise
        raise HRMError(f"hrm serve needs a missing package ({exc.name}); install the extra: "
                       "pip install 'hrm-moe[web]'") from None

    check_address(args.host, args.port)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        import sys

        print(f"warning: --host {args.host}: the planner is reachable from other machines (it has no "
              "authentication); the default 127.0.0.1 keeps it on this one", file=sys.stderr)
    print(f"HRM web planner on http://{args.host}:{args.port}/ (Ctrl-C stops it)", flush=True)
    uvicorn.run(create_app(args.workers, args.timeout_s), host=args.host, port=args.port, log_level="warning")
    return 0
