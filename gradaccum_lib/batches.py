"""Batches and the loss contract: splitting a batch into micro-batches, windows of them, and
checking what a loss function returns.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn

from .runtime import check_positive_int, is_int

__all__ = [
    "Batch",
    "as_micro_batch_list",
    "batch_size",
    "check_loss_output",
    "concatenate_micro_batches",
    "LossFn",
    "loss_pair",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "split_into_micro_batches",
    "windows_of",
]


Batch: TypeAlias = Tensor | Sequence[Tensor] | Mapping[str, Tensor]

LossFn: TypeAlias = Callable[[nn.Module, Any], tuple[Tensor, int | Tensor]]


class NonFiniteLossError(FloatingPointError):
    """A micro-step produced a NaN or infinite loss; ``micro_step`` is its 0-based index (-1:
    it happened on another rank)."""

    def __init__(self, micro_step: int, value: float, *, where: str = "") -> None:
        origin = f"micro-batch {micro_step}" if micro_step >= 0 else "a micro-batch"
        super().__init__(
            f"{origin}{' ' + where if where else ''} produced a non-finite loss ({value}); "
            "refusing to accumulate it into the window's gradient"
        )
        self.micro_step = micro_step
        self.value = value


class NonFiniteGradientError(FloatingPointError):
    """A window's accumulated gradient is inf or NaN (and no GradScaler is there to skip)."""


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
        if not is_int(accumulation_steps):
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
        if not is_int(micro_batch_size):
            raise TypeError(
                f"micro_batch_size must be a positive int; got {micro_batch_size!r} "
                f"of type {type(micro_batch_size).__name__}"
            )
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be a positive int; got {micro_batch_size}")
        parts = [torch.split(tensor, micro_batch_size) for tensor in tensors]
        count = math.ceil(total / micro_batch_size)
    return [_rebuild(batch, parts, index) for index in range(count)]


def _check_batch_collection(batches: object, label: str = "micro_batches") -> None:
    """Refuse what is ONE batch rather than an iterable of (micro-)batches: a Tensor would be
    taken row by row, a dict key by key, a string character by character."""
    if isinstance(batches, (Tensor, Mapping, str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"{label} must be a list (or another iterable) of micro-batches, e.g. from "
            f"split_into_micro_batches, not one batch; got {type(batches).__name__}"
        )


def as_micro_batch_list(micro_batches: Iterable[Batch], label: str = "micro_batches",
                        ) -> list[Batch]:
    """Return ``micro_batches`` as a list, after checking it is a collection of batches."""
    _check_batch_collection(micro_batches, label)
    return list(micro_batches)


def concatenate_micro_batches(micro_batches: Sequence[Batch]) -> Batch:
    """Return the window's whole batch: the micro-batches concatenated along dim 0, of the
    same kind (the inverse of :func:`split_into_micro_batches`).
    """
    micro_batches = as_micro_batch_list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    first = micro_batches[0]
    for micro_batch in micro_batches:
        batch_size(micro_batch)  # checks its kind and shapes
    try:
        if isinstance(first, Tensor):
            return torch.cat(list(micro_batches))
        if isinstance(first, Mapping):
            return type(first)((key, torch.cat([mb[key] for mb in micro_batches])) for key in first)
        parts = [torch.cat([mb[i] for mb in micro_batches]) for i in range(len(first))]
    except (RuntimeError, KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"micro-batches cannot be concatenated (different keys, lengths or padded widths): "
            f"{error}"
        ) from error
    if hasattr(first, "_fields"):
        return type(first)(*parts)
    return type(first)(parts)


def loss_pair(output: object, micro_step: int, *,
              for_backward: bool = False) -> tuple[Tensor, Tensor | float]:
    """Return the ``(summed_loss, num_items)`` pair of a loss function's output, its kinds and
    shapes checked (``for_backward``: and that the loss requires grad) and nothing read from
    the device (a tensor count stays a tensor): the loop's per-micro-step check.
    :func:`check_loss_output` also reads and checks values."""
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
    if for_backward and not summed_loss.requires_grad:
        raise ValueError(f"the loss of micro-batch {micro_step} does not require grad: "
                         "loss_fn must not detach it or run under no_grad()")
    if isinstance(num_items, Tensor):
        if num_items.numel() != 1:
            raise ValueError(
                "loss_fn's num_items must be a single number (items, or total item weight); "
                f"got a tensor of shape {tuple(num_items.shape)} at micro-batch {micro_step}"
            )
        if num_items.requires_grad:  # a count is data; never part of the graph
            num_items = num_items.detach()
        return summed_loss, num_items if num_items.dim() == 0 else num_items.reshape(())
    if isinstance(num_items, numbers.Real) and not isinstance(num_items, bool):
        return summed_loss, float(num_items)
    raise TypeError(
        "loss_fn's num_items must be a number (int, float) or a one-element Tensor; "
        f"got {type(num_items).__name__} at micro-batch {micro_step}"
    )


def _check_num_items(count: float, micro_step: int) -> None:
    """Raise a ValueError naming ``micro_step`` unless ``count`` is finite and >= 0."""
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(
            f"loss_fn's num_items must be finite and >= 0; got {count} at micro-batch {micro_step}"
        )


def check_loss_output(output: object, micro_step: int) -> tuple[Tensor, float]:
    """Return ``(summed_loss, num_items)`` from a loss function's output, validated.

    ``num_items`` comes back as a Python float (exact for counts below 2**53). A non-finite
    loss raises :class:`NonFiniteLossError` naming ``micro_step``.
    """
    summed_loss, num_items = loss_pair(output, micro_step)
    count = float(num_items.item()) if isinstance(num_items, Tensor) else num_items
    _check_num_items(count, micro_step)
    if not torch.isfinite(summed_loss.detach()).item():
        raise NonFiniteLossError(micro_step, summed_loss.item())
    return summed_loss, count


def windows_of(micro_batches: Iterable[Batch], accumulation_steps: int) -> Iterator[list[Batch]]:
    """Yield lists of ``accumulation_steps`` consecutive micro-batches; the last may be shorter.
    The arguments are checked at the call, not at the first window."""
    check_positive_int("accumulation_steps", accumulation_steps)
    _check_batch_collection(micro_batches)
    return _windows(micro_batches, accumulation_steps)


def _windows(micro_batches: Iterable[Batch], accumulation_steps: int) -> Iterator[list[Batch]]:
    window: list[Batch] = []
    for micro_batch in micro_batches:
        window.append(micro_batch)
        if len(window) == accumulation_steps:
            yield window
            window = []
    if window:
        yield window
