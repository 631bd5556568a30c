"""A teaching instrument: a DDP communication hook that counts what gradient synchronisation
sends, then averages each bucket as DDP's default does (divide by the group's size, one
``dist.all_reduce``). The notebooks register it; ``accumulate_window`` does not know about it.

DDP takes one hook per model, registered before its first synchronising backward pass; a hook
must not carry string annotations (``from __future__ import annotations``) on its ``state``
and ``bucket``, so the function registered here is a plain one without them.
"""

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["CommCounter"]


def _counter_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    return state.hook(state, bucket)


@dataclass
class CommCounter:
    """State of a DDP communication hook that counts what gradient synchronisation sends.

    ``calls``: bucket all-reduces; ``bytes``: their payload; ``syncs``: backward passes that
    synchronised (one per backward, whatever the bucketing); ``seconds``: time from each
    all-reduce's launch to its completion (they overlap the backward). :meth:`take` returns
    the counts since the last take (e.g. per optimizer step) and resets them. Register it
    with :meth:`register`.
    """

    calls: int = 0
    bytes: int = 0
    syncs: int = 0
    seconds: float = 0.0
    group: dist.ProcessGroup | None = field(default=None, repr=False)  # the model's

    def register(self, model: nn.parallel.DistributedDataParallel) -> None:
        """Register this counter as ``model``'s communication hook (it averages over the
        model's process group)."""
        self.group = model.process_group
        model.register_comm_hook(self, _counter_hook)

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future:
        """The comm hook: counts, then averages the bucket across ranks as DDP's default
        all-reduce does."""
        buffer = bucket.buffer()
        self.calls += 1
        self.bytes += buffer.numel() * buffer.element_size()
        if bucket.is_last():
            self.syncs += 1
        start = time.perf_counter()
        buffer.div_(dist.get_world_size(self.group))  # the average, as DDP's own hook takes it

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.seconds += time.perf_counter() - start
            return fut.value()[0]

        return dist.all_reduce(buffer, group=self.group, async_op=True).get_future().then(done)

    def take(self) -> dict[str, float]:
        """Return ``{"calls", "bytes", "syncs", "seconds"}`` since the last take; reset."""
        counts = {"calls": self.calls, "bytes": self.bytes, "syncs": self.syncs,
                  "seconds": self.seconds}
        self.calls = self.bytes = self.syncs = 0
        self.seconds = 0.0
        return counts
