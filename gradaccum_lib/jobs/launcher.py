"""Run ``torchrun`` from Python: :func:`launch` and the command line for people.

Distributed code runs under the real engine: :func:`launch` runs torchrun from a notebook or
a test in a subprocess with its own session and a timeout. It records every process of the
run while it waits (workers start late, and each has its own session) and kills all of them
on a timeout, an error or an interrupt; its errors carry the failing ranks' stderr and, on a
timeout, the ranks that had not finished with their Python stacks. A run whose workers join
through ``init_distributed`` listens on loopback only. (``!torchrun`` in a cell never fails
the cell and may not be on PATH; ``mp.spawn`` of a function defined in a notebook cannot
pickle it; fork-based launchers can hang after torch has started threads.)
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

from ..distributed import AGENT_PID_VARIABLE, RUN_ID_VARIABLE, STORE_FILE_VARIABLE
from ..runtime import check_positive_int

__all__ = ["LaunchError", "LaunchTimeout", "launch", "torchrun_command"]

#: seconds each process of a run gets to exit on SIGTERM before launch() sends SIGKILL
TERMINATE_GRACE_SECONDS = 2.0
#: how often launch() records the run's new processes while it waits
POLL_SECONDS = 0.2


class LaunchError(RuntimeError):
    """torchrun exited non-zero; ``rank_stderr`` maps each failing rank to its stderr tail and
    ``root_cause_rank`` is the rank that failed on its own (not because a peer died), else the
    one torchrun saw fail first (None if neither is known); ``process_ids`` are the pids of
    every process the run had (the agent, its workers and theirs), all gone when it is raised
    unless the message says otherwise.
    """

    def __init__(self, message: str, returncode: int, rank_stderr: dict[int, str],
                 root_cause_rank: int | None = None, *,
                 process_ids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.rank_stderr = rank_stderr
        self.root_cause_rank = root_cause_rank
        self.process_ids = process_ids


#: what a rank prints when it fails only because ANOTHER rank died (a collective broke)
PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset by peer|Timed out waiting|"
                          r"DistNetworkError|remote worker crashing")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)


class LaunchTimeout(LaunchError):
    """torchrun did not finish within its timeout; every process of the run was killed.
    ``unfinished_ranks`` are the ranks still running at the timeout; each one started through
    :func:`~gradaccum_lib.jobs.worker.run_worker` printed its Python stacks at the end of its
    stderr (``rank_stderr``).
    """

    def __init__(self, message: str, rank_stderr: dict[int, str], *,
                 unfinished_ranks: tuple[int, ...], process_ids: tuple[int, ...]) -> None:
        super().__init__(message, -signal.SIGKILL, rank_stderr, process_ids=process_ids)
        self.unfinished_ranks = unfinished_ranks


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
            logs = _rank_logs(log_dir, "stderr")
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


def launch(
    module: str,
    arguments: list[str],
    *,
    nproc_per_node: int = 2,
    timeout_seconds: float = 300.0,
    tail_chars: int = 3000,
) -> dict:
    """Run ``torchrun --nnodes=1 --nproc_per_node=N -m MODULE ARGUMENTS --json PATH`` (or a
    script: ``MODULE`` ending in ``.py``) in a subprocess (own session,
    ``OMP_NUM_THREADS=1``) and return the JSON that rank 0 wrote.

    The run listens on loopback only: the rendezvous and the process group (when the workers
    join through :func:`~gradaccum_lib.distributed.init_distributed`) meet through files in a
    private directory instead of TCP stores, which torch binds to every interface, and
    gloo/nccl use the loopback interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``).
    Every process of the run is killed on a timeout, an error or an interrupt (Ctrl-C,
    "Interrupt kernel"). Raises :class:`LaunchTimeout` when the run takes longer than
    ``timeout_seconds``, and :class:`LaunchError` with the failing ranks' stderr tails when
    it exits non-zero.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0; got {timeout_seconds}")
    program = _program(module)
    with tempfile.TemporaryDirectory(prefix="gradaccum-launch-") as scratch:
        scratch_path = Path(scratch)
        json_path = scratch_path / "result.json"
        log_dir = scratch_path / "logs"
        run_id = uuid.uuid4().hex
        command = [  # sh exports the pid it execs torchrun with, for run_worker
            "/bin/sh", "-c", f'export {AGENT_PID_VARIABLE}=$$; exec "$@"', "sh",
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc_per_node={nproc_per_node}", "--rdzv-backend=c10d",
            "--rdzv-conf=store_type=file", f"--rdzv-endpoint={scratch_path / 'rendezvous'}",
            f"--rdzv-id={run_id}", "--local-addr=127.0.0.1", f"--log-dir={log_dir}",
            "--redirects=3", *program, *arguments, "--json", str(json_path),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               # no TCP store in the agent for the workers: they meet through STORE_FILE
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", RUN_ID_VARIABLE: run_id,
               STORE_FILE_VARIABLE: str(scratch_path / "process_group")}
        loopback = _loopback_interface()
        if loopback is not None:  # gloo and nccl listen on this interface's address
            env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True, env=env)
        run = _RunProcesses(process, run_id)
        try:
            launcher_stderr = run.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            unfinished = run.unfinished_ranks()
            stacked = run.dump_stacks(unfinished, log_dir)
            survivors = run.kill()
            logs = {r: log[-tail_chars:] for r, log in _rank_logs(log_dir, "stderr").items()}
            killed = (f"processes {list(survivors)} of the run survived SIGKILL" if survivors
                      else f"every process of the run ({len(run.processes)}) was killed")
            details = "\n".join(f"--- rank {r} stderr (tail) ---\n{logs[r]}"
                                for r in unfinished if r in logs)
            stacks = f" (the Python stacks of {stacked} end their stderr)" if stacked else ""
            running = (f"ranks still running at the timeout: {list(unfinished)}{stacks}"
                       if run.worker_ranks else "no worker had started")
            raise LaunchTimeout(
                f"torchrun {module} did not finish within {timeout_seconds:g} s; {running}; "
                f"{killed}\n{details}", logs, unfinished_ranks=unfinished,
                process_ids=tuple(run.processes)) from None
        finally:
            run.close()
        process_ids = tuple(run.processes)
        if process.returncode != 0:
            logs = _rank_logs(log_dir, "stderr")
            failing = {r: log[-tail_chars:] for r, log in logs.items() if "Traceback" in log}
            failing = failing or {r: log[-tail_chars:] for r, log in logs.items()}
            # the root cause: a rank that failed on its own, not because a peer died; else
            # the rank torchrun observed failing first
            own = sorted(r for r, log in failing.items() if not PEER_FAILURE.search(log))
            match = ROOT_CAUSE.search(launcher_stderr)
            root = own[0] if own else (int(match.group(1)) if match else None)
            order = sorted(failing, key=lambda r: (r != root, r))  # the root cause first
            details = "\n".join(f"--- rank {r} stderr (tail) ---\n{failing[r]}" for r in order)
            if not details:
                details = launcher_stderr[-tail_chars:]
            raise LaunchError(
                f"torchrun {module} exited with code {process.returncode}; first failing rank: "
                f"{root}; ranks with errors: {sorted(failing)}\n{details}",
                process.returncode, failing, root, process_ids=process_ids)
        if not json_path.is_file():
            raise LaunchError(f"torchrun {module} succeeded but rank 0 wrote no JSON",
                              process.returncode, {}, process_ids=process_ids)
        return json.loads(json_path.read_text())


def torchrun_command(
    module: str,
    arguments: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "gradaccum",
) -> str:
    """Return the torchrun command line to run ``module`` on one node (``--standalone``) or,
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
                       "-m", module, *arguments])
