"""One optimizer step of accumulation, the way each audited setup runs it: gradaccum's loop,
the nanoGPT-style bare loop and 🤗 Accelerate (the 🤗 Trainer is in
:mod:`~gradaccum_course.audits.hf_trainer`, Lightning in :mod:`~gradaccum_course.audits.lightning`).

Each function has the signature ``step(model, micro_batches, make_optimizer)`` expected by
:func:`gradaccum_lib.equivalence.audit_update`: it builds the optimizer with
``make_optimizer``, feeds the window's micro-batches (dicts of ``input_ids``,
``attention_mask``, ``labels`` for a HF model) the way the framework's documentation shows,
and takes the framework's optimizer step(s) for that window. ``accumulation_steps`` is the
k the setup is configured with; a window may hold fewer micro-batches (the partial last
window of an epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import concatenate_micro_batches, windows_of
from gradaccum_lib.equivalence import OptimizerFactory
from gradaccum_lib.losses import bert_classification_loss

__all__ = [
    "WindowDataset",
    "accelerate_loop",
    "accelerate_step",
    "bare_loop",
    "bare_loop_step",
    "library_step",
    "model_mean_loss",
]


class WindowDataset(torch.utils.data.Dataset):
    """The samples of a window's micro-batches, as a map-style dataset of dicts. A framework's
    ``DataLoader`` re-batches them at the first micro-batch's size, so every micro-batch but
    the last must have that size (the last may be smaller), or a ValueError says so."""

    def __init__(self, micro_batches: Sequence[Mapping[str, Tensor]]) -> None:
        self.columns = concatenate_micro_batches(micro_batches)
        sizes = [len(next(iter(micro_batch.values()))) for micro_batch in micro_batches]
        self.micro_batch_size = sizes[0]
        if any(size != sizes[0] for size in sizes[:-1]) or sizes[-1] > sizes[0]:
            raise ValueError(
                f"micro_batches of sizes {sizes} cannot be re-batched by a DataLoader: all but "
                "the last must have the first's size, the last at most that (split them with "
                "micro_batch_size=...)"
            )

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {key: column[index] for key, column in self.columns.items()}


def library_step(accumulation_steps: int, loss_fn=bert_classification_loss,  # noqa: ANN001, ANN201
                 **options):  # noqa: ANN003
    """Return a step function running gradaccum's loop, :func:`accumulate_window`, on each
    window of ``accumulation_steps`` micro-batches (extra keyword arguments, e.g.
    ``max_grad_norm``, go to it)."""

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        optimizer = make_optimizer(model.parameters())
        for window in windows_of(micro_batches, accumulation_steps):
            accumulate_window(model, optimizer, window, loss_fn, **options)

    return step


def model_mean_loss(model: nn.Module, micro_batch: Mapping[str, Tensor]) -> Tensor:
    """Return a 🤗 model's own (mean) loss: ``model(**micro_batch).loss``."""
    return model(**micro_batch).loss


_MeanLoss = Callable[[nn.Module, Any], Tensor]


def bare_loop(model: nn.Module, optimizer: torch.optim.Optimizer, accumulation_steps: int,
              mean_loss: _MeanLoss = model_mean_loss) -> Callable[[Sequence[Any]], None]:
    """Return ``run(micro_batches)``: the nanoGPT-style loop over them. Per micro-batch: on a
    DDP model, ``require_backward_grad_sync`` set BEFORE the forward pass (True only on the
    window's last micro-step); the mean loss divided by k; backward. Step and zero every k
    micro-batches and at the end of the data.
    """
    is_ddp = isinstance(model, DistributedDataParallel)

    def run(micro_batches: Sequence[Any]) -> None:
        for index, micro_batch in enumerate(micro_batches):
            last = (index + 1) % accumulation_steps == 0 or index + 1 == len(micro_batches)
            if is_ddp:
                model.require_backward_grad_sync = last
            (mean_loss(model, micro_batch) / accumulation_steps).backward()
            if last:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return run


def bare_loop_step(accumulation_steps: int):  # noqa: ANN201
    """Return a step function for the nanoGPT-style loop (:func:`bare_loop`) on a 🤗 model:
    the model's mean loss divided by k, backward per micro-batch, step and zero once per
    window (or at the end of the data).
    """

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        model.train()
        bare_loop(model, make_optimizer(model.parameters()), accumulation_steps)(micro_batches)

    return step


def _accelerate_micro_step(accelerator: Any, model: nn.Module, optimizer: Any,
                           mean_loss: _MeanLoss, micro_batch: Any) -> None:
    """One micro-batch the way Accelerate documents it: inside ``accelerator.accumulate``,
    ``accelerator.backward`` (which divides by k), then ``optimizer.step()`` and
    ``zero_grad()`` (no-ops until the window's last micro-step, or the data's end)."""
    with accelerator.accumulate(model):
        accelerator.backward(mean_loss(model, micro_batch))
        optimizer.step()
        optimizer.zero_grad()


def accelerate_loop(model: nn.Module, optimizer: torch.optim.Optimizer, accumulation_steps: int,
                    mean_loss: _MeanLoss = model_mean_loss):  # noqa: ANN201
    """Return ``(run(micro_batches), prepared_model)`` for Accelerate without a prepared
    DataLoader (a benchmark of the loop's overhead; windows are counted by calls)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=accumulation_steps,
                              cpu=not torch.cuda.is_available())
    prepared_model, prepared_optimizer = accelerator.prepare(model, optimizer)

    def run(micro_batches: Sequence[Any]) -> None:
        for micro_batch in micro_batches:
            _accelerate_micro_step(accelerator, prepared_model, prepared_optimizer, mean_loss,
                                  micro_batch)

    return run, prepared_model


def accelerate_step(accumulation_steps: int, *, count_window_items: bool = False):  # noqa: ANN201
    """Return a step function for HF Accelerate: ``Accelerator(gradient_accumulation_steps=k)``,
    a prepared DataLoader, and the documented ``with accelerator.accumulate(model):`` loop.

    ``accelerator.backward`` divides every loss by k. With ``count_window_items`` the loop
    instead counts the window's items first and backpropagates ``summed loss / window items
    * k`` (cancelling that division), which is exact for any window, partial ones included.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        accelerator = Accelerator(gradient_accumulation_steps=accumulation_steps, cpu=True)
        dataset = WindowDataset(micro_batches)
        loader = torch.utils.data.DataLoader(dataset, batch_size=dataset.micro_batch_size,
                                             shuffle=False)
        optimizer = make_optimizer(model.parameters())
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        model.train()
        window_items = sum(len(mb["labels"]) for mb in micro_batches)  # one window here
        def window_mean_loss(model: nn.Module, micro_batch: Mapping[str, Tensor]) -> Tensor:
            summed, _ = bert_classification_loss(model, micro_batch)  # cancels backward's 1/k
            return summed / window_items * accelerator.gradient_accumulation_steps

        loss = window_mean_loss if count_window_items else model_mean_loss
        for micro_batch in loader:
            _accelerate_micro_step(accelerator, model, optimizer, loss, micro_batch)

    return step
