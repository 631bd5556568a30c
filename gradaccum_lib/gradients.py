"""Gradients as ``{parameter name: tensor}``: collecting them from a model left exactly as
found, refusing non-finite ones, and comparing two sets. The helpers of the ground-truth
functions (:mod:`gradaccum_lib.equivalence`, which re-exports them) and of the audited steps.

- :func:`model_restored` clears ``.grad`` for its body, then restores every parameter's
  ``.grad`` (the same tensor objects), the buffers and each module's train/eval mode, whether
  the body returns or raises;
- :func:`max_gradient_difference` and :func:`flatten_gradients` compare and flatten two sets.

The ground truth shares no code with the loop it judges (beyond the loss contract): the
loop's norm, rescale and finiteness checks are its own, in :mod:`gradaccum_lib.accumulation`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .runtime import check_bool

__all__ = [
    "check_gradient_dict",
    "collected_gradients",
    "flatten_gradients",
    "max_gradient_difference",
    "model_restored",
]

@contextmanager
def model_restored(model: nn.Module) -> Iterator[None]:
    """Clear ``.grad`` for the body; afterwards restore grads, buffers and modes."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    parameters = list(model.named_parameters())
    saved_grads = {name: parameter.grad for name, parameter in parameters}
    saved_buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    saved_modes = [(module, module.training) for module in model.modules()]
    for _, parameter in parameters:
        parameter.grad = None
    try:
        yield
    finally:
        for name, parameter in parameters:
            parameter.grad = saved_grads[name]
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved_buffers[name])
        for module, training in saved_modes:
            module.training = training


def collected_gradients(model: nn.Module, divisor: float) -> dict[str, Tensor]:
    """Each trainable parameter's ``.grad`` / ``divisor`` (zeros where none arrived), cloned."""
    gradients = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.grad is None:
            gradients[name] = torch.zeros_like(parameter)
        else:
            gradients[name] = parameter.grad.detach() / divisor
    return gradients


def _checked_pair(grads_a: Mapping[str, Tensor], grads_b: Mapping[str, Tensor]) -> None:
    for label, grads in (("grads_a", grads_a), ("grads_b", grads_b)):
        check_gradient_dict(label, grads)
    if set(grads_a) != set(grads_b):
        only_a = sorted(set(grads_a) - set(grads_b))
        only_b = sorted(set(grads_b) - set(grads_a))
        raise ValueError(
            "grads_a and grads_b must name the same parameters; "
            f"only in grads_a: {only_a}, only in grads_b: {only_b}"
        )
    for name in grads_a:
        if grads_a[name].shape != grads_b[name].shape:
            raise ValueError(
                f"gradient {name!r} has shape {tuple(grads_a[name].shape)} in grads_a but "
                f"{tuple(grads_b[name].shape)} in grads_b"
            )


def check_gradient_dict(label: str, grads: object) -> None:
    if not isinstance(grads, Mapping):
        raise TypeError(f"{label} must be a dict of parameter name -> Tensor (non-empty); got "
                        f"{type(grads).__name__}")
    if not grads:
        raise ValueError(f"{label} is empty; it must be a non-empty dict of parameter name -> "
                         "Tensor with at least one gradient")
    for name, value in grads.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{label}[{name!r}] must be a Tensor; got {type(value).__name__}")


def _as_float64(tensor: Tensor) -> Tensor:
    return tensor.detach().to(device="cpu", dtype=torch.float64)


def _largest(values: Iterable[Tensor]) -> float:
    """max over every entry of every tensor (0.0 for none); NaN if any entry is NaN."""
    maxima = [value.max().item() for value in values if value.numel()]
    if any(math.isnan(m) for m in maxima):
        return math.nan
    return max(maxima, default=0.0)


def max_gradient_difference(
    grads_a: Mapping[str, Tensor], grads_b: Mapping[str, Tensor], *, relative: bool = False
) -> float:
    """Return max |a - b| over every parameter (in float64); with ``relative=True``, divided by
    max |b|, so the result is a fraction of the largest gradient entry of ``grads_b``.

    A NaN anywhere in either side gives NaN (never a difference that skips it), as does an
    infinity at the same entry of both sides.
    """
    _checked_pair(grads_a, grads_b)
    check_bool("relative", relative)
    difference = _largest(
        (_as_float64(grads_a[name]) - _as_float64(grads_b[name])).abs() for name in grads_a)
    if math.isnan(difference):  # a NaN on either side, or inf - inf
        return math.nan
    if not relative:
        return difference
    scale = _largest(_as_float64(tensor).abs() for tensor in grads_b.values())
    if scale == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return difference / scale


def flatten_gradients(grads: Mapping[str, Tensor]) -> Tensor:
    """Return every gradient concatenated, in name order, as one float64 CPU vector."""
    check_gradient_dict("grads", grads)
    return torch.cat([_as_float64(grads[name]).reshape(-1) for name in sorted(grads)])
