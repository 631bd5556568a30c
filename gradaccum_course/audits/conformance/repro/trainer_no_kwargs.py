"""transformers #37766 (https://github.com/huggingface/transformers/issues/37766): the 🤗
Trainer gives a model whose ``forward`` takes no loss kwargs (no ``**kwargs``, no
``num_items_in_batch``) no window token count, so it divides each micro-batch's mean loss by k:
the update is the mean of the micro-batch means', not the large batch's, and the loss it logs
is the mean of the micro-batch mean losses (the ``no_kwargs`` scenario: predicted tokens 14, 2,
9, 5; k = 4).

Cell: 🤗 Trainer × no_kwargs (the update and the logged loss).
Run: ``python -m gradaccum_course.audits.conformance.repro.trainer_no_kwargs``; exits 1 if
the deviation is gone or has changed.
"""

from __future__ import annotations

import sys

from ...hf_trainer import hf_trainer_step
from ._common import (
    audit,
    logged_report,
    model_losses,
    report,
    trainer_logged_loss,
    weighted_mean_losses_step,
)


def main() -> int:
    """Audit the Trainer (k = 4, sequential order) and the mean-of-means loop."""
    measured = audit(hf_trainer_step(4, shuffle=False), "no_kwargs")
    explained = audit(weighted_mean_losses_step([1 / 4] * 4), "no_kwargs")
    status = report("🤗 Trainer × no_kwargs (transformers #37766)", measured, explained)
    logged, true = trainer_logged_loss("no_kwargs")
    means = model_losses("no_kwargs")
    return max(status, logged_report("🤗 Trainer × no_kwargs", logged, sum(means) / 4, true))


if __name__ == "__main__":
    sys.exit(main())
