"""memory.tensor_peak_bytes: exact peak bytes of the tensors a step allocates, on any device."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable

import pytest
import torch

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.memory import activation_bytes, static_bytes, tensor_peak_bytes
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


def test_peak_of_known_allocations_is_exact():
    def step() -> tuple[torch.Tensor, torch.Tensor]:
        first = torch.ones(1000)  # 4,000 B
        second = torch.ones(2000, dtype=torch.float64)  # 16,000 B: 20,000 live
        del first  # 16,000 live
        third = torch.ones(500)  # 18,000 live
        return second, third

    assert tensor_peak_bytes(step) == 20_000


def test_views_and_in_place_ops_on_existing_tensors_allocate_nothing():
    existing = torch.ones(100)
    assert tensor_peak_bytes(lambda: (existing.view(10, 10), existing.add_(1), existing[3:],
                                      existing.detach())) == 0
    assert tensor_peak_bytes(lambda: None) == 0


def test_a_storage_freed_and_reallocated_is_counted_once_at_a_time():
    def step() -> None:
        for _ in range(5):
            scratch = torch.zeros(256)  # 1 KiB, freed before the next one
            del scratch

    assert tensor_peak_bytes(step) == 1024


def _window_step(k: int, optimizer: str) -> tuple[Callable[[], object], torch.nn.Module, list]:
    """One window of accumulate_window as a call, after a first one (gradients and optimizer
    state exist from then on), its model and its window."""
    model = make_mlp(32, 64, 4, dtype=torch.float32)
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1), "adamw": torch.optim.AdamW}[optimizer]
    window = split_into_micro_batches(make_toy_classification(64, 32, 4, dtype=torch.float32),
                                      accumulation_steps=k)
    step = functools.partial(accumulate_window, model, make(model.parameters()), window,
                             sample_classification_loss)
    step()
    return step, model, window


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_training_step_gives_the_same_peak_every_time(optimizer):
    step, _, _ = _window_step(4, optimizer)
    peaks = [tensor_peak_bytes(step) for _ in range(3)]
    assert peaks[0] == peaks[1] == peaks[2] > 0


def test_the_sgd_peak_holds_the_new_gradients_and_falls_with_k():
    peaks = {}
    for k in (1, 2, 4, 8):
        step, model, window = _window_step(k, "sgd")
        peaks[k] = tensor_peak_bytes(step)
        gradients = static_bytes(model)["gradients"]  # set to None, then re-allocated
        micro_activations = activation_bytes(model, sample_classification_loss, window[0])
        # the step re-allocates the gradients and holds one micro-batch's activations at
        # least; at most it also holds their gradients (backward) or a second, incoming
        # gradient of a layer (accumulated into .grad, then freed)
        assert gradients + micro_activations <= peaks[k] <= 2 * (gradients + micro_activations)
    assert peaks[1] > peaks[2] > peaks[4] > peaks[8]


def test_gc_state_is_restored_and_bad_input_is_named():
    assert gc.isenabled()
    tensor_peak_bytes(lambda: torch.ones(3))
    assert gc.isenabled()
    with pytest.raises(TypeError, match="step must be a callable"):
        tensor_peak_bytes(42)
    with pytest.raises(ValueError, match="boom"):
        tensor_peak_bytes(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert gc.isenabled()
