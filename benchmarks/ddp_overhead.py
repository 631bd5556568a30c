"""The engine under DDP against the plain nanoGPT ``no_sync`` loop, timed side by side.

Run by ``benchmarks/run.py`` under torchrun (2 gloo processes). Each contender (the engine, the
engine without its gradient-norm history, the plain loop) gets its own DDP-wrapped copy of the
same MLP, the same micro-batches and AdamW; the timed calls are collective, and
``time_interleaved``'s order is the same on every rank. Ratios are paired (the median of
per-round ratios). Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.parallel import DistributedDataParallel

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.bench import paired_ratio, steady_allocator, time_interleaved
from gradaccum_lib.data import make_toy_classification
from gradaccum_lib.distributed import init_distributed, process_group_session, run_worker
from gradaccum_lib.frameworks import bare_loop
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.models import make_mlp


def mean_loss(model, batch):  # noqa: ANN001, ANN201
    summed, count = sample_classification_loss(model, batch)
    return summed / count


def main() -> int:
    """Time both loops for k = 1, 2, 4, 8, 16; rank 0 writes the medians and ratios."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=61)
    parser.add_argument("--hidden-dim", type=int, default=1024)
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    steady_allocator()
    ctx = init_distributed(120.0)
    with process_group_session():
        batch = make_toy_classification(256, 256, 4, seed=ctx.rank, dtype=torch.float32)
        rows = []
        for k in (1, 2, 4, 8, 16):
            window = split_into_micro_batches(batch, accumulation_steps=k)
            engine_model, quiet_model, plain_model = (DistributedDataParallel(
                make_mlp(256, arguments.hidden_dim, 4, dtype=torch.float32)) for _ in range(3))
            engine, quiet = (AccumulationTrainer(
                model, sample_classification_loss, torch.optim.AdamW(model.parameters(), lr=1e-4),
                accumulation_steps=k, progress=False, track_grad_norm=norm)
                for model, norm in ((engine_model, True), (quiet_model, False)))
            plain = bare_loop(plain_model, torch.optim.AdamW(plain_model.parameters(), lr=1e-4),
                              k, mean_loss)
            timings = time_interleaved({"engine": lambda e=engine, w=window: e.step_window(w),
                                        "engine_no_norm": lambda e=quiet, w=window:
                                        e.step_window(w),
                                        "plain": lambda p=plain, w=window: p(w)},
                                       repeats=arguments.repeats, warmup=3)
            rows.append({"k": k, **{name: {"median": t.median, "min": t.min, "max": t.max}
                                    for name, t in timings.items()},
                         "engine_vs_plain": paired_ratio(timings["engine"], timings["plain"]),
                         "engine_no_norm_vs_plain": paired_ratio(timings["engine_no_norm"],
                                                                 timings["plain"])})
            if ctx.is_main:
                print(f"DDP k={k:2d}: engine / plain no_sync loop "
                      f"{rows[-1]['engine_vs_plain']:.3f} (no norm "
                      f"{rows[-1]['engine_no_norm_vs_plain']:.3f})", flush=True)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump({"rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    run_worker(main)
