"""What a torchrun worker uses: the process group and :func:`run_worker`, its entry point
(DDP's communication hooks are in :mod:`gradaccum_lib.comm_hooks`).

``torchrun`` starts the processes (gloo on CPU, nccl on CUDA); :mod:`gradaccum_lib.launcher`
starts torchrun from a notebook or a test. Under torchrun, :func:`run_worker` makes the worker
die with its torchrun agent and print its Python stacks on SIGUSR1, and
:func:`init_distributed` meets the other ranks through the file that
:func:`~gradaccum_lib.launcher.launch` names (no TCP store listening on every interface).
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DistributedContext",
    "SkippedSync",
    "full_value",
    "gradient_sync_kind",
    "init_distributed",
    "process_group_session",
    "run_worker",
]

#: set by launch() for its run: the run id, the torchrun agent's pid (run_worker exits when
#: that process is gone) and the FileStore file through which init_distributed meets
RUN_ID_VARIABLE = "GRADACCUM_RUN_ID"
AGENT_PID_VARIABLE = "GRADACCUM_AGENT_PID"
STORE_FILE_VARIABLE = "GRADACCUM_STORE_FILE"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _launch_variable(name: str) -> str | None:
    """Return the variable ``name`` if launch() set it for THIS torchrun run, else None (a
    torchrun started inside one of launch()'s workers inherits its variables)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or os.environ.get(RUN_ID_VARIABLE) != run_id:
        return None
    return os.environ.get(name)


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


def _attempt_store(world_size: int, timeout: timedelta) -> dist.Store | None:
    """The store of this restart attempt of a plain torchrun, or None (then ``env://``).

    torch 2.13's agent shares ONE TCP store with its workers and keeps it across restarts
    (``DynamicRendezvousHandler.next_rendezvous``), while the workers' side assumes a new store
    per attempt and adds no prefix (``torch.distributed.rendezvous._create_c10d_store``). A
    restarted group can then read the killed rank's gloo address from the previous attempt
    and fail with "connectFullMesh ... Connection refused" (measured: 4 restarts out of 4
    under load). A prefix per attempt keeps each attempt's keys apart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           world_size, is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/gradaccum/attempt_{attempt}", client)


def init_distributed(timeout_seconds: float = 60.0) -> DistributedContext:
    """Initialise the default process group from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...; the FileStore that launch() names
    instead of a TCP store on rank 0): nccl when CUDA is present, gloo otherwise, with a
    timeout; return where this process stands. Without those variables, return a
    single-process context.
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
    if not dist.is_initialized():  # launch()'s runs meet through a file, not a TCP store
        timeout = timedelta(seconds=timeout_seconds)
        store_file = _launch_variable(STORE_FILE_VARIABLE)
        if store_file:
            dist.init_process_group(backend, init_method=Path(store_file).as_uri(), rank=rank,
                                    world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, store=_attempt_store(world_size, timeout),
                                    rank=rank, world_size=world_size, timeout=timeout)
    return DistributedContext(rank, world_size, local_rank, device, backend)


def gradient_sync_kind(model: nn.Module) -> str:
    """Return how ``model`` synchronises gradients: ``"ddp"``, ``"fsdp2"`` or ``"none"``."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "ddp"
    if callable(getattr(model, "set_requires_gradient_sync", None)):
        return "fsdp2"
    return "none"


class SkippedSync:
    """DDP's ``no_sync()`` as one reusable object: ``with skipped:`` turns the model's sync
    flag off for the forward and backward inside it and restores it after (nested too). It
    sets the flag DDP's own ``no_sync()`` sets; a subclass's override of ``no_sync()`` is not
    called. The engine enters it on every micro-step but a window's last, so it is a class,
    not a generator made anew each time."""

    __slots__ = ("model", "_saved")

    def __init__(self, model: nn.parallel.DistributedDataParallel) -> None:
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            raise TypeError(f"SkippedSync needs a DistributedDataParallel model; got "
                            f"{type(model).__name__}")
        self.model, self._saved = model, []

    def __enter__(self) -> None:
        self._saved.append(self.model.require_backward_grad_sync)
        self.model.require_backward_grad_sync = False

    def __exit__(self, *exc_info: object) -> None:
        self.model.require_backward_grad_sync = self._saved.pop()


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """Return the full value of a DTensor (an FSDP2 shard), else ``tensor`` itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


@contextmanager
def process_group_session() -> Iterator[None]:
    """Wrap a torchrun worker's work: on success every rank meets at a barrier (none tears
    down while another still needs it); in every case the process group is destroyed (a
    failed rank must not wait for the others)."""
    try:
        yield
        if dist.is_initialized():
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
    agent_pid = int(_launch_variable(AGENT_PID_VARIABLE) or os.getppid())
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
    (what :func:`~gradaccum_lib.launcher.launch` shows for the ranks that hang).
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
