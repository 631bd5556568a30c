"""The noise-scale estimators, the tracker against brute force, and the learning-rate rules."""

from __future__ import annotations

import math

import pytest
import torch

from gradaccum_course.widgets import _describe_learning_rates, learning_rate_explorer
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.gradients import flatten_gradients
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.noise import (
    NoiseScaleTracker,
    _noise_scale_estimates,
    brute_force_noise_scale,
    scaled_learning_rate,
)
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


def test_estimators_are_unbiased_for_known_moments():
    # E|G_b|^2 = |G|^2 + tr(S)/b: feed the expectations, get the moments back exactly
    squared_gradient, trace = 4.0, 60.0
    small = squared_gradient + trace / 8
    big = squared_gradient + trace / 32
    assert _noise_scale_estimates(small, big, 8, 32) == pytest.approx((4.0, 60.0))
    with pytest.raises(ValueError, match="need 0 < small_batch < big_batch"):
        _noise_scale_estimates(1.0, 1.0, 8, 8)


def test_tracker_matches_brute_force_on_a_model_where_it_is_known():
    inputs, labels = make_toy_classification(128, 6, 3, seed=0)
    model = make_mlp(6, 12, 3, seed=1)
    per_sample = torch.stack([flatten_gradients(full_batch_gradients(
        model, sample_classification_loss, (inputs[i:i + 1], labels[i:i + 1])))
        for i in range(128)])
    truth = brute_force_noise_scale(per_sample)
    tracker = NoiseScaleTracker(model.parameters())
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        rows = torch.randint(0, 128, (16,), generator=generator)
        window = split_into_micro_batches((inputs[rows], labels[rows]), accumulation_steps=4)
        accumulate_window(model, frozen, window, tracker.counting(sample_classification_loss))
        tracker.end_window()
    assert len(tracker.records) == 300
    mean = {key: sum(r[key] for r in tracker.records) / len(tracker.records)
            for key in ("squared_gradient", "trace")}
    assert mean["trace"] / mean["squared_gradient"] == pytest.approx(truth, rel=0.15)
    assert math.isfinite(tracker.records[-1]["b_simple_smoothed"])


def test_tracker_skips_single_micro_batch_windows_and_needs_its_counting_loss():
    inputs, labels = make_toy_classification(8, 4, 2)
    model = make_mlp(4, 5, 2)
    tracker = NoiseScaleTracker(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accumulate_window(model, optimizer, [(inputs, labels)],
                      tracker.counting(sample_classification_loss))
    tracker.end_window()
    assert tracker.records == []
    with pytest.raises(ValueError, match=r"pass tracker.counting\(loss_fn\)"):
        tracker.end_window()
    with pytest.raises(ValueError, match=r"without tracker.counting\(loss_fn\)"):
        accumulate_window(model, optimizer, [(inputs, labels)], sample_classification_loss)
    tracker.close()  # the hook is gone: the plain loss trains again
    accumulate_window(model, optimizer, [(inputs, labels)], sample_classification_loss)


def test_brute_force_noise_scale_by_hand_and_errors():
    gradients = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # mean (2, 0); deviations +-1
    assert brute_force_noise_scale(gradients) == pytest.approx(1.0 / 4.0)
    with pytest.raises(ValueError, match="at least 2 rows"):
        brute_force_noise_scale(torch.ones(1, 3))


def test_scaled_learning_rate_rules_and_widget():
    assert scaled_learning_rate(1e-3, 32, 128, "none") == 1e-3
    assert scaled_learning_rate(1e-3, 32, 128, "linear") == pytest.approx(4e-3)
    assert scaled_learning_rate(1e-3, 32, 128, "sqrt") == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="rule must be one of"):
        scaled_learning_rate(1e-3, 32, 128, "cubic")
    with pytest.raises(ValueError, match="base_lr must be > 0"):
        scaled_learning_rate(0.0, 32, 128, "none")
    measured = {(64, "linear"): 1.5}
    explorer = learning_rate_explorer(1e-3, 32, [32, 64], measured)
    slider, summary = explorer.children
    assert summary.value == _describe_learning_rates(1e-3, 32, 32, measured)
    slider.value = 64
    assert "linear: lr 2.00e-03 -> 1.500" in summary.value


def test_tracker_rejects_a_smoothing_outside_0_1_and_no_parameters():
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\); got 1.0"):
        NoiseScaleTracker(make_mlp(4, 5, 2).parameters(), smoothing=1.0)
    with pytest.raises(TypeError, match=r"parameters must be the model's parameters"):
        NoiseScaleTracker([])
