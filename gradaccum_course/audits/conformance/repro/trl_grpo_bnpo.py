"""TRL #3021 (https://github.com/huggingface/trl/issues/3021), open: under gradient accumulation
GRPOTrainer's ``loss_type="bnpo"`` divides each micro-batch's summed token loss by that
micro-batch's own completion tokens, then by k, as GRPOConfig's docstring says ("normalization
is performed over the local batch only"). On uneven completion lengths the update of k = 4
micro-batches of 2 is then not that of one batch of 8 under bnpo itself (its window's token
mean): the measured update is the explaining loop's, which weighs micro-batch i by 1/(4 n_i).

Cell: TRL GRPOTrainer × bnpo (the GRPO table).
Run: ``python -m gradaccum_course.audits.conformance.repro.trl_grpo_bnpo``; exits 1 if the
deviation is gone or has changed."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from ..grpo import ACCUMULATION_STEPS, MICRO_BATCH_SIZE, grpo_run, token_weighted_update
from ._common import report


def _against(update, large) -> SimpleNamespace:  # noqa: ANN001
    return SimpleNamespace(norm_ratio=float(update.norm() / large.norm()),
                           relative_difference=float((update - large).norm() / large.norm()))


def main() -> int:
    """Run bnpo as k = 4 micro-batches of 2 and as one batch of 8 on the same completions."""
    a = grpo_run("bnpo", MICRO_BATCH_SIZE, ACCUMULATION_STEPS)
    b = grpo_run("bnpo", MICRO_BATCH_SIZE * ACCUMULATION_STEPS, 1)
    assert a["generated"][0]["completion_ids"].equal(b["generated"][0]["completion_ids"])
    tokens = [float(mb["completion_mask"].sum()) for mb in a["micro_batches"]]
    print(f"completion tokens per micro-batch: {[int(n) for n in tokens]}")
    explained = token_weighted_update(a["micro_batches"],
                                      [1 / (ACCUMULATION_STEPS * n) for n in tokens])
    large = token_weighted_update(b["micro_batches"], [1 / sum(tokens)])
    check = _against(large, b["update"]).relative_difference  # the loop is bnpo's gradient
    print(f"the loop's one batch of 8 against GRPOTrainer's: relative error {check:.1g}")
    status = report("TRL GRPOTrainer × bnpo (TRL #3021)", _against(a["update"], b["update"]),
                    _against(explained, b["update"]))
    return max(status, int(check > 1e-6))


if __name__ == "__main__":
    sys.exit(main())
