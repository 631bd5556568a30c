"""AccumulationTrainer: equal to large-batch training, exact partial windows, resume, AMP."""

from __future__ import annotations

import pytest
import torch

from gradaccum_lib import NonFiniteLossError, split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer, WindowRecord
from gradaccum_lib.batches import NonFiniteGradientError, windows_of
from gradaccum_lib.jobs.resume import Resumable
from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
from gradaccum_lib.measure.metrics import evaluate_mean_loss
from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

DATA = make_toy_classification(100, 8, 3, seed=4)  # 100 = 3 windows of 32 + a partial 4


def _trainer(micro_batch_size, accumulation_steps, *, dropout=0.0, amp_dtype=None,
             dtype=torch.float64, progress=False):
    model = make_mlp(8, 16, 3, dropout=dropout, seed=0, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    trainer = AccumulationTrainer(
        model, sample_classification_loss, optimizer, accumulation_steps=accumulation_steps,
        scheduler=scheduler, max_grad_norm=0.5, amp_dtype=amp_dtype, progress=progress,
    )
    data = DATA if dtype == torch.float64 else (DATA[0].to(dtype), DATA[1])
    return trainer, split_into_micro_batches(data, micro_batch_size=micro_batch_size)


def _max_parameter_difference(a, b):
    return max((x - y).abs().max().item()
               for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize(("micro_batch_size", "accumulation_steps"), [(8, 4), (4, 8), (16, 2)])
def test_accumulation_equals_large_batch_training_with_partial_windows(
    micro_batch_size, accumulation_steps
):
    large, large_batches = _trainer(32, 1)
    accumulated, micro_batches = _trainer(micro_batch_size, accumulation_steps)
    for _ in range(3):
        large.train_epoch(large_batches)
        accumulated.train_epoch(micro_batches)
    assert _max_parameter_difference(large.model, accumulated.model) <= 1e-12
    assert accumulated.history.column("items") == [32.0, 32.0, 32.0, 4.0] * 3
    for name in ("loss", "grad_norm", "learning_rate"):
        assert accumulated.history.column(name) == pytest.approx(
            large.history.column(name), rel=1e-12)
    assert accumulated.optimizer_steps == 12 and accumulated.scheduler.last_epoch == 12


def test_window_loss_is_item_weighted_and_grad_norm_is_before_clipping():
    trainer, micro_batches = _trainer(8, 4)
    model = trainer.model
    inputs, labels = DATA[0][:32], DATA[1][:32]
    expected_loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    expected_loss.backward()
    expected_norm = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))
    record = trainer.step_window(micro_batches[:4])
    assert record.loss == pytest.approx(expected_loss.item(), rel=1e-12)
    assert record.grad_norm == pytest.approx(expected_norm.item(), rel=1e-12)
    assert record.grad_norm > 0.5  # so clipping was active
    assert (record.micro_steps, record.items, record.learning_rate) == (4, 32.0, 1e-2)


def test_token_windows_with_uneven_counts_equal_the_large_batch():
    batch = make_toy_token_batch(24, 16, 30, 4, sort_by_length=True, seed=1)
    models = []
    for micro_batch_size, accumulation_steps in ((12, 1), (3, 4)):
        model = TokenTagger(30, 8, 4, seed=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        trainer = AccumulationTrainer(model, token_classification_loss, optimizer,
                                      accumulation_steps=accumulation_steps, progress=False)
        for _ in range(3):
            trainer.train_epoch(split_into_micro_batches(batch, micro_batch_size=micro_batch_size))
        models.append(model)
    assert _max_parameter_difference(*models) <= 1e-12


def test_stale_gradients_from_before_training_do_not_leak_in():
    clean, micro_batches = _trainer(8, 4)
    dirty, _ = _trainer(8, 4)
    for parameter in dirty.model.parameters():
        parameter.grad = torch.ones_like(parameter)
    clean.train_epoch(micro_batches)
    dirty.train_epoch(micro_batches)
    assert _max_parameter_difference(clean.model, dirty.model) == 0.0


def test_resume_from_a_window_boundary_is_exact_even_with_dropout(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.manual_seed(0)
    uninterrupted, micro_batches = _trainer(8, 4, dropout=0.3)
    for _ in range(2):
        uninterrupted.train_epoch(micro_batches)

    torch.manual_seed(0)
    first, _ = _trainer(8, 4, dropout=0.3)
    first.train_epoch(micro_batches)
    Resumable(first).train_epoch(micro_batches, max_windows=2, checkpoint_path=path,
                                 checkpoint_every=2)
    torch.manual_seed(123)  # whatever happens to the RNG meanwhile
    resumed, _ = _trainer(8, 4, dropout=0.3)
    resumable = Resumable(resumed)  # the jobs wing's checkpoints, around the engine
    resumable.load_checkpoint(path)
    assert (resumed.epoch, resumed.windows_done, resumed.optimizer_steps) == (1, 2, 6)
    resumable.train_epoch(micro_batches)
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.history == uninterrupted.history
    assert resumed.scheduler.last_epoch == uninterrupted.scheduler.last_epoch


def test_checkpoint_without_the_trainers_scheduler_is_refused(tmp_path):
    trainer, micro_batches = _trainer(8, 4)
    Resumable(trainer).save_checkpoint(tmp_path / "c.pt")
    model = make_mlp(8, 16, 3, seed=0)
    bare = AccumulationTrainer(model, sample_classification_loss,
                               torch.optim.AdamW(model.parameters()), accumulation_steps=4,
                               progress=False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="scheduler_kind: checkpoint 'StepLR', trainer None"):
        Resumable(bare).load_checkpoint(tmp_path / "c.pt")
    # validated before anything is restored: the weights are untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_bf16_autocast_on_cpu_trains_close_to_fp32():
    fp32, micro_batches_32 = _trainer(8, 4, dtype=torch.float32)
    bf16, micro_batches_16 = _trainer(8, 4, dtype=torch.float32, amp_dtype=torch.bfloat16)
    assert bf16.scaler is None  # bf16 needs no loss scaling
    for _ in range(2):
        fp32.train_epoch(micro_batches_32)
        bf16.train_epoch(micro_batches_16)
    assert all(torch.isfinite(torch.tensor(bf16.history.column("loss"))))
    assert bf16.history.column("loss") == pytest.approx(fp32.history.column("loss"), rel=0.05)
    assert 0 < _max_parameter_difference(fp32.model, bf16.model) < 0.05


def test_non_finite_loss_names_the_micro_step_and_takes_no_step():
    trainer, micro_batches = _trainer(8, 4)
    before = [p.detach().clone() for p in trainer.model.parameters()]

    def poisoned(model, batch):
        summed, count = sample_classification_loss(model, batch)
        return (summed * float("inf") if batch[0] is micro_batches[2][0] else summed), count

    trainer.loss_fn = poisoned
    with pytest.raises(NonFiniteLossError, match="micro-batch 2") as info:
        trainer.step_window(micro_batches[:4])
    assert info.value.micro_step == 2
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert trainer.optimizer_steps == 0 and len(trainer.history) == 0


def test_progress_bar_and_history_helpers(capsys):
    trainer, micro_batches = _trainer(8, 4, progress=True)
    history = trainer.train_epoch(micro_batches)
    assert "epoch 0" in capsys.readouterr().err
    assert len(history) == 4
    assert isinstance(history.records[0], WindowRecord)
    with pytest.raises(ValueError, match="name must be one of"):
        history.column("accuracy")


def test_windows_of_groups_and_keeps_the_partial_tail():
    assert list(windows_of(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(windows_of([], 3)) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"accumulation_steps": 0}, ValueError, "accumulation_steps must be a positive int; got 0"),
        ({"accumulation_steps": 2, "max_grad_norm": 0.0}, ValueError,
         "max_grad_norm must be a finite number > 0"),
        ({"accumulation_steps": 2, "amp_dtype": torch.float64}, ValueError, "amp_dtype must be"),
    ],
)
def test_trainer_rejects_bad_configuration(kwargs, error, message):
    model = make_mlp(8, 16, 3)
    with pytest.raises(error, match=message):
        AccumulationTrainer(model, sample_classification_loss,
                            torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_train_epoch_rejects_half_a_checkpoint_setting(tmp_path):
    trainer, micro_batches = _trainer(8, 4)
    with pytest.raises(ValueError, match="give both checkpoint_path and checkpoint_every"):
        Resumable(trainer).train_epoch(micro_batches, checkpoint_path=tmp_path / "c.pt")
    with pytest.raises(ValueError, match="checkpoint_every must be a positive int; got 0"):
        Resumable(trainer).train_epoch(micro_batches, checkpoint_path=tmp_path / "c.pt",
                                       checkpoint_every=0)
    with pytest.raises(ValueError, match="window is empty"):
        trainer.step_window([])


def test_evaluate_mean_loss_is_item_weighted_and_leaves_no_graph():
    model = make_mlp(8, 16, 3, seed=0)
    parts = split_into_micro_batches(DATA, micro_batch_size=30)  # 30, 30, 30, 10
    expected = torch.nn.functional.cross_entropy(model(DATA[0]), DATA[1]).item()
    assert evaluate_mean_loss(model, sample_classification_loss, parts) == pytest.approx(
        expected, rel=1e-12)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="cover no items"):
        evaluate_mean_loss(model, sample_classification_loss, [])


def test_a_half_model_whose_accumulated_gradient_overflows_raises_and_takes_no_step():
    # a .half() model, no GradScaler, uneven micro-batches (1 item, then 3,000): the true mean
    # gradient is 100, but the provisional normaliser (1 item x k = 2) makes the accumulated
    # one 150,000, past float16's 65,504: an error naming the window and the parameter
    model = torch.nn.Linear(1, 1, bias=False).half()
    torch.nn.init.constant_(model.weight, 0.01)

    def loss_fn(model, inputs):
        return (model(inputs) * 100).sum(), inputs.shape[0]

    trainer = AccumulationTrainer(model, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1),
                                  accumulation_steps=2, progress=False)
    inputs = torch.ones(3001, 1, dtype=torch.float16)
    with pytest.raises(NonFiniteGradientError,
                       match=r"window 0: .* not finite \(first at parameter 'weight'\)"):
        trainer.step_window([inputs[:1], inputs[1:]])
    assert model.weight.item() == pytest.approx(0.01, rel=1e-3)  # float16's 0.01, untouched
    assert model.weight.grad is None  # cleared
    assert trainer.optimizer_steps == 0 and len(trainer.history) == 0


def test_state_dict_round_trips_and_refuses_another_run():
    trainer, micro_batches = _trainer(8, 4)
    trainer.train_epoch(micro_batches, max_windows=2)
    state = trainer.state_dict()
    other, _ = _trainer(8, 4)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.history == trainer.history
    assert (other.epoch, other.windows_done, other.optimizer_steps) == (0, 2, 2)
    assert other.normaliser == trainer.normaliser
    mismatched, _ = _trainer(8, 2)
    with pytest.raises(ValueError, match="accumulation_steps: checkpoint 4, trainer 2"):
        mismatched.load_state_dict(state)
    with pytest.raises(ValueError, match="windows_done must be an int >= 0; got -1"):
        other.load_state_dict({**state, "windows_done": -1})
    with pytest.raises(ValueError, match="history"):
        other.load_state_dict({**state, "history": [(1, 2)]})
    assert other.state_dict() == state  # nothing was restored by the refused loads
    with pytest.raises(TypeError, match="state must be a dict; got list"):
        other.load_state_dict([])


def test_train_epoch_continues_from_windows_done_and_calls_after_window():
    trainer, micro_batches = _trainer(8, 4)
    seen = []
    trainer.train_epoch(micro_batches, max_windows=1, after_window=seen.append)
    assert trainer.windows_done == 1 and len(seen) == 1 and len(seen[0]) == 4
    trainer.train_epoch(micro_batches[4:], after_window=seen.append)  # the epoch's rest
    assert (trainer.epoch, trainer.windows_done) == (1, 0)
    assert trainer.history.column("window") == [0, 1, 2, 3] and len(seen) == 4
