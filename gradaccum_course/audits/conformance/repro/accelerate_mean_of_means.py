"""https://github.com/huggingface/accelerate/pull/3193 (its guide: count the window's tokens
yourself). Accelerate's basic documented loop, ``with
accelerator.accumulate(model): accelerator.backward(model(**batch).loss)``, divides each
micro-batch's MEAN loss by k: with uneven tokens per micro-batch (14, 2, 9, 5; k = 4) the
update is the mean of the micro-batch means', not the large batch's token mean. The model's
forward does not matter: Accelerate passes no token count (the ``uneven``, ``no_kwargs`` and
``drops_kwargs`` scenarios give the same ratio).

Cells: Accelerate accumulate() × uneven, no_kwargs, drops_kwargs.
Run: ``python -m gradaccum_course.audits.conformance.repro.accelerate_mean_of_means``; exits 1
if a deviation is gone or has changed.
"""

from __future__ import annotations

import sys

from ...frameworks import accelerate_step
from ._common import audit, report, weighted_mean_losses_step


def main() -> int:
    """Audit Accelerate (k = 4) and the mean-of-means loop on the three scenarios."""
    status = 0
    for key in ("uneven", "no_kwargs", "drops_kwargs"):
        measured = audit(accelerate_step(4), key)
        explained = audit(weighted_mean_losses_step([1 / 4] * 4), key)
        status = max(status, report(f"Accelerate × {key}", measured, explained))
    return status


if __name__ == "__main__":
    sys.exit(main())
