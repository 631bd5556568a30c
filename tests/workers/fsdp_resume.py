"""Test worker: the engine's checkpoints under FSDP2 (2 gloo processes) resume exactly.

Trains 4 windows straight; then, from a checkpoint taken after window 2, a fresh sharded model
and trainer train windows 3 and 4. Rank 0 writes both final parameter vectors as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.batches import split_into_micro_batches
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.jobs.resume import Resumable
from gradaccum_lib.jobs.agent import run_worker
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


def _trainer() -> AccumulationTrainer:
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(make_mlp(8, 16, 3, seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return AccumulationTrainer(model, sample_classification_loss, optimizer,
                               accumulation_steps=2, max_grad_norm=1.0, progress=False)


def _parameters(trainer: AccumulationTrainer) -> list[float]:
    return torch.cat([p.detach().full_tensor().reshape(-1)  # FSDP2 parameters are DTensors
                      for p in trainer.model.parameters()]).tolist()


def main() -> int:
    """Train straight and resumed; rank 0 writes both parameter vectors."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    ctx = init_distributed(60.0)
    with process_group_session():
        data = make_toy_classification(32, 8, 3, seed=ctx.rank)  # each rank its own shard
        micro_batches = split_into_micro_batches(data, micro_batch_size=4)  # 8 = 4 windows
        straight = _trainer()
        straight.train_epoch(micro_batches)
        directory = [tempfile.mkdtemp() if ctx.is_main else None]
        dist.broadcast_object_list(directory, src=0)
        path = Path(directory[0]) / "fsdp.pt"
        interrupted = _trainer()
        Resumable(interrupted).train_epoch(micro_batches, max_windows=2, checkpoint_path=path,
                                           checkpoint_every=2)
        resumed = _trainer()
        resumable = Resumable(resumed)
        resumable.load_checkpoint(path)
        resumable.train_epoch(micro_batches)
        results = {"straight": _parameters(straight), "resumed": _parameters(resumed),
                   "optimizer_steps": resumed.optimizer_steps}
        if ctx.is_main:
            Path(arguments.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    run_worker(main)
