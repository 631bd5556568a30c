"""memory (measured activation bytes, static bytes, the budget model) and bench (timing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.bench import Timing, paired_ratio, steady_allocator, time_interleaved
from gradaccum_lib.measure.memory import (
    activation_bytes,
    memory_budget,
    static_bytes,
)
from gradaccum_lib.measure.planning import (
    AccumulationPlan,
    StepTimeModel,
    fit_step_time,
    plan_accumulation,
)
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


def test_activation_bytes_of_a_known_layer_stack_is_exact():
    # Linear saves its input (b x 6); Tanh saves its output (b x 10), which the second Linear
    # also saves (same storage, counted once); cross-entropy saves log-probs (b x 3) and the
    # int64 targets (b); weights (and the transposes autograd saves) are excluded.
    model = make_mlp(6, 10, 3, dtype=torch.float32)
    inputs, labels = make_toy_classification(32, 6, 3, dtype=torch.float32)
    per_sample = 4 * (6 + 10 + 3) + 8
    measured = activation_bytes(model, sample_classification_loss, (inputs, labels))
    assert measured - 32 * per_sample in range(0, 9)  # plus at most a scalar or two


def test_activation_bytes_counts_only_the_micro_batch_of_a_view():
    model = make_mlp(6, 10, 3)
    batch = make_toy_classification(64, 6, 3)
    full = activation_bytes(model, sample_classification_loss, batch)
    for k in (2, 4, 8):
        part = split_into_micro_batches(batch, accumulation_steps=k)[0]
        ratio = activation_bytes(model, sample_classification_loss, part) / full
        assert abs(ratio - 1 / k) <= 0.01 / k


def test_activation_bytes_leaves_model_unchanged_and_bf16_autocast_halves_most():
    model = make_mlp(6, 64, 3, normalization="batch", dtype=torch.float32).train()
    batch = make_toy_classification(32, 6, 3, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fp32 = activation_bytes(model, sample_classification_loss, batch)
    bf16 = activation_bytes(model, sample_classification_loss, batch, autocast_dtype=torch.bfloat16)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert 0.4 < bf16 / fp32 < 0.8


def test_static_bytes_measures_parameters_gradients_and_adam_state():
    model = nn.Linear(10, 5)  # 55 float32 parameters
    optimizer = torch.optim.AdamW(model.parameters())
    assert static_bytes(model, optimizer) == {"parameters": 220, "gradients": 0,
                                              "optimizer_state": 0}
    model(torch.ones(2, 10)).sum().backward()
    optimizer.step()
    assert static_bytes(model, optimizer) == {"parameters": 220, "gradients": 220,
                                              "optimizer_state": 440}


@pytest.mark.parametrize(
    ("optimizer", "precision", "expected"),
    [
        ("sgd", "fp32", (400, 400, 0, 0)),
        ("sgd_momentum", "fp32", (400, 400, 400, 0)),
        ("adamw", "fp32", (400, 400, 800, 0)),
        ("adam", "mixed", (200, 200, 800, 400)),
        ("adamw", "autocast", (400, 400, 800, 0)),
    ],
)
def test_memory_budget_parts(optimizer, precision, expected):
    budget = memory_budget(100, optimizer=optimizer, precision=precision,
                           activation_bytes_per_sample=10.0, micro_batch_size=8)
    parts = (budget.parameters, budget.gradients, budget.optimizer_state, budget.master_weights)
    assert parts == expected
    assert budget.activations == 80
    assert budget.total == sum(expected) + budget.activations
    assert budget.as_dict()["total"] == budget.total


def test_memory_budget_agrees_with_measurement_for_adamw():
    model = make_mlp(6, 10, 3, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_toy_classification(16, 6, 3, dtype=torch.float32)
    sample_classification_loss(model, batch)[0].backward()
    optimizer.step()
    measured = static_bytes(model, optimizer)
    per_sample = activation_bytes(model, sample_classification_loss, batch) / 16
    budget = memory_budget(sum(p.numel() for p in model.parameters()),
                           activation_bytes_per_sample=per_sample, micro_batch_size=16)
    assert (budget.parameters, budget.gradients, budget.optimizer_state) == (
        measured["parameters"], measured["gradients"], measured["optimizer_state"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optimizer": "lion"}, r"optimizer must be one of .* got 'lion'"),
        ({"precision": "fp8"}, r"precision must be one of .* got 'fp8'"),
        ({"micro_batch_size": 0}, r"micro_batch_size must be a positive int; got 0"),
        ({"activation_bytes_per_sample": -1.0},
         r"activation_bytes_per_sample must be >= 0; got -1.0"),
        ({"activation_bytes_fixed": -1.0}, r"activation_bytes_fixed must be >= 0"),
    ],
)
def test_memory_budget_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory_budget(10, **kwargs)
    with pytest.raises(ValueError, match="num_parameters must be an int >= 0; got -1"):
        memory_budget(-1)


def test_time_interleaved_rotates_order_and_reports_medians():
    calls = []
    timings = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert set(timings) == {"a", "b"} and len(timings["a"].samples) == 3
    timing = Timing((3.0, 1.0, 2.0))
    assert (timing.median, timing.min, timing.max) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError, match="repeats must be a positive int; got 0"):
        time_interleaved({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="at least one callable"):
        time_interleaved({})


def test_time_interleaved_runs_before_each_timed_call_untimed():
    import time

    calls = []
    timings = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               repeats=2, warmup=1, before=lambda: calls.append("|"))
    assert len(timings["a"].samples) == len(timings["b"].samples) == 2
    # warm-up without it; then before every timed call, in the rotated order
    assert calls == ["a", "b", "|", "a", "|", "b", "|", "b", "|", "a"]
    slow = time_interleaved({"a": lambda: None}, repeats=3, warmup=0,
                            before=lambda: time.sleep(0.05))
    assert slow["a"].max < 0.05  # the sleep is outside the timed call
    with pytest.raises(TypeError, match="before must be a callable or None; got int"):
        time_interleaved({"a": lambda: None}, before=3)


def test_time_interleaved_gives_each_function_turns_of_consecutive_calls():
    import time

    calls = []
    timings = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               repeats=2, warmup=0, calls_per_turn=3,
                               before=lambda: calls.append("|"))
    # a turn: three consecutive calls, each after `before`; the order still rotates per round
    assert "".join(calls) == "|a|a|a|b|b|b|b|b|b|a|a|a"
    assert len(timings["a"].samples) == 2  # one sample per turn ...
    sleepy = time_interleaved({"a": lambda: time.sleep(0.01)}, repeats=1, warmup=0,
                              calls_per_turn=4)
    assert 0.01 <= sleepy["a"].median < 0.03  # ... the mean of its calls, not their sum
    with pytest.raises(ValueError, match="calls_per_turn must be a positive int; got 0"):
        time_interleaved({"a": lambda: None}, calls_per_turn=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0; got True"):
        time_interleaved({"a": lambda: None}, warmup=True)  # a bool is not a count


def test_rounds_run_without_garbage_collection_and_ratios_pair_rounds():
    import gc

    states = []
    time_interleaved({"a": lambda: states.append(gc.isenabled())}, repeats=2, warmup=0)
    assert states == [False, False] and gc.isenabled()  # paused in a round, restored after
    gc.disable()
    try:
        time_interleaved({"a": lambda: None}, repeats=1, warmup=0)
        assert not gc.isenabled()  # the caller's choice is kept
    finally:
        gc.enable()
    # round by round: 2/1, 4/4, 9/3 -> median 2.0 (the ratio of medians would be 4/3)
    assert paired_ratio(Timing((2.0, 4.0, 9.0)), Timing((1.0, 4.0, 3.0))) == 2.0
    with pytest.raises(ValueError, match="same rounds; got 2 and 1 samples"):
        paired_ratio(Timing((1.0, 2.0)), Timing((1.0,)))


def test_steady_allocator_fixes_glibcs_thresholds():
    assert steady_allocator() is True  # Linux with glibc, as CI runs
    with pytest.raises(ValueError, match="threshold_bytes must be a positive int"):
        steady_allocator(0)


def test_fit_step_time_recovers_a_line_and_models_windows():
    model = fit_step_time([1, 2, 4, 8], [0.011, 0.012, 0.014, 0.018],
                          seconds_per_optimizer_step=0.5)
    assert model.overhead_per_micro_step == pytest.approx(0.010)
    assert model.seconds_per_sample == pytest.approx(0.001)
    assert model.window_seconds(4, 3) == pytest.approx(3 * 0.014 + 0.5)
    with pytest.raises(ValueError, match="at least two"):
        fit_step_time([1], [0.1])
    with pytest.raises(ValueError, match="must not all be equal"):
        fit_step_time([2, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="accumulation_steps must be a positive int; got 0"):
        model.window_seconds(4, 0)


def test_plan_accumulation_keeps_the_effective_batch_and_trades_memory_for_time():
    step_time = StepTimeModel(overhead_per_micro_step=0.01, seconds_per_sample=0.001)
    plan = plan_accumulation(num_parameters=1000, activation_bytes_per_sample=100.0,
                             step_time=step_time, micro_batch_size=8, accumulation_steps=4)
    one_pass = plan_accumulation(num_parameters=1000, activation_bytes_per_sample=100.0,
                                 step_time=step_time, micro_batch_size=32, accumulation_steps=1)
    assert isinstance(plan, AccumulationPlan)
    assert plan.effective_batch_size == one_pass.effective_batch_size == 32
    assert plan.memory.activations * 4 == one_pass.memory.activations
    assert plan.window_seconds > one_pass.window_seconds
    assert plan.seconds_per_sample == pytest.approx(plan.window_seconds / 32)
