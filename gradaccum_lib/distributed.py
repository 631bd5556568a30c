"""What a torchrun worker uses: the process group, DDP communication hooks, and
:func:`run_worker`, its entry point.

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
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "CommCounter",
    "DistributedContext",
    "WindowTotals",
    "attach_window_totals",
    "full_value",
    "gradient_sync_kind",
    "init_distributed",
    "process_group_session",
    "reduce_bucket",
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


class WindowTotals:
    """The engine's window totals, carried across ranks inside a DDP gradient bucket.

    Before a window's last backward pass the engine sets :attr:`pending` (this rank's float64
    totals: items, loss sum, error flags); the first float32 or float64 bucket that
    :func:`reduce_bucket` all-reduces in that pass appends them to its gradients, and when
    backward returns :attr:`received` holds their sum over the ranks (float64). The window
    then needs ONE collective, the gradient all-reduce it makes anyway, not one more for its
    totals. A float32 bucket carries each total as two float32 halves (high and low part),
    exact for counts below 2**24 a window and the loss sum to float32's rounding.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.pending: torch.Tensor | None = None
        self.received: torch.Tensor | None = None

    def take(self) -> torch.Tensor | None:
        """Return the received totals (None if no bucket carried them) and clear both slots."""
        received, self.received, self.pending = self.received, None, None
        return received


def reduce_bucket(bucket: dist.GradBucket, group: dist.ProcessGroup | None = None,
                  carrier: WindowTotals | None = None) -> torch.futures.Future:
    """Average ``bucket`` over the ranks as DDP's default hook does (divide by the world
    size, all-reduce the sum); when ``carrier`` has pending totals and the bucket holds
    float32 or float64 gradients, carry them in the same all-reduce (see
    :class:`WindowTotals`)."""
    buffer = bucket.buffer()
    size = dist.get_world_size(group)
    local = carrier.pending if carrier is not None else None
    if local is None or buffer.dtype not in (torch.float32, torch.float64):
        buffer.div_(size)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(
            lambda fut: fut.value()[0])
    carrier.pending = None
    extras = local.to(device=buffer.device, dtype=torch.float64)
    if buffer.dtype == torch.float32:  # high and low halves: about 48 of float64's 53 bits
        high = extras.float()
        extras = torch.cat([high, (extras - high.double()).float()])
    count = buffer.numel()
    packed = torch.empty(count + extras.numel(), dtype=buffer.dtype, device=buffer.device)
    torch.div(buffer, size, out=packed[:count])  # the division the default hook does
    packed[count:] = extras

    def unpack(fut: torch.futures.Future) -> torch.Tensor:
        tail = fut.value()[0][count:].double()
        half = local.numel()
        carrier.received = tail if buffer.dtype == torch.float64 else tail[:half] + tail[half:]
        return packed[:count]  # DDP copies the averaged gradients from here

    return dist.all_reduce(packed, group=group, async_op=True).get_future().then(unpack)


def _counter_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    return state.hook(state, bucket)


def _totals_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    return reduce_bucket(bucket, state.group, state)


def attach_window_totals(model: nn.Module) -> WindowTotals | None:
    """Return a :class:`WindowTotals` that ``model``'s gradient all-reduce will carry, or
    None where it cannot: not DDP, a communication hook of the user's already registered
    (DDP takes one), or the carrier of a :class:`CommCounter` already taken. A DDP model
    without a hook gets the engine's own (:func:`reduce_bucket`, DDP's default averaging);
    one counted by a :class:`CommCounter` (registered with :meth:`CommCounter.register`)
    carries the totals through the counter."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return None
    hooks = getattr(model, "_comm_hooks", None)
    if hooks is None:  # a DDP without the list this relies on: use a separate all-reduce
        return None
    carrier = WindowTotals(model.process_group)
    if not hooks and not model._get_ddp_logging_data().get("comm_hook"):
        model.register_comm_hook(carrier, _totals_hook)
        return carrier
    if len(hooks) == 1 and isinstance(hooks[0][1], CommCounter) and hooks[0][1].carrier is None:
        hooks[0][1].carrier = carrier
        return carrier
    return None


@dataclass
class CommCounter:
    """State of a DDP communication hook that counts what gradient synchronisation sends.

    ``calls``: bucket all-reduces; ``bytes``: their gradient payload (the engine's window
    totals, 32 or 64 bytes carried in one bucket a window, are not counted); ``syncs``:
    backward passes that synchronised (one per backward, whatever the bucketing).
    :meth:`take` returns the counts since the last take (e.g. per optimizer step) and resets
    them. Register it with :meth:`register`.
    """

    calls: int = 0
    bytes: int = 0
    syncs: int = 0
    seconds: float = 0.0  # time from each all-reduce's launch to its completion (overlaps)
    carrier: WindowTotals | None = field(default=None, repr=False)

    def register(self, model: nn.parallel.DistributedDataParallel) -> None:
        """Register this counter as ``model``'s communication hook."""
        model.register_comm_hook(self, _counter_hook)

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future:
        """The comm hook: counts, then averages the bucket across ranks like DDP's default
        all-reduce (carrying the engine's window totals when it has attached them)."""
        buffer = bucket.buffer()
        self.calls += 1
        self.bytes += buffer.numel() * buffer.element_size()
        if bucket.is_last():
            self.syncs += 1
        start = time.perf_counter()
        future = reduce_bucket(bucket, self.carrier.group if self.carrier else None,
                               self.carrier)

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.seconds += time.perf_counter() - start
            return fut.value()

        return future.then(done)

    def take(self) -> dict[str, float]:
        """Return ``{"calls", "bytes", "syncs", "seconds"}`` since the last take; reset."""
        counts = {"calls": self.calls, "bytes": self.bytes, "syncs": self.syncs,
                  "seconds": self.seconds}
        self.calls = self.bytes = self.syncs = 0
        self.seconds = 0.0
        return counts


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
