"""transformers #47688 (https://github.com/huggingface/transformers/issues/47688), open: a head
whose ``forward`` declares ``**kwargs`` but drops ``num_items_in_batch`` is taken to normalise
by the window's token count, so the Trainer does not divide its loss by k; the model returns
its micro-batch's mean, and the update is the SUM of the k micro-batch means' (about k times
too large; the ``drops_kwargs`` scenario: predicted tokens 14, 2, 9, 5; k = 4), and the loss
it logs is the sum of the micro-batch mean losses.

Cell: 🤗 Trainer × drops_kwargs (the update and the logged loss).
Run: ``python -m gradaccum_course.audits.conformance.repro.trainer_drops_kwargs``; exits 1 if
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
    """Audit the Trainer (k = 4, sequential order) and the sum-of-means loop."""
    measured = audit(hf_trainer_step(4, shuffle=False), "drops_kwargs")
    explained = audit(weighted_mean_losses_step([1.0] * 4), "drops_kwargs")
    status = report("🤗 Trainer × drops_kwargs (transformers #47688)", measured, explained)
    logged, true = trainer_logged_loss("drops_kwargs")
    summed = sum(model_losses("drops_kwargs"))
    return max(status, logged_report("🤗 Trainer × drops_kwargs", logged, summed, true))


if __name__ == "__main__":
    sys.exit(main())
