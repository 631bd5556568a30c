"""The agent's side of a :func:`~gradaccum_lib.jobs.launch.launch` run: what runs in the
processes launch() starts, never in its caller.

- :func:`run_agent` is the process launch() starts. It runs torchrun's agent as its child and
  ends the whole tree, whatever ends the run: its caller's death (even by SIGKILL, Jupyter's
  "Restart kernel": the parent-death signal), a SIGTERM/SIGHUP from launch(), or the torchrun
  agent's own exit or death. Ending the tree is SIGTERM to every process of the run,
  :data:`TERMINATE_GRACE_SECONDS` to exit, SIGKILL to the rest: torchrun's own grace between
  the two is 30 s. It is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): a process of
  the run whose parent dies becomes its child instead of PID 1's, so no worker escapes a
  killed torchrun agent, however early it was started, and no process of the run needs to be
  recorded in time.
- :func:`run_worker` is a torchrun worker's entry point: it dies with its torchrun agent,
  prints its Python stacks on SIGUSR1 (what launch() shows for the ranks that hang) and exits
  without the interpreter's finalisation, which gloo's threads can abort.

Limits. Outside Linux (macOS) there is neither a subreaper nor a parent-death signal: a
watchdog thread notices a dead caller or agent within :data:`_WATCHDOG_SECONDS`, and a process
whose parent died belongs to launchd, so only the processes that launch() recorded while it
ran (every 0.2 s) are killed. Everywhere, a SIGKILL of :func:`run_agent`'s own process leaves
torchrun's agent to stop its workers with its own 30 s grace.
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
from pathlib import Path
from typing import NoReturn

import psutil

__all__ = ["TERMINATE_GRACE_SECONDS", "run_agent", "run_worker"]

#: seconds each process of a run gets to exit on SIGTERM before it gets SIGKILL
TERMINATE_GRACE_SECONDS = 2.0
#: how often the watchdog (where there is no parent-death signal) looks at the parent
_WATCHDOG_SECONDS = 0.5
#: set by the torchrun agent for its workers: "TORCHELASTIC_RUN_ID:PID", the agent's pid, which
#: a worker of THAT run dies with (a torchrun started inside a worker inherits it, another run)
_AGENT_VARIABLE = "GRADACCUM_AGENT"
#: what run_agent's child runs: torchrun's agent, which dies with run_agent
_TORCHRUN_ENTRY = ("import sys; sys.path.append(sys.argv[1]); "
                   "from gradaccum_lib.jobs.agent import _run_torchrun; "
                   "_run_torchrun(int(sys.argv[2]), sys.argv[3], sys.argv[4:])")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """Return True if Linux ``prctl(option, value)`` succeeded, False where it is not there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, int(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int, orphaned: Callable[[int], object]) -> threading.Thread:
    """Start and return a daemon thread that calls ``orphaned(parent_pid)`` once this
    process's parent is no longer ``parent_pid``."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_WATCHDOG_SECONDS)
        orphaned(parent_pid)

    thread = threading.Thread(target=watch, name="gradaccum-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _die_with(parent_pid: int, signum: int, orphaned: Callable[[int], object]) -> None:
    """Have ``signum`` sent to this process when ``parent_pid`` dies: the parent-death signal
    (armed for the THREAD that started this process), else a watchdog thread calling
    ``orphaned``; call ``orphaned`` now if that parent is already gone."""
    if not _prctl(_PR_SET_PDEATHSIG, signum):
        _watch_parent(parent_pid, orphaned)
    if os.getppid() != parent_pid:  # it died before the signal was armed
        orphaned(parent_pid)


def _exit_orphaned(parent_pid: int) -> NoReturn:
    """Exit this process at once (code 1): its parent ``parent_pid`` is gone."""
    print(f"torchrun agent (pid {parent_pid}) is gone; worker {os.getpid()} exits",
          file=sys.stderr, flush=True)
    os._exit(1)


def _caller_gone(caller_pid: int) -> None:
    """Send this process SIGTERM: the caller of launch() is gone (run_agent then stops)."""
    print(f"the caller of launch() (pid {caller_pid}) is gone; run_agent {os.getpid()} stops "
          "the run", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def run_agent(caller_pid: int, run_id: str, agent_pid_file: str, arguments: list[str]) -> NoReturn:
    """Run ``torchrun ARGUMENTS`` as this process's child (its pid written to
    ``agent_pid_file``), end the whole tree when it exits, when ``caller_pid`` dies or on
    SIGTERM/SIGHUP/SIGINT, and exit as the torchrun agent did (code 1 when stopped)."""
    stopped: list[int] = []
    for signum in _STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: stopped.append(signum))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of the run become this process's children
    _die_with(caller_pid, signal.SIGTERM, _caller_gone)
    status = None
    if not stopped:
        package_parent = str(Path(__file__).resolve().parents[2])
        agent_pid = os.posix_spawn(sys.executable, [
            sys.executable, "-c", _TORCHRUN_ENTRY, package_parent, str(os.getpid()), run_id,
            *arguments], os.environ)
        Path(agent_pid_file).write_text(str(agent_pid))
        status = _wait_for(agent_pid, stopped)
    _end_tree()
    _exit_as(status)


def _wait_for(agent_pid: int, stopped: list[int]) -> int | None:
    """Reap this process's children until ``agent_pid`` exits (return its wait status) or a
    stop signal is in ``stopped`` (return None)."""
    while not stopped:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == agent_pid:
            return status
        if pid == 0:  # none exited: a signal ends the sleep early, and the loop sees it
            time.sleep(0.05)
    return None


def _running_descendants() -> list[psutil.Process]:
    """Reap this process's exited children; return its descendants that still run."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    running = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.Error:
            continue
    return running


def _end_tree() -> None:
    """SIGTERM every descendant, wait up to :data:`TERMINATE_GRACE_SECONDS` for them to exit,
    then SIGKILL the rest (again while any is left, for at most 5 s) and reap them."""
    for signum in _STOP_SIGNALS:  # nothing interrupts the cleanup
        signal.signal(signum, signal.SIG_IGN)
    _signal_each(_running_descendants(), signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
    while _running_descendants() and time.monotonic() < deadline:
        time.sleep(0.02)
    deadline = time.monotonic() + 5.0
    while (processes := _running_descendants()) and time.monotonic() < deadline:
        _signal_each(processes, signal.SIGKILL)
        time.sleep(0.02)


def _signal_each(processes: list[psutil.Process], signum: int) -> None:
    """Send ``signum`` to each of ``processes`` that is still there."""
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.Error:  # it is gone already
            continue


def _exit_as(status: int | None) -> NoReturn:
    """Exit as the torchrun agent's wait ``status`` says (its signal raised again on this
    process), or with code 1 if it has none (the run was stopped)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status is not None and os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:  # SIGKILL has no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal that does not end a process by default
    os._exit(1 if status is None else os.waitstatus_to_exitcode(status))


def _run_torchrun(parent_pid: int, run_id: str, arguments: list[str]) -> None:
    """Run torchrun's agent here (``torchrun ARGUMENTS``): its workers of run ``run_id`` learn
    its pid; it gets SIGTERM (and stops them) when run_agent, ``parent_pid``, dies."""
    os.environ[_AGENT_VARIABLE] = f"{run_id}:{os.getpid()}"
    _die_with(parent_pid, signal.SIGTERM, lambda pid: os.kill(os.getpid(), signal.SIGTERM))
    from torch.distributed.run import main  # after arming: importing torch takes seconds

    main(arguments)


def _exit_with_agent() -> None:
    """Make this torchrun worker die with its agent (a SIGKILLed agent cannot stop it): the
    agent's pid as launch()'s agent set it for this run, else this process's parent."""
    run_id, _, agent_pid = os.environ.get(_AGENT_VARIABLE, "").partition(":")
    if not agent_pid or run_id != os.environ.get("TORCHELASTIC_RUN_ID"):
        agent_pid = str(os.getppid())
    _die_with(int(agent_pid), signal.SIGKILL, _exit_orphaned)


def run_worker(main: Callable[[], int]) -> None:
    """Run a torchrun worker's ``main`` and exit with its code, skipping the interpreter's
    finalisation when launched by torchrun: gloo's worker threads can abort the process
    during finalisation ("terminate called without an active exception", about one run in
    ten here), after the work is done. ``main`` must destroy its process group first. Under
    torchrun the worker dies with its agent, and SIGUSR1 prints its Python stacks to stderr
    (what :func:`~gradaccum_lib.jobs.launch.launch` shows for the ranks that hang).
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
