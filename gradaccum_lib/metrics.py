"""Evaluation: the item-weighted mean loss, predictions in micro-batches, accuracy and
per-class F1."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from .batches import Batch, LossFn, check_loss_output, split_into_micro_batches

__all__ = ["classification_scores", "evaluate_mean_loss", "predict_classes"]


def evaluate_mean_loss(model: nn.Module, loss_fn: LossFn, batches: Iterable[Batch]) -> float:
    """Return the item-weighted mean loss over ``batches`` (no gradients, mode unchanged)."""
    total_loss = 0.0
    total_items = 0.0
    with torch.no_grad():
        for index, batch in enumerate(batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, batch), index)
            total_loss += summed_loss.double().item()
            total_items += num_items
    if total_items <= 0:
        raise ValueError("batches cover no items; there is no mean loss")
    return total_loss / total_items


def predict_classes(model: nn.Module, batch: Mapping[str, Tensor], *,
                    micro_batch_size: int = 64) -> Tensor:
    """Return the argmax class of a HF classifier for every row of ``batch``, computed in
    eval mode without gradients, ``micro_batch_size`` rows at a time (mode restored).
    """
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
    if predictions.shape != labels.shape or predictions.dim() != 1:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels "
                         f"{tuple(labels.shape)} must be equal 1-dim shapes")
    if len(labels) == 0:
        raise ValueError("labels is empty")
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
