"""The engine under DDP against the plain nanoGPT ``no_sync`` loop, timed side by side.

Run by ``benchmarks/run.py`` under torchrun (2 gloo processes). Each contender gets its own
DDP-wrapped copy of the same MLP, the same micro-batches and AdamW:

- ``engine`` and ``engine_no_norm``: the engine, with and without its gradient-norm history;
- ``plain``: the nanoGPT loop (DDP's C++ all-reduce; it divides by k, so it is exact only when
  every rank's micro-batches hold the same number of samples);
- ``plain_carrying``: the plain loop whose last backward carries a window's totals the way the
  engine's does (the engine's comm hook, :func:`~gradaccum_lib.comm_hooks.reduce_bucket`):
  the price of the global item count alone, without the rest of the engine;
- ``plain_copy``: the plain loop again on another copy (an A/A control: what a tie measures).

Each window is timed after a barrier (``time_interleaved(before=...)``), so that one rank's lag
does not land on the next window; a contender's turn is ``--windows-per-turn`` consecutive
windows (1 by default: turns of 4 measured the same ratios with twice the spread of the A/A
control). Each rank's main thread stays on a core of its own when there are enough. Ratios
are paired (the median of per-round ratios); rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.bench import paired_ratio, steady_allocator, time_interleaved
from gradaccum_lib.comm_hooks import attach_window_totals
from gradaccum_lib.data import make_toy_classification
from gradaccum_lib.distributed import init_distributed, process_group_session, run_worker
from gradaccum_lib.frameworks import bare_loop
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.models import make_mlp
from gradaccum_lib.totals import local_totals

CONTENDERS = ("engine", "engine_no_norm", "plain", "plain_carrying", "plain_copy")


def mean_loss(model, batch):  # noqa: ANN001, ANN201
    summed, count = sample_classification_loss(model, batch)
    return summed / count


def carrying_loss(carrier):  # noqa: ANN001, ANN201
    """The plain loop's loss, handing the window's last backward this micro-batch's totals
    (``totals.local_totals``, the engine's layout) as the engine hands its window's."""
    if carrier is None:
        raise RuntimeError("the plain model already has a comm hook: nothing can carry totals")

    def loss(model, batch):  # noqa: ANN001, ANN202
        summed, count = sample_classification_loss(model, batch)
        if model.require_backward_grad_sync:  # bare_loop set it: the window's last micro-step
            carrier.pending = torch.tensor(local_totals([summed.item()], [count.item()]),
                                           dtype=torch.float64)
        return summed / count
    return loss


def contenders(k: int, window: list, hidden_dim: int) -> dict:
    """Return the five timed calls (one window each) for accumulation steps ``k`` (see the
    module doc)."""
    models = {name: DistributedDataParallel(make_mlp(256, hidden_dim, 4, dtype=torch.float32))
              for name in CONTENDERS}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4)
                  for name, model in models.items()}
    calls = {}
    for name in ("engine", "engine_no_norm"):
        trainer = AccumulationTrainer(models[name], sample_classification_loss, optimizers[name],
                                      accumulation_steps=k, progress=False,
                                      track_grad_norm=name == "engine")
        calls[name] = lambda t=trainer: t.step_window(window)
    for name in ("plain", "plain_copy"):
        run = bare_loop(models[name], optimizers[name], k, mean_loss)
        calls[name] = lambda r=run: r(window)
    carrier = attach_window_totals(models["plain_carrying"])
    run = bare_loop(models["plain_carrying"], optimizers["plain_carrying"], k,
                    carrying_loss(carrier))
    calls["plain_carrying"] = lambda r=run, c=carrier: (r(window), c.take())
    return calls


def main() -> int:
    """Time the contenders for k = 1, 2, 4, 8, 16; rank 0 writes the medians and ratios."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=121)
    parser.add_argument("--windows-per-turn", type=int, default=1)
    parser.add_argument("--hidden-dim", type=int, default=1024)
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    steady_allocator()
    ctx = init_distributed(120.0)
    if hasattr(os, "sched_setaffinity") and ctx.world_size <= len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[ctx.rank]})
    with process_group_session():
        batch = make_toy_classification(256, 256, 4, seed=ctx.rank, dtype=torch.float32)
        rows = []
        for k in (1, 2, 4, 8, 16):
            window = split_into_micro_batches(batch, accumulation_steps=k)
            timings = time_interleaved(contenders(k, window, arguments.hidden_dim),
                                       repeats=arguments.repeats, warmup=3, before=dist.barrier,
                                       calls_per_turn=arguments.windows_per_turn)
            rows.append({"k": k, "windows_per_turn": arguments.windows_per_turn,
                         **{name: {"median": t.median, "min": t.min, "max": t.max}
                                    for name, t in timings.items()},
                         **{f"{name}_vs_plain": paired_ratio(timings[name], timings["plain"])
                            for name in CONTENDERS if name != "plain"}})
            if ctx.is_main:
                row = rows[-1]
                print(f"DDP k={k:2d}: engine / plain no_sync loop {row['engine_vs_plain']:.3f} "
                      f"(no norm {row['engine_no_norm_vs_plain']:.3f}; plain carrying the "
                      f"totals {row['plain_carrying_vs_plain']:.3f}; plain copy "
                      f"{row['plain_copy_vs_plain']:.3f})", flush=True)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump({"rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    run_worker(main)
