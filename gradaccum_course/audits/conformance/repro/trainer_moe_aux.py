"""No upstream thread found in transformers (unexplained upstream). A Qwen3-MoE adds
``router_aux_loss_coef`` times its router's load-balancing loss to its loss. The 🤗 Trainer
passes ``num_items_in_batch``, so the cross-entropy part is the window's sum over its token
count (exact), but the auxiliary term of every micro-batch is added unscaled: over k = 4
micro-batches its weight in the update is about 4 times the large batch's (the ``moe_aux``
scenario: equal micro-batches, coefficient 0.001), and the logged loss carries it 4 times too.
The same mechanism was fixed in another framework (NeMo AutoModel,
https://github.com/NVIDIA-NeMo/Automodel/pull/3359).

Cell: 🤗 Trainer × moe_aux (the update and the logged loss).
Run: ``python -m gradaccum_course.audits.conformance.repro.trainer_moe_aux``; exits 1 if the
deviation is gone or has changed.
"""

from __future__ import annotations

import sys

import torch

from ...hf_trainer import hf_trainer_step
from ..moe import decompose
from ..scenarios import SCENARIOS
from ._common import (
    audit,
    logged_report,
    model_losses,
    report,
    trainer_logged_loss,
    weighted_mean_losses_step,
)


def main() -> int:
    """Audit the Trainer (k = 4) and the loop that backpropagates each micro-batch's own loss
    with num_items_in_batch = 56 (the window's predicted tokens): its auxiliary term unscaled."""
    measured = audit(hf_trainer_step(4, shuffle=False), "moe_aux")
    explained = audit(weighted_mean_losses_step([1.0] * 4, num_items_in_batch=torch.tensor(56)),
                      "moe_aux")
    (scenario,) = [s for s in SCENARIOS if s.key == "moe_aux"]
    parts = decompose("trainer", scenario)
    print(f"cross-entropy part: relative error {parts['ce_relative_error']:.1e}; auxiliary "
          f"part: weight {parts['aux_weight']:.3f} x the large batch's (k = 4)")
    status = report("🤗 Trainer × moe_aux (no thread found)", measured, explained)
    if not 3.9 < parts["aux_weight"] < 4.1 or parts["ce_relative_error"] > 1e-6:
        print("🤗 Trainer × moe_aux: the deviation has CHANGED")
        status = 1
    logged, true = trainer_logged_loss("moe_aux")
    summed = sum(model_losses("moe_aux", num_items_in_batch=torch.tensor(56)))
    return max(status, logged_report("🤗 Trainer × moe_aux", logged, summed, true))


if __name__ == "__main__":
    sys.exit(main())
