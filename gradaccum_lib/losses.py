"""Loss functions that follow the series' contract: ``(summed_loss, num_items)``.

Each returns the SUM of per-item losses and the number of items it covers; the accumulation
code divides by the window's total. :func:`info_nce_loss` is the counter-example: with in-batch
negatives, one item's loss depends on the other items, so it does not decompose over
micro-batches at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "cross_entropy_sum",
    "bert_classification_loss",
    "bert_masked_lm_loss",
    "info_nce_from_embeddings",
    "info_nce_loss",
    "sample_classification_loss",
    "token_classification_loss",
]


def cross_entropy_sum(
    logits: Tensor, targets: Tensor, *, ignore_index: int = -100, weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Return (sum of per-item cross-entropies, number of non-ignored items).

    With class ``weight``, the "items" are weighted: the count is the sum of the targets'
    weights, which is exactly what ``F.cross_entropy(..., weight=w, reduction="mean")``
    divides by.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    summed = nn.functional.cross_entropy(
        flat_logits, flat_targets, weight=weight, ignore_index=ignore_index, reduction="sum"
    )
    kept = flat_targets != ignore_index
    if weight is None:
        count = kept.sum()
    else:
        count = weight.to(flat_logits.dtype)[flat_targets[kept]].sum()
    return summed, count


def sample_classification_loss(model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Loss function for ``(inputs, labels)`` batches: summed cross-entropy, sample count."""
    inputs, labels = batch
    return cross_entropy_sum(model(inputs), labels)


def token_classification_loss(
    model: nn.Module, batch: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """Loss function for token batches ``{"input_ids", "labels"}``: summed over real tokens.

    Padding tokens carry the label -100 and count for nothing, so ``num_items`` is the number
    of real tokens in the micro-batch.
    """
    return cross_entropy_sum(model(batch["input_ids"]), batch["labels"])


def info_nce_from_embeddings(
    anchor_embeddings: Tensor, positive_embeddings: Tensor, *, temperature: float = 0.5
) -> tuple[Tensor, Tensor]:
    """InfoNCE of paired embeddings, summed over anchors: row i's positive is column i, every
    other column is a negative. Returns (summed loss, number of anchors).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    anchors = nn.functional.normalize(anchor_embeddings, dim=-1)
    positives = nn.functional.normalize(positive_embeddings, dim=-1)
    logits = anchors @ positives.T / temperature
    targets = torch.arange(logits.shape[0], device=logits.device)
    return cross_entropy_sum(logits, targets)


def info_nce_loss(
    model: nn.Module, batch: Sequence[Tensor], *, temperature: float = 0.5
) -> tuple[Tensor, Tensor]:
    """InfoNCE with in-batch negatives for ``(anchors, positives)``: summed over anchors.

    Anchor i's positive is positives[i]; every other positive in the SAME batch is a negative,
    so the loss of a sample changes when the batch around it changes.
    """
    anchors, positives = batch
    return info_nce_from_embeddings(model(anchors), model(positives), temperature=temperature)


def bert_classification_loss(
    model: nn.Module, batch: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """Loss function for a HF sequence classifier on ``{"input_ids", "attention_mask",
    "labels"}``: summed cross-entropy over the notes, and the number of notes.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return cross_entropy_sum(logits, batch["labels"])


def bert_masked_lm_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Loss function for a HF masked-LM on ``{"input_ids", "attention_mask", "labels"}``
    (labels -100 except at masked positions): summed over masked tokens, and their number.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return cross_entropy_sum(logits, batch["labels"])
