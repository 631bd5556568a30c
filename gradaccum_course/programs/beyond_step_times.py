"""One optimizer step's time under DDP, for notebook 06, section 5 ("Where the time goes").

The notebook runs it under torchrun through ``launch()``:

    torchrun --nproc_per_node=N -m gradaccum_course.programs.beyond_step_times \
        --ks 1,2,4,8 --repeats 30 --json PATH

What it times: one window of k micro-batches of 8, stepped by ``accumulate_window`` on its own
DDP copy of notebook 05's MLP (section 3), syncing the gradients once per window and every
micro-step, for each k. The steps are timed interleaved (``time_interleaved``: every step once
per round, in a rotated order, after 2 warm-up rounds), so that a slow moment of the machine
hits them alike. Each rank takes its own 8 x max(k) samples, seeded by its rank; each sample
kept is the slowest rank's. Rank 0 writes the samples and the model's parameter bytes as JSON.
"""

import argparse
import copy
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.programs import syncing_every_micro_step
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.distributed import init_distributed
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.bench import time_interleaved
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

parser = argparse.ArgumentParser()
parser.add_argument("--ks", default="1,2,4,8")
parser.add_argument("--repeats", type=int, default=30)
parser.add_argument("--json", required=True)
arguments = parser.parse_args()
ks = [int(k) for k in arguments.ks.split(",")]
ctx = init_distributed()
inputs, labels = make_toy_classification(8 * max(ks), 16, 4, seed=ctx.rank)
micro_batches = [(x.to(ctx.device), y.to(ctx.device))
                 for x, y in zip(inputs.split(8), labels.split(8), strict=True)]
model = make_mlp(16, 256, 4, seed=0).to(ctx.device)


def step(k, sync):
    """One window of k micro-batches, on its own DDP copy of the model."""
    ddp = DistributedDataParallel(copy.deepcopy(model))
    if sync == "every":  # the slow way, for comparison: no_sync does nothing on this copy
        syncing_every_micro_step(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    return lambda: accumulate_window(ddp, optimizer, micro_batches[:k], sample_classification_loss)


timings = time_interleaved({(k, sync): step(k, sync) for k in ks for sync in ("window", "every")},
                           repeats=arguments.repeats, warmup=2)
slowest = {}
for key, timing in timings.items():  # each sample: the slowest rank's
    samples = torch.tensor(timing.samples, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX)
    slowest[key] = samples.tolist()
if ctx.is_main:
    with open(arguments.json, "w") as handle:
        json.dump({"world_size": ctx.world_size,
                   "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                   "timings": [[k, sync, samples] for (k, sync), samples in slowest.items()]},
                  handle)
dist.destroy_process_group()
os._exit(0)  # skip interpreter teardown, where gloo's threads can abort
