"""PyTorch Lightning's ``accumulate_grad_batches``, run as its documentation shows, audited.

- :func:`lightning_step` is a step function for :func:`gradaccum_lib.equivalence.audit_update`:
  a ``LightningModule`` whose ``training_step`` returns the 🤗 model's own (mean) loss, a
  ``Trainer(accumulate_grad_batches=k)`` and one epoch over the window's micro-batches.
- :func:`lightning_step_counts` runs one epoch and counts what Lightning calls steps: the
  optimizer's ``step`` calls, ``trainer.global_step`` and the scheduler's steps (a scheduler
  configured with ``"interval": "step"``, as for a warm-up).

Lightning runs on the CPU, quietly: no progress bar, logger, checkpoints or model summary,
its info messages silenced, anything it writes kept in a temporary ``default_root_dir``.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gradaccum_lib.equivalence import OptimizerFactory
from gradaccum_lib.runtime import check_positive_int

from .frameworks import WindowDataset, model_mean_loss

__all__ = ["LightningCounts", "lightning_step", "lightning_step_counts"]


@dataclass(frozen=True)
class LightningCounts:
    """What one Lightning epoch of ``micro_batches`` micro-batches counted."""

    micro_batches: int
    accumulation_steps: int
    optimizer_steps: int  # calls of the optimizer's own step()
    global_step: int  # trainer.global_step at the end of the epoch
    scheduler_steps: int  # steps of a scheduler configured with interval "step"


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence Lightning's info messages and its advice warnings (workers, logging)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric",
                                                    "pytorch_lightning", "lightning")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
            warnings.filterwarnings("ignore", module=r"pytorch_lightning(\..*)?")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _lightning_fit(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]],
                   make_optimizer: OptimizerFactory, accumulation_steps: int, *,
                   step_scheduler: bool = False,
                   ) -> tuple[object, torch.optim.Optimizer, object]:
    """Fit ``model`` (trained in place) for one epoch over the micro-batches' samples, in
    order, with ``Trainer(accumulate_grad_batches=k)`` and a ``LightningModule`` returning
    ``model(**batch).loss``. With ``step_scheduler``, ``configure_optimizers`` also returns a
    constant ``LambdaLR`` stepped per optimizer step (``"interval": "step"``). Returns
    ``(trainer, optimizer, scheduler or None)``.
    """
    import lightning

    check_positive_int("accumulation_steps", accumulation_steps)
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    optimizer = make_optimizer(model.parameters())
    scheduler = (torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
                 if step_scheduler else None)

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: dict, batch_idx: int) -> Tensor:  # noqa: ARG002
            return model_mean_loss(self.model, batch)

        def configure_optimizers(self):  # noqa: ANN202
            if scheduler is None:
                return optimizer
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    dataset = WindowDataset(micro_batches)
    loader = torch.utils.data.DataLoader(dataset, batch_size=dataset.micro_batch_size,
                                         shuffle=False)
    with _quiet(), tempfile.TemporaryDirectory() as root:
        trainer = lightning.Trainer(
            accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=accumulation_steps,
            logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0,
        )
        trainer.fit(Module(), train_dataloaders=loader)
    return trainer, optimizer, scheduler


def lightning_step(accumulation_steps: int):  # noqa: ANN201
    """Return a step function for :func:`~.equivalence.audit_update`: Lightning with
    ``accumulate_grad_batches=k`` over the window's micro-batches (:func:`_lightning_fit`)."""
    check_positive_int("accumulation_steps", accumulation_steps)

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        model.train()
        _lightning_fit(model, micro_batches, make_optimizer, accumulation_steps)

    return step


def lightning_step_counts(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]],
                          make_optimizer: OptimizerFactory,
                          accumulation_steps: int) -> LightningCounts:
    """Run one Lightning epoch over ``micro_batches`` on ``model`` (trained in place) with a
    per-step scheduler, and count the optimizer's step calls, ``trainer.global_step`` and
    the scheduler's steps."""
    counted = [0]

    def counting_optimizer(parameters) -> torch.optim.Optimizer:  # noqa: ANN001
        optimizer = make_optimizer(parameters)
        optimizer.register_step_post_hook(lambda *_: counted.__setitem__(0, counted[0] + 1))
        return optimizer

    model.train()
    trainer, _, scheduler = _lightning_fit(model, micro_batches, counting_optimizer,
                                           accumulation_steps, step_scheduler=True)
    return LightningCounts(micro_batches=len(list(micro_batches)),
                           accumulation_steps=accumulation_steps, optimizer_steps=counted[0],
                           global_step=trainer.global_step, scheduler_steps=scheduler.last_epoch)
