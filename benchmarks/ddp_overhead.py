"""The library's loop under DDP against the exact plain ``no_sync`` loop, timed side by side.

Exactness needs the global item count, and every exact peer pays one collective for it, so
the library's loop is compared with the exact plain loop, not with nanoGPT's inexact one. Run
by ``benchmarks/run.py`` under torchrun (2 gloo processes). The contenders share five
DDP-wrapped copies of the same MLP (each with its AdamW), the same micro-batches:

- ``library``: :func:`~gradaccum_lib.accumulation.accumulate_window`;
- ``exact_plain``: the plain loop written torchtune-style (``run.exact_plain_loop``): summed
  losses, one async all-reduce of the window's item count during the last backward, one
  rescale by world size / global items. Checked exact against the library's loop on
  uneven micro-batches and ranks (:func:`check_exact`) before anything is timed;
- ``plain``: the nanoGPT loop (DDP's all-reduce; it divides by k, so it is exact only when
  every rank's micro-batches hold the same number of samples): ``exact_plain / plain`` is the
  price of exactness;
- ``exact_plain_copy``: the exact plain loop again (an A/A control: what a tie measures);
- ``library_no_norm``: the library's loop less its pass for the gradient's norm
  (``run.without_gradient_norm``): what the non-finite-gradient check costs.

What makes the A/A control resolve 1% (it spanned 0.958-1.038 with 121 rounds on fixed
copies): the contenders trade the five copies every turn (``run.trading_copies``), so a copy's
memory layout lands on every contender alike; ``--repeats`` rounds (400 by default: the
median's error falls as 1 / sqrt(rounds)); ten warm-up rounds; each rank pinned to a core of
its own, before its process group starts, so that gloo's threads stay there too, when the
machine has a core per rank. Each window is timed after a barrier (``time_interleaved(
before=...)``), so that one rank's lag does not land on the next window; a contender's turn
is ``--windows-per-turn`` consecutive windows (1 by default: turns of 4 measured the same
ratios with twice the spread of the A/A control). Ratios are paired (the median of per-round
ratios), and so is the library's fixed cost per window (the median of per-round
differences, in µs); rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.audits.frameworks import bare_loop
from gradaccum_course.launch import run_worker
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.bench import Timing, paired_ratio, steady_allocator, time_interleaved
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402 - benchmarks/run.py, beside this file
    exact_plain_loop,
    trading_copies,
    warm_up,
    without_gradient_norm,
)

CONTENDERS = ("library", "library_no_norm", "plain", "exact_plain", "exact_plain_copy")
#: JSON key: (numerator, denominator) of a paired ratio
RATIOS = {"library_vs_exact_plain": ("library", "exact_plain"),
          "library_no_norm_vs_exact_plain": ("library_no_norm", "exact_plain"),
          "exact_plain_vs_plain": ("exact_plain", "plain"),
          "exact_plain_copy_vs_exact_plain": ("exact_plain_copy", "exact_plain")}
WARM_UP_ROUNDS = 10


def mean_loss(model, batch):  # noqa: ANN001, ANN201
    summed, count = sample_classification_loss(model, batch)
    return summed / count


def check_exact(rank: int) -> None:
    """Raise unless one window of :func:`exact_plain_loop` updates the model as the library's
    loop does, on micro-batches uneven within and across ranks (SGD: AdamW's first step
    barely sees a gradient's scale)."""
    window = split_into_micro_batches(make_toy_classification(10 + 3 * rank, 16, 4, seed=rank),
                                      accumulation_steps=3)
    library, exact = (DistributedDataParallel(make_mlp(16, 8, 4)) for _ in range(2))
    accumulate_window(library, torch.optim.SGD(library.parameters(), lr=1.0), window,
                      sample_classification_loss)
    exact_plain_loop(exact, torch.optim.SGD(exact.parameters(), lr=1.0),
                     sample_classification_loss)(window)
    for a, b in zip(library.parameters(), exact.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def median_difference_us(a: Timing, b: Timing) -> float:
    """Return the median over rounds of ``a``'s time minus ``b``'s in the same round, in µs."""
    return statistics.median(1e6 * (x - y) for x, y in zip(a.samples, b.samples, strict=True))


def contenders(k: int, window: list, hidden_dim: int, windows_per_turn: int) -> dict:
    """Return the five timed calls (one window each) for accumulation steps ``k``, trading
    five DDP copies of the model every turn (see the module doc)."""
    copies = [(model, torch.optim.AdamW(model.parameters(), lr=1e-4)) for model in (
        DistributedDataParallel(make_mlp(256, hidden_dim, 4, dtype=torch.float32))
        for _ in CONTENDERS)]

    def library(model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> Callable:
        return lambda window: accumulate_window(model, optimizer, window,
                                                sample_classification_loss)

    def plain(model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> Callable:
        return bare_loop(model, optimizer, k, mean_loss)

    def library_no_norm(model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                        ) -> Callable:
        return without_gradient_norm(library(model, optimizer))

    def exact_plain(model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                    ) -> Callable:
        return exact_plain_loop(model, optimizer, sample_classification_loss)

    makers = {"library": library, "library_no_norm": library_no_norm, "plain": plain,
              "exact_plain": exact_plain, "exact_plain_copy": exact_plain}
    return trading_copies(makers, copies, window, windows_per_turn)


def main() -> int:
    """Time the contenders for k = 1, 2, 4, 8, 16; rank 0 writes the medians and ratios."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--windows-per-turn", type=int, default=1)
    parser.add_argument("--hidden-dim", type=int, default=1024)
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    steady_allocator()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if hasattr(os, "sched_setaffinity") and world_size <= len(os.sched_getaffinity(0)):
        # before the process group starts: gloo's threads, made then, inherit the core
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    ctx = init_distributed(120.0)
    with process_group_session():
        check_exact(ctx.rank)
        batch = make_toy_classification(256, 256, 4, seed=ctx.rank, dtype=torch.float32)
        rows = []
        for k in (1, 2, 4, 8, 16):
            window = split_into_micro_batches(batch, accumulation_steps=k)
            calls = contenders(k, window, arguments.hidden_dim, arguments.windows_per_turn)
            warm_up(calls, WARM_UP_ROUNDS, arguments.windows_per_turn)
            timings = time_interleaved(calls, repeats=arguments.repeats, warmup=0,
                                       before=dist.barrier,
                                       calls_per_turn=arguments.windows_per_turn)
            row = {"k": k, "windows_per_turn": arguments.windows_per_turn,
                   **{name: {"median": t.median, "min": t.min, "max": t.max}
                      for name, t in timings.items()},
                   **{key: paired_ratio(timings[a], timings[b]) for key, (a, b) in RATIOS.items()},
                   "library_minus_exact_plain_us": median_difference_us(
                       timings["library"], timings["exact_plain"])}
            rows.append(row)
            if ctx.is_main:
                print(f"DDP k={k:2d}: library / exact plain loop "
                      f"{row['library_vs_exact_plain']:.3f} "
                      f"({row['library_minus_exact_plain_us']:+.0f} µs), without its norm "
                      f"{row['library_no_norm_vs_exact_plain']:.3f}; exact plain / nanoGPT "
                      f"{row['exact_plain_vs_plain']:.3f}; A/A "
                      f"{row['exact_plain_copy_vs_exact_plain']:.3f}", flush=True)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump({"rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    run_worker(main)
