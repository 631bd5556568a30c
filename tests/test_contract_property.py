"""Property: for ANY batch size, split and sequence lengths, accumulation is exact (float64)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradaccum_lib import (
    accumulated_gradients,
    full_batch_gradients,
    max_gradient_difference,
    split_into_micro_batches,
)
from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

MODEL = make_mlp(5, 7, 3, seed=11)
TAGGER = TokenTagger(20, 6, 4, seed=12)


@settings(max_examples=40, deadline=None)
@given(
    num_samples=st.integers(1, 40),
    split=st.data(),
    seed=st.integers(0, 2**16),
)
def test_sample_level_contract(num_samples, split, seed):
    batch = make_toy_classification(num_samples, 5, 3, seed=seed)
    if split.draw(st.booleans(), label="by_steps"):
        steps = split.draw(st.integers(1, num_samples), label="accumulation_steps")
        parts = split_into_micro_batches(batch, accumulation_steps=steps)
        assert len(parts) == steps
    else:
        size = split.draw(st.integers(1, num_samples + 3), label="micro_batch_size")
        parts = split_into_micro_batches(batch, micro_batch_size=size)
        assert all(len(p[0]) == size for p in parts[:-1]) and 1 <= len(parts[-1][0]) <= size
    assert sum(len(p[0]) for p in parts) == num_samples
    full = full_batch_gradients(MODEL, sample_classification_loss, batch)
    accumulated = accumulated_gradients(MODEL, sample_classification_loss, parts)
    assert max_gradient_difference(accumulated, full, relative=True) <= 1e-12


@settings(max_examples=40, deadline=None)
@given(
    num_sequences=st.integers(1, 16),
    max_length=st.integers(1, 12),
    sort_by_length=st.booleans(),
    split=st.data(),
    seed=st.integers(0, 2**16),
)
def test_token_level_contract_with_padding(num_sequences, max_length, sort_by_length, split, seed):
    batch = make_toy_token_batch(
        num_sequences, max_length, 20, 4, sort_by_length=sort_by_length, seed=seed
    )
    steps = split.draw(st.integers(1, num_sequences), label="accumulation_steps")
    parts = split_into_micro_batches(batch, accumulation_steps=steps)
    assert all(isinstance(p, dict) for p in parts)
    full = full_batch_gradients(TAGGER, token_classification_loss, batch)
    accumulated = accumulated_gradients(TAGGER, token_classification_loss, parts)
    assert max_gradient_difference(accumulated, full, relative=True) <= 1e-12
    # padding never counts: the window's items are exactly the real tokens
    assert int(batch["attention_mask"].sum()) == int((batch["labels"] != -100).sum())
    assert torch.equal(torch.cat([p["labels"] for p in parts]), batch["labels"])
