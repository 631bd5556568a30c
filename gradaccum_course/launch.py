"""The caller's side of a torchrun run: :func:`launch`, and the command line for people.

Distributed code runs under a real torchrun: :func:`launch` runs torchrun from a notebook or
a test in a subprocess with its own session and a timeout, and returns what rank 0 wrote. Its
errors carry the failing ranks' stderr and, on a timeout, the ranks that had not finished
with their Python stacks. The subprocess is :func:`~gradaccum_course.agent.run_agent`,
which with torchrun's agent ends the run's whole process tree when the run ends, however it
ends (:mod:`gradaccum_course.agent`). A run whose workers join through
``init_distributed`` listens on loopback only. (``!torchrun`` in a cell never fails the cell
and may not be on PATH; ``mp.spawn`` of a function defined in a notebook cannot pickle it;
fork-based launchers can hang after torch has started threads.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Collection
from pathlib import Path

import psutil

from gradaccum_lib.distributed import STORE_FILE_VARIABLE
from gradaccum_lib.runtime import check_positive_int

from .agent import TERMINATE_GRACE_SECONDS

__all__ = ["LaunchError", "LaunchTimeout", "launch", "torchrun_command"]

#: what launch() starts: agent.run_agent, which runs torchrun's agent; the package's parent
#: folder comes last on its path, for a caller that added it
_AGENT_ENTRY = ("import sys; sys.path.append(sys.argv[1]); "
                "from gradaccum_course.agent import run_agent; run_agent(*sys.argv[2:])")
#: how much of each rank's stderr an error carries
_TAIL_CHARS = 3000
#: how often launch() records the run's new processes while it waits
_POLL_SECONDS = 0.2
#: what torchrun's agent prints when its SIGTERM/SIGINT/SIGHUP/SIGQUIT handler stopped it
_AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (?:Signals\.)?(\w+)")
#: what a rank prints when it fails only because ANOTHER rank died (a collective broke)
_PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset by peer|Timed out "
                           r"waiting|DistNetworkError|remote worker crashing")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)


class LaunchError(RuntimeError):
    """torchrun exited non-zero; ``rank_stderr`` maps each failing rank to its stderr tail and
    ``root_cause_rank`` is the rank that failed on its own (not because a peer died), else the
    one torchrun saw fail first (None if neither is known); ``process_ids`` are the pids of
    every process launch() saw in the run (its agent, its workers and theirs), all gone when
    it is raised unless the message says otherwise.
    """

    def __init__(self, message: str, returncode: int, rank_stderr: dict[int, str],
                 root_cause_rank: int | None = None, *,
                 process_ids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.rank_stderr = rank_stderr
        self.root_cause_rank = root_cause_rank
        self.process_ids = process_ids


class LaunchTimeout(LaunchError):
    """torchrun did not finish within its timeout; every process of the run was killed.
    ``unfinished_ranks`` are the ranks still running at the timeout; each one started through
    :func:`~gradaccum_course.agent.run_worker` printed its Python stacks at the end of its
    stderr (``rank_stderr``).
    """

    def __init__(self, message: str, rank_stderr: dict[int, str], *,
                 unfinished_ranks: tuple[int, ...], process_ids: tuple[int, ...]) -> None:
        super().__init__(message, -signal.SIGKILL, rank_stderr, process_ids=process_ids)
        self.unfinished_ranks = unfinished_ranks


def launch(
    module: str,
    arguments: list[str],
    *,
    nproc_per_node: int = 2,
    timeout_seconds: float = 300.0,
) -> dict:
    """Run ``torchrun --nnodes=1 --nproc_per_node=N -m MODULE ARGUMENTS --json PATH`` (or a
    script: ``MODULE`` ending in ``.py``) in a subprocess (own session,
    ``OMP_NUM_THREADS=1``) and return the JSON that rank 0 wrote.

    The run listens on loopback only: the rendezvous and the process group (when the workers
    join through :func:`~gradaccum_lib.distributed.init_distributed`) meet through files in a
    private directory instead of TCP stores, which torch binds to every interface, and
    gloo/nccl use the loopback interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``).
    Every process of the run is gone within about 2 s (SIGTERM, then SIGKILL) of a timeout, an
    error, an interrupt (Ctrl-C, "Interrupt kernel"), this process's death however it dies
    (SIGTERM, SIGKILL: "Restart kernel"), or the death of the run's supervisor or of
    torchrun's agent, however slowly the workers handle SIGTERM. Raises
    :class:`LaunchTimeout` when the run takes longer than ``timeout_seconds``, and
    :class:`LaunchError` with the failing ranks' stderr tails (or how a signal ended the
    supervisor or the agent) when it exits non-zero.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0; got {timeout_seconds}")
    program = _program(module)
    with tempfile.TemporaryDirectory(prefix="gradaccum-launch-",
                                     ignore_cleanup_errors=True) as name:
        folder, run_id = Path(name), uuid.uuid4().hex
        with open(folder / "agent.log", "w") as log:  # the child holds its own copy
            process = subprocess.Popen(
                [sys.executable, "-c", _AGENT_ENTRY, str(Path(__file__).resolve().parents[2]),
                 str(os.getpid()), name, run_id,
                 *_torchrun_arguments(folder, run_id, nproc_per_node, [*program, *arguments])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=_environment(run_id, folder))
        run = _RunProcesses(process, run_id, folder)
        try:
            run.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            raise _timeout_error(run, module, timeout_seconds) from None
        finally:
            run.close()
        if process.returncode != 0:
            raise _exit_error(run, module, (folder / "agent.log").read_text(errors="replace"))
        if not (folder / "result.json").is_file():
            raise LaunchError(f"torchrun {module} succeeded but rank 0 wrote no JSON",
                              process.returncode, {}, process_ids=tuple(run.processes))
        return json.loads((folder / "result.json").read_text())


def _torchrun_arguments(folder: Path, run_id: str, nproc_per_node: int,
                        program: list[str]) -> list[str]:
    """torchrun's arguments for one node: a file rendezvous and the logs in ``folder``, the
    program and ``--json`` where rank 0 writes its result."""
    return ["--nnodes=1", f"--nproc_per_node={nproc_per_node}", "--rdzv-backend=c10d",
            "--rdzv-conf=store_type=file", f"--rdzv-endpoint={folder / 'rendezvous'}",
            f"--rdzv-id={run_id}", "--local-addr=127.0.0.1", f"--log-dir={folder / 'logs'}",
            "--redirects=3", *program, "--json", str(folder / "result.json")]


def _environment(run_id: str, folder: Path) -> dict[str, str]:
    """The run's environment: one thread per worker, the process group's FileStore, and
    gloo and nccl on the loopback interface."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           # no TCP store in the agent for the workers: they meet through the store file
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           STORE_FILE_VARIABLE: f"{run_id}:{folder / 'process_group'}"}
    loopback = _loopback_interface()
    if loopback is not None:  # gloo and nccl listen on this interface's address
        env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
    return env


def _timeout_error(run: _RunProcesses, module: str, timeout_seconds: float) -> LaunchTimeout:
    """Kill the run that timed out (the unfinished ranks' stacks dumped first) and return the
    error naming those ranks, with their stderr tails."""
    unfinished = run.unfinished_ranks()
    stacked = run.dump_stacks(unfinished)
    survivors = run.kill()
    logs = {r: log[-_TAIL_CHARS:] for r, log in _rank_logs(run.log_dir, "stderr").items()}
    killed = (f"processes {list(survivors)} of the run survived SIGKILL" if survivors
              else f"every process of the run ({len(run.processes)}) was killed")
    details = "\n".join(f"--- rank {r} stderr (tail) ---\n{logs[r]}"
                        for r in unfinished if r in logs)
    stacks = f" (the Python stacks of {stacked} end their stderr)" if stacked else ""
    running = (f"ranks still running at the timeout: {list(unfinished)}{stacks}"
               if run.worker_ranks else "no worker had started")
    return LaunchTimeout(
        f"torchrun {module} did not finish within {timeout_seconds:g} s; {running}; "
        f"{killed}\n{details}", logs, unfinished_ranks=unfinished,
        process_ids=tuple(run.processes))


def _exit_error(run: _RunProcesses, module: str, agent_log: str) -> LaunchError:
    """Return the error of a run that exited non-zero: the failing ranks' stderr tails, the
    root cause's first, or how a signal ended the supervisor or torchrun's agent."""
    returncode, logs = run.supervisor.returncode, _rank_logs(run.log_dir, "stderr")
    failing = {r: log[-_TAIL_CHARS:] for r, log in logs.items() if "Traceback" in log}
    agent = f"the torchrun agent (pid {run.agent_pid()})"
    death, match = None, _AGENT_SIGNAL.search(agent_log)
    if returncode < 0:  # run_agent stops on SIGTERM/SIGHUP/SIGINT: this was another signal
        death = (f"the run's supervisor run_agent (pid {run.supervisor.pid}) was killed by "
                 f"{_signal_name(-returncode)}")
    elif returncode > 128:  # run_agent exits 128 + N when signal N killed torchrun's agent
        returncode = 128 - returncode
        death = f"{agent} was killed by {_signal_name(-returncode)}"
    elif match is not None:  # its handler raised, torchrun stopped the ranks
        death = f"{agent} was stopped by {_signal_name(match.group(1))}"
    if death is not None:  # no rank failed on its own
        failing = failing or {r: log[-_TAIL_CHARS:] for r, log in logs.items() if log}
        root, cause = None, f"{death}; ranks with errors: {sorted(failing)}"
    else:
        failing = failing or {r: log[-_TAIL_CHARS:] for r, log in logs.items()}
        # the root cause: a rank that failed on its own, not because a peer died; else the
        # rank torchrun observed failing first
        own = sorted(r for r, log in failing.items() if not _PEER_FAILURE.search(log))
        match = _ROOT_CAUSE.search(agent_log)
        root = own[0] if own else (int(match.group(1)) if match else None)
        cause = f"first failing rank: {root}; ranks with errors: {sorted(failing)}"
    order = sorted(failing, key=lambda r: (r != root, r))  # the root cause first
    details = "\n".join(f"--- rank {r} stderr (tail) ---\n{failing[r]}" for r in order)
    return LaunchError(
        f"torchrun {module} exited with code {returncode}; {cause}\n"
        f"{details or agent_log[-_TAIL_CHARS:]}",
        returncode, failing, root, process_ids=tuple(run.processes))


def _loopback_interface() -> str | None:
    """Return the name of the network interface that holds 127.0.0.1 (None if none does)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.family == socket.AF_INET and address.address == "127.0.0.1"
               for address in addresses):
            return name
    return None


def _program(module: str) -> list[str]:
    """torchrun's program arguments: ``-m MODULE``, or a script path ending in ``.py``."""
    if not isinstance(module, str) or not module:
        raise TypeError(f"module must be a module name or a .py script path; got {module!r}")
    return [module] if module.endswith(".py") else ["-m", module]


def _signal_name(signum: int | str) -> str:
    """Return ``SIGTERM`` for 15 or "15"; a name as it is, another number as ``signal N``."""
    with contextlib.suppress(ValueError):
        return signal.Signals(int(signum)).name
    return f"signal {signum}" if str(signum).isdigit() else str(signum)


def _rank_logs(log_dir: Path, name: str) -> dict[int, str]:
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


class _RunProcesses:
    """One run as launch() sees it: the supervisor (run_agent), each descendant seen while it
    ran (for the error's pids, and a last SIGKILL should the supervisor fail), the workers'
    ranks. Ending the tree is the supervisor's job: it needs no record to find a process."""

    def __init__(self, supervisor: subprocess.Popen, run_id: str, folder: Path) -> None:
        self.supervisor, self.run_id, self.folder = supervisor, run_id, folder
        self.log_dir = folder / "logs"
        self.processes: dict[int, psutil.Process] = {}
        self.worker_ranks: dict[int, int] = {}  # pid -> rank, for the torchrun agent's children
        with contextlib.suppress(psutil.Error):
            self.processes[supervisor.pid] = psutil.Process(supervisor.pid)

    def agent_pid(self) -> int | None:
        """Return the pid of torchrun's agent, once run_agent has written it."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.folder / "agent_pid").read_text())
        return None

    def refresh(self) -> None:
        """Record the new descendants of every recorded process, and the workers' ranks."""
        for process in list(self.processes.values()):
            with contextlib.suppress(psutil.Error):
                for child in process.children(recursive=True):
                    self.processes.setdefault(child.pid, child)
        agent = self.agent_pid()
        for pid, process in self.processes.items():
            if agent is None or pid in self.worker_ranks:
                continue
            with contextlib.suppress(psutil.Error, KeyError, ValueError):
                environment = process.environ() if process.ppid() == agent else {}
                if environment.get("TORCHELASTIC_RUN_ID") == self.run_id:  # once exec'd
                    self.worker_ranks[pid] = int(environment["RANK"])

    def wait(self, timeout_seconds: float) -> None:
        """Wait for the supervisor to exit, recording processes meanwhile; raise
        ``subprocess.TimeoutExpired`` after ``timeout_seconds``."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self.refresh()
            try:
                self.supervisor.wait(max(0.0, min(_POLL_SECONDS, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise

    def unfinished_ranks(self) -> tuple[int, ...]:
        """Return the ranks whose worker is still running, sorted."""
        return tuple(sorted(rank for pid, rank in self.worker_ranks.items()
                            if _is_alive(self.processes[pid])))

    def dump_stacks(self, ranks: Collection[int]) -> list[int]:
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
            logs = _rank_logs(self.log_dir, "stderr")
            if all("(most recent call first)" in logs.get(rank, "") for rank in asked):
                break
            time.sleep(0.05)
        return sorted(asked)

    def kill(self) -> tuple[int, ...]:
        """Have the supervisor end the run (SIGTERM: it ends its tree within
        :data:`~gradaccum_course.agent.TERMINATE_GRACE_SECONDS` and exits; torchrun's agent
        does if the supervisor is dead), SIGKILL what launch() recorded and is still alive 1 s
        after that grace, and again 5 s later; return the pids alive then."""
        self.refresh()
        if self.supervisor.poll() is None:
            self.supervisor.terminate()
        for seconds in (TERMINATE_GRACE_SECONDS + 1.0, 5.0):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.supervisor.poll()  # reap it
                if not any(_is_alive(process) for process in self.processes.values()):
                    return ()
                time.sleep(0.05)
            self.refresh()
            for process in self.processes.values():
                with contextlib.suppress(psutil.Error):
                    process.kill()
        return tuple(process.pid for process in self.processes.values() if _is_alive(process))

    def close(self) -> None:
        """Kill what is left of the run; warn about any process that survives."""
        survivors = self.kill()
        if survivors:
            warnings.warn(f"processes {list(survivors)} of a torchrun run survived SIGKILL",
                          RuntimeWarning, stacklevel=3)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.supervisor.wait(timeout=1.0)


def torchrun_command(
    module: str,
    arguments: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "gradaccum",
) -> str:
    """Return the torchrun command line to run ``module`` (a module name, or a script path
    ending in ``.py``) on one node (``--standalone``) or,
    the same line on every node, on ``nnodes`` nodes meeting at the c10d rendezvous
    ``rdzv_endpoint`` (host:port of any one of them).
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be >= 1; got {nnodes}, {nproc_per_node}")
    if nnodes == 1:
        launcher = ["--standalone"]
    elif rdzv_endpoint is None:
        raise ValueError("rdzv_endpoint (host:port) is required for more than one node")
    else:
        launcher = [f"--nnodes={nnodes}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    return shlex.join(["torchrun", *launcher, f"--nproc_per_node={nproc_per_node}",
                       *_program(module), *arguments])
