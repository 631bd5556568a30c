"""Ground truth: full-batch gradients, accumulated gradients, and how far apart two are.

Every function here leaves the model as it found it: existing ``.grad`` tensors, buffers
(BatchNorm running statistics) and each module's train/eval mode are restored, and parameters
are never stepped. Gradients come back as ``{parameter name: tensor}``, cloned, so they never
alias a ``.grad``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .batches import (
    Batch,
    LossFn,
    as_micro_batch_list,
    check_loss_output,
    concatenate_micro_batches,
)
from .gradients import (
    check_gradient_dict,
    collected_gradients,
    model_restored,
)
from .losses import info_nce_from_embeddings
from .runtime import check_model, check_number

__all__ = [
    "OptimizerFactory",
    "audit_update",
    "accumulated_gradients",
    "averaged_micro_batch_gradients",
    "full_batch_gradients",
    "info_nce_cached_gradients",
    "parameters_after_step",
]


def _backward(loss: Tensor, micro_step: int) -> None:
    if not loss.requires_grad:
        raise ValueError(
            f"the loss of micro-batch {micro_step} does not require grad: loss_fn must not "
            "detach it or run under torch.no_grad(), and the model needs trainable parameters"
        )
    loss.backward()


def _check_callable(label: str, value: object, usage: str) -> None:
    if not callable(value):
        raise TypeError(f"{label} must be callable as {usage}; got {type(value).__name__}")


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")


def _check_loss_fn(loss_fn: object) -> None:
    _check_callable("loss_fn", loss_fn, "loss_fn(model, batch) -> (summed_loss, num_items)")


def full_batch_gradients(model: nn.Module, loss_fn: LossFn, batch: Batch) -> dict[str, Tensor]:
    """Return the gradient of the mean loss over ``batch``, computed in one forward/backward."""
    check_model(model)
    _check_loss_fn(loss_fn)
    with model_restored(model), _inputs_untouched([batch], model):
        summed_loss, num_items = check_loss_output(loss_fn(model, batch), 0)
        if num_items <= 0:
            raise ValueError("batch covers no items (loss_fn returned num_items == 0)")
        _backward(summed_loss / num_items, 0)
        _check_finite_gradients(model, 0)
        return collected_gradients(model, 1.0)


def _check_window_items(total_items: float, micro_steps: int) -> None:
    if total_items <= 0:
        raise ValueError(
            f"the window of {micro_steps} micro-batches covers no items "
            "(every num_items was 0); there is no mean to take a gradient of"
        )


def _accumulate_in_float32(model: nn.Module, loss_fn: LossFn,
                           micro_batches: list[Batch]) -> dict[str, Tensor]:
    """16-bit models: each summed loss divided by one provisional normaliser, a power of two
    near the window's item count (exact), each micro-batch's gradient added into float32, and
    one rescale to the mean at the end (gradients are linear in the loss, so this is exact)."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    sums = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in trainable}
    total_items, provisional = 0.0, None
    for micro_step, micro_batch in enumerate(micro_batches):
        summed_loss, num_items = check_loss_output(loss_fn(model, micro_batch), micro_step)
        if provisional is None:
            provisional = 2.0 ** round(math.log2(max(num_items, 1.0) * len(micro_batches)))
        if summed_loss.dtype in (torch.float16, torch.bfloat16):
            summed_loss = summed_loss.float()
        _backward(summed_loss / provisional, micro_step)
        _check_finite_gradients(model, micro_step)
        for name, parameter in trainable:
            if parameter.grad is not None:
                sums[name] += parameter.grad.float()
                parameter.grad = None
        total_items += num_items
    _check_window_items(total_items, len(micro_batches))
    gradients = {}
    for name, parameter in trainable:
        gradients[name] = (sums[name] * (provisional / total_items)).to(parameter.dtype)
        if not bool(torch.isfinite(gradients[name]).all()):
            largest = sums[name].abs().max().item() * provisional / total_items
            raise ValueError(
                f"the mean gradient of parameter {name!r} does not fit in {parameter.dtype} "
                f"(its largest entry is {largest:.4g}); compute it in float32"
            )
    return gradients


def accumulated_gradients(
    model: nn.Module, loss_fn: LossFn, micro_batches: Iterable[Batch]
) -> dict[str, Tensor]:
    """Return the accumulated gradient of a window of micro-batches, weighted by item count.

    Each micro-batch is forwarded and backpropagated on its own (one graph alive at a time);
    the summed gradients are divided by the window's total item count, so the result is the
    gradient of the mean loss over every item in the window, however unevenly they are split.
    A float16 model is accumulated at mean scale in float32 (raw sums would overflow); a
    gradient that is NaN or infinite after any micro-batch is refused, naming the parameter.
    ``micro_batches`` is a list of micro-batches (one bare batch is refused).
    """
    check_model(model)
    _check_loss_fn(loss_fn)
    micro_batches = as_micro_batch_list(micro_batches)
    with model_restored(model), _inputs_untouched(micro_batches, model):
        if not micro_batches:
            raise ValueError("micro_batches is empty; it needs at least one micro-batch")
        if any(p.dtype == torch.float16 for p in model.parameters() if p.requires_grad):
            return _accumulate_in_float32(model, loss_fn, micro_batches)
        total_items = 0.0
        for micro_step, micro_batch in enumerate(micro_batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, micro_batch), micro_step)
            _backward(summed_loss, micro_step)
            _check_finite_gradients(model, micro_step)
            total_items += num_items
        _check_window_items(total_items, len(micro_batches))
        return collected_gradients(model, total_items)


def averaged_micro_batch_gradients(
    model: nn.Module, loss_fn: LossFn, micro_batches: Iterable[Batch]
) -> dict[str, Tensor]:
    """Return what most hand-written loops compute: the mean of each micro-batch's mean-loss
    gradient (``loss.mean() / k`` per micro-batch). Exact only when every micro-batch covers
    the same number of items.
    """
    check_model(model)
    _check_loss_fn(loss_fn)
    micro_batches = as_micro_batch_list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    accumulation_steps = len(micro_batches)
    with model_restored(model), _inputs_untouched(micro_batches, model):
        for micro_step, micro_batch in enumerate(micro_batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, micro_batch), micro_step)
            if num_items <= 0:
                raise ValueError(
                    f"micro-batch {micro_step} covers no items, so its mean loss is undefined"
                )
            _backward(summed_loss / num_items / accumulation_steps, micro_step)
            _check_finite_gradients(model, micro_step)
        return collected_gradients(model, 1.0)


def parameters_after_step(
    model: nn.Module,
    grads: Mapping[str, Tensor],
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
) -> dict[str, Tensor]:
    """Return the parameters one optimizer step from ``grads`` would produce, on a copy of
    ``model`` (the model itself is not touched).
    """
    _check_model(model)
    check_gradient_dict("grads", grads)
    _check_callable("make_optimizer", make_optimizer, "make_optimizer(parameters) -> Optimizer")
    trial = copy.deepcopy(model)
    trainable = {name: p for name, p in trial.named_parameters() if p.requires_grad}
    if set(trainable) != set(grads):
        raise ValueError(
            "grads must name exactly the model's trainable parameters; missing: "
            f"{sorted(set(trainable) - set(grads))}, unknown: {sorted(set(grads) - set(trainable))}"
        )
    for name, parameter in trainable.items():
        grad = grads[name]
        if grad.shape != parameter.shape:
            raise ValueError(f"grads[{name!r}] has shape {tuple(grad.shape)} but the parameter "
                             f"has shape {tuple(parameter.shape)}")
        if not bool(torch.isfinite(grad).all()):
            raise ValueError(f"grads[{name!r}] holds a NaN or an inf; refusing to step on it")
        parameter.grad = grad.detach().clone().to(parameter.device, parameter.dtype)
    optimizer = make_optimizer(trainable.values())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("make_optimizer must return a torch.optim.Optimizer; got "
                        f"{type(optimizer).__name__}")
    optimizer.step()
    return {name: parameter.detach().clone() for name, parameter in trial.named_parameters()}


OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
_StepFunction = Callable[[nn.Module, list[Batch], OptimizerFactory], None]


@dataclass(frozen=True)
class _AuditResult:
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
    step_fn: _StepFunction,
    model: nn.Module,
    loss_fn: LossFn,
    micro_batches: Sequence[Batch],
    make_optimizer: OptimizerFactory,
    *,
    max_grad_norm: float | None = None,
) -> _AuditResult:
    """Run ONE optimizer step of an audited setup and compare its parameter update with the
    ground truth: the same optimizer stepped once from the full-batch gradient of the
    concatenated window (:func:`full_batch_gradients`, mean over every item).

    With ``max_grad_norm``, the truth's gradient is clipped to that norm first (what a large
    batch with clipping does). ``step_fn(model_copy, micro_batches, make_optimizer)`` must
    build its optimizer with ``make_optimizer`` and take exactly one step over the window; it
    gets a deep copy of ``model``, which is never touched.
    """
    _check_callable("step_fn", step_fn, "step_fn(model, micro_batches, make_optimizer)")
    _check_model(model)
    if max_grad_norm is not None:
        check_number("max_grad_norm", max_grad_norm, low=0, low_open=True)
    micro_batches = as_micro_batch_list(micro_batches)
    window = concatenate_micro_batches(micro_batches)
    before = _parameter_vector(model)
    truth_gradients = full_batch_gradients(model, loss_fn, window)
    if max_grad_norm is not None:  # the large batch clips once, with clip_grad_norm_'s formula
        total_norm = torch.nn.utils.get_total_norm(list(truth_gradients.values()))
        coefficient = torch.clamp(max_grad_norm / (total_norm + 1e-6), max=1.0)
        truth_gradients = {name: g * coefficient for name, g in truth_gradients.items()}
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
    return _AuditResult(
        norm_ratio=update.norm().item() / true_norm,
        cosine=torch.nn.functional.cosine_similarity(update, true_update, dim=0).item(),
        relative_difference=(update - true_update).norm().item() / true_norm,
    )


def info_nce_cached_gradients(
    model: nn.Module, micro_batches: Iterable[Sequence[Tensor]], *, temperature: float = 0.5
) -> dict[str, Tensor]:
    """Return the gradient of the FULL-batch InfoNCE loss while holding one micro-batch's
    graph at a time (gradient caching, Gao et al. 2021, arXiv:2101.06983).

    1. embed every micro-batch without a graph; 2. compute the loss over all embeddings and
    its gradient with respect to the embeddings; 3. re-embed each micro-batch with a graph and
    backpropagate those cached embedding gradients. Exact for deterministic encoders (with
    dropout, step 3 must replay step 1's random state).
    """
    check_number("temperature", temperature, low=0, low_open=True)
    micro_batches = as_micro_batch_list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    for index, pair in enumerate(micro_batches):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(t, Tensor) for t in pair)):
            raise TypeError(f"micro_batches[{index}] must be a pair of Tensors (anchors, "
                            f"positives); got {type(pair).__name__}")
    with model_restored(model), _inputs_untouched(micro_batches, model):
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


# The ground truth's guards: inputs left as found, gradients refused when not finite. --------

def _input_leaves(batches: Iterable[object], model: nn.Module) -> list[Tensor]:
    """Leaf tensors outside ``model`` that require grad and that the batches' tensors come from
    (an input leaf itself, or the leaf a micro-batch is a view of): backward would write their
    ``.grad``."""
    stack, tensors = list(batches), []
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            tensors.append(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    leaves = {id(t): t for t in tensors if t.requires_grad and t.is_leaf}
    nodes, seen = [t.grad_fn for t in tensors if t.requires_grad and not t.is_leaf], set()
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, Tensor):
            leaves[id(variable)] = variable
        nodes.extend(next_node for next_node, _ in node.next_functions)
    own = {id(p) for p in model.parameters()}
    return [leaf for key, leaf in leaves.items() if key not in own]


@contextmanager
def _inputs_untouched(batches: Iterable[object], model: nn.Module) -> Iterator[None]:
    """Restore the ``.grad`` of the batches' leaf tensors that require grad (see above)."""
    saved = [(leaf, leaf.grad) for leaf in _input_leaves(batches, model)]
    for leaf, _ in saved:
        leaf.grad = None  # else backward would add into the caller's tensor in place
    try:
        yield
    finally:
        for leaf, grad in saved:
            leaf.grad = grad


def _first_non_finite(model: nn.Module) -> str | None:
    """Return the name of the first parameter whose ``.grad`` holds a NaN or an inf, or None
    (an FSDP2 shard is checked whole: every rank must call it)."""
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        if grad is None:
            continue
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        if not bool(torch.isfinite(grad.coalesce().values() if grad.is_sparse else grad).all()):
            return name
    return None


def _check_finite_gradients(model: nn.Module, micro_step: int) -> None:
    """Raise a ValueError naming the first parameter whose ``.grad`` holds a NaN or an inf."""
    name = _first_non_finite(model)
    if name is not None:
        raise ValueError(
            f"the gradient of parameter {name!r} is not finite (NaN or inf) after micro-batch "
            f"{micro_step}; refusing to return it (a 16-bit model overflowing, or a loss "
            "whose backward divides by zero)"
        )
