"""No upstream thread found (unexplained). A window that holds 2 micro-batches where
``gradient_accumulation_steps`` is 4 (the end of the data): ``accelerator.backward`` still
divides each micro-batch's loss by the configured 4, so the update is 2/4 of the large batch's
(the ``partial`` scenario: 2 equal micro-batches of 14 predicted tokens).

Cell: Accelerate accumulate() × partial.
Run: ``python -m gradaccum_course.audits.conformance.repro.accelerate_partial``; exits 1 if the
deviation is gone or has changed.
"""

from __future__ import annotations

import sys

from ...frameworks import accelerate_step
from ._common import audit, report, weighted_mean_losses_step


def main() -> int:
    """Audit Accelerate (k = 4, a window of 2) and the loop dividing each mean by 4."""
    measured = audit(accelerate_step(4), "partial")
    explained = audit(weighted_mean_losses_step([1 / 4] * 2), "partial")
    return report("Accelerate × partial", measured, explained)


if __name__ == "__main__":
    sys.exit(main())
