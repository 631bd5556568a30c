"""The 🤗 Trainer's column of the conformance table, through the audits' public functions:
the update by :func:`~gradaccum_course.audits.hf_trainer.hf_trainer_step` (its sequential
sampler, so the micro-batches are the scenario's), the logged loss by
:func:`~gradaccum_course.audits.hf_trainer.hf_trainer_clipped_run` (its default random sampler,
the loss it logs for the step next to the true mean of the samples it put in the window);
:func:`logging_step`, the sequential Trainer that keeps its logged loss, serves the 2-rank
scenario and the reproduction programs."""

from __future__ import annotations

import tempfile
from importlib.metadata import version

from gradaccum_lib.equivalence import audit_update

from ..hf_trainer import build_trainer, hf_trainer_clipped_run, hf_trainer_step
from .scenarios import Scenario, make_optimizer

__all__ = ["NAME", "PACKAGE", "logging_step", "run"]

NAME, PACKAGE = "🤗 Trainer", "transformers"


def run(scenario: Scenario) -> dict[str, float | None | str]:
    """Return the Trainer's cell for ``scenario``: the update's relative error against the
    large batch's, and the loss it logs next to the window's true mean."""
    model, parts = scenario.model(), scenario.micro_batches()
    clip = scenario.max_grad_norm or None
    step = hf_trainer_step(scenario.accumulation_steps, max_grad_norm=scenario.max_grad_norm,
                           shuffle=False)
    audit = audit_update(step, model, scenario.loss_fn, parts, make_optimizer,
                         max_grad_norm=clip)
    (logged,) = hf_trainer_clipped_run(model, parts, make_optimizer, scenario.accumulation_steps,
                                       max_grad_norm=scenario.max_grad_norm,
                                       loss_fn=scenario.loss_fn)
    return {"gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "logged_loss": logged.logged_loss,
            "true_loss": logged.true_loss, "version": version(PACKAGE)}


def logging_step(accumulation_steps: int, logged: dict[str, float]):  # noqa: ANN202
    """:func:`~gradaccum_course.audits.hf_trainer.hf_trainer_step`'s Trainer (sequential
    sampler, no clipping) with logging at every step: the step's logged ``loss`` (as the
    Trainer hands it to its callbacks, on this rank) goes to ``logged``."""
    from transformers import TrainerCallback

    class KeepLoss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003, ANN201, ARG002
            if logs and "loss" in logs:
                logged.setdefault("train_loss", float(logs["loss"]))

    def step(model, micro_batches: list, make_optimizer) -> None:  # noqa: ANN001
        with tempfile.TemporaryDirectory() as output_dir:
            build_trainer(model, micro_batches, make_optimizer(model.parameters()),
                           accumulation_steps, output_dir, callbacks=[KeepLoss()],
                           log_every_step=True, shuffle=False).train()

    return step
