"""plots.plot_errors and the exact contrastive fix (gradient caching)."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from gradaccum_course.plots import plot_errors
from gradaccum_lib import full_batch_gradients, max_gradient_difference, split_into_micro_batches
from gradaccum_lib.equivalence import info_nce_cached_gradients
from gradaccum_lib.losses import info_nce_loss
from gradaccum_lib.runtime import make_generator
from gradaccum_lib.workloads.models import make_mlp


def test_plot_errors_returns_a_log_figure_and_clips_zeros_to_the_floor():
    figure = plot_errors([1, 2, 4], {"exact": [0.0, 1e-16, 2e-16], "naive": [0.0, 0.3, 0.4]},
                         xlabel="k", bound=1e-12, reference={"guide": [1.0, 0.5, 0.25]})
    assert isinstance(figure, Figure)
    axes = figure.axes[0]
    assert axes.get_yscale() == "log" and axes.get_xlabel() == "k"
    exact_line = axes.get_lines()[0]
    assert list(exact_line.get_ydata()) == [1e-18, 1e-16, 2e-16]
    labels = [line.get_label() for line in axes.get_lines()]
    assert labels == ["exact", "naive", "guide", "bound 1e-12",
                      "exact 0 (or below 1e-18), drawn at 1e-18"]
    assert list(axes.get_lines()[-1].get_xdata()) == [1, 1]  # both zeros marked as such
    nonzero = plot_errors([1, 2], {"a": [1e-3, 1e-2]}, xlabel="k").axes[0]
    assert [line.get_label() for line in nonzero.get_lines()] == ["a"]  # nothing floored


def test_plot_errors_draws_linear_growth_on_a_linear_axis_with_zeros_as_zeros():
    axes = plot_errors([1, 2, 4], {"bytes": [0, 100, 400]}, xlabel="k", log_y=False).axes[0]
    assert axes.get_yscale() == "linear"
    assert list(axes.get_lines()[0].get_ydata()) == [0, 100, 400]
    assert len(axes.get_lines()) == 1


def test_plot_errors_rejects_mismatched_or_missing_series():
    with pytest.raises(ValueError, match="series 'a' has 2 values for 3 x values"):
        plot_errors([1, 2, 3], {"a": [1.0, 2.0]}, xlabel="k")
    with pytest.raises(ValueError, match="at least one error series"):
        plot_errors([1], {}, xlabel="k")


@pytest.mark.parametrize("accumulation_steps", [1, 3, 4])
def test_gradient_caching_gives_the_full_batch_info_nce_gradient(accumulation_steps):
    encoder = make_mlp(5, 7, 4, seed=3)
    anchors = torch.randn(12, 5, dtype=torch.float64, generator=make_generator(0))
    pairs = (anchors, anchors + 0.2)
    for parameter in encoder.parameters():
        parameter.grad = torch.full_like(parameter, 3.0)
    full = full_batch_gradients(encoder, info_nce_loss, pairs)
    parts = split_into_micro_batches(pairs, accumulation_steps=accumulation_steps)
    cached = info_nce_cached_gradients(encoder, parts)
    assert max_gradient_difference(cached, full, relative=True) <= 1e-12
    assert all(bool((p.grad == 3.0).all()) for p in encoder.parameters())  # left as found
    with pytest.raises(ValueError, match="micro_batches is empty"):
        info_nce_cached_gradients(encoder, [])
