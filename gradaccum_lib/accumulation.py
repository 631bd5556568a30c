"""Splitting a batch into micro-batches and weighting their losses by the window's item count.

The loss contract of the whole series:

    loss_fn(model, batch) -> (summed_loss, num_items)

``summed_loss`` is the SUM of per-item losses (items are samples, or non-padding tokens) and
``num_items`` says how many items it covers. Because the library, not the loss function,
divides by the total item count of the whole accumulation window, uneven micro-batches and
variable-length sequences give exactly the large-batch gradient.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn

Batch: TypeAlias = Tensor | Sequence[Tensor] | Mapping[str, Tensor]
LossFn: TypeAlias = Callable[[nn.Module, Any], tuple[Tensor, int | Tensor]]

__all__ = [
    "Batch",
    "LossFn",
    "NonFiniteLossError",
    "batch_size",
    "check_loss_output",
    "split_into_micro_batches",
]


class NonFiniteLossError(FloatingPointError):
    """A micro-step produced a NaN or infinite loss; ``micro_step`` is its 0-based index."""

    def __init__(self, micro_step: int, value: float) -> None:
        super().__init__(
            f"micro-batch {micro_step} produced a non-finite loss ({value}); "
            "refusing to accumulate it into the window's gradient"
        )
        self.micro_step = micro_step
        self.value = value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensors_of(batch: Batch) -> list[tuple[str, Tensor]]:
    """(label, tensor) pairs of a batch, after checking its kind."""
    if isinstance(batch, Tensor):
        return [("batch", batch)]
    if isinstance(batch, Mapping):
        pairs = [(f"batch[{key!r}]", value) for key, value in batch.items()]
    elif isinstance(batch, (tuple, list)):
        pairs = [(f"batch[{index}]", value) for index, value in enumerate(batch)]
    else:
        raise TypeError(
            "batch must be a Tensor, a tuple/list of Tensors or a dict of Tensors; "
            f"got {type(batch).__name__}"
        )
    if not pairs:
        raise ValueError("batch must hold at least one Tensor; got an empty container")
    for label, value in pairs:
        if not isinstance(value, Tensor):
            raise TypeError(f"{label} must be a Tensor; got {type(value).__name__}")
    return pairs


def batch_size(batch: Batch) -> int:
    """Return the size of dim 0 shared by every tensor of ``batch`` (checked)."""
    pairs = _tensors_of(batch)
    sizes = {}
    for label, tensor in pairs:
        if tensor.dim() == 0:
            raise ValueError(f"{label} is a 0-dim tensor; every tensor needs a batch dim 0")
        sizes[label] = tensor.shape[0]
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{label}: {size}" for label, size in sizes.items())
        raise ValueError(f"tensors in batch disagree on dim 0 ({listing}); they must be equal")
    size = next(iter(sizes.values()))
    if size == 0:
        raise ValueError("batch is empty (dim 0 has size 0); it needs at least one item")
    return size


def _rebuild(batch: Batch, parts_per_tensor: list[tuple[Tensor, ...]], index: int) -> Batch:
    """The ``index``-th micro-batch, of the same kind as ``batch``."""
    if isinstance(batch, Tensor):
        return parts_per_tensor[0][index]
    if isinstance(batch, Mapping):
        return type(batch)(
            (key, parts[index]) for key, parts in zip(batch, parts_per_tensor, strict=True)
        )
    items = [parts[index] for parts in parts_per_tensor]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*items)
    return type(batch)(items)


def split_into_micro_batches(
    batch: Batch,
    *,
    accumulation_steps: int | None = None,
    micro_batch_size: int | None = None,
) -> list[Batch]:
    """Return ``batch`` split along dim 0 into micro-batches of the same kind (views, no copy).

    Give exactly one of ``accumulation_steps`` (exactly that many micro-batches, sizes
    differing by at most one, as ``torch.tensor_split``) or ``micro_batch_size`` (chunks of
    that size, the last one possibly smaller).
    """
    total = batch_size(batch)
    if (accumulation_steps is None) == (micro_batch_size is None):
        raise ValueError(
            "give exactly one of accumulation_steps or micro_batch_size; got "
            f"accumulation_steps={accumulation_steps!r}, micro_batch_size={micro_batch_size!r}"
        )
    tensors = [tensor for _, tensor in _tensors_of(batch)]
    if accumulation_steps is not None:
        if not _is_int(accumulation_steps):
            raise TypeError(
                f"accumulation_steps must be a positive int no larger than the batch ({total}); "
                f"got {accumulation_steps!r} of type {type(accumulation_steps).__name__}"
            )
        if not 1 <= accumulation_steps <= total:
            raise ValueError(
                f"accumulation_steps must be a positive int no larger than the batch ({total}); "
                f"got {accumulation_steps}"
            )
        parts = [torch.tensor_split(tensor, accumulation_steps) for tensor in tensors]
        count = accumulation_steps
    else:
        if not _is_int(micro_batch_size):
            raise TypeError(
                f"micro_batch_size must be a positive int; got {micro_batch_size!r} "
                f"of type {type(micro_batch_size).__name__}"
            )
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be a positive int; got {micro_batch_size}")
        parts = [torch.split(tensor, micro_batch_size) for tensor in tensors]
        count = math.ceil(total / micro_batch_size)
    return [_rebuild(batch, parts, index) for index in range(count)]


def check_loss_output(output: object, micro_step: int) -> tuple[Tensor, float]:
    """Return ``(summed_loss, num_items)`` from a loss function's output, validated.

    ``num_items`` comes back as a Python float (exact for counts below 2**53). A non-finite
    loss raises :class:`NonFiniteLossError` naming ``micro_step``.
    """
    if not isinstance(output, tuple) or len(output) != 2:
        raise TypeError(
            "loss_fn must return a tuple (summed_loss, num_items); "
            f"got {type(output).__name__} at micro-batch {micro_step}"
        )
    summed_loss, num_items = output
    if not isinstance(summed_loss, Tensor) or summed_loss.dim() != 0:
        shape = tuple(summed_loss.shape) if isinstance(summed_loss, Tensor) else None
        raise TypeError(
            "loss_fn's summed_loss must be a 0-dim Tensor (the SUM of per-item losses); "
            f"got {type(summed_loss).__name__} with shape {shape} at micro-batch {micro_step}"
        )
    if isinstance(num_items, Tensor):
        if num_items.numel() != 1:
            raise ValueError(
                "loss_fn's num_items must be a single number (items, or total item weight); "
                f"got a tensor of shape {tuple(num_items.shape)} at micro-batch {micro_step}"
            )
        count = float(num_items.detach().reshape(()).item())
    elif isinstance(num_items, numbers.Real) and not isinstance(num_items, bool):
        count = float(num_items)
    else:
        raise TypeError(
            "loss_fn's num_items must be a number (int, float) or a one-element Tensor; "
            f"got {type(num_items).__name__} at micro-batch {micro_step}"
        )
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(
            f"loss_fn's num_items must be finite and >= 0; got {count} "
            f"at micro-batch {micro_step}"
        )
    if not torch.isfinite(summed_loss.detach()).item():
        raise NonFiniteLossError(micro_step, summed_loss.item())
    return summed_loss, count
