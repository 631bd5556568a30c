"""A design choice, not a bug (Qiu et al. 2025, arXiv 2501.11873: MoE frameworks usually take
each micro-batch's load-balancing loss). A Qwen3-MoE's load-balancing loss is a product of
two batch means (the share of tokens routed to each expert and its mean router probability),
so the window's is not the mean of the micro-batches'. Accelerate's ``accumulate()`` and
Lightning divide each micro-batch's loss by k, TRL's SFTTrainer divides the auxiliary term by
the accumulation steps: the auxiliary part of the update has the large batch's weight (about 1)
but is the mean of the micro-batches' load-balancing gradients, about 30% off the window's in
the ``moe_aux`` scenario (equal micro-batches, k = 4, coefficient 0.001); notebook 08 §2 shows
the exact way (the window's routed counts). The cross-entropy part matches.

Cells: Accelerate accumulate(), Lightning, TRL SFTTrainer × moe_aux (the update).
Run: ``python -m gradaccum_course.audits.conformance.repro.moe_mean_of_aux``; exits 1 if a
deviation is gone or has changed.
"""

from __future__ import annotations

import sys

from ..moe import decompose, step_function
from ..scenarios import SCENARIOS
from ._common import audit, report, weighted_mean_losses_step


def main() -> int:
    """Audit each framework (k = 4) and the loop that backpropagates each micro-batch's own
    loss (cross-entropy mean plus its load-balancing term) divided by 4."""
    (scenario,) = [s for s in SCENARIOS if s.key == "moe_aux"]
    explained = audit(weighted_mean_losses_step([1 / 4] * 4), "moe_aux")
    status = 0
    for framework in ("accelerate", "lightning", "trl"):
        measured = audit(step_function(framework, 4), "moe_aux")
        parts = decompose(framework, scenario)
        print(f"{framework}: cross-entropy part: relative error {parts['ce_relative_error']:.1e};"
              f" auxiliary part: weight {parts['aux_weight']:.3f}, relative error "
              f"{parts['aux_relative_error']:.3f}")
        status = max(status, report(f"{framework} × moe_aux", measured, explained))
        if not 0.99 < parts["aux_weight"] < 1.01 or parts["aux_relative_error"] < 0.1:
            print(f"{framework} × moe_aux: the deviation has CHANGED")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
