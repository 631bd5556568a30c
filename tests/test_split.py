"""split_into_micro_batches: sizes, kinds, views, and every bad input's message."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.batches import batch_size


def test_accumulation_steps_gives_exactly_k_micro_batches_differing_by_at_most_one():
    batch = torch.arange(37)
    parts = split_into_micro_batches(batch, accumulation_steps=5)
    assert [len(p) for p in parts] == [8, 8, 7, 7, 7]
    assert torch.equal(torch.cat(parts), batch)


def test_micro_batch_size_gives_chunks_with_a_smaller_last_one():
    parts = split_into_micro_batches(torch.arange(10), micro_batch_size=4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_micro_batch_size_larger_than_batch_gives_one_micro_batch():
    parts = split_into_micro_batches(torch.arange(3), micro_batch_size=8)
    assert len(parts) == 1 and parts[0].tolist() == [0, 1, 2]


def test_kinds_are_preserved_dict_tuple_list_namedtuple():
    x, y = torch.randn(6, 2), torch.arange(6)
    as_dict = split_into_micro_batches({"x": x, "y": y}, accumulation_steps=3)
    assert all(isinstance(p, dict) and list(p) == ["x", "y"] for p in as_dict)
    as_tuple = split_into_micro_batches((x, y), accumulation_steps=2)
    assert all(isinstance(p, tuple) and len(p) == 2 for p in as_tuple)
    as_list = split_into_micro_batches([x, y], micro_batch_size=4)
    assert all(isinstance(p, list) for p in as_list)
    Pair = namedtuple("Pair", "inputs labels")
    as_named = split_into_micro_batches(Pair(x, y), accumulation_steps=2)
    assert all(isinstance(p, Pair) for p in as_named)
    assert as_named[1].labels.tolist() == [3, 4, 5]


def test_micro_batches_are_views_not_copies():
    batch = torch.zeros(4, 3)
    parts = split_into_micro_batches(batch, accumulation_steps=2)
    assert parts[0].data_ptr() == batch.data_ptr()


def test_batch_size_of_nested_kinds():
    assert batch_size({"a": torch.zeros(5, 2), "b": torch.zeros(5)}) == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"accumulation_steps": 0}, ValueError, r"accumulation_steps must be a positive int no "
         r"larger than the batch \(8\); got 0"),
        ({"accumulation_steps": -2}, ValueError, r"accumulation_steps .* got -2"),
        ({"accumulation_steps": 9}, ValueError, r"no larger than the batch \(8\); got 9"),
        ({"accumulation_steps": 2.0}, TypeError, r"accumulation_steps .* got 2.0 of type float"),
        ({"accumulation_steps": True}, TypeError, r"accumulation_steps .* type bool"),
        ({"micro_batch_size": 0}, ValueError, r"micro_batch_size must be a positive int; got 0"),
        ({"micro_batch_size": -1}, ValueError, r"micro_batch_size must be a positive int; got -1"),
        ({"micro_batch_size": 1.5}, TypeError, r"micro_batch_size must be a positive int; got 1.5"),
        ({}, ValueError, r"exactly one of accumulation_steps or micro_batch_size"),
        ({"accumulation_steps": 2, "micro_batch_size": 4}, ValueError,
         r"exactly one of .* got accumulation_steps=2, micro_batch_size=4"),
    ],
)
def test_bad_step_arguments_name_the_argument_and_range(kwargs, error, message):
    with pytest.raises(error, match=message):
        split_into_micro_batches(torch.zeros(8), **kwargs)


@pytest.mark.parametrize(
    ("batch", "error", "message"),
    [
        (torch.zeros(0, 3), ValueError, r"batch is empty"),
        ({}, ValueError, r"at least one Tensor"),
        ((), ValueError, r"at least one Tensor"),
        ((torch.zeros(4), torch.zeros(5)), ValueError,
         r"disagree on dim 0 \(batch\[0\]: 4, batch\[1\]: 5\)"),
        ({"x": torch.zeros(4), "y": torch.zeros(3)}, ValueError, r"batch\['y'\]: 3"),
        (torch.tensor(3.0), ValueError, r"0-dim tensor"),
        ([torch.zeros(2), [1, 2]], TypeError, r"batch\[1\] must be a Tensor; got list"),
        ("not a batch", TypeError, r"batch must be a Tensor, a tuple/list .* got str"),
    ],
)
def test_bad_batches_are_rejected_with_their_reason(batch, error, message):
    with pytest.raises(error, match=message):
        split_into_micro_batches(batch, accumulation_steps=1)


def test_check_positive_int_accepts_ints_and_names_bad_values():
    from gradaccum_lib.runtime import check_positive_int

    assert check_positive_int("k", 3) == 3
    for bad in (0, -2, 2.0, True, "3", None):
        with pytest.raises(ValueError, match=rf"k must be a positive int; got {bad!r}"):
            check_positive_int("k", bad)
