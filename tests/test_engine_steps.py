"""The engine's private steps, one by one (accumulation.py, below AccumulationTrainer): the
window totals and their checks, its passes over .grad (norm, rescale, first non-finite), and
the state check of load_state_dict. The engine's behaviour as a whole is in test_trainer.py."""

from __future__ import annotations

import math

import pytest
import torch

from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.accumulation import _check_window_totals as check_window_totals
from gradaccum_lib.accumulation import _first_non_finite_gradient as first_non_finite_gradient
from gradaccum_lib.accumulation import _gradient_norm as gradient_norm
from gradaccum_lib.accumulation import _scale_gradients_ as scale_gradients_
from gradaccum_lib.accumulation import _window_totals as window_totals
from gradaccum_lib.batches import NonFiniteLossError
from gradaccum_lib.losses import sample_classification_loss


def test_totals_count_bad_values_instead_of_summing_them():
    losses, counts = [1.5, float("nan"), 2.0], [3, 4, -1.0]
    assert window_totals(losses, counts) == [7.0, 3.5, 1.0, 1.0]  # numbers: no tensor
    tensors = [torch.tensor(v) for v in losses], [torch.tensor(c) for c in counts]
    on_device = window_totals(*tensors)  # tensors: computed where they are, no host read
    assert on_device.dtype == torch.float64 and on_device.tolist() == [7.0, 3.5, 1.0, 1.0]
    assert window_totals([torch.tensor(1.0)], [2]).tolist() == [2.0, 1.0, 0.0, 0.0]  # mixed


def test_checked_totals_names_the_bad_micro_batch_or_another_rank():
    assert check_window_totals([8.0, 4.0, 0.0, 0.0], [2.0, 2.0], [4, 4], 0) == (8.0, 4.0)
    with pytest.raises(NonFiniteLossError, match="micro-batch 1 produced a non-finite"):
        check_window_totals([4.0, 2.0, 1.0, 0.0], [2.0, math.inf], [4, 4], 0)
    with pytest.raises(NonFiniteLossError, match="on another rank"):
        check_window_totals([8.0, 4.0, 1.0, 0.0], [2.0, 2.0], [4, 4], 0)
    with pytest.raises(ValueError, match="got -1.0 at micro-batch 1"):
        check_window_totals([4.0, 4.0, 0.0, 1.0], [2.0, 2.0], [4, -1.0], 0)
    with pytest.raises(ValueError, match="another rank returned an invalid num_items"):
        check_window_totals([8.0, 4.0, 0.0, 1.0], [2.0, 2.0], [4, 4], 0)
    with pytest.raises(ValueError, match="window 3 covers no items"):
        check_window_totals([0.0, 0.0, 0.0, 0.0], [0.0], [0], 3)


def test_gradient_norm_and_scale_match_torch():
    grads = [torch.randn(5, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    assert gradient_norm(grads) == pytest.approx(
        torch.nn.utils.get_total_norm(grads).item(), rel=1e-6)
    mixed = [grads[0].double(), grads[1]]  # two dtypes: each norm read as a number
    assert gradient_norm(mixed) == pytest.approx(
        torch.cat([g.double().flatten() for g in mixed]).norm().item(), rel=1e-6)
    assert gradient_norm([]) == 0.0
    before = [g.clone() for g in grads]
    scale_gradients_(grads, 0.5)
    assert all(torch.equal(g, b * 0.5) for g, b in zip(grads, before, strict=True))
    scale_gradients_([], 2.0)  # nothing to scale


def test_first_non_finite_gradient_names_the_parameter_or_none():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert first_non_finite_gradient(model) is None  # no gradients at all
    model(torch.ones(1, 2)).sum().backward()
    assert first_non_finite_gradient(model) is None
    model[1].weight.grad[0, 1] = math.inf
    model[1].bias.grad[0] = math.nan
    assert first_non_finite_gradient(model) == "1.weight"


def _trainer() -> AccumulationTrainer:
    model = torch.nn.Linear(3, 2)
    return AccumulationTrainer(model, sample_classification_loss,
                               torch.optim.SGD(model.parameters(), lr=0.1),
                               accumulation_steps=2, progress=False)


@pytest.mark.parametrize(("history", "message"), [
    ({"records": "garbage"}, "history must be a list of records; got dict"),
    ("garbage", "history must be a list of records; got str"),
    ([(0, 0, 2, 8.0, 1.0, 0.5)], r"history\[0\] must be 7 fields"),
    ([(0, "0", 2, 8.0, 1.0, 0.5, 0.1)], r"history\[0\] must be 7 fields.*got \(0, '0'"),
    ([(0, 0, 2, 8.0, "1.0", 0.5, 0.1)], r"history\[0\] must be 7 fields"),
])
def test_a_history_of_the_wrong_types_is_refused_before_anything_is_restored(history, message):
    """Issue 30: {"records": "garbage"} used to become WindowRecord(epoch='r', ...)."""
    trainer = _trainer()
    state = trainer.state_dict() | {"windows_done": 3, "history": history}
    with pytest.raises(ValueError, match=message):
        trainer.load_state_dict(state)
    assert trainer.windows_done == 0 and len(trainer.history) == 0  # nothing restored


@pytest.mark.parametrize("normaliser", ["8", -1.0, float("nan"), True])
def test_a_bad_normaliser_is_refused(normaliser):
    trainer = _trainer()
    with pytest.raises(ValueError, match="normaliser must be None or a finite number > 0"):
        trainer.load_state_dict(trainer.state_dict() | {"normaliser": normaliser})
