"""The audit against the ground truth, and the audited frameworks' step functions."""

from __future__ import annotations

import pytest
import torch

from gradaccum_course.audits.frameworks import (
    WindowDataset,
    accelerate_step,
    bare_loop_step,
    library_step,
)
from gradaccum_course.audits.hf_trainer import (
    _summed_cross_entropy_over_window,
    hf_trainer_clipped_run,
    hf_trainer_step,
    hf_trainer_train_sampler,
)
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.batches import concatenate_micro_batches
from gradaccum_lib.equivalence import _AuditResult, audit_update
from gradaccum_lib.losses import bert_classification_loss


def SGD(parameters):  # noqa: N802 - reads like the optimizer it builds
    return torch.optim.SGD(parameters, lr=0.1)


def _forgets_to_scale(accumulation_steps):
    def step(model, micro_batches, make_optimizer):
        optimizer = make_optimizer(model.parameters())
        for micro_batch in micro_batches:
            model(**micro_batch).loss.backward()  # bug: no division by the window
        optimizer.step()
    return step


def test_audit_passes_a_correct_loop_and_detects_a_broken_one(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, accumulation_steps=3)
    good = audit_update(library_step(3), model, bert_classification_loss, parts, SGD)
    assert good.matches(1e-10) and good.norm_ratio == pytest.approx(1.0, abs=1e-10)
    bad = audit_update(_forgets_to_scale(3), model, bert_classification_loss, parts, SGD)
    assert not bad.matches() and bad.norm_ratio == pytest.approx(3.0, rel=1e-10)
    assert bad.cosine == pytest.approx(1.0, abs=1e-10)  # right direction, wrong length
    assert isinstance(bad, _AuditResult)


def test_audit_refuses_a_zero_true_update(emr_window):
    model, batch = emr_window
    with pytest.raises(ValueError, match="true update is zero"):
        audit_update(library_step(1), model, bert_classification_loss, [batch],
                     lambda p: torch.optim.SGD(p, lr=0.0))


@pytest.mark.parametrize("accumulation_steps", [1, 2, 4])
def test_full_windows_library_bare_and_accelerate_match(emr_window, accumulation_steps):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, accumulation_steps=accumulation_steps)
    for make_step in (library_step, bare_loop_step, accelerate_step):
        result = audit_update(make_step(accumulation_steps), model, bert_classification_loss,
                              parts, SGD)
        assert result.matches(1e-10), make_step.__name__


def test_hf_trainer_inflates_by_k_for_bert_and_the_workarounds_fix_it(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, accumulation_steps=4)
    default = audit_update(hf_trainer_step(4), model, bert_classification_loss, parts, SGD)
    assert default.norm_ratio == pytest.approx(4.0, rel=1e-6)  # transformers #47688
    for workaround in ("accepts_loss_kwargs=False", "loss_is_scaled_for_ga=False",
                       "compute_loss_func"):
        fixed = audit_update(hf_trainer_step(4, workaround=workaround), model,
                             bert_classification_loss, parts, SGD)
        assert fixed.matches(1e-10), workaround
    with pytest.raises(ValueError, match="workaround must be one of"):
        hf_trainer_step(4, workaround="divide")


def test_partial_uneven_window_only_exact_counting_matches(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=16)  # 16 + 8, configured k = 4
    exact = [library_step(4), accelerate_step(4, count_window_items=True),
             hf_trainer_step(4, workaround="compute_loss_func")]
    for step in exact:
        assert audit_update(step, model, bert_classification_loss, parts, SGD).matches(1e-10)
    under = audit_update(accelerate_step(4), model, bert_classification_loss, parts, SGD)
    assert under.norm_ratio < 0.6  # every loss divided by k = 4 though 2 micro-batches came


def test_window_dataset_and_loss_func(emr_window):
    _, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=10)
    dataset = WindowDataset(parts)
    assert len(dataset) == 24 and dataset.micro_batch_size == 10
    assert torch.equal(dataset[23]["labels"], batch["labels"][23])
    with pytest.raises(ValueError, match="cannot be re-batched"):
        WindowDataset(split_into_micro_batches(batch, accumulation_steps=7))  # 4,4,4,3,3,3,3
    logits = torch.randn(4, 3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 1])
    summed = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    torch.testing.assert_close(
        _summed_cross_entropy_over_window({"logits": logits}, labels, num_items_in_batch=8),
        summed / 8)
    torch.testing.assert_close(_summed_cross_entropy_over_window((logits,), labels), summed / 4)


def test_concatenate_micro_batches_inverts_split_and_rejects_mismatches():
    batch = {"x": torch.arange(10), "y": torch.arange(10) * 2}
    parts = split_into_micro_batches(batch, micro_batch_size=3)
    joined = concatenate_micro_batches(parts)
    assert all(torch.equal(joined[k], batch[k]) for k in batch)
    pairs = split_into_micro_batches((torch.zeros(4, 2), torch.ones(4)), accumulation_steps=2)
    assert isinstance(concatenate_micro_batches(pairs), tuple)
    with pytest.raises(ValueError, match="cannot be concatenated"):
        concatenate_micro_batches([torch.zeros(2, 3), torch.zeros(2, 4)])
    with pytest.raises(ValueError, match="micro_batches is empty"):
        concatenate_micro_batches([])


def test_equal_partial_window_gets_half_from_accelerate_and_twice_from_the_trainer(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches({k: v[:12] for k, v in batch.items()}, micro_batch_size=6)
    for step in (bare_loop_step(4), accelerate_step(4)):  # 2 of 4 micro-batches, each / 4
        result = audit_update(step, model, bert_classification_loss, parts, SGD)
        assert result.norm_ratio == pytest.approx(0.5, abs=1e-10)
        assert result.cosine == pytest.approx(1.0, abs=1e-10)
    trainer = audit_update(hf_trainer_step(4), model, bert_classification_loss, parts, SGD)
    assert trainer.norm_ratio == pytest.approx(2.0, abs=1e-10)  # two trusted means, summed
    divided = hf_trainer_step(4, workaround="accepts_loss_kwargs=False")
    assert audit_update(divided, model, bert_classification_loss, parts, SGD).matches(1e-10)


def test_loss_is_scaled_for_ga_false_divides_like_accepts_loss_kwargs_false(emr_window):
    model, batch = emr_window
    equal = split_into_micro_batches({k: v[:12] for k, v in batch.items()}, micro_batch_size=6)
    uneven = split_into_micro_batches(batch, micro_batch_size=16)  # 16 + 8, configured k = 4
    scaled = hf_trainer_step(4, workaround="loss_is_scaled_for_ga=False")
    assert audit_update(scaled, model, bert_classification_loss, equal, SGD).matches(1e-10)
    ours = audit_update(scaled, model, bert_classification_loss, uneven, SGD)
    theirs = audit_update(hf_trainer_step(4, workaround="accepts_loss_kwargs=False"), model,
                          bert_classification_loss, uneven, SGD)
    assert not ours.matches(1e-3)  # two micro-batch means averaged equally: not the truth
    assert ours.norm_ratio == pytest.approx(theirs.norm_ratio, abs=1e-10)
    assert ours.cosine == pytest.approx(theirs.cosine, abs=1e-10)


def test_trainer_default_sampler_shuffles_and_its_sequential_one_splits_like_a_bare_loop(
        emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=16)  # 16 + 8
    before = [p.detach().clone() for p in model.parameters()]
    assert isinstance(hf_trainer_train_sampler(model, parts), torch.utils.data.RandomSampler)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    bare = audit_update(bare_loop_step(4), model, bert_classification_loss, parts, SGD)
    in_order = audit_update(hf_trainer_step(4, workaround="accepts_loss_kwargs=False",
                                            shuffle=False),
                            model, bert_classification_loss, parts, SGD)
    assert in_order.cosine == pytest.approx(bare.cosine, abs=1e-10)
    assert in_order.norm_ratio == pytest.approx(2 * bare.norm_ratio, abs=1e-10)


def test_clipped_trainer_run_inflates_logs_and_clips_by_k(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=3)  # 8 micro-batches, k=2: 4 steps
    steps = hf_trainer_clipped_run(model, parts, SGD, 2, max_grad_norm=0.1)
    assert len(steps) == 4
    for s in steps:
        assert s.logged_loss == pytest.approx(2 * s.true_loss, rel=1e-6)  # float32 running sum
        assert s.logged_grad_norm == pytest.approx(2 * s.true_grad_norm, rel=1e-9)
        assert s.stepped_grad_norm == pytest.approx(min(0.1, s.logged_grad_norm), rel=1e-5)
        assert s.clipped == (s.logged_grad_norm > 0.1)
        assert s.cosine == pytest.approx(1.0, abs=1e-9)  # SGD: only the length differs
        true_length = min(0.1, s.true_grad_norm)
        assert s.norm_ratio == pytest.approx(s.stepped_grad_norm / true_length, rel=1e-5)
    unclipped = hf_trainer_clipped_run(model, parts, SGD, 2, max_grad_norm=0)
    assert all(s.norm_ratio == pytest.approx(2.0, rel=1e-9) and not s.clipped for s in unclipped)


def test_clipped_trainer_run_with_the_loss_workaround_follows_the_large_batch(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=5)  # 5,5,5,5,4: windows 10,10,4
    for make_optimizer in (SGD, lambda p: torch.optim.AdamW(p, lr=1e-2)):
        steps = hf_trainer_clipped_run(model, parts, make_optimizer, 2, max_grad_norm=0.05,
                                       workaround="compute_loss_func")
        assert len(steps) == 3
        for s in steps:
            assert s.norm_ratio == pytest.approx(1.0, abs=1e-9)
            assert s.cosine == pytest.approx(1.0, abs=1e-9)
            assert s.true_loss == pytest.approx(s.reference_loss, abs=1e-10)  # one trajectory
            assert s.logged_loss == pytest.approx(s.true_loss, rel=1e-6)
            assert s.logged_grad_norm == pytest.approx(s.true_grad_norm, rel=1e-9)


def test_clipped_trainer_run_rejects_bad_arguments(emr_window):
    model, batch = emr_window
    parts = split_into_micro_batches(batch, micro_batch_size=6)
    with pytest.raises(ValueError, match="accumulation_steps"):
        hf_trainer_clipped_run(model, parts, SGD, 0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        hf_trainer_clipped_run(model, parts, SGD, 2, max_grad_norm=-1.0)
    with pytest.raises(ValueError, match="micro_batches is empty"):
        hf_trainer_clipped_run(model, [], SGD, 2)
    with pytest.raises(ValueError, match="workaround must be one of"):
        hf_trainer_clipped_run(model, parts, SGD, 2, workaround="divide")


def test_hf_model_loss_gradients_divides_by_k_or_passes_the_window_count():
    from gradaccum_course.audits.hf_trainer import hf_model_loss_gradients
    from gradaccum_lib.equivalence import averaged_micro_batch_gradients, full_batch_gradients
    from gradaccum_lib.gradients import max_gradient_difference
    from gradaccum_lib.losses import cross_entropy_sum
    from gradaccum_lib.workloads.models import make_tiny_causal_lm

    model = make_tiny_causal_lm(20, hidden_size=8, max_length=8, dtype=torch.float64)
    input_ids = torch.randint(1, 20, (6, 8), generator=torch.Generator().manual_seed(0))
    labels = input_ids.clone()
    labels[1, 3:], labels[4, 2:] = -100, -100  # uneven real lengths
    window = {"input_ids": input_ids, "labels": labels}
    parts = split_into_micro_batches(window, accumulation_steps=3)

    def token_sum(model, batch):
        logits = model(input_ids=batch["input_ids"]).logits
        return cross_entropy_sum(logits[:, :-1], batch["labels"][:, 1:])

    def token_mean(model, batch):  # the model's own loss: the micro-batch's token mean
        return model(**batch).loss, 1

    # transformers' causal-LM loss computes in float32 (logits.float()): bounds, relative
    truth = full_batch_gradients(model, token_sum, window)
    count = torch.tensor(int((labels[:, 1:] != -100).sum()))
    with_count = hf_model_loss_gradients(model, parts, num_items_in_batch=count)
    assert max_gradient_difference(with_count, truth, relative=True) < 1e-6
    without = hf_model_loss_gradients(model, parts)  # each micro-batch's mean, / k
    assert max_gradient_difference(without, averaged_micro_batch_gradients(
        model, token_mean, parts), relative=True) < 1e-6
    assert max_gradient_difference(without, truth, relative=True) > 1e-2  # uneven: not exact
    assert all(p.grad is None for p in model.parameters())  # the model left as found
    with pytest.raises(ValueError, match="micro_batches is empty"):
        hf_model_loss_gradients(model, [])


def test_the_benchmarks_accelerate_loop_steps_as_the_bare_loop(emr_window):
    import copy

    from gradaccum_course.audits.frameworks import accelerate_loop, bare_loop

    model, batch = emr_window
    # 8 micro-batches, two full windows (the loop counts windows by calls: it has no data end)
    parts = split_into_micro_batches(batch, micro_batch_size=3)
    bare, accelerated = copy.deepcopy(model), copy.deepcopy(model)
    bare_loop(bare, SGD(bare.parameters()), 4)(parts)
    run, prepared = accelerate_loop(accelerated, SGD(accelerated.parameters()), 4)
    run(parts)
    before = dict(model.named_parameters())
    moved = {name: (p - before[name]).abs().max().item() for name, p in bare.named_parameters()}
    assert max(moved.values()) > 1e-3  # both windows stepped
    for name, parameter in prepared.named_parameters():
        torch.testing.assert_close(parameter, dict(bare.named_parameters())[name],
                                   rtol=0, atol=1e-12)
