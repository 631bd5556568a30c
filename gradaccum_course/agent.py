"""The agent's side of a :func:`~gradaccum_course.launch.launch` run: what runs in the
processes launch() starts, and :func:`run_worker`, every torchrun worker's entry point.

launch() starts :func:`run_agent`, the run's supervisor, which starts torchrun's agent as its
child. Each of the two ends the whole tree when the other dies, even by SIGKILL: SIGTERM to
every process below it, :data:`TERMINATE_GRACE_SECONDS` to exit, then SIGKILL (torchrun's
own grace between the two is 30 s). The supervisor also ends it when torchrun's agent exits,
on SIGTERM/SIGHUP/SIGINT from launch() and when launch()'s caller dies, however it dies
(Jupyter's "Restart kernel" is a SIGKILL); whichever ends the run after the caller's death
also removes the run's folder. Each watches the other, or the caller, from a thread that
looks at its parent every :data:`_WATCH_SECONDS`. On Linux the supervisor is a child
subreaper (``PR_SET_CHILD_SUBREAPER``; torchrun's agent becomes one when it ends the run): a
process of the run whose parent dies becomes its child instead of PID 1's, so no worker
escapes a killed torchrun agent, however early it was started. A process whose parent died
elsewhere (macOS) belongs to launchd: only what launch() recorded is killed then.

A worker started through :func:`run_worker` dies with torchrun's agent (SIGKILL: Linux's
parent-death signal, else a watching thread), even a plain torchrun's. That agent exports no
pid: the worker takes its parent when this module was imported for its agent, so one whose
agent died before that import runs on; a module that imports this one first narrows the gap.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import psutil

from gradaccum_lib import _PARENT_PID

__all__ = ["TERMINATE_GRACE_SECONDS", "run_agent", "run_worker"]

#: seconds each process of a run gets to exit on SIGTERM before it gets SIGKILL
TERMINATE_GRACE_SECONDS = 2.0
#: how often a watching thread looks at its process's parent
_WATCH_SECONDS = 0.1
#: set by launch()'s torchrun agent for its workers: "TORCHELASTIC_RUN_ID:PID", the agent's
#: pid, which a worker of THAT run dies with (a torchrun started inside a worker inherits it)
_AGENT_VARIABLE = "GRADACCUM_AGENT"
#: what run_agent's child runs: torchrun's agent (the package's parent folder comes last on
#: its path, for a caller that added it)
_TORCHRUN_ENTRY = ("import sys; sys.path.append(sys.argv[1]); from gradaccum_course.agent "
                   "import _run_torchrun; _run_torchrun(*sys.argv[2:])")
#: this process's parent when the package was imported, before torch loaded: a plain torchrun
#: worker's agent, which exports no pid, if it was still alive then
_PARENT_AT_IMPORT = _PARENT_PID
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # <linux/prctl.h>


def _prctl(option: int, value: int) -> bool:
    """Return True if Linux ``prctl(option, value)`` succeeded, False where it is not there."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(option, int(value), 0, 0, 0) == 0


def _when_orphaned(parent_pid: int, action: Callable[[], object]) -> None:
    """Call ``action()`` in a daemon thread once this process's parent is no longer
    ``parent_pid`` (at once if it already is not)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_WATCH_SECONDS)
        action()

    threading.Thread(target=watch, name="gradaccum-parent-watch", daemon=True).start()


def run_agent(caller_pid: str, folder: str, run_id: str, *arguments: str) -> NoReturn:
    """Run ``torchrun ARGUMENTS`` as this process's child (its pid written to
    ``FOLDER/agent_pid``); end the whole tree when it exits, when ``caller_pid`` dies or on
    SIGTERM/SIGHUP/SIGINT; exit with its exit code (128 + N if signal N killed it; 1 when
    stopped). Remove ``folder`` if the caller is gone."""
    caller, stop = int(caller_pid), []  # a list: no lock that a signal handler could take
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop.append(signum))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of the run become this process's children
    _when_orphaned(caller, lambda: stop.append(0))
    status = None
    if os.getppid() == caller:
        agent = os.posix_spawn(sys.executable, [
            sys.executable, "-c", _TORCHRUN_ENTRY, str(Path(__file__).resolve().parents[2]),
            str(os.getpid()), caller_pid, folder, run_id, *arguments], os.environ)
        (Path(folder) / "agent_pid").write_text(str(agent))
        while status is None and not stop:
            time.sleep(0.05)  # a signal ends it early
            status = _reap().get(agent)
    if os.getppid() != caller:
        print(f"the caller of launch() (pid {caller}) is gone", file=sys.stderr, flush=True)
    _end_run(caller, folder)
    code = 1 if status is None else os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _run_torchrun(supervisor_pid: str, caller_pid: str, folder: str, run_id: str,
                  *arguments: str) -> None:
    """Run torchrun's agent here (``torchrun ARGUMENTS``): its workers of run ``run_id``
    learn its pid; it ends the run and exits if run_agent, ``supervisor_pid``, dies."""
    os.environ[_AGENT_VARIABLE] = f"{run_id}:{os.getpid()}"
    ending = threading.Lock()  # held by the watch once it ends the run

    def supervisor_gone() -> None:
        ending.acquire()
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # what is orphaned from now on comes here
        _end_run(int(caller_pid), folder)
        os._exit(1)

    _when_orphaned(int(supervisor_pid), supervisor_gone)
    from torch.distributed.run import main  # after the watch: importing torch takes seconds

    try:
        main(list(arguments))
    finally:  # torchrun may finish as its workers die: the watch then exits this process
        ending.acquire()


def _reap() -> dict[int, int]:
    """Reap this process's exited children; return their wait statuses by pid."""
    statuses = {}
    with contextlib.suppress(ChildProcessError):
        while (reaped := os.waitpid(-1, os.WNOHANG))[0]:
            statuses[reaped[0]] = reaped[1]
    return statuses


def _running_descendants() -> list[psutil.Process]:
    """Reap this process's exited children; return its descendants that still run."""
    _reap()
    running = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


def _end_run(caller_pid: int, folder: str) -> None:
    """SIGTERM every descendant, wait up to :data:`TERMINATE_GRACE_SECONDS` for them to exit,
    then SIGKILL the rest (again while any is left, for at most 5 s); remove ``folder`` if
    launch()'s caller, ``caller_pid``, is gone (else launch() removes it)."""
    kill_at = time.monotonic() + TERMINATE_GRACE_SECONDS
    for process in _running_descendants():
        with contextlib.suppress(psutil.Error):
            process.terminate()
    while (processes := _running_descendants()) and time.monotonic() < kill_at + 5.0:
        if time.monotonic() >= kill_at:
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        time.sleep(0.02)
    with contextlib.suppress(psutil.NoSuchProcess):  # (/proc/PID/stat: no AccessDenied)
        if psutil.Process(caller_pid).status() != psutil.STATUS_ZOMBIE:
            return
    shutil.rmtree(folder, ignore_errors=True)


def _exit_orphaned(agent_pid: int) -> NoReturn:
    """Exit this worker at once (code 1): its torchrun agent ``agent_pid`` is gone."""
    print(f"torchrun agent (pid {agent_pid}) is gone; worker {os.getpid()} exits",
          file=sys.stderr, flush=True)
    os._exit(1)


def _die_with_agent() -> None:
    """Make this torchrun worker die with its agent (a SIGKILLed agent cannot stop it):
    SIGKILL on its parent's death, armed FIRST, then exit at once if the parent already is
    not the agent. The agent: the pid launch()'s agent exported for this run, else this
    process's parent when this module was imported."""
    run_id, _, pid = os.environ.get(_AGENT_VARIABLE, "").partition(":")
    agent = int(pid) if pid and run_id == os.environ["TORCHELASTIC_RUN_ID"] else _PARENT_AT_IMPORT
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL):
        _when_orphaned(agent, lambda: _exit_orphaned(agent))
    if os.getppid() != agent:  # it died before the signal was armed
        _exit_orphaned(agent)


def run_worker(main: Callable[[], int]) -> None:
    """Run a torchrun worker's ``main`` and exit with its code, skipping the interpreter's
    finalisation when launched by torchrun: gloo's worker threads can abort the process
    during finalisation ("terminate called without an active exception", about one run in
    ten here), after the work is done. ``main`` must destroy its process group first. Under
    torchrun the worker dies with its agent, and SIGUSR1 prints its Python stacks to stderr
    (what :func:`~gradaccum_course.launch.launch` shows for the ranks that hang).
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        _die_with_agent()
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
