"""A torchrun program: the engine's DDP step times, one sync per window against one per
micro-step, interleaved (what :func:`gradaccum_lib.measure.planning.fit_ddp_step_model`
fits; notebook 05 §5).

Usage: ``torchrun --nproc_per_node=2 -m gradaccum_lib.jobs.step_times --ks 1,2,4,8 --repeats 30
--json build/step_times.json`` (or ``launch("gradaccum_lib.jobs.step_times", [...])``). Each rank
takes its own ``8 x max(k)`` samples of the toy classification set (seeded by its rank), in
micro-batches of 8, and times section 3's MLP (``make_mlp(16, 256, 4)``, float64); rank 0
writes the world size, the model's parameter bytes and every (k, sync)'s samples.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..accumulation import AccumulationTrainer
from ..batches import Batch, LossFn
from ..distributed import init_distributed, process_group_session
from ..losses import sample_classification_loss
from ..measure.bench import Timing, time_interleaved
from ..runtime import check_positive_int
from ..workloads.data import make_toy_classification
from ..workloads.models import make_mlp
from .agent import run_worker

__all__ = ["main", "time_ddp_steps"]

_MICRO_BATCH = 8


def _measurements(accumulation_steps: Sequence[int]) -> list[int]:
    if isinstance(accumulation_steps, (str, bytes)) or not isinstance(accumulation_steps,
                                                                      Sequence):
        raise TypeError(f"accumulation_steps must be a sequence of ints; got "
                        f"{type(accumulation_steps).__name__}")
    for index, k in enumerate(accumulation_steps):
        check_positive_int(f"accumulation_steps[{index}]", k)
    return [int(k) for k in accumulation_steps]


def time_ddp_steps(
    model: nn.Module,
    loss_fn: LossFn,
    micro_batches: Sequence[Batch],
    accumulation_steps: Sequence[int],
    *,
    repeats: int = 20,
    warmup: int = 2,
    make_optimizer: Callable[[object], torch.optim.Optimizer] | None = None,
) -> dict[tuple[int, str], Timing]:
    """Return the seconds of one optimizer step for each k in ``accumulation_steps`` and each
    sync (``"window"``: once per window; ``"every"``: every micro-step), measured by
    :func:`~gradaccum_lib.measure.bench.time_interleaved`: every (k, sync) is an engine over its own
    copy of ``model`` (DDP-wrapped inside a process group of several ranks) stepping the first
    k of ``micro_batches``, all of them interleaved in each of ``repeats`` rounds after
    ``warmup`` rounds. In a process group each sample is the slowest rank's (identical on every
    rank). ``model`` itself is not changed.
    """
    ks = _measurements(accumulation_steps)
    micro_batches = list(micro_batches)
    if not ks or max(ks) > len(micro_batches):
        raise ValueError(f"accumulation_steps must be non-empty and at most the number of "
                         f"micro_batches ({len(micro_batches)}); got {list(accumulation_steps)}")
    grouped = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    make_optimizer = make_optimizer or (lambda parameters: torch.optim.SGD(parameters, lr=0.01))
    steps = {}
    for k, sync in itertools.product(dict.fromkeys(int(k) for k in ks), ("window", "every")):
        copied = copy.deepcopy(model)
        wrapped = nn.parallel.DistributedDataParallel(copied) if grouped else copied
        trainer = AccumulationTrainer(wrapped, loss_fn, make_optimizer(wrapped.parameters()),
                                      accumulation_steps=k, progress=False,
                                      sync_every_micro_step=sync == "every")
        steps[k, sync] = (lambda trainer=trainer, k=k: trainer.step_window(micro_batches[:k]))
    timings = time_interleaved(steps, repeats=repeats, warmup=warmup)
    if grouped:
        device = next(model.parameters()).device
        for key, timing in timings.items():
            samples = torch.tensor(timing.samples, dtype=torch.float64, device=device)
            dist.all_reduce(samples, op=dist.ReduceOp.MAX)
            timings[key] = Timing(tuple(samples.tolist()))
    return timings


def _ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ks takes comma-separated ints; got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--ks takes positive ints; got {text!r}")
    return ks


def main(argv: list[str] | None = None) -> int:
    """Time the steps on this rank; rank 0 writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=_ks, default=[1, 2, 4, 8], help="k values, e.g. 1,2,4,8")
    parser.add_argument("--repeats", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--json", required=True, help="where rank 0 writes the samples")
    arguments = parser.parse_args(argv)
    check_positive_int("--repeats", arguments.repeats)
    ks = arguments.ks
    with process_group_session():
        ctx = init_distributed()
        inputs, labels = make_toy_classification(_MICRO_BATCH * max(ks), 16, 4, seed=ctx.rank)
        micro_batches = [(x.to(ctx.device), y.to(ctx.device)) for x, y in
                         zip(inputs.split(_MICRO_BATCH), labels.split(_MICRO_BATCH), strict=True)]
        model = make_mlp(16, 256, 4, seed=0).to(ctx.device)
        timings = time_ddp_steps(model, sample_classification_loss, micro_batches, ks,
                                 repeats=arguments.repeats, warmup=2)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump({"world_size": ctx.world_size,
                           "parameter_bytes": sum(p.numel() * p.element_size()
                                                  for p in model.parameters()),
                           "timings": [[k, sync, list(timing.samples)]
                                       for (k, sync), timing in timings.items()]}, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
