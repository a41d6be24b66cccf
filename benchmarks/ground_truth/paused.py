"""Run one command with this machine's other CPU work paused (SIGSTOP, then SIGCONT): the
profile the ground-truth runs are predicted on is measured in the runs' own quiet conditions.

    python paused.py -- COMMAND ...
"""

from __future__ import annotations

import signal
import subprocess
import sys

from llama_cpu_runs import pausable_pids, signal_all, wait_idle


def main() -> int:
    cmd = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]
    paused = pausable_pids()
    signal_all(paused, signal.SIGSTOP)
    try:
        wait_idle(30.0)
        return subprocess.run(cmd).returncode
    finally:
        signal_all(paused, signal.SIGCONT)


if __name__ == "__main__":
    raise SystemExit(main())
