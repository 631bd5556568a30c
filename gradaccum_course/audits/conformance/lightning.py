"""Lightning's column of the conformance table: ``Trainer(accumulate_grad_batches=k,
gradient_clip_val=...)`` over the window's micro-batches, a ``LightningModule`` whose
``training_step`` returns the model's own loss and logs it the documented way,
``self.log("train_loss", loss, on_epoch=True)`` (Lightning's epoch value: the mean of the
micro-batch losses weighted by the batch size it infers, here sequences). The update without
clipping is the audits' :func:`~gradaccum_course.audits.lightning.lightning_step`'s (the tests
hold the two equal)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from importlib.metadata import version

import torch
from torch import Tensor, nn

from gradaccum_lib.equivalence import OptimizerFactory, audit_update

from ..frameworks import WindowDataset, model_mean_loss
from .scenarios import Scenario, make_optimizer, window_mean_loss

__all__ = ["NAME", "PACKAGE", "fit_step", "run"]

NAME, PACKAGE = "Lightning", "lightning"
_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")


def fit_step(accumulation_steps: int, max_grad_norm: float, logged: dict[str, float], *,  # noqa: ANN201
             devices: int = 1):
    """Return a step function for :func:`~gradaccum_lib.equivalence.audit_update`: one quiet
    Lightning epoch over the window (on ``devices`` CPU processes: DDP under torchrun); the
    epoch's logged ``train_loss`` goes to ``logged``."""
    import lightning

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        optimizer = make_optimizer(model.parameters())

        class Module(lightning.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def training_step(self, batch: dict, batch_idx: int) -> Tensor:  # noqa: ARG002
                loss = model_mean_loss(self.model, batch)
                self.log("train_loss", loss, on_step=False, on_epoch=True)
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return optimizer

        dataset = WindowDataset(micro_batches)
        loader = torch.utils.data.DataLoader(dataset, batch_size=dataset.micro_batch_size)
        levels = {name: logging.getLogger(name).level for name in _LOGGERS}
        for name in _LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), tempfile.TemporaryDirectory() as root:
                warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
                trainer = lightning.Trainer(
                    accelerator="cpu", devices=devices, max_epochs=1,
                    strategy="ddp" if devices > 1 else "auto",
                    accumulate_grad_batches=accumulation_steps,
                    gradient_clip_val=max_grad_norm or None, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0)
                trainer.fit(Module(), train_dataloaders=loader)
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
        logged["train_loss"] = float(trainer.callback_metrics["train_loss"])

    return step


def run(scenario: Scenario) -> dict[str, float | None | str]:
    """Return Lightning's cell for ``scenario``: the update's relative error against the large
    batch's, and the epoch's logged loss next to the window's true mean."""
    model, parts, logged = scenario.model(), scenario.micro_batches(), {}
    step = fit_step(scenario.accumulation_steps, scenario.max_grad_norm, logged)
    audit = audit_update(step, model, scenario.loss_fn, parts, make_optimizer,
                         max_grad_norm=scenario.max_grad_norm or None)
    return {"gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "logged_loss": logged["train_loss"],
            "true_loss": window_mean_loss(model, parts, scenario.loss_fn),
            "version": version(PACKAGE)}
