"""The engine's window totals (gradaccum_lib.totals) and its two passes over .grad
(gradients.gradient_norm, scale_gradients_)."""

from __future__ import annotations

import math

import pytest
import torch

from gradaccum_lib.batches import NonFiniteLossError
from gradaccum_lib.gradients import gradient_norm, scale_gradients_
from gradaccum_lib.totals import checked_totals, device_totals, local_totals


def test_totals_count_bad_values_instead_of_summing_them():
    losses, counts = [1.5, float("nan"), 2.0], [3, 4, -1.0]
    assert local_totals(losses, counts) == [7.0, 3.5, 1.0, 1.0]
    tensors = [torch.tensor(v) for v in losses], [torch.tensor(c) for c in counts]
    assert local_totals(*tensors) == [7.0, 3.5, 1.0, 1.0]  # the same from tensors
    assert device_totals(*tensors).tolist() == [7.0, 3.5, 1.0, 1.0]
    assert device_totals(losses, counts).dtype == torch.float64  # numbers mixed in, too
    assert device_totals([torch.tensor(1.0)], [2]).tolist() == [2.0, 1.0, 0.0, 0.0]


def test_checked_totals_names_the_bad_micro_batch_or_another_rank():
    assert checked_totals([8.0, 4.0, 0.0, 0.0], [2.0, 2.0], [4, 4], 0) == (8.0, 4.0)
    with pytest.raises(NonFiniteLossError, match="micro-batch 1 produced a non-finite"):
        checked_totals([4.0, 2.0, 1.0, 0.0], [2.0, math.inf], [4, 4], 0)
    with pytest.raises(NonFiniteLossError, match="on another rank"):
        checked_totals([8.0, 4.0, 1.0, 0.0], [2.0, 2.0], [4, 4], 0)
    with pytest.raises(ValueError, match="got -1.0 at micro-batch 1"):
        checked_totals([4.0, 4.0, 0.0, 1.0], [2.0, 2.0], [4, -1.0], 0)
    with pytest.raises(ValueError, match="another rank returned an invalid num_items"):
        checked_totals([8.0, 4.0, 0.0, 1.0], [2.0, 2.0], [4, 4], 0)
    with pytest.raises(ValueError, match="window 3 covers no items"):
        checked_totals([0.0, 0.0, 0.0, 0.0], [0.0], [0], 3)


def test_gradient_norm_and_scale_match_torch():
    grads = [torch.randn(5, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    assert gradient_norm(grads).item() == pytest.approx(
        torch.nn.utils.get_total_norm(grads).item(), rel=1e-6)
    mixed = [grads[0].double(), grads[1]]  # two dtype groups: get_total_norm's path
    assert gradient_norm(mixed).item() == pytest.approx(
        torch.cat([g.double().flatten() for g in mixed]).norm().item(), rel=1e-6)
    assert gradient_norm([]).item() == 0.0
    before = [g.clone() for g in grads]
    scale_gradients_(grads, 0.5)
    assert all(torch.equal(g, b * 0.5) for g, b in zip(grads, before, strict=True))
    scale_gradients_([], 2.0)  # nothing to scale
