"""A torchrun worker for tests/test_launch.py that does not die on SIGTERM, nor does its child.

Plain Python (no ``run_worker``, so nothing kills it when its agent dies): each rank ignores
SIGTERM, starts a child in a session of its own that ignores SIGTERM too, writes
``READY_DIR/rank-R`` (its pid) and ``READY_DIR/rank-R-child`` (the child's pid) and sleeps.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = ("import pathlib, signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "pathlib.Path(sys.argv[1]).write_text(str(__import__('os').getpid()))\n"
         "time.sleep(3600)\n")


def main() -> None:
    """Ignore SIGTERM, start the child, write the ready files and sleep."""
    parser = argparse.ArgumentParser(prog="slow_to_die.py")
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready = Path(arguments.ready_dir) / f"rank-{os.environ['RANK']}"
    subprocess.Popen([sys.executable, "-c", CHILD, f"{ready}-child"], start_new_session=True)
    ready.write_text(str(os.getpid()))
    time.sleep(3600)


if __name__ == "__main__":
    main()
