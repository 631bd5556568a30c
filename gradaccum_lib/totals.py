"""The engine's window totals: what a rank's micro-batches add up to, and the checks on them.

Per window, the engine needs one rank's ``[items, finite loss sum, non-finite losses, invalid
counts]`` (summed over the ranks by an all-reduce, or carried in DDP's gradient all-reduce:
:mod:`gradaccum_lib.comm_hooks`), then the checks that refuse the step. Losses and counts
come as numbers when they live on the CPU (read as they come: no device to wait for) and as
tensors on an accelerator, where :func:`device_totals` sums them without a host sync.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .batches import NonFiniteLossError, _check_count

__all__ = ["checked_totals", "device_totals", "local_totals"]


def _as_tensor(value: Tensor | float, device: torch.device | None = None) -> Tensor:
    """A loss or count as a tensor (a number read on the CPU goes back as float64)."""
    if isinstance(value, Tensor):
        return value
    return torch.tensor(value, dtype=torch.float64, device=device)


def local_totals(summed_losses: list, counts: list) -> list[float]:
    """Return ``[items, finite loss sum, non-finite losses, invalid counts]`` in numbers:
    invalid counts (negative or not finite) and non-finite losses are counted, not summed.
    Tensors cost one host read of the losses and one of the counts."""
    losses = (torch.stack([_as_tensor(loss) for loss in summed_losses]).tolist()
              if any(isinstance(loss, Tensor) for loss in summed_losses) else summed_losses)
    items = (torch.stack(counts).tolist() if all(isinstance(c, Tensor) for c in counts)
             else [float(c) for c in counts])
    valid = [math.isfinite(c) and c >= 0 for c in items]
    finite = [math.isfinite(loss) for loss in losses]
    return [float(sum(c for c, ok in zip(items, valid, strict=True) if ok)),
            float(sum(loss for loss, ok in zip(losses, finite, strict=True) if ok)),
            float(finite.count(False)), float(valid.count(False))]


def device_totals(summed_losses: list, counts: list) -> Tensor:
    """Return :func:`local_totals` as a float64 tensor on the losses' device, computed there
    without waiting for it (the all-reduce that follows needs no host sync either)."""
    losses = torch.stack([_as_tensor(loss) for loss in summed_losses]).to(torch.float64)
    items = torch.stack([_as_tensor(c, losses.device) for c in counts]).to(
        device=losses.device, dtype=torch.float64)
    valid, finite = torch.isfinite(items) & (items >= 0), torch.isfinite(losses)
    return torch.stack([torch.where(valid, items, 0.0).sum(),
                        torch.where(finite, losses, 0.0).sum(),
                        (~finite).sum().to(torch.float64),
                        (~valid).sum().to(torch.float64)])


def checked_totals(values: list[float], summed_losses: list, counts: list,
                   window_index: int) -> tuple[float, float]:
    """Return the window's (items, summed loss) from its totals over every rank; raise on a
    non-finite loss, an invalid count or a window without items. This rank's own
    ``summed_losses`` and ``counts`` name the bad micro-batch when it holds one; otherwise
    the error says it was on another rank."""
    total_items, total_loss, bad, invalid = values
    if invalid:
        for micro_step, count in enumerate(counts):
            _check_count(float(count), micro_step)
        raise ValueError("a micro-batch on another rank returned an invalid num_items "
                         "(negative or not finite)")
    if bad:
        for micro_step, loss in enumerate(summed_losses):
            if not math.isfinite(float(loss)):
                raise NonFiniteLossError(micro_step, float(loss))
        raise NonFiniteLossError(-1, float("nan"), where="on another rank")
    if total_items <= 0:
        raise ValueError(f"window {window_index} covers no items (every num_items was 0 on "
                         "every rank)")
    return total_items, total_loss
