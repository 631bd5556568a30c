"""Lightning #19987 (https://github.com/Lightning-AI/pytorch-lightning/issues/19987), open:
the last, incomplete window of an epoch is scaled by ``accumulate_grad_batches`` instead of by
the batches it holds: with 2 micro-batches and ``accumulate_grad_batches=4`` the update is 2/4
of the large batch's (the ``partial`` scenario: 2 equal micro-batches of 14 predicted tokens).

Cell: Lightning × partial.
Run: ``python -m gradaccum_course.audits.conformance.repro.lightning_partial``; exits 1 if the
deviation is gone or has changed.
"""

from __future__ import annotations

import sys

from ..lightning import fit_step
from ._common import audit, report, weighted_mean_losses_step


def main() -> int:
    """Audit one Lightning epoch (k = 4, a window of 2) and the loop dividing each mean by 4."""
    measured = audit(fit_step(4, 0.0, {}), "partial")
    explained = audit(weighted_mean_losses_step([1 / 4] * 2), "partial")
    return report("Lightning × partial (Lightning #19987)", measured, explained)


if __name__ == "__main__":
    sys.exit(main())
