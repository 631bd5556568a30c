"""Accelerate's column of the conformance table: ``accelerator.accumulate(model)`` as its
documentation shows it (a prepared DataLoader, ``accelerator.backward`` of the model's own
loss), through :func:`~gradaccum_course.audits.frameworks.accelerate_step`; with clipping, the
same loop with ``accelerator.clip_grad_norm_`` on the micro-step that syncs. Accelerate logs no
loss of its own: that cell is not run."""

from __future__ import annotations

from importlib.metadata import version

import torch
from torch import nn

from gradaccum_lib.equivalence import OptimizerFactory, audit_update

from ..frameworks import WindowDataset, accelerate_step, model_mean_loss
from .scenarios import Scenario, make_optimizer

__all__ = ["NAME", "PACKAGE", "run"]

NAME, PACKAGE = "Accelerate accumulate()", "accelerate"
NO_LOGGED_LOSS = "Accelerate logs no loss: the loop's user logs what they compute"


def _clipping_step(accumulation_steps: int, max_grad_norm: float):  # noqa: ANN202
    """The documented loop with ``accelerator.clip_grad_norm_`` when gradients sync."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        accelerator = Accelerator(gradient_accumulation_steps=accumulation_steps, cpu=True)
        dataset = WindowDataset(micro_batches)
        loader = torch.utils.data.DataLoader(dataset, batch_size=dataset.micro_batch_size)
        model, optimizer, loader = accelerator.prepare(model, make_optimizer(model.parameters()),
                                                       loader)
        model.train()
        for micro_batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model_mean_loss(model, micro_batch))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()

    return step


def run(scenario: Scenario) -> dict[str, float | None | str]:
    """Return Accelerate's cell for ``scenario`` (its logged loss: None, with the reason)."""
    k = scenario.accumulation_steps
    step = (_clipping_step(k, scenario.max_grad_norm) if scenario.max_grad_norm
            else accelerate_step(k))
    audit = audit_update(step, scenario.model(), scenario.loss_fn, scenario.micro_batches(),
                         make_optimizer, max_grad_norm=scenario.max_grad_norm or None)
    return {"gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "logged_loss": None, "true_loss": None,
            "logged_not_run": NO_LOGGED_LOSS, "version": version(PACKAGE)}
