"""A torchrun worker's entry point, :func:`run_worker`: it dies with its torchrun agent (a
SIGKILLed agent cannot stop it otherwise), prints its Python stacks on SIGUSR1 (what
:func:`gradaccum_lib.jobs.launcher.launch` shows for the ranks that hang) and exits without
the interpreter's finalisation, which gloo's threads can abort.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from ..distributed import AGENT_PID_VARIABLE, launch_variable

__all__ = ["run_worker"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal() -> bool:
    """Return True once the kernel will SIGKILL this process when the thread that started it
    exits (Linux ``prctl(PR_SET_PDEATHSIG)``), False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _exit_orphaned(parent_pid: int) -> NoReturn:
    """Exit this process at once (code 1): its parent ``parent_pid`` is gone."""
    print(f"torchrun agent (pid {parent_pid}) is gone; worker {os.getpid()} exits",
          file=sys.stderr, flush=True)
    os._exit(1)


def _watch_parent(parent_pid: int, poll_seconds: float = 0.5) -> threading.Thread:
    """Start and return a daemon thread that exits the process once its parent is no longer
    ``parent_pid``."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        _exit_orphaned(parent_pid)

    thread = threading.Thread(target=watch, name="gradaccum-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _exit_with_agent() -> None:
    """Make this torchrun worker die with its agent (a SIGKILLed agent cannot stop it): the
    parent-death signal on Linux (torchrun starts workers from its main thread), a watchdog
    thread elsewhere; exit now if the agent is already gone."""
    agent_pid = int(launch_variable(AGENT_PID_VARIABLE) or os.getppid())
    if not _set_parent_death_signal():
        _watch_parent(agent_pid)
    if os.getppid() != agent_pid:  # the agent died before the signal was armed
        _exit_orphaned(agent_pid)


def run_worker(main: Callable[[], int]) -> None:
    """Run a torchrun worker's ``main`` and exit with its code, skipping the interpreter's
    finalisation when launched by torchrun: gloo's worker threads can abort the process
    during finalisation ("terminate called without an active exception", about one run in
    ten here), after the work is done. ``main`` must destroy its process group first. Under
    torchrun the worker dies with its agent, and SIGUSR1 prints its Python stacks to stderr
    (what :func:`~gradaccum_lib.jobs.launcher.launch` shows for the ranks that hang).
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        _exit_with_agent()
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - report any failure as the rank's traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
        os._exit(code)
    sys.exit(code)
