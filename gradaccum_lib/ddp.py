"""The program torchrun runs: DDP with gradient accumulation, checked against one process.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m gradaccum_lib.ddp \\
        --accumulation-steps 4 --micro-batch-size 8 --steps 6 --sync window --json out.json

Per optimizer step, every rank runs k micro-batches of its ``DistributedSampler`` shard. In
``--sync window`` mode the first k-1 backward passes run inside ``model.no_sync()`` (forward
AND backward: DDP decides at forward time whether the next backward synchronises), so the
gradients are all-reduced once per window; ``--sync every`` all-reduces after every
micro-batch. The loss is each micro-batch's SUMMED loss times world_size / (the window's item
count summed over all ranks), so DDP's averaging over ranks yields the mean over every item of
the global window, even when ranks hold different numbers of items.

After each optimizer step the program checks that all ranks hold the same parameters, and at
the end it compares them with a single-process run, inside this same program, that takes one
full-batch step per global window on exactly the same samples. Rank 0 prints and writes JSON.
The trap flags reproduce mistakes on purpose: ``--trap sync-after-forward`` sets
``require_backward_grad_sync`` after the forward pass, ``--trap static-graph`` builds DDP with
``static_graph=True``, ``--trap no-set-epoch`` never calls ``sampler.set_epoch``.
Without torchrun's environment it runs as one process (world size 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .data import make_toy_classification
from .distributed import CommCounter, DistributedContext, init_distributed, run_worker
from .equivalence import full_batch_gradients
from .losses import sample_classification_loss
from .models import make_mlp

TRAPS = ("none", "sync-after-forward", "static-graph", "no-set-epoch")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command line parsed and checked."""
    parser = argparse.ArgumentParser(prog="python -m gradaccum_lib.ddp",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--accumulation-steps", type=int, required=True)
    parser.add_argument("--sweep", default=None,
                        help="comma-separated k values: run each with --sync window and every "
                             "in this one launch (JSON: {'runs': [...]})")
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps in all")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="optimizer steps per epoch (default: --steps, one epoch)")
    parser.add_argument("--sync", choices=("window", "every"), default="window")
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    parser.add_argument("--input-dim", type=int, default=16)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trap", choices=TRAPS, default="none")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="process-group timeout in seconds")
    parser.add_argument("--fail-on-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hang-on-rank", type=int, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    for name in ("accumulation_steps", "micro_batch_size", "steps"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    arguments.steps_per_epoch = arguments.steps_per_epoch or arguments.steps
    if arguments.steps_per_epoch < 1:
        parser.error("--steps-per-epoch must be >= 1")
    if arguments.sweep is not None:
        try:
            arguments.sweep = [int(value) for value in arguments.sweep.split(",")]
        except ValueError:
            parser.error(f"--sweep must be comma-separated ints; got {arguments.sweep!r}")
        if not arguments.sweep or min(arguments.sweep) < 1:
            parser.error("--sweep values must be >= 1")
    return arguments


def _optimizer(arguments: argparse.Namespace, parameters) -> torch.optim.Optimizer:  # noqa: ANN001
    if arguments.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=arguments.lr)
    return torch.optim.AdamW(parameters, lr=arguments.lr)


def _sampler(dataset: TensorDataset, ctx_rank: int, world_size: int,
             seed: int) -> DistributedSampler:
    return DistributedSampler(dataset, num_replicas=world_size, rank=ctx_rank, shuffle=True,
                              seed=seed, drop_last=False)


def _parameter_vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def cross_rank_difference(model: nn.Module, ctx: DistributedContext) -> float:
    """Return max |parameters - rank 0's parameters| over all ranks (0.0 in one process)."""
    if ctx.world_size == 1:
        return 0.0
    mine = _parameter_vector(model)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    difference = (mine - reference).abs().max().to(torch.float64).reshape(1)
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return difference.item()


def run(arguments: argparse.Namespace) -> dict:
    """Train with DDP and accumulation; return the results (identical on every rank)."""
    ctx = init_distributed(arguments.timeout)
    dtype = DTYPES[arguments.dtype]
    k, micro = arguments.accumulation_steps, arguments.micro_batch_size
    effective = micro * k * ctx.world_size
    steps_per_epoch = arguments.steps_per_epoch
    epochs = -(-arguments.steps // steps_per_epoch)
    inputs, labels = make_toy_classification(effective * steps_per_epoch, arguments.input_dim,
                                             arguments.num_classes, seed=arguments.seed,
                                             dtype=dtype)
    dataset = TensorDataset(inputs, labels)

    base = make_mlp(arguments.input_dim, arguments.hidden_dim, arguments.num_classes,
                    seed=arguments.seed, dtype=dtype).to(ctx.device)
    reference = copy.deepcopy(base)
    reference_optimizer = _optimizer(arguments, reference.parameters())
    model: nn.Module = base
    counter = CommCounter()
    if ctx.world_size > 1:
        model = DistributedDataParallel(base, static_graph=arguments.trap == "static-graph")
        # a lambda: DDP rejects string annotations (from __future__) on a hook's bucket
        model.register_comm_hook(None, lambda state, bucket: counter.hook(state, bucket))
    optimizer = _optimizer(arguments, model.parameters())
    sampler = _sampler(dataset, ctx.rank, ctx.world_size, arguments.seed)
    every_sampler = [_sampler(dataset, r, ctx.world_size, arguments.seed)
                     for r in range(ctx.world_size)]

    if ctx.is_main:
        print(f"world size {ctx.world_size} ({ctx.backend or 'single process'}), effective "
              f"batch = micro-batch {micro} x k {k} x world {ctx.world_size} = {effective}",
              flush=True)
    per_step: list[dict] = []
    epoch_orders: list[list[int]] = []
    step = 0
    for epoch in range(epochs):
        if arguments.trap != "no-set-epoch":
            sampler.set_epoch(epoch)
        for other in every_sampler:  # the reference always reshuffles, as intended
            other.set_epoch(epoch)
        epoch_orders.append(list(iter(sampler)))
        loader = iter(DataLoader(dataset, batch_size=micro, sampler=sampler))
        global_orders = [list(iter(s)) for s in every_sampler]
        for window_index in range(steps_per_epoch):
            if step == arguments.steps:
                break
            if arguments.fail_on_rank == ctx.rank:
                raise RuntimeError(f"deliberate failure on rank {ctx.rank} at step {step}")
            if arguments.hang_on_rank == ctx.rank:
                time.sleep(3600)
            window = [next(loader) for _ in range(k)]
            # the window's item count over every rank: the denominator of the global mean
            items = torch.tensor([float(sum(len(y) for _, y in window))], dtype=torch.float64)
            if ctx.world_size > 1:
                dist.all_reduce(items)
            scale = ctx.world_size / items.item()
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            for j, (x, y) in enumerate(window):
                micro_batch = (x.to(ctx.device), y.to(ctx.device))
                sync_now = arguments.sync == "every" or j == k - 1
                if ctx.world_size > 1 and arguments.trap == "sync-after-forward":
                    summed, _ = sample_classification_loss(model, micro_batch)
                    model.require_backward_grad_sync = sync_now  # too late: forward decided
                    (summed * scale).backward()
                    continue
                skip = ctx.world_size > 1 and not sync_now
                with model.no_sync() if skip else contextlib.nullcontext():
                    summed, _ = sample_classification_loss(model, micro_batch)
                    (summed * scale).backward()
            optimizer.step()
            seconds = time.perf_counter() - start
            comm = counter.take()
            per_step.append({"bytes": comm["bytes"], "syncs": comm["syncs"],
                             "calls": comm["calls"], "seconds": seconds,
                             "comm_seconds": comm["seconds"],
                             "cross_rank_difference": cross_rank_difference(base, ctx)})
            # the single-process ground truth: one full-batch step on the same global window
            rows = slice(window_index * k * micro, (window_index + 1) * k * micro)
            indices = [i for order in global_orders for i in order[rows]]
            batch = (inputs[indices].to(ctx.device), labels[indices].to(ctx.device))
            gradients = full_batch_gradients(reference, sample_classification_loss, batch)
            for name, parameter in reference.named_parameters():
                parameter.grad = gradients[name]
            reference_optimizer.step()
            per_step[-1]["difference_to_single_process"] = (
                _parameter_vector(base) - _parameter_vector(reference)).abs().max().item()
            step += 1

    difference_to_single = (_parameter_vector(base) - _parameter_vector(reference)).abs().max()
    results = {
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "accumulation_steps": k,
        "micro_batch_size": micro,
        "effective_batch_size": effective,
        "sync": arguments.sync,
        "trap": arguments.trap,
        "optimizer": arguments.optimizer,
        "dtype": arguments.dtype,
        "steps": step,
        "parameter_bytes": sum(p.numel() * p.element_size() for p in base.parameters()),
        "per_step": per_step,
        "bytes_per_step": statistics.median(s["bytes"] for s in per_step),
        "syncs_per_step": statistics.median(s["syncs"] for s in per_step),
        "seconds_per_step": statistics.median(s["seconds"] for s in per_step),
        "comm_seconds_per_step": statistics.median(s["comm_seconds"] for s in per_step),
        "max_cross_rank_difference": max(s["cross_rank_difference"] for s in per_step),
        "max_difference_to_single_process": difference_to_single.item(),
        "epoch_orders_repeat": len(epoch_orders) > 1 and all(
            order == epoch_orders[0] for order in epoch_orders[1:]),
    }
    if ctx.world_size > 1:
        dist.barrier()
        del model  # release DDP's reducer (and its hook) before another run or the teardown
        gc.collect()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, print and write on rank 0, and tear the process group down."""
    arguments = parse_arguments(argv)
    try:
        if arguments.sweep is None:
            results = run(arguments)
            summaries = [results]
        else:  # one process group, every (k, sync) of the sweep
            summaries = [run(argparse.Namespace(**{**vars(arguments), "accumulation_steps": k,
                                                    "sync": sync}))
                         for k in arguments.sweep for sync in ("window", "every")]
            results = {"runs": summaries}
        if not dist.is_initialized() or dist.get_rank() == 0:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle, indent=1)
            for summary in summaries:
                print(f"k={summary['accumulation_steps']} sync={summary['sync']}: bytes/step "
                      f"{summary['bytes_per_step']:.0f}, syncs/step "
                      f"{summary['syncs_per_step']:.0f},"
                      f" max cross-rank difference {summary['max_cross_rank_difference']:.1e},"
                      f" vs single process {summary['max_difference_to_single_process']:.1e}",
                      flush=True)
        if dist.is_initialized():
            dist.barrier()  # only on success: a failed rank must not wait for the others
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_worker(main)
