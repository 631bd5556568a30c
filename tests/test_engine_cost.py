"""What the engine's window costs beyond the work it must do (issue 30): tensor operations
counted against the bare nanoGPT loop, the backward seed that replaces the division, the
parameter list read once a window, and a hidden progress bar that formats nothing. Counts,
not timings: the same on every machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.audits.frameworks import bare_loop
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


class _CountOps(TorchDispatchMode):
    """Counts the tensor operations dispatched inside it; reading a number out of a CPU
    tensor (``.item()``, ``_local_scalar_dense``) is left out: it is no kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is not torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _ops_per_window(step: Callable[[], object]) -> int:
    step()  # the optimizer's state exists after a first window
    with _CountOps() as counter:
        step()
    return counter.count


def _mean_loss(model, batch):  # noqa: ANN001, ANN202
    summed, count = sample_classification_loss(model, batch)
    return summed / count


@pytest.mark.parametrize("k", [1, 4])
def test_a_window_dispatches_fewer_tensor_ops_than_the_bare_loop(k):
    """Issue 30: with its norm history on, the engine's window of k = 1 dispatched 89 tensor
    operations to the bare loop's 88 (a division per micro-step, then the norm's
    ``_foreach_norm``, ``stack`` and ``vector_norm``); now the division's gradient is
    backward's seed and the per-parameter norms are combined as numbers: 85."""
    window = split_into_micro_batches(make_toy_classification(16, 8, 2, dtype=torch.float32),
                                      accumulation_steps=k)
    engine_model, bare_model = (make_mlp(8, 8, 2, dtype=torch.float32) for _ in range(2))
    trainer = AccumulationTrainer(engine_model, sample_classification_loss,
                                  torch.optim.AdamW(engine_model.parameters(), lr=1e-4),
                                  accumulation_steps=k, progress=False)
    run = bare_loop(bare_model, torch.optim.AdamW(bare_model.parameters(), lr=1e-4), k,
                    _mean_loss)
    assert (_ops_per_window(lambda: trainer.step_window(window))
            < _ops_per_window(lambda: run(window)))


def test_the_backward_seed_gives_the_bits_of_the_division():
    """Micro-batches of 3 items, k = 4: the normaliser is 12, whose reciprocal is not a
    binary fraction; the gradients equal, bit for bit, those of (summed loss / 12).backward()
    summed over the micro-batches (even items: no rescale after)."""
    data = make_toy_classification(12, 8, 3, seed=1, dtype=torch.float32)
    window = split_into_micro_batches(data, accumulation_steps=4)
    model, reference = make_mlp(8, 16, 3, dtype=torch.float32), make_mlp(8, 16, 3,
                                                                          dtype=torch.float32)
    trainer = AccumulationTrainer(model, sample_classification_loss,
                                  torch.optim.SGD(model.parameters(), lr=0.0),
                                  accumulation_steps=4, progress=False)
    trainer.step_window(window)
    assert trainer.normaliser == 12.0
    for micro_batch in window:
        (sample_classification_loss(reference, micro_batch)[0] / 12.0).backward()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(ours.grad, theirs.grad)


def test_a_loss_that_is_a_view_of_a_parameter_gets_a_fresh_seed_each_micro_step():
    """loss = a parameter seen through views: backward hands its seed itself to ``.grad``,
    and the next micro-step adds into it in place. A seed kept across micro-steps would be
    that ``.grad`` and drift (2.0 in the second window); a fresh one keeps every window at
    the mean, 1.0."""
    model = torch.nn.Linear(1, 1)

    def loss_fn(module, batch):  # noqa: ANN001, ANN202
        return module.bias.squeeze(), 1

    trainer = AccumulationTrainer(model, loss_fn, torch.optim.SGD(model.parameters(), lr=0.0),
                                  accumulation_steps=2, progress=False)
    for _ in range(3):
        trainer.step_window([None, None])
        assert model.bias.grad.item() == 1.0


def test_the_parameter_list_follows_the_optimizer_groups():
    """The list is read once a window, from ``optimizer.param_groups``: a group added after a
    window is rescaled, normed and stepped from the next one on, and every observer call of
    one window gets that window's list."""
    model = make_mlp(8, 16, 3, dtype=torch.float64)
    first, second = model[0], model[2]
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
    seen: list[list] = []

    class Observer:
        def on_micro_step(self, parameters, *_):  # noqa: ANN001, ANN002, ANN202
            seen.append(parameters)

        def on_window_end(self, parameters, *_):  # noqa: ANN001, ANN002, ANN202
            seen.append(parameters)

    trainer = AccumulationTrainer(model, sample_classification_loss, optimizer,
                                  accumulation_steps=2, progress=False, observers=[Observer()])
    data = make_toy_classification(10, 8, 3, seed=2)
    window = split_into_micro_batches(data, micro_batch_size=6)  # 6 + 4 items: rescaled
    trainer.step_window(window)
    assert len(seen) == 3 and all(p is seen[0] for p in seen) and len(seen[0]) == 2
    optimizer.add_param_group({"params": list(second.parameters())})
    before = second.weight.detach().clone()
    record = trainer.step_window(window)
    assert len(seen[-1]) == 4 and seen[-1] is not seen[0]
    grads = [p.grad for p in model.parameters()]
    assert record.grad_norm == pytest.approx(torch.cat([g.flatten() for g in grads]).norm()
                                             .item(), rel=1e-12)
    assert not torch.equal(second.weight, before)  # stepped


def test_a_hidden_progress_bar_formats_nothing_and_a_shown_one_ends_on_the_last_window(
        monkeypatch, capsys):
    """Issue 30: ``train_epoch`` formatted the loss and lr for its bar on every window, shown
    or not (about 30,000 instructions a window); a hidden bar now formats none, and a shown
    one still ends on the last window's loss."""
    from gradaccum_lib import accumulation

    calls = []
    original = accumulation.tqdm.set_postfix
    monkeypatch.setattr(accumulation.tqdm, "set_postfix",
                        lambda bar, *a, **kw: calls.append(kw) or original(bar, *a, **kw))
    micro_batches = split_into_micro_batches(make_toy_classification(24, 8, 3, seed=3),
                                             micro_batch_size=4)
    for progress in (False, True):
        model = make_mlp(8, 16, 3)
        trainer = AccumulationTrainer(model, sample_classification_loss,
                                      torch.optim.SGD(model.parameters(), lr=0.1),
                                      accumulation_steps=2, progress=progress)
        history = trainer.train_epoch(micro_batches)
        if not progress:
            assert calls == []
    assert calls[-1]["loss"] == f"{history.records[-1].loss:.4f}"
    assert f"loss={history.records[-1].loss:.4f}" in capsys.readouterr().err.split("\r")[-1]
