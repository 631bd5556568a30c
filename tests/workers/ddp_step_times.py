"""Test worker: gradaccum_lib.planning.time_ddp_steps under torchrun (gloo on CPU).

Usage: ddp_step_times.py K,K,... REPEATS --json PATH. Rank 0 writes every (k, sync)'s samples.
"""

from __future__ import annotations

import json
import sys

from gradaccum_lib.data import make_toy_classification
from gradaccum_lib.distributed import init_distributed, process_group_session, run_worker
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.models import make_mlp
from gradaccum_lib.planning import time_ddp_steps


def main() -> int:
    ks = [int(k) for k in sys.argv[1].split(",")]
    repeats, json_path = int(sys.argv[2]), sys.argv[-1]
    with process_group_session():
        ctx = init_distributed()
        inputs, labels = make_toy_classification(8 * max(ks), 16, 4, seed=ctx.rank)
        micro_batches = list(zip(inputs.split(8), labels.split(8), strict=True))
        timings = time_ddp_steps(make_mlp(16, 256, 4, seed=0), sample_classification_loss,
                                 micro_batches, ks, repeats=repeats)
        if ctx.is_main:
            with open(json_path, "w") as handle:
                json.dump({"world_size": ctx.world_size,
                           "timings": [[k, sync, list(t.samples)]
                                       for (k, sync), t in timings.items()]}, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
