"""The program torchrun runs: the loop under DDP or FSDP2, checked against one process.

    torchrun --standalone --nproc_per_node=2 -m gradaccum_course.programs.ddp \\
        --accumulation-steps 4 --micro-batch-size 8 --steps 6 --sync window --json out.json

Every rank trains its ``DistributedSampler`` shard, each window one call of
:func:`~gradaccum_lib.accumulation.accumulate_window` (the package's one loop): ``--sync
window`` synchronises gradients once per window (``no_sync`` for the other micro-steps),
``--sync every`` after every micro-step (the same gradient, k times the communication). The
loop divides by the window's item count over ALL ranks, so each step is the exact mean over
every item of the global window, even when ranks hold different numbers of items (``--task
tokens``: a token-level loss over sequences of uneven length) and in a partial last window
(``--samples`` not a multiple of the global window).

After each optimizer step the program checks that all ranks hold the same parameters, and
compares them with a single-process reference in this same program: one full-batch step
(``equivalence.full_batch_gradients``, the ground truth) per global window on exactly the same
samples. Rank 0 prints and writes JSON. Without torchrun's environment it runs as one process.
(The mistakes notebook 05 measures are programs written in the notebook, next to the correct
loop, not options of this one.)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gradaccum_course.launch import run_worker
from gradaccum_course.programs import syncing_every_micro_step
from gradaccum_lib.accumulation import WindowResult, accumulate_window
from gradaccum_lib.batches import windows_of
from gradaccum_lib.distributed import DistributedContext, init_distributed, process_group_session
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
from gradaccum_lib.measure.comm import CommCounter
from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
_POSITIVE = ("accumulation_steps", "micro_batch_size", "steps", "input_dim", "hidden_dim",
             "num_classes")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command line parsed and checked."""
    parser = _parser()
    arguments = parser.parse_args(argv)
    if arguments.steps_per_epoch is None:
        arguments.steps_per_epoch = arguments.steps
    problem = _problem(arguments)
    if problem is not None:
        parser.error(problem)
    if arguments.sweep is not None:
        arguments.sweep = _sweep(parser, arguments.sweep)
    return arguments


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gradaccum_course.programs.ddp",
                                     description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--accumulation-steps", type=int, required=True)
    add("--sweep", default=None, help="comma-separated k values: run each with --sync window "
        "and every in this one launch (JSON: {'runs': [...]})")
    add("--micro-batch-size", type=int, required=True)
    add("--steps", type=int, required=True, help="optimizer steps in all")
    add("--steps-per-epoch", type=int, default=None,
        help="optimizer steps per epoch (default: --steps, one epoch)")
    add("--samples", type=int, default=None,
        help="samples in the data set (default: enough for --steps-per-epoch full windows); "
             "not a multiple of the global window gives a partial last window")
    add("--task", choices=("classification", "tokens"), default="classification")
    add("--wrap", choices=("ddp", "fsdp2"), default="ddp")
    add("--sync", choices=("window", "every"), default="window")
    add("--json", required=True, help="where rank 0 writes the results")
    add("--optimizer", choices=("sgd", "adamw"), default="sgd")
    add("--lr", type=float, default=0.1)
    add("--dtype", choices=tuple(_DTYPES), default="float64")
    add("--input-dim", type=int, default=16)
    add("--hidden-dim", type=int, default=64)
    add("--num-classes", type=int, default=4)
    add("--seed", type=int, default=0)
    add("--dump-parameters", action="store_true",
        help="add the final parameters (a flat list) to the JSON")
    add("--timeout", type=float, default=60.0, help="process-group timeout in seconds")
    return parser


def _problem(arguments: argparse.Namespace) -> str | None:
    """What is wrong with the parsed numbers, or None."""
    for name in (*_POSITIVE, "steps_per_epoch"):
        if getattr(arguments, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if not (math.isfinite(arguments.lr) and arguments.lr > 0):
        return f"--lr must be a finite number > 0; got {arguments.lr}"
    if arguments.samples is not None and arguments.samples < 1:
        return "--samples must be >= 1"
    if not arguments.timeout > 0:
        return "--timeout must be > 0"
    return None


def _sweep(parser: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        ks = [int(value) for value in text.split(",")]
    except ValueError:
        parser.error(f"--sweep must be comma-separated ints; got {text!r}")
    if not ks or min(ks) < 1:
        parser.error("--sweep values must be >= 1")
    return ks


def cross_rank_difference(model: nn.Module) -> float:
    """Return max |parameters - rank 0's parameters| over all ranks (0.0 in one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0.0
    mine = _parameter_vector(model).to(next(model.parameters()).device)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    difference = (mine - reference).abs().max().to(torch.float64).reshape(1)
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return difference.item()


def _parameter_vector(model: nn.Module) -> Tensor:
    """All parameters as one flat CPU vector (an FSDP2 parameter, a DTensor, gathered)."""
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach()
                      .reshape(-1).cpu() for p in model.parameters()])


@dataclasses.dataclass
class _Job:
    """What one run holds: the loop's side and the single-process reference's."""

    arguments: argparse.Namespace
    ctx: DistributedContext
    dataset: TensorDataset
    loss_fn: Callable
    model: nn.Module
    optimizer: torch.optim.Optimizer
    counter: CommCounter
    reference: nn.Module
    reference_optimizer: torch.optim.Optimizer
    results: list[WindowResult] = dataclasses.field(default_factory=list)  # one per window

    def sampler(self, rank: int) -> DistributedSampler:
        """The shard sampler of ``rank`` (the reference builds every rank's)."""
        return DistributedSampler(self.dataset, num_replicas=self.ctx.world_size, rank=rank,
                                  shuffle=True, seed=self.arguments.seed, drop_last=False)


def _build(arguments: argparse.Namespace, ctx: DistributedContext, samples: int) -> _Job:
    """The data, the wrapped model and its optimizer, and the reference copy of the model."""
    dataset, base, loss_fn = _task(arguments, samples, _DTYPES[arguments.dtype])
    base = base.to(ctx.device)
    reference = copy.deepcopy(base)
    counter = CommCounter()
    model = _wrap(base, arguments, ctx, counter)
    return _Job(arguments, ctx, dataset, loss_fn, model, _optimizer(arguments, model.parameters()),
                counter, reference, _optimizer(arguments, reference.parameters()))


def _task(arguments: argparse.Namespace, samples: int, dtype: torch.dtype):  # noqa: ANN202
    """(dataset, model, loss function) of the chosen task."""
    if arguments.task == "tokens":  # sequences of 1..24 real tokens: uneven item counts
        tokens = make_toy_token_batch(samples, 24, 50, arguments.num_classes,
                                      seed=arguments.seed)
        model = TokenTagger(50, arguments.hidden_dim, arguments.num_classes,
                            seed=arguments.seed, dtype=dtype)
        return TensorDataset(tokens["input_ids"], tokens["labels"]), model, _token_pair_loss
    inputs, labels = make_toy_classification(samples, arguments.input_dim,
                                             arguments.num_classes, seed=arguments.seed,
                                             dtype=dtype)
    model = make_mlp(arguments.input_dim, arguments.hidden_dim, arguments.num_classes,
                     seed=arguments.seed, dtype=dtype)
    return TensorDataset(inputs, labels), model, sample_classification_loss


def _token_pair_loss(model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`token_classification_loss` for ``(input_ids, labels)`` pairs of a TensorDataset."""
    input_ids, labels = batch
    return token_classification_loss(model, {"input_ids": input_ids, "labels": labels})


def _wrap(base: nn.Module, arguments: argparse.Namespace, ctx: DistributedContext,
          counter: CommCounter) -> nn.Module:
    if ctx.world_size == 1:
        return base
    if arguments.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        return fully_shard(base)
    # gradient_as_bucket_view: .grad are views into DDP's buckets, so no second copy of the
    # gradients (00 measures it); safe with the loop, which never detaches a .grad in place
    model = DistributedDataParallel(base, gradient_as_bucket_view=True)
    counter.register(model)
    if arguments.sync == "every":  # the slow way, for comparison: no_sync does nothing here
        syncing_every_micro_step(model)
    return model


def _optimizer(arguments: argparse.Namespace, parameters) -> torch.optim.Optimizer:  # noqa: ANN001
    if arguments.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=arguments.lr)
    return torch.optim.AdamW(parameters, lr=arguments.lr)


def _train(job: _Job) -> list[dict]:
    """Every epoch's windows through the loop, each followed by the reference's step on
    the same global window; return what each optimizer step measured."""
    arguments, ctx = job.arguments, job.ctx
    sampler = job.sampler(ctx.rank)
    reference_samplers = [job.sampler(rank) for rank in range(ctx.world_size)]
    per_step: list[dict] = []
    epoch = 0
    while len(per_step) < arguments.steps:
        for each in (sampler, *reference_samplers):
            each.set_epoch(epoch)  # a new shuffle every epoch
        global_orders = [list(iter(each)) for each in reference_samplers]
        loader = DataLoader(job.dataset, batch_size=arguments.micro_batch_size, sampler=sampler)
        for window_index, window in enumerate(windows_of(loader, arguments.accumulation_steps)):
            if len(per_step) == arguments.steps or window_index == arguments.steps_per_epoch:
                break
            window = [[t.to(ctx.device) for t in micro_batch] for micro_batch in window]
            start = time.perf_counter()
            job.results.append(accumulate_window(job.model, job.optimizer, window, job.loss_fn))
            seconds = time.perf_counter() - start
            _reference_step(job, global_orders, window_index)
            per_step.append(_measured(job, seconds))
        epoch += 1
    return per_step


def _reference_step(job: _Job, global_orders: list[list[int]], window_index: int) -> None:
    """The single-process ground truth: one full-batch step on the same global window."""
    rows = job.arguments.accumulation_steps * job.arguments.micro_batch_size
    window = slice(window_index * rows, (window_index + 1) * rows)
    indices = [i for order in global_orders for i in order[window]]
    batch = tuple(t.to(job.ctx.device) for t in job.dataset[indices])
    gradients = full_batch_gradients(job.reference, job.loss_fn, batch)
    for name, parameter in job.reference.named_parameters():
        parameter.grad = gradients[name]
    job.reference_optimizer.step()


def _measured(job: _Job, seconds: float) -> dict:
    """One optimizer step's communication, items and agreement (across ranks, and with the
    reference)."""
    comm = job.counter.take()
    return {"bytes": comm["bytes"], "syncs": comm["syncs"], "calls": comm["calls"],
            "seconds": seconds, "comm_seconds": comm["seconds"],
            "items": job.results[-1].items,
            "cross_rank_difference": cross_rank_difference(job.model),
            "difference_to_single_process": _distance(job.model, job.reference)}


def _distance(model: nn.Module, other: nn.Module) -> float:
    return (_parameter_vector(model) - _parameter_vector(other)).abs().max().item()


def _summary(job: _Job, per_step: list[dict], samples: int) -> dict:
    """The run's results: its setting, every step, the medians and the largest differences."""
    arguments, ctx = job.arguments, job.ctx
    k, micro = arguments.accumulation_steps, arguments.micro_batch_size
    results = {
        "world_size": ctx.world_size, "backend": ctx.backend, "wrap": arguments.wrap,
        "task": arguments.task, "accumulation_steps": k, "micro_batch_size": micro,
        "effective_batch_size": micro * k * ctx.world_size, "samples": samples,
        "sync": arguments.sync, "optimizer": arguments.optimizer, "dtype": arguments.dtype,
        "steps": len(per_step),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in job.reference.parameters()),
        "per_step": per_step,
        "history": {field.name: [getattr(result, field.name) for result in job.results]
                    for field in dataclasses.fields(WindowResult)},
        "max_cross_rank_difference": max(s["cross_rank_difference"] for s in per_step),
        "max_difference_to_single_process": _distance(job.model, job.reference),
    }
    for key in ("bytes", "syncs", "seconds", "comm_seconds"):
        results[f"{key}_per_step"] = statistics.median(s[key] for s in per_step)
    if arguments.dump_parameters:
        results["final_parameters"] = _parameter_vector(job.model).double().tolist()
    return results


def _run(arguments: argparse.Namespace) -> dict:
    """Train with the loop under DDP/FSDP2; return the results (identical on every rank)."""
    ctx = init_distributed(arguments.timeout)
    effective = arguments.micro_batch_size * arguments.accumulation_steps * ctx.world_size
    samples = arguments.samples or effective * arguments.steps_per_epoch
    job = _build(arguments, ctx, samples)
    if ctx.is_main:
        print(f"world size {ctx.world_size} ({ctx.backend or 'single process'}), effective "
              f"batch = micro-batch {arguments.micro_batch_size} x k "
              f"{arguments.accumulation_steps} x world {ctx.world_size} = {effective}",
              flush=True)
    results = _summary(job, _train(job), samples)
    if ctx.world_size > 1:
        dist.barrier()
        del job  # release DDP's reducer (and its hook) before the teardown
        gc.collect()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, print and write on rank 0, and tear the process group down."""
    arguments = parse_arguments(argv)
    with process_group_session():
        if arguments.sweep is None:
            results = _run(arguments)
            summaries = [results]
        else:  # one process group, every (k, sync) of the sweep
            summaries = [_run(argparse.Namespace(**{**vars(arguments), "accumulation_steps": k,
                                                     "sync": sync}))
                         for k in arguments.sweep for sync in ("window", "every")]
            results = {"runs": summaries}
        if not dist.is_initialized() or dist.get_rank() == 0:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle, indent=1)
            for summary in summaries:
                print(_summary_line(summary), flush=True)
    return 0


def _summary_line(summary: dict) -> str:
    return (f"k={summary['accumulation_steps']} sync={summary['sync']}: bytes/step "
            f"{summary['bytes_per_step']:.0f}, syncs/step {summary['syncs_per_step']:.0f}, "
            f"max cross-rank difference {summary['max_cross_rank_difference']:.1e}, "
            f"vs single process {summary['max_difference_to_single_process']:.1e}")


if __name__ == "__main__":
    run_worker(main)
