"""https://github.com/huggingface/transformers/pull/46204 counts ``labels[..., 1:]`` only for a
causal-LM ``loss_type``; GPT2LMHeadModel's is None, so the 🤗 Trainer still counts every label
that is not -100: with ``labels = input_ids`` a GPT-2's position 0 is labelled, but the shifted
causal-LM loss never predicts it. So
``num_items_in_batch`` is 64 labelled positions for 56 predicted tokens, and the update is
56/64 of the large batch's, and so is the loss it logs (the ``position_0`` scenario: equal
micro-batches, k = 4).

Cell: 🤗 Trainer × position_0 (the update and the logged loss).
Run: ``python -m gradaccum_course.audits.conformance.repro.trainer_position_0``; exits 1 if
the deviation is gone or has changed.
"""

from __future__ import annotations

import sys

import torch

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
    """Audit the Trainer (k = 4) and the loop that sums every micro-batch's token loss and
    divides by 64, the labelled positions."""
    measured = audit(hf_trainer_step(4, shuffle=False), "position_0")
    explained = audit(weighted_mean_losses_step([1.0] * 4, num_items_in_batch=torch.tensor(64)),
                      "position_0")
    print(f"56 / 64 = {56 / 64:.4f}")
    status = report("🤗 Trainer × position_0 (transformers PR #46204)", measured, explained)
    logged, true = trainer_logged_loss("position_0")
    over_64 = sum(model_losses("position_0", num_items_in_batch=torch.tensor(64)))
    return max(status, logged_report("🤗 Trainer × position_0", logged, over_64, true))


if __name__ == "__main__":
    sys.exit(main())
