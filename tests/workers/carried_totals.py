"""Test worker: the engine's window totals ride in DDP's gradient all-reduce (2 gloo ranks).

For each way of registering the hook (none: the engine's own; a ``CommCounter``; a hook of the
user's, which the engine cannot ride: one all-reduce of its own a window; the engine's own with
``gradient_as_bucket_view=True``), trains 3 windows of a float32 MLP whose ranks hold different
numbers of samples (uneven counts: the division must use the global count) and counts the
all-reduces (``ProcessGroup.allreduce`` calls, whoever makes them) per window. Then a NaN loss
on rank 1 (both ranks must raise, no step taken) and a bfloat16 model (buckets that cannot
carry float64 totals: the engine falls back to an all-reduce of its own). Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch.nn.parallel import DistributedDataParallel

from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.batches import NonFiniteLossError, split_into_micro_batches
from gradaccum_lib.comm_hooks import CommCounter, reduce_bucket
from gradaccum_lib.data import make_toy_classification
from gradaccum_lib.distributed import init_distributed, process_group_session, run_worker
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.models import make_mlp

CALLS = {"all_reduce": 0}
_all_reduce = ProcessGroup.allreduce  # what dist.all_reduce and the engine's hook both call


def _counting_all_reduce(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    CALLS["all_reduce"] += 1
    return _all_reduce(*args, **kwargs)


def _users_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    return reduce_bucket(bucket)  # DDP's averaging, but not the engine's: nothing carried


def _train(how: str, windows: list, dtype: torch.dtype = torch.float32) -> dict:
    model = DistributedDataParallel(make_mlp(6, 1024, 3, seed=0, dtype=dtype),
                                    gradient_as_bucket_view=how == "bucket view")
    if how == "counter":
        CommCounter().register(model)
    elif how == "user hook":
        model.register_comm_hook(None, _users_hook)
    trainer = AccumulationTrainer(model, sample_classification_loss,
                                  torch.optim.SGD(model.parameters(), lr=0.5),
                                  accumulation_steps=len(windows[0]), progress=False)
    calls = []
    for window in windows:
        before = CALLS["all_reduce"]
        trainer.step_window(window)
        calls.append(CALLS["all_reduce"] - before)
    return {"parameters": torch.cat([p.detach().reshape(-1).double()
                                     for p in model.parameters()]).tolist(),
            "calls_per_window": calls, "carried": trainer._carrier is not None,
            "items": [record.items for record in trainer.history.records],
            "losses": [record.loss for record in trainer.history.records]}


def main() -> int:
    """Run every case; rank 0 writes the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    ctx = init_distributed(60.0)
    ProcessGroup.allreduce = _counting_all_reduce  # every all-reduce, whoever starts it
    with process_group_session():
        sizes = (12, 20)  # rank 0: 12 samples a window, rank 1: 20 (uneven counts)
        data = [make_toy_classification(3 * size, 6, 3, seed=rank, dtype=torch.float32)
                for rank, size in enumerate(sizes)]
        size, (x, y) = sizes[ctx.rank], data[ctx.rank]
        windows = [split_into_micro_batches((x[w * size:(w + 1) * size],
                                             y[w * size:(w + 1) * size]), accumulation_steps=2)
                   for w in range(3)]
        results = {how: _train(how, windows) for how in ("engine hook", "counter", "user hook",
                                                         "bucket view")}
        # the ground truth: plain SGD on the full-batch mean gradient over both ranks' samples
        reference = make_mlp(6, 1024, 3, seed=0, dtype=torch.float32)
        for w in range(3):
            pieces = [(x[w * s:(w + 1) * s], y[w * s:(w + 1) * s])
                      for (x, y), s in zip(data, sizes, strict=True)]
            inputs, labels = (torch.cat(part) for part in zip(*pieces, strict=True))
            gradients = full_batch_gradients(reference, sample_classification_loss,
                                             (inputs, labels))
            with torch.no_grad():
                for name, parameter in reference.named_parameters():
                    parameter -= 0.5 * gradients[name]
        results["reference"] = torch.cat([p.detach().reshape(-1).double()
                                          for p in reference.parameters()]).tolist()
        # a NaN on rank 1 only: both ranks raise after the window, no step taken
        model = DistributedDataParallel(make_mlp(6, 16, 3, seed=0, dtype=torch.float32))
        trainer = AccumulationTrainer(model, sample_classification_loss,
                                      torch.optim.SGD(model.parameters(), lr=0.5),
                                      accumulation_steps=2, progress=False)
        before = [p.detach().clone() for p in model.parameters()]
        x, y = windows[0][0]
        bad = x.clone()
        if ctx.rank == 1:
            bad[0, 0] = float("nan")
        try:
            trainer.step_window([(x, y), (bad, y)])
            raised = "no error"
        except NonFiniteLossError as error:
            raised = str(error)
        stepped = any(not torch.equal(a, p)
                      for a, p in zip(before, model.parameters(), strict=True))
        raised_everywhere = [None, None]
        dist.all_gather_object(raised_everywhere, raised)
        results["nan"] = {"raised": raised_everywhere, "stepped": stepped,
                          "optimizer_steps": trainer.optimizer_steps}
        # bfloat16 buckets cannot carry float64 totals: one all-reduce of the engine's own
        results["bfloat16"] = _train("engine hook", [[(x.bfloat16(), y) for x, y in windows[0]]],
                                     dtype=torch.bfloat16)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
