"""The program torchrun runs: the engine under DDP or FSDP2, checked against one process.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m gradaccum_lib.jobs.ddp \\
        --accumulation-steps 4 --micro-batch-size 8 --steps 6 --sync window --json out.json

Every rank trains its ``DistributedSampler`` shard with :class:`AccumulationTrainer` (the one
accumulation loop of the package): ``--sync window`` synchronises gradients once per window
(``no_sync`` for the other micro-steps), ``--sync every`` after every micro-step (the same
gradient, k times the communication). The engine divides by the window's item count over ALL
ranks, so each step is the exact mean over every item of the global window, even when ranks
hold different numbers of items (``--task tokens``: a token-level loss over sequences of
uneven length) and in a partial last window (``--samples`` not a multiple of the global
window).

After each optimizer step the program checks that all ranks hold the same parameters, and
compares them with a single-process reference in this same program: one full-batch step
(``equivalence.full_batch_gradients``, the ground truth) per global window on exactly the same
samples. Rank 0 prints and writes JSON. The traps reproduce mistakes on purpose:
``sync-after-forward`` sets ``require_backward_grad_sync`` after the forward pass (too late),
``static-graph`` builds DDP with ``static_graph=True``, ``no-set-epoch`` never calls
``sampler.set_epoch``. Without torchrun's environment it runs as one process.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..accumulation import AccumulationTrainer, WindowRecord
from ..batches import windows_of
from ..distributed import DistributedContext, full_value, init_distributed, process_group_session
from ..equivalence import full_batch_gradients
from ..losses import sample_classification_loss, token_classification_loss
from ..measure.comm import CommCounter
from ..workloads.data import make_toy_classification, make_toy_token_batch
from ..workloads.models import TokenTagger, make_mlp
from .worker import run_worker

TRAPS = ("none", "sync-after-forward", "static-graph", "no-set-epoch")
DTYPES = {"float64": torch.float64, "float32": torch.float32}
HISTORY_COLUMNS = tuple(WindowRecord.__dataclass_fields__)  # written as columns to the JSON


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command line parsed and checked."""
    parser = argparse.ArgumentParser(prog="python -m gradaccum_lib.jobs.ddp",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--accumulation-steps", type=int, required=True)
    parser.add_argument("--sweep", default=None,
                        help="comma-separated k values: run each with --sync window and every "
                             "in this one launch (JSON: {'runs': [...]})")
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps in all")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="optimizer steps per epoch (default: --steps, one epoch)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples in the data set (default: enough for --steps-per-epoch "
                             "full windows); not a multiple of the global window gives a "
                             "partial last window")
    parser.add_argument("--task", choices=("classification", "tokens"), default="classification")
    parser.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp")
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
    parser.add_argument("--dump-parameters", action="store_true",
                        help="add the final parameters (a flat list) to the JSON")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="process-group timeout in seconds")
    arguments = parser.parse_args(argv)
    for name in ("accumulation_steps", "micro_batch_size", "steps", "input_dim", "hidden_dim",
                 "num_classes"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not (math.isfinite(arguments.lr) and arguments.lr > 0):
        parser.error(f"--lr must be a finite number > 0; got {arguments.lr}")
    if arguments.steps_per_epoch is None:
        arguments.steps_per_epoch = arguments.steps
    if arguments.steps_per_epoch < 1:
        parser.error("--steps-per-epoch must be >= 1")
    if arguments.samples is not None and arguments.samples < 1:
        parser.error("--samples must be >= 1")
    if not arguments.timeout > 0:
        parser.error("--timeout must be > 0")
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


def _parameter_vector(model: nn.Module) -> Tensor:
    return torch.cat([full_value(p.detach()).reshape(-1).cpu() for p in model.parameters()])


def cross_rank_difference(model: nn.Module, ctx: DistributedContext) -> float:
    """Return max |parameters - rank 0's parameters| over all ranks (0.0 in one process)."""
    if ctx.world_size == 1:
        return 0.0
    mine = _parameter_vector(model).to(ctx.device)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    difference = (mine - reference).abs().max().to(torch.float64).reshape(1)
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return difference.item()


def token_pair_loss(model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`token_classification_loss` for ``(input_ids, labels)`` pairs of a TensorDataset."""
    input_ids, labels = batch
    return token_classification_loss(model, {"input_ids": input_ids, "labels": labels})


def _task(arguments: argparse.Namespace, samples: int, dtype: torch.dtype):  # noqa: ANN202
    """(dataset, model, loss function) of the chosen task."""
    if arguments.task == "tokens":  # sequences of 1..24 real tokens: uneven item counts
        tokens = make_toy_token_batch(samples, 24, 50, arguments.num_classes,
                                      seed=arguments.seed)
        model = TokenTagger(50, arguments.hidden_dim, arguments.num_classes,
                            seed=arguments.seed, dtype=dtype)
        return TensorDataset(tokens["input_ids"], tokens["labels"]), model, token_pair_loss
    inputs, labels = make_toy_classification(samples, arguments.input_dim,
                                             arguments.num_classes, seed=arguments.seed,
                                             dtype=dtype)
    model = make_mlp(arguments.input_dim, arguments.hidden_dim, arguments.num_classes,
                     seed=arguments.seed, dtype=dtype)
    return TensorDataset(inputs, labels), model, sample_classification_loss


class LateSyncFlagTrainer(AccumulationTrainer):
    """TRAP (``--trap sync-after-forward``): the engine, except that the DDP sync flag is
    set AFTER each forward pass, as a copied loop might do (by the loss function below; the
    engine's own flag, set before the forward, is switched off). DDP has already decided at
    forward time, so the window's last backward does not synchronise (and the next window's
    first one does)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._skip_sync = contextlib.nullcontext()  # no flag before the forward pass
        self.window_length = self.micro_step = 0

    def step_window(self, window: Sequence) -> object:
        self.window_length, self.micro_step = len(window), 0
        return super().step_window(window)


def _late_flag_loss(trainer_box: list, loss_fn):  # noqa: ANN001, ANN202
    def loss(model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        output = loss_fn(model, batch)  # the forward pass has run ...
        trainer = trainer_box[0]
        model.require_backward_grad_sync = trainer.micro_step == trainer.window_length - 1
        trainer.micro_step += 1
        return output  # ... so setting the flag now is too late
    return loss


def _wrap(base: nn.Module, arguments: argparse.Namespace, ctx: DistributedContext,
          counter: CommCounter) -> nn.Module:
    if ctx.world_size == 1:
        return base
    if arguments.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        return fully_shard(base)
    # gradient_as_bucket_view: .grad are views into DDP's buckets, so no second copy of the
    # gradients (00 measures it); safe with the engine, which never detaches a .grad in place
    model = DistributedDataParallel(base, static_graph=arguments.trap == "static-graph",
                                    gradient_as_bucket_view=True)
    counter.register(model)
    return model


def run(arguments: argparse.Namespace) -> dict:
    """Train with the engine under DDP/FSDP2; return the results (identical on every rank)."""
    ctx = init_distributed(arguments.timeout)
    dtype = DTYPES[arguments.dtype]
    k, micro = arguments.accumulation_steps, arguments.micro_batch_size
    effective = micro * k * ctx.world_size
    samples = arguments.samples or effective * arguments.steps_per_epoch
    dataset, base, loss_fn = _task(arguments, samples, dtype)
    base = base.to(ctx.device)
    reference = copy.deepcopy(base)
    reference_optimizer = _optimizer(arguments, reference.parameters())
    counter = CommCounter()
    model = _wrap(base, arguments, ctx, counter)
    late = arguments.trap == "sync-after-forward" and ctx.world_size > 1
    box: list = []
    trainer = (LateSyncFlagTrainer if late else AccumulationTrainer)(
        model, _late_flag_loss(box, loss_fn) if late else loss_fn,
        _optimizer(arguments, model.parameters()), accumulation_steps=k, progress=False,
        sync_every_micro_step=arguments.sync == "every")
    box.append(trainer)
    def make_sampler(rank: int) -> DistributedSampler:
        return DistributedSampler(dataset, num_replicas=ctx.world_size, rank=rank,
                                  shuffle=True, seed=arguments.seed, drop_last=False)

    sampler = make_sampler(ctx.rank)
    reference_samplers = [make_sampler(rank) for rank in range(ctx.world_size)]
    if ctx.is_main:
        print(f"world size {ctx.world_size} ({ctx.backend or 'single process'}), effective "
              f"batch = micro-batch {micro} x k {k} x world {ctx.world_size} = {effective}",
              flush=True)
    per_step: list[dict] = []
    epoch_orders: list[list[int]] = []
    step, epoch = 0, 0
    while step < arguments.steps:
        if arguments.trap != "no-set-epoch":
            sampler.set_epoch(epoch)
        for reference_sampler in reference_samplers:  # the reference always reshuffles
            reference_sampler.set_epoch(epoch)
        epoch_orders.append(list(iter(sampler)))
        global_orders = [list(iter(s)) for s in reference_samplers]
        loader = DataLoader(dataset, batch_size=micro, sampler=sampler)
        for window_index, window in enumerate(windows_of(loader, k)):
            if step == arguments.steps or window_index == arguments.steps_per_epoch:
                break
            window = [[t.to(ctx.device) for t in micro_batch] for micro_batch in window]
            start = time.perf_counter()
            trainer.step_window(window)
            seconds = time.perf_counter() - start
            comm = counter.take()
            # the single-process ground truth: one full-batch step on the same global window
            rows = slice(window_index * k * micro, (window_index + 1) * k * micro)
            indices = [i for order in global_orders for i in order[rows]]
            batch = tuple(t.to(ctx.device) for t in dataset[indices])
            gradients = full_batch_gradients(reference, loss_fn, batch)
            for name, parameter in reference.named_parameters():
                parameter.grad = gradients[name]
            reference_optimizer.step()
            per_step.append({
                "bytes": comm["bytes"], "syncs": comm["syncs"], "calls": comm["calls"],
                "seconds": seconds, "comm_seconds": comm["seconds"],
                "items": trainer.history.records[-1].items,
                "cross_rank_difference": cross_rank_difference(model, ctx),
                "difference_to_single_process": (
                    _parameter_vector(model) - _parameter_vector(reference)).abs().max().item(),
            })
            step += 1
        epoch += 1

    final = _parameter_vector(model)
    results = {
        "world_size": ctx.world_size, "backend": ctx.backend, "wrap": arguments.wrap,
        "task": arguments.task, "accumulation_steps": k, "micro_batch_size": micro,
        "effective_batch_size": effective, "samples": samples, "sync": arguments.sync,
        "trap": arguments.trap, "optimizer": arguments.optimizer, "dtype": arguments.dtype,
        "steps": step,
        "parameter_bytes": sum(p.numel() * p.element_size() for p in reference.parameters()),
        "per_step": per_step,
        "history": {name: trainer.history.column(name) for name in HISTORY_COLUMNS},
        "bytes_per_step": statistics.median(s["bytes"] for s in per_step),
        "syncs_per_step": statistics.median(s["syncs"] for s in per_step),
        "seconds_per_step": statistics.median(s["seconds"] for s in per_step),
        "comm_seconds_per_step": statistics.median(s["comm_seconds"] for s in per_step),
        "max_cross_rank_difference": max(s["cross_rank_difference"] for s in per_step),
        "max_difference_to_single_process": (final - _parameter_vector(reference)).abs().max()
        .item(),
        "epoch_orders_repeat": len(epoch_orders) > 1 and all(
            order == epoch_orders[0] for order in epoch_orders[1:]),
    }
    if arguments.dump_parameters:
        results["final_parameters"] = final.double().tolist()
    if ctx.world_size > 1:
        dist.barrier()
        del model, trainer, box  # release DDP's reducer (and its hook) before the teardown
        gc.collect()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, print and write on rank 0, and tear the process group down."""
    arguments = parse_arguments(argv)
    with process_group_session():
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
    return 0


if __name__ == "__main__":
    run_worker(main)
