"""Test worker: under FSDP2 (2 gloo processes), a checkpoint file of the job's format
(``write_checkpoint``; the model's and the optimizer's shards gathered into full states) resumes
``accumulate_window`` exactly.

Trains 4 windows straight; then a fresh sharded model trains 2 and saves, and another one loads
that checkpoint and trains windows 3 and 4. Rank 0 writes both final parameter vectors and the
resumed optimizer's step count as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from gradaccum_course.launch import run_worker
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import split_into_micro_batches, windows_of
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp
from recipes.emr_classification.checkpoints import read_checkpoint, write_checkpoint


def _sharded() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = fully_shard(make_mlp(8, 16, 3, seed=0))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, windows: list) -> None:
    for window in windows:
        accumulate_window(model, optimizer, window, sample_classification_loss,
                          max_grad_norm=1.0)


def _parameters(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().full_tensor().reshape(-1)  # FSDP2 parameters are DTensors
                      for p in model.parameters()]).tolist()


def main() -> int:
    """Train straight and resumed; rank 0 writes both parameter vectors."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    ctx = init_distributed(60.0)
    with process_group_session():
        data = make_toy_classification(32, 8, 3, seed=ctx.rank)  # each rank its own shard
        windows = list(windows_of(split_into_micro_batches(data, micro_batch_size=4), 2))
        straight = _sharded()
        _train(*straight, windows)  # 4 windows
        directory = [tempfile.mkdtemp() if ctx.is_main else None]
        dist.broadcast_object_list(directory, src=0)
        path = Path(directory[0]) / "fsdp.pt"
        interrupted = _sharded()
        _train(*interrupted, windows[:2])
        gathered = StateDictOptions(full_state_dict=True, cpu_offload=True)  # collectives
        state = {"model": get_model_state_dict(interrupted[0], options=gathered),
                 "optimizer": get_optimizer_state_dict(*interrupted, options=gathered)}
        if ctx.is_main:
            write_checkpoint(state, path)
        dist.barrier()
        resumed = _sharded()
        state = read_checkpoint(path, map_location="cpu")  # every rank: the full states
        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(resumed[0], state["model"], options=full)
        set_optimizer_state_dict(*resumed, state["optimizer"], options=full)
        _train(*resumed, windows[2:])
        step = resumed[1].state[next(resumed[0].parameters())]["step"]
        results = {"straight": _parameters(straight[0]), "resumed": _parameters(resumed[0]),
                   "optimizer_steps": int(step)}
        if ctx.is_main:
            Path(arguments.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    run_worker(main)
