"""Test worker for tests/test_accumulation.py: accumulate_window on 2 gloo ranks, with DDP (with
and without a user's comm hook) and FSDP2, against the ground truth.

Rank 0 holds 12 samples a window, rank 1 holds 20 (uneven ranks: the divisor must be the
global count, 32), each split into 2 uneven micro-batches; three windows, then a partial one of
one micro-batch (3 + 4 samples). Each case trains a float64 MLP with SGD and records its
parameters, the windows' items and losses, the all-reduces per window
(``ProcessGroup.allreduce``, whoever calls it) and the hook's synchronising backward passes.
After training, registering a hook must work on a model without one (the loop took no slot)
and fail on a model with the user's. Then a NaN loss on rank 1's second micro-batch: every rank
raises, no rank steps; the same with a count of -1 there; then ``agree_on_windows`` (what
the program that makes the windows calls once per epoch) over windows rank 1 has none of (2 | 0),
one window fewer on rank 1 (it stops calling), and 3 | 2 micro-batches: every rank raises,
naming rank 1, except DDP at 3 | 2, which is exact. Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.launch import run_worker
from gradaccum_course.programs import syncing_every_micro_step
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import NonFiniteLossError, split_into_micro_batches
from gradaccum_lib.distributed import agree_on_windows, init_distributed, process_group_session
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

SIZES, PARTIAL = (12, 20), (3, 4)  # samples a window, and in the partial last one, per rank
LR = 0.5
CALLS = {"all_reduce": 0, "hook_syncs": 0}
_all_reduce = ProcessGroup.allreduce  # what dist.all_reduce and DDP's Python hooks call


def _counting_all_reduce(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    CALLS["all_reduce"] += 1
    return _all_reduce(*args, **kwargs)


def _counting_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    CALLS["hook_syncs"] += bucket.is_last()  # one per synchronising backward pass
    return default_hooks.allreduce_hook(state, bucket)


def _noop_hook(state, bucket):  # noqa: ANN001, ANN202
    return default_hooks.allreduce_hook(state, bucket)


def _model(how: str) -> torch.nn.Module:
    plain = make_mlp(6, 32, 3, seed=0, dtype=torch.float64)
    if how.startswith("fsdp2"):
        return fully_shard(plain)
    model = DistributedDataParallel(plain, gradient_as_bucket_view=how.endswith("bucket view"))
    if how == "ddp, counting hook":
        model.register_comm_hook(None, _counting_hook)
    elif how == "ddp, PowerSGD":  # vanilla all-reduce for its first iterations, then compressed
        model.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1),
                                 powerSGD_hook.powerSGD_hook)
    return model


def _parameters(model: torch.nn.Module) -> list[float]:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in model.parameters()]).tolist()


def _train(how: str, windows: list) -> dict:
    model = _model(how)
    if how.endswith("sync every micro-step"):  # the slow way: the sync switch does nothing
        syncing_every_micro_step(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    all_reduces, syncs, results = [], [], []
    for window in windows:
        before, synced = CALLS["all_reduce"], CALLS["hook_syncs"]
        results.append(accumulate_window(model, optimizer, window, sample_classification_loss))
        all_reduces.append(CALLS["all_reduce"] - before)
        syncs.append(CALLS["hook_syncs"] - synced)
    slot = "fsdp2"
    if isinstance(model, DistributedDataParallel):
        try:  # DDP takes one hook: a free slot means the loop registered none
            model.register_comm_hook(None, _noop_hook)
            slot = "free"
        except RuntimeError as error:
            slot = f"taken: {error}"
    return {"parameters": _parameters(model), "items": [r.items for r in results],
            "losses": [r.loss for r in results], "all_reduces_per_window": all_reduces,
            "hook_syncs_per_window": syncs, "slot_after": slot}


def _ground_truth(data: list) -> tuple[list[float], list[float]]:
    """Plain SGD on the full-batch mean gradient of each window's samples over both ranks."""
    model = make_mlp(6, 32, 3, seed=0, dtype=torch.float64)
    losses = []
    for w in range(4):
        inputs, labels = (torch.cat(parts) for parts in zip(
            *(_window_samples(batch, rank, w) for rank, batch in enumerate(data)), strict=True))
        losses.append(torch.nn.functional.cross_entropy(model(inputs), labels).item())
        gradients = full_batch_gradients(model, sample_classification_loss, (inputs, labels))
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter -= LR * gradients[name]
    return _parameters(model), losses


def _window_samples(batch: tuple, rank: int, w: int) -> tuple:
    """Rank ``rank``'s samples of window ``w`` (the fourth: the partial one)."""
    size = SIZES[rank]
    start, end = w * size, (w * size + (size if w < 3 else PARTIAL[rank]))
    return batch[0][start:end], batch[1][start:end]


def _agreement_case(how: str, windows: list) -> tuple[str, float]:
    """``agree_on_windows`` over this rank's ``windows`` and, if they agree, every window
    through the loop: what this rank raised (or "no error"), and how long it took."""
    model = _model(how)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    start = time.monotonic()
    try:
        agree_on_windows(model, windows)
        for window in windows:
            accumulate_window(model, optimizer, window, sample_classification_loss)
        raised = "no error"
    except ValueError as error:
        raised = f"{type(error).__name__}: {error}"
    return raised, time.monotonic() - start


def _uneven_exact(window: list, rank: int) -> float:
    """DDP over a window of 3 micro-batches on rank 0 and 2 on rank 1: the largest difference
    between the gradient stepped on (SGD, lr 1) and the full batch's of both ranks' samples."""
    model = _model("ddp")
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    agree_on_windows(model, [window])
    accumulate_window(model, optimizer, window, sample_classification_loss)
    everywhere = [None, None]
    dist.all_gather_object(everywhere, [tuple(t.tolist() for t in mb) for mb in window])
    inputs, labels = (torch.tensor(sum((list(mb[i]) for part in everywhere for mb in part), []),
                                   dtype=dtype) for i, dtype in ((0, torch.float64),
                                                                 (1, torch.long)))
    truth = full_batch_gradients(make_mlp(6, 32, 3, seed=0, dtype=torch.float64),
                                 sample_classification_loss, (inputs, labels))
    stepped = [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]
    return max(float((s - g).abs().max()) for s, g in zip(stepped, truth.values(), strict=True))


def _bad_case(how: str, window: list, rank: int, what: str) -> tuple[str, bool]:
    """One window in which rank 1's second micro-batch has a NaN loss (``what="nan"``) or a
    count of -1 (``"count"``): what each rank raised, and whether it stepped."""
    model = _model(how)
    if how.endswith("sync every micro-step"):  # the slow way: the sync switch does nothing
        syncing_every_micro_step(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    before = _parameters(model)
    inputs, labels = window[1]
    if rank == 1 and what == "nan":
        inputs = inputs.clone()
        inputs[0, 0] = float("nan")

    def loss_fn(model: torch.nn.Module, batch: tuple) -> tuple:
        summed, count = sample_classification_loss(model, batch)
        return summed, -1 if rank == 1 and what == "count" and batch[0] is inputs else count

    try:
        accumulate_window(model, optimizer, [window[0], (inputs, labels)], loss_fn)
        raised = "no error"
    except (NonFiniteLossError, ValueError) as error:
        raised = f"{type(error).__name__}: {error}"
    return raised, _parameters(model) != before


def main() -> int:
    """Run every case; rank 0 writes the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    ctx = init_distributed(60.0)
    ProcessGroup.allreduce = _counting_all_reduce  # every all-reduce, whoever starts it
    with process_group_session():
        data = [make_toy_classification(3 * size + partial, 6, 3, seed=rank, dtype=torch.float64)
                for rank, (size, partial) in enumerate(zip(SIZES, PARTIAL, strict=True))]
        windows = [split_into_micro_batches(_window_samples(data[ctx.rank], ctx.rank, w),
                                            accumulation_steps=2 if w < 3 else 1)
                   for w in range(4)]
        # a third of the micro-batch on rank 0 (4 of 12 samples, then 8): uneven inside a rank
        if ctx.rank == 0:
            x, y = _window_samples(data[0], 0, 0)
            windows = [[(x[:4], y[:4]), (x[4:], y[4:])], *windows[1:]]
        results = {how: _train(how, windows) for how in (
            "ddp", "ddp, sync every micro-step", "ddp, counting hook", "ddp, PowerSGD",
            "ddp, bucket view", "fsdp2", "fsdp2, sync every micro-step")}
        results["reference"], results["reference_losses"] = _ground_truth(data)
        for kind, what in (("ddp", "nan"), ("fsdp2", "nan"), ("ddp", "count")):
            raised, stepped = _bad_case(kind, windows[1], ctx.rank, what)
            everywhere = [None, None]
            dist.all_gather_object(everywhere, (raised, stepped))
            results[f"{what}, {kind}"] = {"raised": [r for r, _ in everywhere],
                                          "stepped": [s for _, s in everywhere]}
        full = windows[0]  # 2 micro-batches on each rank
        three = split_into_micro_batches(_window_samples(data[ctx.rank], ctx.rank, 0),
                                         accumulation_steps=3 if ctx.rank == 0 else 2)
        cases = {"empty": [full] if ctx.rank == 0 else [[]],  # 2 | 0: rank 1's data ran out
                 "stops": [full, full] if ctx.rank == 0 else [full],  # rank 1 stops calling
                 "3 | 2": [three]}
        for kind in ("ddp", "fsdp2"):
            for name, its_windows in cases.items():
                everywhere = [None, None]
                dist.all_gather_object(everywhere, _agreement_case(kind, its_windows))
                results[f"{name}, {kind}"] = {"raised": [r for r, _ in everywhere],
                                              "seconds": [s for _, s in everywhere]}
        results["3 | 2, ddp, gradient error"] = _uneven_exact(three, ctx.rank)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
