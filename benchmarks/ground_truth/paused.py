"""Run one command with this machine's other CPU work paused (SIGSTOP, then SIGCONT): the
profile the ground-truth runs are predicted on is measured in the runs' own quiet conditions.

    python paused.py -- COMMAND ...
"""

from __future__ import annotations

import subprocess
import sys

from llama_cpu_runs import Paused, wait_idle


def main() -> int:
    cmd = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]
    # processes started while it runs are stopped too (Paused): a profile takes minutes
    with Paused():
        wait_idle(30.0)
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    raise SystemExit(main())
