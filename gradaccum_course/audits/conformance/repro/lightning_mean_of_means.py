"""Lightning #20350 (https://github.com/Lightning-AI/pytorch-lightning/issues/20350), open:
``accumulate_grad_batches=k`` divides each micro-batch's mean loss by k, so with uneven tokens
per micro-batch (14, 2, 9, 5; k = 4) the update is the mean of the micro-batch means', not the
large batch's token mean. The loss logged with ``self.log(..., on_epoch=True)`` is the same
mean of means (weighted by the batch size Lightning infers, 2 sequences each), not the
window's token mean: no thread found for the logged value.

Cells: Lightning × uneven, no_kwargs, drops_kwargs (update and logged loss).
Run: ``python -m gradaccum_course.audits.conformance.repro.lightning_mean_of_means``; exits 1
if a deviation is gone or has changed.
"""

from __future__ import annotations

import sys

import torch

from ..lightning import fit_step
from ..scenarios import SCENARIOS, window_mean_loss
from ._common import audit, report, weighted_mean_losses_step


def main() -> int:
    """Audit one Lightning epoch (k = 4) and the mean-of-means loop on the three scenarios,
    and hold its logged loss against the mean of the micro-batch mean losses."""
    status = 0
    for scenario in [s for s in SCENARIOS if s.key in ("uneven", "no_kwargs", "drops_kwargs")]:
        logged = {}
        measured = audit(fit_step(4, 0.0, logged), scenario.key)
        explained = audit(weighted_mean_losses_step([1 / 4] * 4), scenario.key)
        status = max(status, report(f"Lightning × {scenario.key}", measured, explained))
        model, parts = scenario.model(), scenario.micro_batches()
        with torch.no_grad():
            mean_of_means = sum(float(model(**mb).loss) for mb in parts) / len(parts)
        true = window_mean_loss(model, parts)
        print(f"  logged {logged['train_loss']:.6f}, mean of means {mean_of_means:.6f}, "
              f"window's token mean {true:.6f}")
        if abs(logged["train_loss"] - mean_of_means) > 1e-6 * true or abs(
                logged["train_loss"] - true) <= 1e-6 * true:
            print(f"Lightning × {scenario.key}: the logged loss has CHANGED")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
