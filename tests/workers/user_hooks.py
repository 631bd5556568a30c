"""Test worker: accumulate_window leaves a user's DDP comm hook in place, and stays exact beside it
(2 gloo ranks).

For each hook the user registers before training (none; torch's ``allreduce_hook`` wrapped
with a counter; ``fp16_compress_hook``; PowerSGD; none with ``gradient_as_bucket_view``;
PowerSGD with ``gradient_as_bucket_view``, where the hook's bucket IS the ``.grad`` memory),
trains 3 windows of a float64 MLP whose ranks hold different numbers of samples (12 and 20: the
division must use the global count), and records per window how many backward passes the
hook synchronised and how many all-reduces ran (``ProcessGroup.allreduce``, whoever calls it).
After training, registering another hook must still work on the model without one (the loop
took no slot) and fail on the others (the user's hook is still there). Then a NaN loss on rank
1: both ranks raise, no step. Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.launch import run_worker
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import NonFiniteLossError, split_into_micro_batches
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

CALLS = {"all_reduce": 0, "hook_syncs": 0}
_all_reduce = ProcessGroup.allreduce  # what dist.all_reduce and DDP's hooks call


def _counting_all_reduce(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    CALLS["all_reduce"] += 1
    return _all_reduce(*args, **kwargs)


def _counting_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    CALLS["hook_syncs"] += bucket.is_last()  # one per synchronising backward pass
    return default_hooks.allreduce_hook(state, bucket)


def _noop_hook(state, bucket):  # noqa: ANN001, ANN202
    return default_hooks.allreduce_hook(state, bucket)


def _parameters(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def _train(how: str, windows: list) -> dict:
    model = DistributedDataParallel(make_mlp(6, 64, 3, seed=0, dtype=torch.float64),
                                    gradient_as_bucket_view=how.endswith("bucket view"))
    if how == "counter":
        model.register_comm_hook(None, _counting_hook)
    elif how == "fp16 compress":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif how.startswith("PowerSGD"):  # vanilla all-reduce for its first iterations, then compressed
        model.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1),
                                 powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    all_reduces, syncs, items = [], [], []
    for window in windows:
        before, synced = CALLS["all_reduce"], CALLS["hook_syncs"]
        items.append(accumulate_window(model, optimizer, window,
                                       sample_classification_loss).items)
        all_reduces.append(CALLS["all_reduce"] - before)
        syncs.append(CALLS["hook_syncs"] - synced)
    try:  # DDP takes one hook: a free slot means the loop registered none
        model.register_comm_hook(None, _noop_hook)
        slot = "free"
    except RuntimeError as error:
        slot = f"taken: {error}"
    return {"parameters": _parameters(model), "all_reduces_per_window": all_reduces,
            "hook_syncs_per_window": syncs, "slot_after": slot,
            "items": items}


def main() -> int:
    """Run every case; rank 0 writes the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    ctx = init_distributed(60.0)
    ProcessGroup.allreduce = _counting_all_reduce  # every all-reduce, whoever starts it
    with process_group_session():
        sizes = (12, 20)  # rank 0: 12 samples a window, rank 1: 20 (uneven counts)
        data = [make_toy_classification(3 * size, 6, 3, seed=rank, dtype=torch.float64)
                for rank, size in enumerate(sizes)]
        size, (x, y) = sizes[ctx.rank], data[ctx.rank]
        windows = [split_into_micro_batches((x[w * size:(w + 1) * size],
                                             y[w * size:(w + 1) * size]), accumulation_steps=2)
                   for w in range(3)]
        results = {how: _train(how, windows) for how in (
            "no hook", "counter", "fp16 compress", "PowerSGD", "bucket view",
            "PowerSGD, bucket view")}
        # the ground truth: plain SGD on the full-batch mean gradient over both ranks' samples
        reference = make_mlp(6, 64, 3, seed=0, dtype=torch.float64)
        for w in range(3):
            pieces = [(x[w * s:(w + 1) * s], y[w * s:(w + 1) * s])
                      for (x, y), s in zip(data, sizes, strict=True)]
            inputs, labels = (torch.cat(part) for part in zip(*pieces, strict=True))
            gradients = full_batch_gradients(reference, sample_classification_loss,
                                             (inputs, labels))
            with torch.no_grad():
                for name, parameter in reference.named_parameters():
                    parameter -= 0.5 * gradients[name]
        results["reference"] = _parameters(reference)
        # a NaN on rank 1 only: both ranks raise after the window, no step taken
        model = DistributedDataParallel(make_mlp(6, 16, 3, seed=0, dtype=torch.float64))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        before = [p.detach().clone() for p in model.parameters()]
        x, y = windows[0][0]
        bad = x.clone()
        if ctx.rank == 1:
            bad[0, 0] = float("nan")
        try:
            accumulate_window(model, optimizer, [(x, y), (bad, y)], sample_classification_loss)
            raised = "no error"
        except NonFiniteLossError as error:
            raised = str(error)
        stepped = any(not torch.equal(a, p)
                      for a, p in zip(before, model.parameters(), strict=True))
        raised_everywhere = [None, None]
        dist.all_gather_object(raised_everywhere, raised)
        results["nan"] = {"raised": raised_everywhere, "stepped": stepped}
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
