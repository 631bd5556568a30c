"""DDP communication hooks: DDP's averaging in Python (:func:`reduce_bucket`), a counter of
what gradient synchronisation sends (:class:`CommCounter`), and the engine's window totals
carried in the gradient all-reduce (:class:`WindowTotals`, :func:`attach_window_totals`).

DDP takes one hook per model, registered before its first synchronising backward pass; a hook
must not carry string annotations (``from __future__ import annotations``) on its ``state``
and ``bucket``, so the hooks registered here are plain functions without them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "CommCounter",
    "WindowTotals",
    "attach_window_totals",
    "reduce_bucket",
]


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
        self._packed: torch.Tensor | None = None  # a bucket and the totals, reused

    def take(self) -> torch.Tensor | None:
        """Return the received totals (None if no bucket carried them) and clear both slots."""
        received, self.received, self.pending = self.received, None, None
        return received


def _first(future: torch.futures.Future) -> torch.Tensor:
    return future.value()[0]


def reduce_bucket(bucket: dist.GradBucket, group: dist.ProcessGroup | None = None,
                  carrier: WindowTotals | None = None) -> torch.futures.Future:
    """Average ``bucket`` over the ranks as DDP's default hook does (divide by the world
    size, all-reduce the sum); when ``carrier`` has pending totals and the bucket holds
    float32 or float64 gradients, carry them in the same all-reduce (see
    :class:`WindowTotals`). ``group`` None means the default group. The hook runs once per
    bucket on every synchronising backward pass, so it calls the process group directly
    (``ProcessGroup.allreduce``, what ``dist.all_reduce`` calls after checking its arguments
    and the rank's membership: DDP has done both for its buckets)."""
    buffer = bucket.buffer()
    group = group if group is not None else dist.group.WORLD
    local = carrier.pending if carrier is not None else None
    if local is None or buffer.dtype not in (torch.float32, torch.float64):
        buffer.div_(group.size())
        return group.allreduce([buffer]).get_future().then(_first)
    carrier.pending = None
    count, extra = buffer.numel(), local.numel()
    half = buffer.dtype == torch.float32  # high and low float32 halves (see WindowTotals)
    width = count + (2 * extra if half else extra)
    packed = carrier._packed  # reused across windows: DDP copies the averaged gradients out
    # of it before the backward pass that made it returns, and one bucket a window carries
    if packed is None or packed.numel() != width or packed.dtype != buffer.dtype or (
            packed.device != buffer.device):
        packed = carrier._packed = torch.empty(width, dtype=buffer.dtype, device=buffer.device)
    torch.div(buffer, group.size(), out=packed[:count])  # the division the default hook does
    local = local.to(device=buffer.device, dtype=torch.float64)
    if half:
        high = packed[count:count + extra]
        high.copy_(local)
        packed[count + extra:].copy_(local - high)
    else:
        packed[count:].copy_(local)

    def unpack(future: torch.futures.Future) -> torch.Tensor:
        tail = packed[count:].to(torch.float64, copy=True)  # the buffer is reused
        carrier.received = tail[:extra] + tail[extra:] if half else tail
        return packed[:count]  # DDP copies the averaged gradients from here

    return group.allreduce([packed]).get_future().then(unpack)


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
    group: dist.ProcessGroup | None = field(default=None, repr=False)  # the model's

    def register(self, model: nn.parallel.DistributedDataParallel) -> None:
        """Register this counter as ``model``'s communication hook (it averages over the
        model's process group)."""
        self.group = model.process_group
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
        future = reduce_bucket(bucket, self.carrier.group if self.carrier else self.group,
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
