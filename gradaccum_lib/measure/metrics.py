"""Evaluation: the item-weighted mean loss, predictions in micro-batches, accuracy and
per-class F1."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from gradaccum_lib.batches import (
    Batch,
    LossFn,
    as_micro_batch_list,
    check_loss_output,
    split_into_micro_batches,
)
from gradaccum_lib.runtime import check_positive_int

__all__ = ["classification_scores", "evaluate_mean_loss", "predict_classes"]


def evaluate_mean_loss(model: nn.Module, loss_fn: LossFn, batches: Iterable[Batch]) -> float:
    """Return the item-weighted mean loss over ``batches`` (no gradients, mode unchanged)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, batch) -> (summed_loss, "
                        f"num_items); got {type(loss_fn).__name__}")
    batches = as_micro_batch_list(batches, "batches")
    total_loss = 0.0
    total_items = 0.0
    with torch.no_grad():
        for index, batch in enumerate(batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, batch), index)
            total_loss += summed_loss.double().item()
            total_items += num_items
    if total_items <= 0:
        raise ValueError("batches cover no items (none given, or every num_items was 0); there "
                         "is no mean loss")
    return total_loss / total_items


def predict_classes(model: nn.Module, batch: Mapping[str, Tensor], *,
                    micro_batch_size: int = 64) -> Tensor:
    """Return the argmax class of a HF classifier for every row of ``batch``, computed in
    eval mode without gradients, ``micro_batch_size`` rows at a time (mode restored).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not isinstance(batch, Mapping) or not all(
            isinstance(batch.get(key), Tensor) for key in ("input_ids", "attention_mask")):
        raise TypeError("batch must be a dict holding Tensors 'input_ids' and 'attention_mask' "
                        f"(from encode_records); got {type(batch).__name__}"
                        + (f" with keys {list(batch)}" if isinstance(batch, Mapping) else ""))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            parts = split_into_micro_batches(
                {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
                micro_batch_size=micro_batch_size)
            return torch.cat([model(**part).logits.argmax(dim=-1) for part in parts])
    finally:
        model.train(was_training)


def classification_scores(predictions: Tensor, labels: Tensor,
                          num_classes: int) -> dict[str, float | list[float]]:
    """Return ``accuracy``, ``f1`` per class (0 for a class never predicted nor present)
    and ``macro_f1``.
    """
    check_positive_int("num_classes", num_classes)
    for label, tensor in (("predictions", predictions), ("labels", labels)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{label} must be a Tensor of class indices; got "
                            f"{type(tensor).__name__}")
    if predictions.shape != labels.shape or predictions.dim() != 1:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels "
                         f"{tuple(labels.shape)} must be equal 1-dim shapes")
    if len(labels) == 0:
        raise ValueError("labels is empty; it needs at least one item")
    for label, tensor in (("predictions", predictions), ("labels", labels)):
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            raise TypeError(f"{label} must be an integer tensor of class indices; got dtype "
                            f"{tensor.dtype}")
        outside = (tensor < 0) | (tensor >= num_classes)
        if bool(outside.any()):
            raise ValueError(f"{label} must be class indices in [0, {num_classes}) "
                             f"(num_classes={num_classes}); got {tensor[outside][0].item()}")
    f1 = []
    for c in range(num_classes):
        true_positive = int(((predictions == c) & (labels == c)).sum())
        predicted = int((predictions == c).sum())
        actual = int((labels == c).sum())
        denominator = predicted + actual
        f1.append(2 * true_positive / denominator if denominator else 0.0)
    return {
        "accuracy": float((predictions == labels).double().mean()),
        "f1": f1,
        "macro_f1": sum(f1) / num_classes,
    }
