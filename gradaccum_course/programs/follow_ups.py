"""The harness of the three torchrun programs notebook 08 writes (build/pipeline_window.py,
build/compiled_no_sync.py, build/fsdp2_sync.py): everything a rank does around what it measures.

Each program defines ``measure(ctx)``, what one rank measures, and hands it to
:func:`run_on_ranks`: join the process group (gloo on CPUs, nccl on GPUs), run ``measure``,
gather every rank's result, and have rank 0 write the list, one result per rank, as JSON to the
path after ``--json`` (where ``launch()`` reads it). The programs add this folder to their path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from gradaccum_course.launch import run_worker
from gradaccum_lib.distributed import DistributedContext, init_distributed, process_group_session
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp


def run_on_ranks(measure: Callable[[DistributedContext], object]) -> None:
    """Run ``measure(ctx)`` on every rank of a torchrun run; rank 0 writes all the results."""

    def main() -> int:
        ctx = init_distributed()
        with process_group_session():  # a barrier on success; the group destroyed in any case
            results = [None] * ctx.world_size
            dist.all_gather_object(results, measure(ctx))
            if ctx.is_main:
                with open(sys.argv[sys.argv.index("--json") + 1], "w") as handle:
                    json.dump(results, handle)
        return 0

    run_worker(main)  # exits without interpreter teardown, where gloo's threads can abort


def toy_data(samples: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The same ``samples`` float64 inputs (16 features) and labels (4 classes) on every rank."""
    return tuple(t.to(device) for t in make_toy_classification(samples, 16, 4, seed=0))


def gradient(module: nn.Module) -> list[float]:
    """Every parameter's ``.grad`` of ``module``, flat, as a list for JSON."""
    return torch.cat([p.grad.flatten() for p in module.parameters()]).tolist()


def gradient_shard(model: nn.Module) -> torch.Tensor | None:
    """This rank's shard of an FSDP2 model's reduced gradient (None before any backward)."""
    grads = [p.grad.to_local().flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat(grads).clone() if grads else None


class Classifier(nn.Module):
    """The MLP (16 -> 32 -> 4, seed 1) in a module with a forward of its own: compiled inside
    DDP, a bare ``nn.Sequential`` compiles no graph (as reported for other DDP models,
    https://github.com/pytorch/pytorch/issues/140416), so counting no_sync's all-reduces on it
    would measure an eager model."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = make_mlp(16, 32, 4, seed=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)
