"""Data for the series: small synthetic sets for the math notebooks.

Everything is generated from an explicit seed through a private ``torch.Generator``, so the
global random state is never touched.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["IGNORE_INDEX", "PAD_ID", "make_toy_classification", "make_toy_token_batch"]

PAD_ID = 0  # input id of padding tokens
IGNORE_INDEX = -100  # label of padding tokens: they count as no item


def _positive_int(label: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{label} must be a positive int; got {value!r}")
    return value


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
    _positive_int("num_samples", num_samples)
    _positive_int("input_dim", input_dim)
    _positive_int("num_classes", num_classes)
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
    _positive_int("num_sequences", num_sequences)
    _positive_int("max_length", max_length)
    _positive_int("num_tags", num_tags)
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
