"""https://github.com/huggingface/accelerate/pull/3193 (gather the window's token count) and
https://github.com/Lightning-AI/pytorch-lightning/issues/20350. On 2 gloo ranks, k = 2 each
(the ``two_ranks`` scenario: the 8 uneven sequences, 14, 2, 9, 5 predicted tokens per
micro-batch), Accelerate and Lightning divide every micro-batch's MEAN loss by k and DDP
averages the ranks: the update is the mean of the 4 micro-batch means' (the cause of
``accelerate_mean_of_means`` and Lightning #20350, over ranks). Accelerate gives rank r the
micro-batches r and r + 2. Lightning's DistributedSampler shuffles (seed 0) though the loader
given does not (``_process_dataloader``, lightning 2.6.6): rank 0 gets samples 4, 7, 2, 1,
rank 1 0, 3, 5, 6, so its micro-batches, and its ratio, differ. Its logged ``train_loss``
(``on_epoch=True``, ``sync_dist`` off by default) is rank 0's own mean of its 2 means.

Cells: Accelerate accumulate() × two_ranks; Lightning × two_ranks, its logged loss too.
Run: ``python -m gradaccum_course.audits.conformance.repro.two_ranks [accelerate|lightning]``
(torchrun, 2 processes); exits 1 if a deviation is gone or has changed.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from gradaccum_lib.batches import concatenate_micro_batches

from .. import two_ranks
from ..scenarios import SCENARIOS
from ._common import audit, report, weighted_mean_losses_step

#: the window's samples in the order each framework's 2 ranks group them into micro-batches
ORDERS = {"accelerate": [0, 1, 2, 3, 4, 5, 6, 7], "lightning": [4, 7, 2, 1, 0, 3, 5, 6]}


def main(frameworks: list[str]) -> int:
    """Run each framework on 2 ranks and audit the mean-of-means loop on its grouping."""
    (scenario,) = [s for s in SCENARIOS if s.key == "two_ranks"]
    status = 0
    for framework in frameworks:
        result = two_ranks.run(framework, scenario)
        measured = SimpleNamespace(norm_ratio=result["norm_ratio"],
                                   relative_difference=result["gradient_relative_error"])
        explained = audit(weighted_mean_losses_step([1 / 4] * 4), "two_ranks",
                          ORDERS[framework])
        status = max(status, report(f"{framework} × two_ranks", measured, explained))
        if framework == "lightning":  # rank 0 logs the mean of ITS micro-batches' mean losses
            model, window = scenario.model(), concatenate_micro_batches(scenario.micro_batches())
            with torch.no_grad():
                means = [float(model(**{n: v[ORDERS[framework][i:i + 2]] for n, v in
                                        window.items()}).loss) for i in (0, 2)]
            print(f"  logged on rank 0 {result['logged_loss']:.6f}, its mean of means "
                  f"{sum(means) / 2:.6f}, the window's token mean {result['true_loss']:.6f}")
            if abs(result["logged_loss"] - sum(means) / 2) > 1e-6 * result["true_loss"]:
                print("lightning × two_ranks: the logged loss has CHANGED")
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(ORDERS)))
