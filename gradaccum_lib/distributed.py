"""What a worker needs to take part in gradient accumulation across ranks: join the process
group (gloo on CPU, nccl on CUDA), agree once per epoch that every rank holds the same windows,
and leave cleanly. How the loop skips DDP's gradient sync on a window's inner micro-steps is
the loop's own (:mod:`gradaccum_lib.accumulation`).

``torchrun`` starts the processes; :func:`init_distributed` meets the other ranks through
torchrun's store, or through the file that :func:`gradaccum_course.launch.launch` names in
:data:`STORE_FILE_VARIABLE` (no TCP store listening on every interface). A worker's entry
point, which makes it die with its agent, is :func:`gradaccum_course.launch.run_worker`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "STORE_FILE_VARIABLE",
    "DistributedContext",
    "agree_on_windows",
    "init_distributed",
    "process_group_session",
]

#: the FileStore file through which init_distributed meets, as "RUN_ID:PATH" (launch() sets
#: it): honoured only under the torchrun run whose ``TORCHELASTIC_RUN_ID`` is RUN_ID, not by a
#: torchrun started inside one of that run's workers, which inherits the variable
STORE_FILE_VARIABLE = "GRADACCUM_STORE_FILE"


def _store_file() -> str | None:
    """Return the path that :data:`STORE_FILE_VARIABLE` names for THIS torchrun run, else None."""
    run_id, _, path = os.environ.get(STORE_FILE_VARIABLE, "").partition(":")
    return path if path and run_id == os.environ.get("TORCHELASTIC_RUN_ID") else None


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
        store_file = _store_file()
        if store_file:
            dist.init_process_group(backend, init_method=Path(store_file).as_uri(), rank=rank,
                                    world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, store=_attempt_store(world_size, timeout),
                                    rank=rank, world_size=world_size, timeout=timeout)
    return DistributedContext(rank, world_size, local_rank, device, backend)


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


def agree_on_windows(model: torch.nn.Module, windows: Sequence[Sequence[object]]) -> None:
    """Check, once per epoch and on every rank, that every rank holds as many windows and none
    an empty one (and, under FSDP2, windows of equal length); raise the same error on every
    rank, naming the rank, if not. One collective (``all_gather_object``), before any forward.

    Why: a rank whose data runs out a window early stops calling the loop (or passes an empty
    window), and the other ranks wait in a collective it never joins (gloo: "Connection closed
    by peer"; nccl: until the timeout). FSDP2 all-gathers the parameters in every forward and
    backward, so its ranks must also run as many micro-steps per window; DDP only all-reduces
    on the last one, so there each rank may hold its own number (3 | 2 is exact).
    """
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence) or not all(
            isinstance(window, Sequence) for window in windows):
        raise TypeError("windows must be a list of windows (lists of micro-batches), all of the "
                        f"epoch's, made before the first; got {type(windows).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        return
    group = getattr(model, "process_group", None)  # DDP's group; None: the default one
    per_rank: list[list[int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(per_rank, [len(window) for window in windows], group=group)
    counts = [len(sizes) for sizes in per_rank]
    short = [rank for rank, count in enumerate(counts) if count < max(counts)]
    if short:
        raise ValueError(f"rank {', '.join(map(str, short))} holds fewer windows this epoch "
                         f"(windows per rank: {counts}): its data runs out before the other "
                         "ranks'. Every rank stops here; give every rank the same number of "
                         "windows (DistributedSampler pads its shards to equal length; "
                         "Accelerate has even_batches)")
    for index, sizes in enumerate(zip(*per_rank, strict=True)):
        empty = [rank for rank, size in enumerate(sizes) if size == 0]
        if empty:
            raise ValueError(f"rank {', '.join(map(str, empty))} holds an empty window "
                             f"(window {index}, micro-batches per rank: {list(sizes)}): "
                             "every rank stops here; each rank needs at least one micro-batch "
                             "in every window")
        if len(set(sizes)) > 1 and callable(getattr(model, "set_requires_gradient_sync", None)):
            raise ValueError(f"window {index} holds {list(sizes)} micro-batches per rank under "
                             "FSDP2, which all-gathers in every forward and backward, so its "
                             "ranks must run as many micro-steps: give every rank the same "
                             "number of micro-batches per window (pad the short rank with "
                             "micro-batches of zero items)")
