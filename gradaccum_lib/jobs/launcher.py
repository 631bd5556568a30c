"""Run ``torchrun`` from Python: :func:`launch` and the command line for people.

Distributed code runs under the real engine: :func:`launch` runs torchrun from a notebook or
a test in a subprocess with its own session and a timeout. It records every process of the
run while it waits (workers start late, and each has its own session) and kills all of them
on a timeout, an error, an interrupt, or SIGTERM/SIGHUP to its caller; its errors carry the
failing ranks' stderr and, on a timeout, the ranks that had not finished with their Python
stacks. The run also ends when its caller dies otherwise (SIGKILL: "Restart kernel"), and
the next launch() removes that run's folder (:mod:`~gradaccum_lib.jobs.run_cleanup`). A run
whose workers join through ``init_distributed`` listens on loopback only. (``!torchrun`` in
a cell never fails the cell and may not be on PATH; ``mp.spawn`` of a function defined in a
notebook cannot pickle it; fork-based launchers can hang after torch has started threads.)
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
import uuid
from pathlib import Path

import psutil

from ..distributed import RUN_ID_VARIABLE, STORE_FILE_VARIABLE
from ..runtime import check_positive_int
from .run_cleanup import CallerSignals, RunProcesses, rank_logs, run_folder

__all__ = ["LaunchError", "LaunchTimeout", "launch", "torchrun_command"]

#: what the agent process runs: worker.run_agent (torchrun, which it stops when the caller
#: dies); the package's parent folder comes last on its path, for a caller that added it
AGENT_ENTRY = ("import sys; sys.path.append(sys.argv[1]); "
               "from gradaccum_lib.jobs.worker import run_agent; "
               "run_agent(int(sys.argv[2]), sys.argv[3:])")
#: what torchrun's agent prints when its SIGTERM/SIGINT/SIGHUP/SIGQUIT handler stopped it
AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (?:Signals\.)?(\w+)")


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
    return signum if isinstance(signum, str) and not signum.isdigit() else f"signal {signum}"


def _agent_death(pid: int, returncode: int, agent_stderr: str) -> str | None:
    """Return how a signal ended the torchrun agent ``pid``, or None if none did."""
    if returncode < 0:
        return f"the torchrun agent (pid {pid}) was killed by {_signal_name(-returncode)}"
    match = AGENT_SIGNAL.search(agent_stderr)  # its handler raised, torchrun stopped the ranks
    if match is None:
        return None
    return f"the torchrun agent (pid {pid}) was stopped by {_signal_name(match.group(1))}"


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
    Every process of the run is killed on a timeout, an error, an interrupt (Ctrl-C,
    "Interrupt kernel") or SIGTERM/SIGHUP to this process (when launch() runs in the main
    thread, for the signals not ignored; then the signal takes its course with the caller's
    own handler: the default ends the process). When this process dies otherwise (SIGKILL:
    "Restart kernel"; a signal while launch() runs in another thread), torchrun's agent gets
    SIGTERM (its parent-death signal, armed for the thread that started it, which launch()
    blocks until the agent is gone) and stops its workers, and the next launch() removes the
    run's folder. Raises
    :class:`LaunchTimeout` when the run takes longer than ``timeout_seconds``, and
    :class:`LaunchError` with the failing ranks' stderr tails (or how a signal ended the
    agent) when it exits non-zero.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0; got {timeout_seconds}")
    program = _program(module)
    caller = os.getpid()
    signals = CallerSignals(lambda signum: LaunchError(
        f"launch() of {module} was stopped by {signal.Signals(signum).name} to its caller (pid "
        f"{caller}); the run's processes were killed", -signum, {}))
    with signals, run_folder() as scratch_path:
        json_path = scratch_path / "result.json"
        log_dir = scratch_path / "logs"
        run_id = uuid.uuid4().hex
        command = [  # the agent: run_agent runs torchrun in this process (its pid is the agent's)
            sys.executable, "-c", AGENT_ENTRY, str(Path(__file__).resolve().parents[2]),
            str(caller), "--nnodes=1",
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
        run = RunProcesses(process, run_id)
        try:
            launcher_stderr = run.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            unfinished = run.unfinished_ranks()
            stacked = run.dump_stacks(unfinished, log_dir)
            survivors = run.kill()
            logs = {r: log[-tail_chars:] for r, log in rank_logs(log_dir, "stderr").items()}
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
            logs = rank_logs(log_dir, "stderr")
            failing = {r: log[-tail_chars:] for r, log in logs.items() if "Traceback" in log}
            death = _agent_death(process.pid, process.returncode, launcher_stderr)
            if death is not None:  # no rank failed on its own
                failing = failing or {r: log[-tail_chars:] for r, log in logs.items() if log}
                root, cause = None, f"{death}; ranks with errors: {sorted(failing)}"
            else:
                failing = failing or {r: log[-tail_chars:] for r, log in logs.items()}
                # the root cause: a rank that failed on its own, not because a peer died;
                # else the rank torchrun observed failing first
                own = sorted(r for r, log in failing.items() if not PEER_FAILURE.search(log))
                match = ROOT_CAUSE.search(launcher_stderr)
                root = own[0] if own else (int(match.group(1)) if match else None)
                cause = f"first failing rank: {root}; ranks with errors: {sorted(failing)}"
            order = sorted(failing, key=lambda r: (r != root, r))  # the root cause first
            details = "\n".join(f"--- rank {r} stderr (tail) ---\n{failing[r]}" for r in order)
            if not details:
                details = launcher_stderr[-tail_chars:]
            raise LaunchError(
                f"torchrun {module} exited with code {process.returncode}; {cause}\n{details}",
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
