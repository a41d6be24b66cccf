"""``hrm serve`` in a subprocess on 127.0.0.1 and a free port, for the web planner's tests
(tests/test_web.py, tests/test_web_browser.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(workers: int = 2, start_timeout_s: float = 60.0):
    """The base URL of a running ``hrm serve`` (loopback only); stopped on exit."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "-m", "hrm_cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                                "--workers", str(workers)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"hrm serve did not start: {process.stdout.read().decode()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
