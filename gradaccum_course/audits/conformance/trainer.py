"""The 🤗 Trainer's column of the conformance table, through the audits' public functions:
the update by :func:`~gradaccum_course.audits.hf_trainer.hf_trainer_step` (its sequential
sampler, so the micro-batches are the scenario's), the logged loss by
:func:`~gradaccum_course.audits.hf_trainer.hf_trainer_clipped_run` (its default random sampler,
the loss it logs for the step next to the true mean of the samples it put in the window)."""

from __future__ import annotations

from importlib.metadata import version

from gradaccum_lib.equivalence import audit_update

from ..hf_trainer import hf_trainer_clipped_run, hf_trainer_step
from .scenarios import Scenario, make_optimizer, token_loss

__all__ = ["NAME", "PACKAGE", "run"]

NAME, PACKAGE = "🤗 Trainer", "transformers"


def run(scenario: Scenario) -> dict[str, float | None | str]:
    """Return the Trainer's cell for ``scenario``: the update's relative error against the
    large batch's, and the loss it logs next to the window's true mean."""
    model, parts = scenario.model(), scenario.micro_batches()
    clip = scenario.max_grad_norm or None
    step = hf_trainer_step(scenario.accumulation_steps, max_grad_norm=scenario.max_grad_norm,
                           shuffle=False)
    audit = audit_update(step, model, token_loss, parts, make_optimizer, max_grad_norm=clip)
    (logged,) = hf_trainer_clipped_run(model, parts, make_optimizer, scenario.accumulation_steps,
                                       max_grad_norm=scenario.max_grad_norm, loss_fn=token_loss)
    return {"gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "logged_loss": logged.logged_loss,
            "true_loss": logged.true_loss, "version": version(PACKAGE)}
