"""Ground truth: full-batch gradients, accumulated gradients, and how far apart two are.

Every function here leaves the model as it found it: existing ``.grad`` tensors, buffers
(BatchNorm running statistics) and each module's train/eval mode are restored, and parameters
are never stepped. Gradients come back as ``{parameter name: tensor}``, cloned, so they never
alias a ``.grad``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .batches import Batch, LossFn, check_loss_output, concatenate_micro_batches
from .losses import info_nce_from_embeddings

Gradients = dict[str, Tensor]

__all__ = [
    "AuditResult",
    "Gradients",
    "audit_update",
    "accumulated_gradients",
    "averaged_micro_batch_gradients",
    "collected_gradients",
    "flatten_gradients",
    "full_batch_gradients",
    "info_nce_cached_gradients",
    "max_gradient_difference",
    "model_restored",
    "parameters_after_step",
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


def collected_gradients(model: nn.Module, divisor: float) -> Gradients:
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


def _backward(loss: Tensor, micro_step: int) -> None:
    if not loss.requires_grad:
        raise ValueError(
            f"the loss of micro-batch {micro_step} does not require grad: loss_fn must not "
            "detach it or run under torch.no_grad(), and the model needs trainable parameters"
        )
    loss.backward()


def full_batch_gradients(model: nn.Module, loss_fn: LossFn, batch: Batch) -> Gradients:
    """Return the gradient of the mean loss over ``batch``, computed in one forward/backward."""
    with model_restored(model):
        summed_loss, num_items = check_loss_output(loss_fn(model, batch), 0)
        if num_items <= 0:
            raise ValueError("batch covers no items (loss_fn returned num_items == 0)")
        _backward(summed_loss / num_items, 0)
        return collected_gradients(model, 1.0)


def accumulated_gradients(
    model: nn.Module, loss_fn: LossFn, micro_batches: Iterable[Batch]
) -> Gradients:
    """Return the accumulated gradient of a window of micro-batches, weighted by item count.

    Each micro-batch is forwarded and backpropagated on its own (one graph alive at a time);
    the summed gradients are divided by the window's total item count, so the result is the
    gradient of the mean loss over every item in the window, however unevenly they are split.
    """
    with model_restored(model):
        total_items = 0.0
        micro_steps = 0
        for micro_step, micro_batch in enumerate(micro_batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, micro_batch), micro_step)
            _backward(summed_loss, micro_step)
            total_items += num_items
            micro_steps += 1
        if micro_steps == 0:
            raise ValueError("micro_batches is empty; it needs at least one micro-batch")
        if total_items <= 0:
            raise ValueError(
                f"the window of {micro_steps} micro-batches covers no items "
                "(every num_items was 0); there is no mean to take a gradient of"
            )
        return collected_gradients(model, total_items)


def averaged_micro_batch_gradients(
    model: nn.Module, loss_fn: LossFn, micro_batches: Iterable[Batch]
) -> Gradients:
    """Return what most hand-written loops compute: the mean of each micro-batch's mean-loss
    gradient (``loss.mean() / k`` per micro-batch). Exact only when every micro-batch covers
    the same number of items.
    """
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    accumulation_steps = len(micro_batches)
    with model_restored(model):
        for micro_step, micro_batch in enumerate(micro_batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, micro_batch), micro_step)
            if num_items <= 0:
                raise ValueError(
                    f"micro-batch {micro_step} covers no items, so its mean loss is undefined"
                )
            _backward(summed_loss / num_items / accumulation_steps, micro_step)
        return collected_gradients(model, 1.0)


def _checked_pair(grads_a: Mapping[str, Tensor], grads_b: Mapping[str, Tensor]) -> None:
    for label, grads in (("grads_a", grads_a), ("grads_b", grads_b)):
        if not isinstance(grads, Mapping):
            raise TypeError(
                f"{label} must be a dict of parameter name -> Tensor; got {type(grads).__name__}"
            )
        if not grads:
            raise ValueError(f"{label} is empty; it needs at least one gradient")
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


def _as_float64(tensor: Tensor) -> Tensor:
    return tensor.detach().to(device="cpu", dtype=torch.float64)


def max_gradient_difference(
    grads_a: Mapping[str, Tensor], grads_b: Mapping[str, Tensor], *, relative: bool = False
) -> float:
    """Return max |a - b| over every parameter (in float64); with ``relative=True``, divided by
    max |b|, so the result is a fraction of the largest gradient entry of ``grads_b``.
    """
    _checked_pair(grads_a, grads_b)
    difference = max(
        (_as_float64(grads_a[name]) - _as_float64(grads_b[name])).abs().max().item()
        if grads_a[name].numel()
        else 0.0
        for name in grads_a
    )
    if not relative:
        return difference
    scale = max(
        _as_float64(tensor).abs().max().item() if tensor.numel() else 0.0
        for tensor in grads_b.values()
    )
    if scale == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return difference / scale


def flatten_gradients(grads: Mapping[str, Tensor]) -> Tensor:
    """Return every gradient concatenated, in name order, as one float64 CPU vector."""
    if not isinstance(grads, Mapping) or not grads:
        raise ValueError("grads must be a non-empty dict of parameter name -> Tensor")
    return torch.cat([_as_float64(grads[name]).reshape(-1) for name in sorted(grads)])


def parameters_after_step(
    model: nn.Module,
    grads: Mapping[str, Tensor],
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
) -> dict[str, Tensor]:
    """Return the parameters one optimizer step from ``grads`` would produce, on a copy of
    ``model`` (the model itself is not touched).
    """
    trial = copy.deepcopy(model)
    trainable = {name: p for name, p in trial.named_parameters() if p.requires_grad}
    if set(trainable) != set(grads):
        raise ValueError(
            "grads must name exactly the model's trainable parameters; missing: "
            f"{sorted(set(trainable) - set(grads))}, unknown: {sorted(set(grads) - set(trainable))}"
        )
    for name, parameter in trainable.items():
        parameter.grad = grads[name].detach().clone().to(parameter.dtype)
    make_optimizer(trainable.values()).step()
    return {name: parameter.detach().clone() for name, parameter in trial.named_parameters()}


OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
StepFunction = Callable[[nn.Module, list[Batch], OptimizerFactory], None]


@dataclass(frozen=True)
class AuditResult:
    """How one optimizer step of an audited setup compares with the ground truth's step."""

    norm_ratio: float  # |candidate update| / |true update|
    cosine: float  # cosine similarity of the two updates
    relative_difference: float  # |candidate - true| / |true|

    def matches(self, tolerance: float = 1e-5) -> bool:
        """Return True when the update equals the truth up to ``tolerance`` (relative)."""
        return self.relative_difference <= tolerance


def _parameter_vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().to("cpu", torch.float64).reshape(-1)
                      for p in model.parameters() if p.requires_grad])


def audit_update(
    step_fn: StepFunction,
    model: nn.Module,
    loss_fn: LossFn,
    micro_batches: Sequence[Batch],
    make_optimizer: OptimizerFactory,
) -> AuditResult:
    """Run ONE optimizer step of an audited setup and compare its parameter update with the
    ground truth: the same optimizer stepped once from the full-batch gradient of the
    concatenated window (:func:`full_batch_gradients`, mean over every item).

    ``step_fn(model_copy, micro_batches, make_optimizer)`` must build its optimizer with
    ``make_optimizer`` and take exactly one step over the window; it gets a deep copy of
    ``model``, which is never touched.
    """
    micro_batches = list(micro_batches)
    window = concatenate_micro_batches(micro_batches)
    before = _parameter_vector(model)
    truth_gradients = full_batch_gradients(model, loss_fn, window)
    truth_parameters = parameters_after_step(model, truth_gradients, make_optimizer)
    true_update = torch.cat([
        truth_parameters[name].detach().to("cpu", torch.float64).reshape(-1)
        for name, p in model.named_parameters() if p.requires_grad
    ]) - before
    candidate = copy.deepcopy(model)
    step_fn(candidate, micro_batches, make_optimizer)
    update = _parameter_vector(candidate) - before
    true_norm = true_update.norm().item()
    if true_norm == 0.0:
        raise ValueError("the true update is zero (learning rate 0?); nothing to compare with")
    return AuditResult(
        norm_ratio=update.norm().item() / true_norm,
        cosine=torch.nn.functional.cosine_similarity(update, true_update, dim=0).item(),
        relative_difference=(update - true_update).norm().item() / true_norm,
    )


def info_nce_cached_gradients(
    model: nn.Module, micro_batches: Iterable[Sequence[Tensor]], *, temperature: float = 0.5
) -> Gradients:
    """Return the gradient of the FULL-batch InfoNCE loss while holding one micro-batch's
    graph at a time (gradient caching, Gao et al. 2021, arXiv:2101.06983).

    1. embed every micro-batch without a graph; 2. compute the loss over all embeddings and
    its gradient with respect to the embeddings; 3. re-embed each micro-batch with a graph and
    backpropagate those cached embedding gradients. Exact for deterministic encoders (with
    dropout, step 3 must replay step 1's random state).
    """
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    with model_restored(model):
        with torch.no_grad():
            anchors = torch.cat([model(a) for a, _ in micro_batches])
            positives = torch.cat([model(p) for _, p in micro_batches])
        anchors.requires_grad_(True)
        positives.requires_grad_(True)
        summed_loss, num_items = info_nce_from_embeddings(
            anchors, positives, temperature=temperature
        )
        anchor_grads, positive_grads = torch.autograd.grad(
            summed_loss / num_items, (anchors, positives)
        )
        start = 0
        for micro_anchors, micro_positives in micro_batches:
            rows = slice(start, start + micro_anchors.shape[0])
            surrogate = (model(micro_anchors) * anchor_grads[rows]).sum() + (
                model(micro_positives) * positive_grads[rows]
            ).sum()
            surrogate.backward()
            start = rows.stop
        return collected_gradients(model, 1.0)
