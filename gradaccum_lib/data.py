"""Data for the series: loading the shipped EMR corpus, the tokenizer over ``data/vocab.txt``,
encoding and masking, and small synthetic sets for the math notebooks.

Everything random is generated from an explicit seed through a private ``torch.Generator``,
so the global random state is never touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .emr_corpus import DATA_DIR, LABELS, SPLITS
from .runtime import check_positive_int

if TYPE_CHECKING:  # transformers is imported only where a tokenizer is built
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "encode_records",
    "IGNORE_INDEX",
    "LABELS",
    "load_emr_split",
    "load_tokenizer",
    "make_toy_classification",
    "make_toy_token_batch",
    "mask_tokens",
    "PAD_ID",
]

PAD_ID = 0  # input id of padding tokens

IGNORE_INDEX = -100  # label of padding tokens: they count as no item


def make_toy_classification(
    num_samples: int,
    input_dim: int,
    num_classes: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """Return ``(inputs, labels)``: Gaussian inputs, labels from a random linear teacher plus
    noise (learnable, not separable).
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("input_dim", input_dim)
    check_positive_int("num_classes", num_classes)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, input_dim, generator=generator, dtype=torch.float64)
    teacher = torch.randn(input_dim, num_classes, generator=generator, dtype=torch.float64)
    noise = torch.randn(num_samples, num_classes, generator=generator, dtype=torch.float64)
    labels = (inputs @ teacher + noise).argmax(dim=1)
    return inputs.to(dtype), labels

def make_toy_token_batch(
    num_sequences: int,
    max_length: int,
    vocab_size: int,
    num_tags: int,
    *,
    min_length: int = 1,
    sort_by_length: bool = False,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Return ``{"input_ids", "labels", "attention_mask"}`` for padded sequences of random
    length in [min_length, max_length]; padding has id ``PAD_ID`` and label ``IGNORE_INDEX``.

    ``sort_by_length`` orders sequences longest first, as length-grouped samplers do, which
    makes consecutive micro-batches hold very different numbers of real tokens.
    """
    check_positive_int("num_sequences", num_sequences)
    check_positive_int("max_length", max_length)
    check_positive_int("num_tags", num_tags)
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (id 0 is padding); got {vocab_size!r}")
    if not isinstance(min_length, int) or not 1 <= min_length <= max_length:
        raise ValueError(f"min_length must be an int in [1, max_length={max_length}]; "
                         f"got {min_length!r}")
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (num_sequences,), generator=generator)
    if sort_by_length:
        lengths = lengths.sort(descending=True).values
    input_ids = torch.randint(1, vocab_size, (num_sequences, max_length), generator=generator)
    # the tag of a token depends on its id and its left neighbour: learnable, not trivial
    previous = torch.roll(input_ids, shifts=1, dims=1)
    labels = (input_ids * 7 + previous * 3) % num_tags
    attention_mask = torch.arange(max_length)[None, :] < lengths[:, None]
    input_ids = input_ids.masked_fill(~attention_mask, PAD_ID)
    labels = labels.masked_fill(~attention_mask, IGNORE_INDEX)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": attention_mask.long(),
    }

def load_emr_split(split: str, directory: str | Path = DATA_DIR) -> list[dict[str, object]]:
    """Return the records of one shipped split: ``train``, ``validation`` or ``test``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
    path = Path(directory) / f"emr_{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; regenerate it with `python -m gradaccum_lib.emr_corpus`"
        )
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]

def load_tokenizer(vocab_path: str | Path = DATA_DIR / "vocab.txt") -> PreTrainedTokenizerBase:
    """Return a BERT tokenizer over the shipped character vocabulary (no download).

    transformers 5 pitfall: ``BertTokenizerFast(vocab_file=...)`` silently maps every character
    to [UNK]; ``BertTokenizer(vocab=path)`` loads the file. Case is kept (CT, BNP, mmHg).
    """
    from transformers import BertTokenizer

    path = Path(vocab_path)
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary {path} is missing")
    return BertTokenizer(vocab=str(path), do_lower_case=False)

def encode_records(
    records: Sequence[Mapping[str, object]], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, Tensor]:
    """Return ``{"input_ids", "attention_mask", "labels"}`` for ``records``, each note
    truncated and padded to ``max_length`` tokens (fixed padding: micro-batches are views).
    """
    check_positive_int("max_length", max_length)
    if not records:
        raise ValueError("records is empty")
    encoded = tokenizer([str(r["text"]) for r in records], padding="max_length",
                        truncation=True, max_length=max_length, return_tensors="pt",
                        return_token_type_ids=False)
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": torch.tensor([int(r["label"]) for r in records]),
    }

def mask_tokens(
    batch: Mapping[str, Tensor],
    *,
    mask_token_id: int,
    special_token_ids: Iterable[int],
    probability: float = 0.15,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Return a masked-LM copy of ``batch``: each real, non-special token is replaced by
    ``mask_token_id`` with ``probability`` (its label is the original id); every other
    position is labelled ``IGNORE_INDEX``. At least one token per note is masked.
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1); got {probability}")
    input_ids = batch["input_ids"]
    candidates = batch["attention_mask"].bool()
    for special in special_token_ids:
        candidates &= input_ids != special
    generator = torch.Generator().manual_seed(seed)
    draws = torch.rand(input_ids.shape, generator=generator)
    chosen = candidates & (draws < probability)
    # guarantee one masked token per note that has any candidate: its lowest draw
    lowest = torch.where(candidates, draws, torch.full_like(draws, 2.0)).argmin(dim=1)
    has_candidate = candidates.any(dim=1)
    chosen[has_candidate, lowest[has_candidate]] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return {**batch, "input_ids": input_ids.masked_fill(chosen, mask_token_id), "labels": labels}
