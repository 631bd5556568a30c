"""PyTorch Lightning's accumulate_grad_batches against the ground truth, and its step counts."""

from __future__ import annotations

import copy

import pytest
import torch

from gradaccum_course.audits.lightning import LightningCounts, lightning_step, lightning_step_counts
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.equivalence import audit_update
from gradaccum_lib.losses import bert_classification_loss

pytest.importorskip("lightning")


def SGD(parameters):  # noqa: N802 - reads like the optimizer it builds
    return torch.optim.SGD(parameters, lr=0.1)


@pytest.mark.parametrize("accumulation_steps", [1, 2, 4])
def test_full_windows_match_the_ground_truth(emr_window, accumulation_steps):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, accumulation_steps=accumulation_steps)
    for make_optimizer in (SGD, lambda p: torch.optim.AdamW(p, lr=1e-3)):
        result = audit_update(lightning_step(accumulation_steps), model,
                              bert_classification_loss, parts, make_optimizer)
        assert result.matches(1e-10)


def test_partial_last_window_is_divided_by_the_configured_k(emr_window):
    model, batch = emr_window
    equal = split_into_micro_batches({k: v[:12] for k, v in batch.items()}, micro_batch_size=6)
    result = audit_update(lightning_step(4), model, bert_classification_loss, equal, SGD)
    assert result.norm_ratio == pytest.approx(0.5, abs=1e-10)  # 2 of 4 micro-batches, each / 4
    assert result.cosine == pytest.approx(1.0, abs=1e-10)
    uneven = split_into_micro_batches(batch, micro_batch_size=16)  # 16 + 8
    result = audit_update(lightning_step(4), model, bert_classification_loss, uneven, SGD)
    assert result.norm_ratio < 0.6 and result.cosine < 0.999  # short and turned


@pytest.mark.parametrize(("micro_batch_size", "accumulation_steps", "micro_batches", "steps"),
                         [(2, 5, 12, 3), (3, 3, 8, 3), (4, 4, 6, 2), (5, 2, 5, 3), (24, 4, 1, 1)])
def test_step_counts_over_an_epoch(emr_window, micro_batch_size, accumulation_steps, micro_batches,
                                   steps):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=micro_batch_size)
    assert len(parts) == micro_batches
    counts = lightning_step_counts(copy.deepcopy(model), parts, SGD, accumulation_steps)
    assert counts == LightningCounts(micro_batches, accumulation_steps, steps, steps, steps)


def test_runs_quietly_and_writes_nothing_in_the_working_directory(emr_window, tmp_path,
                                                                   monkeypatch, capfd):
    model, batch = emr_window
    monkeypatch.chdir(tmp_path)
    parts = split_into_micro_batches(batch, accumulation_steps=3)
    lightning_step_counts(copy.deepcopy(model), parts, SGD, 2)
    assert list(tmp_path.iterdir()) == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_bad_arguments_are_refused(emr_window):
    model, batch = emr_window
    with pytest.raises(ValueError, match="accumulation_steps"):
        lightning_step(0)
    with pytest.raises(ValueError, match="micro_batches is empty"):
        lightning_step_counts(copy.deepcopy(model), [], SGD, 2)
