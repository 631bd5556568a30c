"""How :func:`~gradaccum_lib.jobs.launcher.launch` makes a torchrun run end with its caller:
the run's processes (recorded while it runs, killed as a tree), the caller's SIGTERM and
SIGHUP (they clean up like Ctrl-C, then end the caller as before) and the run's folder (its
owner recorded, so that the next launch() removes the folders of callers that were killed).

The agent itself gets SIGTERM when its caller dies, even by SIGKILL ("Restart kernel"):
:func:`~gradaccum_lib.jobs.worker.run_agent` runs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import psutil

__all__ = ["CallerSignals", "RunProcesses", "remove_orphaned_run_folders", "run_folder"]

#: seconds each process of a run gets to exit on SIGTERM before launch() sends SIGKILL
TERMINATE_GRACE_SECONDS = 2.0
#: how often launch() records the run's new processes while it waits
POLL_SECONDS = 0.2
#: the name of each run's folder in the system temp dir starts so
RUN_FOLDER_PREFIX = "gradaccum-launch-"
#: the file in a run's folder that records its owner: "PID CREATE_TIME PID_NAMESPACE"
OWNER_FILE = "owner"


def rank_logs(log_dir: Path, name: str) -> dict[int, str]:
    """Return each rank's ``name`` log (``stdout``/``stderr``) in torchrun's ``log_dir``."""
    logs = {}
    for path in sorted(log_dir.glob(f"**/{name}.log")):
        try:
            rank = int(path.parent.name)
        except ValueError:
            continue
        logs[rank] = path.read_text(errors="replace")
    return logs


def _is_alive(process: psutil.Process) -> bool:
    """Return True if ``process`` (the same one: psutil checks pid reuse) runs, zombies aside."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _handles(process: psutil.Process, signum: int) -> bool:
    """Return True if ``process`` has a handler for ``signum`` (Linux /proc; else False)."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines()
                   if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signum - 1) & 1)


class RunProcesses:
    """Every process of one torchrun run: the agent and each descendant seen while it ran
    (workers start late, and outlive an agent that dies), with the workers' ranks."""

    def __init__(self, agent: subprocess.Popen, run_id: str) -> None:
        self.agent = agent
        self.run_id = run_id
        self.processes: dict[int, psutil.Process] = {}
        self.worker_ranks: dict[int, int] = {}  # pid -> rank, for the agent's own children
        with contextlib.suppress(psutil.Error):
            self.processes[agent.pid] = psutil.Process(agent.pid)

    def refresh(self) -> None:
        """Record the new descendants of every recorded process, and the workers' ranks."""
        visited: set[int] = set()
        for process in list(self.processes.values()):
            if process.pid in visited:
                continue
            with contextlib.suppress(psutil.Error):
                for child in process.children(recursive=True):
                    visited.add(child.pid)
                    self.processes.setdefault(child.pid, child)
        for pid, process in self.processes.items():
            if pid == self.agent.pid or pid in self.worker_ranks:
                continue
            with contextlib.suppress(psutil.Error, KeyError, ValueError):
                environment = process.environ() if process.ppid() == self.agent.pid else {}
                if environment.get("TORCHELASTIC_RUN_ID") == self.run_id:  # once exec'd
                    self.worker_ranks[pid] = int(environment["RANK"])

    def wait(self, timeout_seconds: float) -> str:
        """Return the agent's stderr once it exits, recording processes meanwhile; raise
        ``subprocess.TimeoutExpired`` after ``timeout_seconds``."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self.refresh()
            remaining = deadline - time.monotonic()
            try:
                return self.agent.communicate(timeout=max(0.0, min(POLL_SECONDS, remaining)))[1]
            except subprocess.TimeoutExpired:
                if remaining <= POLL_SECONDS:
                    raise

    def unfinished_ranks(self) -> tuple[int, ...]:
        """Return the ranks whose worker is still running, sorted."""
        return tuple(sorted(rank for pid, rank in self.worker_ranks.items()
                            if _is_alive(self.processes[pid])))

    def dump_stacks(self, ranks: Collection[int], log_dir: Path) -> list[int]:
        """Have the workers of ``ranks`` that handle SIGUSR1 (``run_worker``'s faulthandler)
        print their Python stacks to their stderr log, wait up to 1 s for them; return the
        ranks asked, sorted."""
        asked = []
        for pid, rank in self.worker_ranks.items():
            if rank in ranks and _handles(self.processes[pid], signal.SIGUSR1):
                with contextlib.suppress(psutil.Error):
                    self.processes[pid].send_signal(signal.SIGUSR1)
                    asked.append(rank)
        deadline = time.monotonic() + 1.0
        while asked and time.monotonic() < deadline:
            logs = rank_logs(log_dir, "stderr")
            if all("(most recent call first)" in logs.get(rank, "") for rank in asked):
                break
            time.sleep(0.05)
        return sorted(asked)

    def kill(self) -> tuple[int, ...]:
        """Send SIGTERM to every process of the run still alive, SIGKILL to those alive
        :data:`TERMINATE_GRACE_SECONDS` later; return the pids still alive after that."""
        for signum, wait_seconds in ((signal.SIGTERM, TERMINATE_GRACE_SECONDS),
                                     (signal.SIGKILL, 5.0)):
            self.refresh()
            alive = [process for process in self.processes.values() if _is_alive(process)]
            if not alive:
                return ()
            signalled_group = False
            if self.agent.returncode is None:  # not reaped: its pid is still its group's id
                with contextlib.suppress(OSError):
                    os.killpg(self.agent.pid, signum)
                    signalled_group = True
            for process in alive:
                if not (signalled_group and process.pid == self.agent.pid):
                    with contextlib.suppress(psutil.Error):
                        process.send_signal(signum)
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline:
                self.agent.poll()  # reap the agent
                if not any(_is_alive(process) for process in alive):
                    break
                time.sleep(0.05)
        return tuple(process.pid for process in self.processes.values() if _is_alive(process))

    def close(self) -> None:
        """Kill what is left of the run (warn about any process that survives) and close the
        agent's pipes."""
        survivors = self.kill()
        if survivors:
            warnings.warn(f"processes {list(survivors)} of a torchrun run survived SIGKILL",
                          RuntimeWarning, stacklevel=3)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.agent.wait(timeout=1.0)  # reap it (kill() may have seen it a zombie)
        for stream in (self.agent.stdout, self.agent.stderr):
            if stream is not None:
                stream.close()


class _Signalled(BaseException):
    """Raised in the caller's main thread by :class:`CallerSignals` on SIGTERM or SIGHUP."""


class CallerSignals:
    """``with CallerSignals(make_error):`` around a run: SIGTERM and SIGHUP raise inside the
    block like Ctrl-C does (so its cleanup runs); on leaving, the caller's own handlers are
    back and the signal is raised again with them (the default ends the process). If the
    process survives that (its handler returned), ``make_error(signum)`` is raised.

    Only in the main thread (Python runs handlers there only) and only for a signal whose
    handler Python set and does not ignore (``nohup`` keeps SIGHUP ignored); elsewhere the
    caller dies as before and the agent's parent-death signal stops the run.
    """

    NAMES = ("SIGTERM", "SIGHUP")

    def __init__(self, make_error: Callable[[int], BaseException]) -> None:
        self.make_error = make_error
        self.previous: dict[int, object] = {}
        self.received: int | None = None
        self.leaving = False

    def _handle(self, signum: int, frame: object) -> None:
        first = self.received is None
        self.received = self.received or signum
        if first and not self.leaving:  # a second signal must not interrupt the cleanup
            raise _Signalled(signum)

    def __enter__(self) -> CallerSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.NAMES:
            signum = getattr(signal, name, None)
            previous = None if signum is None else signal.getsignal(signum)
            if previous is not None and previous != signal.SIG_IGN:
                self.previous[signum] = previous
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        self.leaving = True
        for signum, previous in self.previous.items():
            if signal.getsignal(signum) == self._handle:  # not if someone else took the slot
                signal.signal(signum, previous)
        self.previous.clear()
        if self.received is None:
            return False
        signal.raise_signal(self.received)  # the caller's handler; the default ends it here
        raise self.make_error(self.received) from None


def _pid_namespace() -> str:
    """Return this process's pid namespace (Linux), else ``-``: pids mean something only in
    the namespace that wrote them."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _owner_is_gone(folder: Path) -> bool:
    """Return True if ``folder``'s recorded owner process no longer runs (a zombie counts
    as gone); False if it runs or nothing tells (no owner file, another pid namespace)."""
    try:
        pid, created, namespace = (folder / OWNER_FILE).read_text().split(" ", 2)
        process = psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        return namespace == _pid_namespace()
    except (OSError, ValueError, psutil.Error):
        return False
    if namespace != _pid_namespace():
        return False
    try:  # another process with the same pid started later: the owner is gone
        return (process.status() == psutil.STATUS_ZOMBIE
                or abs(process.create_time() - float(created)) > 0.5)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def remove_orphaned_run_folders(directory: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's run folders in ``directory`` (the system temp dir) whose owner is dead."""
    removed = []
    for folder in Path(directory or tempfile.gettempdir()).glob(f"{RUN_FOLDER_PREFIX}*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _owner_is_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    return removed


@contextlib.contextmanager
def run_folder(directory: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a new private run folder that records its owner (this process); remove it after."""
    remove_orphaned_run_folders(directory)
    with tempfile.TemporaryDirectory(prefix=RUN_FOLDER_PREFIX, dir=directory,
                                     ignore_cleanup_errors=True) as name:
        folder = Path(name)
        me = psutil.Process()
        (folder / f"{OWNER_FILE}.new").write_text(
            f"{me.pid} {me.create_time()!r} {_pid_namespace()}")
        os.replace(folder / f"{OWNER_FILE}.new", folder / OWNER_FILE)  # never read half-written
        yield folder
