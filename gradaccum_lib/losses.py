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

from .runtime import check_number, is_int

__all__ = [
    "cross_entropy_sum",
    "bert_classification_loss",
    "bert_masked_lm_loss",
    "info_nce_from_embeddings",
    "info_nce_loss",
    "sample_classification_loss",
    "token_classification_loss",
]


def _check_tensor(label: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{label} must be a Tensor; got {type(value).__name__}")
    return value


def _check_targets(logits: Tensor, targets: Tensor, ignore_index: int) -> None:
    """Class-index targets in [0, C) or ``ignore_index``; checked where it costs no host sync
    (on CUDA the check would stall every micro-step; there torch's own assert reports it)."""
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor of class indices; got dtype "
                        f"{targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have logits' shape without its last (class) dim, "
                         f"{tuple(logits.shape[:-1])}; got {tuple(targets.shape)}")
    if targets.device.type == "cuda" or targets.numel() == 0:
        return
    classes = logits.shape[-1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= classes))
    if bool(bad.any()):
        raise ValueError(f"targets must be class indices in [0, {classes}) or ignore_index "
                         f"({ignore_index}); got {targets[bad][0].item()}")


def cross_entropy_sum(
    logits: Tensor, targets: Tensor, *, ignore_index: int = -100, weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Return (sum of per-item cross-entropies, number of non-ignored items).

    With class ``weight``, the "items" are weighted: the count is the sum of the targets'
    weights, which is exactly what ``F.cross_entropy(..., weight=w, reduction="mean")``
    divides by.
    """
    _check_tensor("logits", logits)
    _check_tensor("targets", targets)
    if logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor of shape (..., classes); got "
                         f"dtype {logits.dtype} with shape {tuple(logits.shape)}")
    if not is_int(ignore_index):
        raise TypeError(f"ignore_index must be an int; got {ignore_index!r}")
    _check_targets(logits, targets, ignore_index)
    if weight is not None and (not isinstance(weight, Tensor)
                               or tuple(weight.shape) != (logits.shape[-1],)):
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be None or a 1-dim Tensor of one weight per class, shape "
                         f"({logits.shape[-1]},); got {shape}")
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


def _pair(batch: object, function: str, names: str) -> tuple[Tensor, Tensor]:
    """The two tensors of a pair batch, or a TypeError saying what ``function`` expects."""
    if (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, Tensor) for t in batch)):
        return batch[0], batch[1]
    kind = type(batch).__name__ + (f" of {len(batch)} items"
                                   if isinstance(batch, (tuple, list)) else "")
    raise TypeError(f"{function}'s batch must be a pair of Tensors ({names}); got {kind}")


def _fields(batch: object, function: str, keys: tuple[str, ...]) -> None:
    """Refuse a batch that is not a dict holding Tensors under ``keys``."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{function}'s batch must be a dict with keys {list(keys)}; got "
                        f"{type(batch).__name__}")
    missing = [key for key in keys if not isinstance(batch.get(key), Tensor)]
    if missing:
        raise ValueError(f"{function}'s batch must hold Tensors under {list(keys)}; missing or "
                         f"not a Tensor: {missing} (keys given: {list(batch)})")


def sample_classification_loss(model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Loss function for ``(inputs, labels)`` batches: summed cross-entropy, sample count."""
    inputs, labels = _pair(batch, "sample_classification_loss", "inputs, labels")
    return cross_entropy_sum(model(inputs), labels)


def token_classification_loss(
    model: nn.Module, batch: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """Loss function for token batches ``{"input_ids", "labels"}``: summed over real tokens.

    Padding tokens carry the label -100 and count for nothing, so ``num_items`` is the number
    of real tokens in the micro-batch.
    """
    _fields(batch, "token_classification_loss", ("input_ids", "labels"))
    return cross_entropy_sum(model(batch["input_ids"]), batch["labels"])


def info_nce_from_embeddings(
    anchor_embeddings: Tensor, positive_embeddings: Tensor, *, temperature: float = 0.5
) -> tuple[Tensor, Tensor]:
    """InfoNCE of paired embeddings, summed over anchors: row i's positive is column i, every
    other column is a negative. Returns (summed loss, number of anchors).
    """
    check_number("temperature", temperature, low=0, low_open=True)
    _check_tensor("anchor_embeddings", anchor_embeddings)
    _check_tensor("positive_embeddings", positive_embeddings)
    if anchor_embeddings.dim() != 2 or anchor_embeddings.shape != positive_embeddings.shape:
        raise ValueError("anchor_embeddings and positive_embeddings must be 2-dim tensors of the "
                         f"same shape (items, dim); got {tuple(anchor_embeddings.shape)} and "
                         f"{tuple(positive_embeddings.shape)}")
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
    check_number("temperature", temperature, low=0, low_open=True)
    anchors, positives = _pair(batch, "info_nce_loss", "anchors, positives")
    return info_nce_from_embeddings(model(anchors), model(positives), temperature=temperature)


def bert_classification_loss(
    model: nn.Module, batch: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """Loss function for a HF sequence classifier on ``{"input_ids", "attention_mask",
    "labels"}``: summed cross-entropy over the notes, and the number of notes.
    """
    _fields(batch, "bert_classification_loss", ("input_ids", "attention_mask", "labels"))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return cross_entropy_sum(logits, batch["labels"])


def bert_masked_lm_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Loss function for a HF masked-LM on ``{"input_ids", "attention_mask", "labels"}``
    (labels -100 except at masked positions): summed over masked tokens, and their number.
    """
    _fields(batch, "bert_masked_lm_loss", ("input_ids", "attention_mask", "labels"))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return cross_entropy_sum(logits, batch["labels"])
