"""The entry points of a :func:`~gradaccum_lib.jobs.launcher.launch` run's processes.

:func:`run_worker`, a torchrun worker's: it dies with its torchrun agent (a SIGKILLed agent
cannot stop it otherwise), prints its Python stacks on SIGUSR1 (what launch() shows for the
ranks that hang) and exits without the interpreter's finalisation, which gloo's threads can
abort. :func:`run_agent`, the torchrun agent's: it gets SIGTERM when the process that called
launch() dies, even by SIGKILL (Jupyter's "Restart kernel"), and then stops its workers.
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

__all__ = ["run_agent", "run_worker"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Return True once the kernel will send ``signum`` to this process when the THREAD that
    started it exits (Linux ``prctl(PR_SET_PDEATHSIG)``), False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _exit_orphaned(parent_pid: int) -> NoReturn:
    """Exit this process at once (code 1): its parent ``parent_pid`` is gone."""
    print(f"torchrun agent (pid {parent_pid}) is gone; worker {os.getpid()} exits",
          file=sys.stderr, flush=True)
    os._exit(1)


def _watch_parent(parent_pid: int, poll_seconds: float = 0.5,
                  orphaned: Callable[[int], object] = _exit_orphaned) -> threading.Thread:
    """Start and return a daemon thread that calls ``orphaned(parent_pid)`` (default: exit the
    process) once its parent is no longer ``parent_pid``."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        orphaned(parent_pid)

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


def _terminate_self(caller_pid: int) -> None:
    """Send this process SIGTERM (torchrun's agent then stops its workers and exits)."""
    print(f"the caller of launch() (pid {caller_pid}) is gone; torchrun agent {os.getpid()} "
          "stops", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def run_agent(caller_pid: int, arguments: list[str]) -> None:
    """Run torchrun's agent here (``torchrun ARGUMENTS``), stopped when ``caller_pid`` dies."""
    # The kernel sends SIGTERM once the THREAD that started this process exits: launch()
    # blocks the thread it runs in until the agent is gone, so a launch() from any thread is
    # covered, and a caller that dies takes all its threads. torchrun's SIGTERM handler
    # stops its workers (SIGTERM, then SIGKILL 30 s later); run_worker's die with the agent.
    os.environ[AGENT_PID_VARIABLE] = str(os.getpid())  # run_worker's agent: this process
    if not _set_parent_death_signal(signal.SIGTERM):
        _watch_parent(caller_pid, orphaned=_terminate_self)
    if os.getppid() != caller_pid:  # the caller died before the signal was armed
        print(f"the caller of launch() (pid {caller_pid}) is gone; torchrun agent "
              f"{os.getpid()} exits", file=sys.stderr, flush=True)
        sys.exit(1)
    from torch.distributed.run import main  # after arming: importing torch takes seconds

    main(arguments)


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
