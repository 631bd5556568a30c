"""Process groups, a DDP communication counter, and launching ``torchrun`` from Python.

Distributed code runs under the real engine: ``torchrun`` starts the processes (gloo on CPU,
nccl on CUDA), and :func:`launch` runs it from a notebook or a test in a subprocess with its
own session, a timeout that kills the whole process group, and an error that carries the
failing rank's stderr. (``!torchrun`` in a cell never fails the cell and may not be on PATH;
``mp.spawn`` of a function defined in a notebook cannot pickle it; fork-based launchers can
hang after torch has started threads.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .runtime import check_positive_int

__all__ = [
    "CommCounter",
    "DistributedContext",
    "LaunchError",
    "LaunchTimeout",
    "init_distributed",
    "launch",
    "run_worker",
    "torchrun_command",
]


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: rank, world size, device, backend (None: single process)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """Return True on rank 0 (the rank that prints and writes)."""
        return self.rank == 0


def init_distributed(timeout_seconds: float = 60.0) -> DistributedContext:
    """Initialise the default process group from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...): nccl when CUDA is present, gloo
    otherwise, with a timeout. Without those variables, return a single-process context.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return DistributedContext(0, 1, 0, device, None)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds))
    return DistributedContext(rank, world_size, local_rank, device, backend)


@dataclass
class CommCounter:
    """State of a DDP communication hook that counts what gradient synchronisation sends.

    ``calls``: bucket all-reduces; ``bytes``: their payload; ``syncs``: backward passes that
    synchronised (one per backward, whatever the bucketing). :meth:`take` returns the counts
    since the last take (e.g. per optimizer step) and resets them.
    """

    calls: int = 0
    bytes: int = 0
    syncs: int = 0
    seconds: float = 0.0  # time from each all-reduce's launch to its completion (overlaps)
    _pending: list[float] = field(default_factory=list, repr=False)

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future:
        """The comm hook (register with ``ddp.register_comm_hook(counter, counter.hook)``):
        counts, then averages the bucket across ranks like DDP's default all-reduce.
        """
        buffer = bucket.buffer()
        self.calls += 1
        self.bytes += buffer.numel() * buffer.element_size()
        if bucket.is_last():
            self.syncs += 1
        start = time.perf_counter()
        buffer.div_(dist.get_world_size())
        future = dist.all_reduce(buffer, async_op=True).get_future()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.seconds += time.perf_counter() - start
            return fut.value()[0]

        return future.then(done)

    def take(self) -> dict[str, float]:
        """Return ``{"calls", "bytes", "syncs", "seconds"}`` since the last take; reset."""
        counts = {"calls": self.calls, "bytes": self.bytes, "syncs": self.syncs,
                  "seconds": self.seconds}
        self.calls = self.bytes = self.syncs = 0
        self.seconds = 0.0
        return counts


class LaunchError(RuntimeError):
    """torchrun exited non-zero; ``rank_stderr`` maps each failing rank to its stderr tail and
    ``root_cause_rank`` is the rank that failed on its own (not because a peer died), else the
    one torchrun saw fail first (None if neither is known).
    """

    def __init__(self, message: str, returncode: int, rank_stderr: dict[int, str],
                 root_cause_rank: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.rank_stderr = rank_stderr
        self.root_cause_rank = root_cause_rank


#: what a rank prints when it fails only because ANOTHER rank died (a collective broke)
PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset by peer|Timed out waiting|"
                          r"DistNetworkError|remote worker crashing")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)


class LaunchTimeout(LaunchError):
    """torchrun did not finish within its timeout; its whole process group was killed."""


def _rank_logs(log_dir: Path, name: str) -> dict[int, str]:
    logs = {}
    for path in sorted(log_dir.glob(f"**/{name}.log")):
        try:
            rank = int(path.parent.name)
        except ValueError:
            continue
        logs[rank] = path.read_text(errors="replace")
    return logs


def _kill_group(process: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    module: str,
    arguments: list[str],
    *,
    nproc_per_node: int = 2,
    timeout_seconds: float = 300.0,
    tail_chars: int = 3000,
) -> dict:
    """Run ``torchrun --standalone --nproc_per_node=N -m MODULE ARGUMENTS --json PATH`` in a
    subprocess (own session, ``OMP_NUM_THREADS=1``) and return the JSON that rank 0 wrote.

    Raises :class:`LaunchTimeout` (after killing every process of the run) when it takes
    longer than ``timeout_seconds``, and :class:`LaunchError` with the failing ranks' stderr
    tails when it exits non-zero.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0; got {timeout_seconds}")
    with tempfile.TemporaryDirectory(prefix="gradaccum-launch-") as scratch:
        scratch_path = Path(scratch)
        json_path = scratch_path / "result.json"
        log_dir = scratch_path / "logs"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc_per_node}", f"--log-dir={log_dir}", "--redirects=3",
            "-m", module, *arguments, "--json", str(json_path),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True, env=env)
        try:
            _, launcher_stderr = process.communicate(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            stderr = {r: log[-tail_chars:] for r, log in _rank_logs(log_dir, "stderr").items()}
            raise LaunchTimeout(
                f"torchrun {module} did not finish within {timeout_seconds:g} s; every process "
                "of the run was killed", -signal.SIGKILL, stderr) from None
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
                process.returncode, failing, root)
        if not json_path.is_file():
            raise LaunchError(f"torchrun {module} succeeded but rank 0 wrote no JSON",
                              process.returncode, {})
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


def run_worker(main: Callable[[], int]) -> None:
    """Run a torchrun worker's ``main`` and exit with its code, skipping the interpreter's
    finalisation when launched by torchrun: gloo's worker threads can abort the process
    during finalisation ("terminate called without an active exception", about one run in
    ten here), after the work is done. ``main`` must destroy its process group first.
    """
    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - report any failure as the rank's traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
        os._exit(code)
    sys.exit(code)
