"""The ground-truth functions: exactness, leaving the model as found, and bad inputs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from gradaccum_lib import (
    NonFiniteLossError,
    accumulated_gradients,
    full_batch_gradients,
    max_gradient_difference,
    split_into_micro_batches,
)
from gradaccum_lib.equivalence import averaged_micro_batch_gradients, parameters_after_step
from gradaccum_lib.gradients import flatten_gradients
from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp


@pytest.fixture
def problem():
    inputs, labels = make_toy_classification(37, 6, 3, seed=1)
    return make_mlp(6, 8, 3, seed=2), (inputs, labels)


@pytest.mark.parametrize("accumulation_steps", [1, 2, 4, 5, 8, 37])
def test_accumulated_equals_full_batch_in_float64(problem, accumulation_steps):
    model, batch = problem
    full = full_batch_gradients(model, sample_classification_loss, batch)
    parts = split_into_micro_batches(batch, accumulation_steps=accumulation_steps)
    accumulated = accumulated_gradients(model, sample_classification_loss, parts)
    assert max_gradient_difference(accumulated, full, relative=True) <= 1e-12


def test_full_batch_gradient_matches_a_hand_written_mean_loss(problem):
    model, (inputs, labels) = problem
    expected = torch.autograd.grad(
        nn.functional.cross_entropy(model(inputs), labels), list(model.parameters())
    )
    full = full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    for (name, _), grad in zip(model.named_parameters(), expected, strict=True):
        torch.testing.assert_close(full[name], grad, rtol=0, atol=1e-15)


def test_token_level_uneven_windows_are_exact_but_averaged_means_are_not():
    batch = make_toy_token_batch(24, 20, 30, 4, sort_by_length=True, seed=3)
    model = TokenTagger(30, 8, 4, seed=4)
    full = full_batch_gradients(model, token_classification_loss, batch)
    parts = split_into_micro_batches(batch, accumulation_steps=4)
    exact = accumulated_gradients(model, token_classification_loss, parts)
    naive = averaged_micro_batch_gradients(model, token_classification_loss, parts)
    assert max_gradient_difference(exact, full, relative=True) <= 1e-12
    assert max_gradient_difference(naive, full, relative=True) > 0.05


def test_averaged_means_are_exact_for_equal_sizes(problem):
    model, (inputs, labels) = problem
    parts = split_into_micro_batches((inputs[:36], labels[:36]), accumulation_steps=4)
    full = full_batch_gradients(model, sample_classification_loss, (inputs[:36], labels[:36]))
    naive = averaged_micro_batch_gradients(model, sample_classification_loss, parts)
    assert max_gradient_difference(naive, full, relative=True) <= 1e-12


def test_model_is_left_as_found_grads_buffers_mode():
    model = make_mlp(6, 8, 3, normalization="batch", dropout=0.2, seed=5)
    inputs, labels = make_toy_classification(16, 6, 3, seed=6)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 7.0)
    grad_objects = [parameter.grad for parameter in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    model[1].eval()  # a mixed-mode model must come back mixed
    modes = [m.training for m in model.modules()]
    parts = split_into_micro_batches((inputs, labels), accumulation_steps=2)
    grads = accumulated_gradients(model, sample_classification_loss, parts)
    full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    averaged_micro_batch_gradients(model, sample_classification_loss, parts)
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is g for p, g in zip(model.parameters(), grad_objects, strict=True))
    assert all(bool((p.grad == 7.0).all()) for p in model.parameters())
    # no aliasing: the returned tensors are not any parameter's .grad
    assert all(grads[name] is not p.grad for name, p in model.named_parameters())


def test_batchnorm_running_stats_are_restored_even_in_train_mode():
    model = make_mlp(6, 8, 3, normalization="batch", seed=5).train()
    inputs, labels = make_toy_classification(16, 6, 3, seed=6)
    before = model[1].running_mean.clone()
    full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    assert torch.equal(model[1].running_mean, before)
    assert model[1].num_batches_tracked.item() == 0


def test_model_is_restored_when_loss_fn_raises(problem):
    model, batch = problem
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)

    def failing(model, batch):
        summed, count = sample_classification_loss(model, batch)
        summed.backward()  # a grad is written before the failure
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        accumulated_gradients(model, failing, [batch])
    assert all(bool((p.grad == 1.0).all()) for p in model.parameters())


def test_frozen_parameters_are_excluded_and_unused_ones_get_zeros():
    model = make_mlp(4, 5, 2, seed=0)
    model[0].weight.requires_grad_(False)
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    model.register_parameter("unused", unused)
    inputs, labels = make_toy_classification(6, 4, 2)
    grads = full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    assert "0.weight" not in grads
    assert torch.equal(grads["unused"], torch.zeros(3, dtype=torch.float64))


def test_non_finite_loss_names_its_micro_step(problem):
    model, batch = problem
    parts = split_into_micro_batches(batch, accumulation_steps=3)

    def poisoned(model, micro_batch):
        summed, count = sample_classification_loss(model, micro_batch)
        if micro_batch[0].shape[0] == parts[2][0].shape[0] and micro_batch[0] is parts[2][0]:
            summed = summed * float("nan")
        return summed, count

    message = r"micro-batch 2 produced a non-finite loss"
    with pytest.raises(NonFiniteLossError, match=message) as info:
        accumulated_gradients(model, poisoned, parts)
    assert info.value.micro_step == 2
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    ("loss_fn", "error", "message"),
    [
        (lambda m, b: m(b[0]).sum(), TypeError, r"must return a tuple \(summed_loss, num_items\)"),
        (lambda m, b: (m(b[0]), 3), TypeError, r"0-dim Tensor .* shape \(37, 3\)"),
        (lambda m, b: (m(b[0]).sum(), "3"), TypeError, r"num_items must be a number .* got str"),
        (lambda m, b: (m(b[0]).sum(), True), TypeError, r"num_items must be a number .* got bool"),
        (lambda m, b: (m(b[0]).sum(), float("nan")), ValueError, r"finite and >= 0; got nan"),
        (lambda m, b: (m(b[0]).sum(), -1), ValueError, r"num_items must be finite and >= 0"),
        (lambda m, b: (m(b[0]).sum(), torch.ones(2)), ValueError, r"single number .* shape \(2,\)"),
        (lambda m, b: (m(b[0]).sum(), 0), ValueError, r"covers no items"),
        (lambda m, b: (m(b[0]).sum().detach(), 1), ValueError, r"does not require grad"),
    ],
)
def test_bad_loss_outputs_are_explained(problem, loss_fn, error, message):
    model, batch = problem
    with pytest.raises(error, match=message):
        accumulated_gradients(model, loss_fn, [batch])


def test_numpy_and_float_counts_are_accepted(problem):
    model, (inputs, labels) = problem
    full = full_batch_gradients(model, lambda m, b: (
        torch.nn.functional.cross_entropy(m(b[0]), b[1], reduction="sum"), np.int64(len(b[1]))
    ), (inputs, labels))
    reference = full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    assert max_gradient_difference(full, reference) == 0.0


def test_float_tensor_num_items_is_a_total_weight(problem):
    model, batch = problem
    weight = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)

    def weighted(model, micro_batch):
        logits = model(micro_batch[0])
        labels = micro_batch[1]
        summed = nn.functional.cross_entropy(logits, labels, weight=weight, reduction="sum")
        return summed, weight[labels].sum()

    parts = split_into_micro_batches(batch, accumulation_steps=4)
    inputs, labels = batch
    expected = torch.autograd.grad(
        nn.functional.cross_entropy(model(inputs), labels, weight=weight), list(model.parameters())
    )
    got = accumulated_gradients(model, weighted, parts)
    assert max_gradient_difference(got, dict(zip(got, expected, strict=True))) <= 1e-15


def test_empty_micro_batches_and_non_module_are_rejected(problem):
    model, _ = problem
    with pytest.raises(ValueError, match="micro_batches is empty"):
        accumulated_gradients(model, sample_classification_loss, [])
    with pytest.raises(ValueError, match="micro_batches is empty"):
        averaged_micro_batch_gradients(model, sample_classification_loss, iter([]))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module; got function"):
        full_batch_gradients(lambda x: x, sample_classification_loss, [torch.zeros(1)])


def test_averaged_means_reject_a_micro_batch_without_items(problem):
    model, batch = problem
    with pytest.raises(ValueError, match="micro-batch 1 covers no items"):
        averaged_micro_batch_gradients(
            model, lambda m, b: (m(b[0]).sum(), b[0].shape[0] if b is batch else 0),
            [batch, (batch[0][:0], batch[1][:0])],
        )


def test_max_gradient_difference_values_and_errors():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([1.0, 2.5]), "b": torch.tensor([0.0])}
    assert max_gradient_difference(a, b) == 0.5
    assert max_gradient_difference(a, b, relative=True) == 0.5 / 2.5
    assert max_gradient_difference(a, a) == 0.0
    zero = {"w": torch.zeros(2), "b": torch.zeros(1)}
    assert max_gradient_difference(zero, zero, relative=True) == 0.0
    assert max_gradient_difference(a, zero, relative=True) == float("inf")
    with pytest.raises(ValueError, match=r"only in grads_a: \['b'\], only in grads_b: \[\]"):
        max_gradient_difference(a, {"w": a["w"]})
    with pytest.raises(ValueError, match=r"'w' has shape \(2,\) in grads_a but \(3,\)"):
        max_gradient_difference(a, {"w": torch.zeros(3), "b": torch.zeros(1)})
    with pytest.raises(ValueError, match="grads_b is empty"):
        max_gradient_difference(a, {})
    with pytest.raises(TypeError, match="grads_a must be a dict .* got list"):
        max_gradient_difference([1.0], b)


def test_flatten_gradients_orders_by_name_in_float64():
    flat = flatten_gradients({"b": torch.tensor([3.0]), "a": torch.tensor([[1.0, 2.0]])})
    assert flat.dtype == torch.float64 and flat.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="non-empty dict"):
        flatten_gradients({})


def test_parameters_after_step_matches_a_manual_sgd_step(problem):
    model, batch = problem
    grads = full_batch_gradients(model, sample_classification_loss, batch)
    stepped = parameters_after_step(model, grads, lambda p: torch.optim.SGD(p, lr=0.1))
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(stepped[name], parameter.detach() - 0.1 * grads[name])
    with pytest.raises(ValueError, match=r"missing: \['0.bias'\]"):
        parameters_after_step(
            model, {k: v for k, v in grads.items() if k != "0.bias"},
            lambda p: torch.optim.SGD(p, lr=0.1),
        )


def test_max_gradient_difference_is_nan_when_either_side_has_a_nan_anywhere():
    a = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5, float("nan")])}
    b = {"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([0.5, 0.0])}
    for relative in (False, True):  # Python's max() would drop a NaN after the first entry
        assert np.isnan(max_gradient_difference(a, b, relative=relative))
        assert np.isnan(max_gradient_difference(b, a, relative=relative))
    infinite = {"a": torch.tensor([float("inf"), 0.0]), "b": torch.zeros(2)}
    assert np.isnan(max_gradient_difference(infinite, infinite))  # inf - inf is not 0


def _fp16_problem():
    """An fp16 linear model whose per-micro-batch SUMMED gradients overflow float16 (each item
    contributes about -61; 4096 of them are -2.5e5 > 65504) while the mean fits."""
    layer = nn.Linear(4, 1).half()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.25, -0.5, 0.125, 0.75]]))
        layer.bias.fill_(0.5)
    inputs = (torch.rand(8192, 4, generator=torch.Generator().manual_seed(0)) + 0.5).half()
    targets = torch.full((8192, 1), 30.0)

    def loss_fn(model, batch):
        return ((model(batch[0]).float() - batch[1]) ** 2).sum(), len(batch[0])
    return layer, loss_fn, (inputs, targets)


def test_fp16_accumulation_is_exact_where_raw_sums_would_overflow():
    layer, loss_fn, batch = _fp16_problem()
    full = full_batch_gradients(layer, loss_fn, batch)
    reference = copy.deepcopy(layer).double()
    truth = full_batch_gradients(reference, lambda m, b: loss_fn(m, (b[0].double(), b[1])), batch)
    for k in (1, 2, 4, 7):
        accumulated = accumulated_gradients(
            layer, loss_fn, split_into_micro_batches(batch, accumulation_steps=k))
        assert all(g.dtype == torch.float16 and bool(torch.isfinite(g).all())
                   for g in accumulated.values())
        # within one float16 rounding of the float64 truth, as the full batch is
        assert max_gradient_difference(accumulated, truth, relative=True) <= 2**-10
        assert max_gradient_difference(accumulated, full, relative=True) <= 2**-10
    assert max_gradient_difference(full, truth, relative=True) <= 2**-10
    assert all(p.grad is None for p in layer.parameters())


def test_fp16_raw_sums_would_have_overflowed():
    layer, loss_fn, batch = _fp16_problem()
    half = split_into_micro_batches(batch, accumulation_steps=2)[0]
    summed, _ = loss_fn(layer, half)
    summed.backward()  # what the unscaled sum of one micro-batch does in float16
    assert not bool(torch.isfinite(layer.weight.grad).all())


@pytest.mark.parametrize("function", [accumulated_gradients, averaged_micro_batch_gradients])
@pytest.mark.parametrize(("bad_step", "count"), [(0, -1), (1, -1), (1, float("nan")),
                                                 (1, "3"), (2, torch.ones(2))])
def test_model_is_left_as_found_when_a_count_is_invalid(problem, function, bad_step, count):
    model, batch = problem
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 3.0)
    grads_before = [p.grad for p in model.parameters()]
    steps = []

    def loss_fn(model, micro_batch):
        summed, items = sample_classification_loss(model, micro_batch)
        steps.append(None)
        return summed, count if len(steps) - 1 == bad_step else items

    with pytest.raises((ValueError, TypeError), match=f"at micro-batch {bad_step}"):
        function(model, loss_fn, split_into_micro_batches(batch, accumulation_steps=3))
    assert all(p.grad is g for p, g in zip(model.parameters(), grads_before, strict=True))
    assert all(bool((p.grad == 3.0).all()) for p in model.parameters())


def test_model_is_left_as_found_when_a_gradient_is_not_finite(problem):
    model, batch = problem

    def nan_gradient(model, micro_batch):  # a finite loss (0) whose gradient is NaN
        return torch.sqrt((model(micro_batch[0]) ** 2).sum() * 0.0), len(micro_batch[0])

    with pytest.raises(ValueError, match=r"gradient of parameter '0\.weight' is not finite"):
        accumulated_gradients(model, nan_gradient, split_into_micro_batches(batch,
                                                                            accumulation_steps=2))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", ["leaf", "view"])
def test_inputs_that_require_grad_keep_their_grad(problem, kind):
    model, (inputs, labels) = problem
    inputs = inputs.clone().requires_grad_(True)
    inputs.grad = torch.full_like(inputs, 5.0)
    grad_before = inputs.grad
    window = split_into_micro_batches((inputs, labels), accumulation_steps=3)
    if kind == "leaf":  # each micro-batch its own leaf
        window = [(x.detach().requires_grad_(True), y) for x, y in window]
    reference = accumulated_gradients(
        model, sample_classification_loss,
        split_into_micro_batches((inputs.detach(), labels), accumulation_steps=3))
    got = accumulated_gradients(model, sample_classification_loss, window)
    full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    averaged_micro_batch_gradients(model, sample_classification_loss, window)
    assert max_gradient_difference(got, reference) == 0.0
    assert inputs.grad is grad_before and bool((inputs.grad == 5.0).all())
    if kind == "leaf":
        assert all(x.grad is None for x, _ in window)


def test_a_bare_tensor_is_refused_not_taken_row_by_row(problem):
    model, (inputs, _) = problem
    with pytest.raises(TypeError,
                       match=r"micro_batches must be a list .* split_into_micro_batches.* Tensor"):
        accumulated_gradients(model, lambda m, b: (m(b).sum(), len(b)), inputs)


@pytest.mark.parametrize("ground_truth", [accumulated_gradients, "full", "averaged"])
def test_a_model_of_mixed_dtypes_is_refused_naming_two_parameters(ground_truth):
    """Issue 30: torch's bare 'mat1 and mat2 must have the same dtype' became the engine's
    message, naming the two parameters."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).double())
    batch = (torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1]))
    call = {"full": lambda: full_batch_gradients(model, sample_classification_loss, batch),
            "averaged": lambda: averaged_micro_batch_gradients(
                model, sample_classification_loss, split_into_micro_batches(
                    batch, accumulation_steps=2))}.get(ground_truth) or (
        lambda: accumulated_gradients(model, sample_classification_loss,
                                      split_into_micro_batches(batch, accumulation_steps=2)))
    with pytest.raises(ValueError, match=r"mixed dtypes \('0\.weight' is torch\.float32, "
                                         r"'1\.weight' is torch\.float64\)"):
        call()
