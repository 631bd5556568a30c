"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch

from gradaccum_lib.workloads.data import encode_records, load_emr_split, load_tokenizer
from gradaccum_lib.workloads.models import make_tiny_bert


@pytest.fixture(scope="module")
def emr_window():
    """A float64 tiny BERT classifier and 24 encoded EMR notes (24 tokens each): what the
    framework audits step through."""
    tokenizer = load_tokenizer()
    batch = encode_records(load_emr_split("train")[:24], tokenizer, max_length=24)
    model = make_tiny_bert(len(tokenizer), 10, hidden_size=16, max_length=24,
                           dtype=torch.float64, seed=3)
    return model, batch
