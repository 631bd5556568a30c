"""transformers PR #46204 (https://github.com/huggingface/transformers/pull/46204), merged: the
Trainer counts ``labels[..., 1:]`` for ``num_items_in_batch`` only when the model's
``loss_type`` maps to ``ForCausalLMLoss``. GPT2LMHeadModel's ``loss_type`` is None, and TRL's
SFT collator labels every position (labels = input_ids), so SFTTrainer divides the predicted
tokens' summed loss by the labelled positions, position 0 included: the update and the logged
loss are 56/64 of the truth's (equal), 30/38 (uneven; on 2 ranks too), 28/32 (partial); under
clipping the logged loss only. With ``model.loss_type = "ForCausalLM"`` the update matches.

Cells: TRL SFTTrainer × equal, uneven, partial, clip, two_ranks.
Run: ``python -m gradaccum_course.audits.conformance.repro.trl_position_0 [--two-ranks]`` (2
torchrun processes); exits 1 if the deviation is gone or has changed."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from .. import two_ranks
from ..scenarios import SCENARIOS, window_mean_loss
from ..trl import sft_step
from ..verdicts import TOLERANCE
from ._common import audit, logged_report, model_losses, report, weighted_mean_losses_step

SCENARIO = {scenario.key: scenario for scenario in SCENARIOS}
#: scenario -> (micro-batches in the window, its labelled positions, max_grad_norm)
LABELLED = {"equal": (4, 64, 0.0), "uneven": (4, 38, 0.0), "partial": (2, 32, 0.0),
            "clip": (4, 64, 1.0)}


def main(argv: list[str] | None = None) -> int:
    """Audit SFTTrainer (k = 4) against the loop that divides by the labelled positions."""
    status = 0
    for key, (count, labelled, clip) in LABELLED.items():
        kept: dict[str, float] = {}
        measured, over = audit(sft_step(4, clip, kept), key), torch.tensor(labelled)
        explained = audit(weighted_mean_losses_step([1.0] * count, num_items_in_batch=over), key)
        if not clip:  # clipping rescales the update to the truth's norm, not the logged loss
            status = max(status, report(f"TRL SFTTrainer × {key} (transformers PR #46204)",
                                        measured, explained))
        true = window_mean_loss(SCENARIO[key].model(), SCENARIO[key].micro_batches())
        status = max(status, logged_report(f"TRL SFTTrainer × {key}", kept["train_loss"],
                                           sum(model_losses(key, num_items_in_batch=over)), true))
    fixed = audit(lambda model, *rest: (setattr(model, "loss_type", "ForCausalLM"),
                                        sft_step(4)(model, *rest)), "equal")
    print(f"with loss_type = 'ForCausalLM': relative error {fixed.relative_difference:.1g}")
    status = max(status, int(fixed.relative_difference > TOLERANCE))
    if "--two-ranks" in (argv or []):
        result = two_ranks.run("trl", SCENARIO["two_ranks"])
        measured = SimpleNamespace(norm_ratio=result["norm_ratio"],
                                   relative_difference=result["gradient_relative_error"])
        explained = audit(weighted_mean_losses_step([1.0] * 4, num_items_in_batch=38), "uneven")
        status = max(status, report("TRL SFTTrainer × two_ranks", measured, explained))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
