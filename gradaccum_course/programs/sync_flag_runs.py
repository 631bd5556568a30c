r"""Run the sync-flag loops of notebook 05 (``05_ddp_torchrun.ipynb``) side by side, under torchrun.

The notebook writes its loops to ``build/sync_flag.py``: ``flag_before_forward`` (the
library's ``accumulate_window``) and three ways to get DDP's sync flag wrong. This program is
their harness: it trains each loop from one start on the same ``DistributedSampler`` shards
(section 1's run: a float64 MLP, micro-batches of 8, k = 4, SGD) and after every optimizer
step records how many backward passes DDP synchronised (``CommCounter``) and how far the
ranks' parameters are apart. Rank 0 writes JSON: per loop, those records and its final
parameters.

    torchrun --standalone --nproc_per_node=2 \
        -m gradaccum_course.programs.sync_flag_runs build/sync_flag.py --json PATH

With ``--static-graph`` it trains ``flag_before_forward`` for two windows on a model that DDP
wraps with ``static_graph=True`` instead: the trap of notebook 05's section 4
(pytorch/pytorch issue #143580), where the ranks fail.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gradaccum_course.launch import run_worker
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.measure.comm import CommCounter
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

#: the loops of build/sync_flag.py, in the order the notebook compares them
LOOPS = ("flag_before_forward", "flag_after_forward", "no_sync_around_backward",
         "sync_first_not_last")
MICRO_BATCH, K = 8, 4


def _load_loops(path: str) -> object:
    """Import the notebook's ``build/sync_flag.py`` from ``path``."""
    spec = importlib.util.spec_from_file_location("sync_flag", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cross_rank_difference(model: torch.nn.Module) -> float:
    """Return max |parameters - rank 0's| over all ranks."""
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    difference = (mine - reference).abs().max()
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return difference.item()


def _train(loop, device: torch.device, windows: int, **ddp_options) -> dict:
    """Train section 1's run with ``loop`` for ``windows`` windows from one start; return the
    synchronised backward passes and the ranks' distance after each window, and the final
    parameters."""
    samples = MICRO_BATCH * K * dist.get_world_size() * windows
    inputs, labels = make_toy_classification(samples, 16, 4, seed=0, dtype=torch.float64)
    dataset = TensorDataset(inputs.to(device), labels.to(device))
    model = DistributedDataParallel(make_mlp(16, 64, 4, seed=0, dtype=torch.float64).to(device),
                                    **ddp_options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    counter, records = CommCounter(), []
    counter.register(model)
    micro_batches = list(DataLoader(dataset, batch_size=MICRO_BATCH, sampler=sampler))
    for start in range(0, len(micro_batches), K):
        loop(model, optimizer, micro_batches[start:start + K])
        records.append({"syncs": counter.take()["syncs"],
                        "across_ranks": _cross_rank_difference(model)})
    return {"windows": records, "final_parameters": torch.cat(
        [p.detach().flatten() for p in model.parameters()]).tolist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loops", help="the notebook's build/sync_flag.py")
    parser.add_argument("--static-graph", action="store_true",
                        help="the trap: flag_before_forward on DDP(static_graph=True)")
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    arguments = parser.parse_args()
    loops = _load_loops(arguments.loops)
    device = init_distributed().device
    with process_group_session():
        if arguments.static_graph:
            results = {"flag_before_forward": _train(loops.flag_before_forward, device, 2,
                                                     static_graph=True)}
        else:
            results = {name: _train(getattr(loops, name), device, 6) for name in LOOPS}
        if dist.get_rank() == 0:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
