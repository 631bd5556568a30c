"""What accumulation costs under FSDP2: gradient bytes each rank holds, measured.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m gradaccum_lib.jobs.fsdp_probe \\
        --json out.json

With ``set_requires_gradient_sync(False)`` (FSDP2's ``no_sync``) the backward pass skips the
reduce-scatter, so each rank keeps the UNSHARDED gradient of every parameter until the window's
last micro-batch: world_size times the bytes of the sharded gradient it holds when it syncs
every micro-step. The probe trains one window of two micro-batches with the engine each way
(once per window, and ``sync_every_micro_step=True``) and an observer reads the gradients
FSDP2 holds after the first micro-step (its parameter groups are internal API, stable for the
pinned torch). Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch
from torch import nn

from ..accumulation import AccumulationTrainer
from ..distributed import init_distributed, process_group_session
from ..losses import sample_classification_loss
from ..workloads.models import make_mlp
from .worker import run_worker


def held_gradient_bytes(model: nn.Module) -> dict[str, int]:
    """Return the bytes of unsharded and sharded gradients this rank holds for ``model``."""
    held = {"unsharded": 0, "sharded": 0}
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None)
        for fsdp_param in group.fsdp_params if group is not None else ():
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            for key, grad in (("unsharded", unsharded.grad if unsharded is not None else None),
                              ("sharded", fsdp_param.sharded_param.grad)):
                if grad is not None:
                    local = grad.to_local() if hasattr(grad, "to_local") else grad
                    held[key] += local.numel() * local.element_size()
    return held


class HeldGradientProbe:
    """An engine observer: the gradient bytes held after the window's first micro-step."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.held: dict[str, int] | None = None

    def on_micro_step(self, parameters: object, micro_step: int, *_: object) -> None:
        """Record what the rank holds after micro-step 0's backward."""
        if micro_step == 0:
            self.held = held_gradient_bytes(self.model)

    def on_window_end(self, *_: object) -> None:
        """Nothing at the window's end."""


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both ways and write JSON on rank 0."""
    from torch.distributed.fsdp import fully_shard

    parser = argparse.ArgumentParser(prog="python -m gradaccum_lib.jobs.fsdp_probe")
    parser.add_argument("--json", required=True)
    parser.add_argument("--input-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=256)
    arguments = parser.parse_args(argv)
    ctx = init_distributed()
    if ctx.world_size < 2:
        parser.error("run under torchrun with at least 2 processes")
    with process_group_session():
        generator = torch.Generator().manual_seed(ctx.rank)
        inputs = torch.randn(8, arguments.input_dim, generator=generator)
        labels = torch.randint(0, 4, (8,), generator=generator)
        window = [(inputs[:4], labels[:4]), (inputs[4:], labels[4:])]
        results: dict[str, object] = {"world_size": ctx.world_size}
        for name, sync_every in (("no_sync", False), ("sync", True)):
            model = make_mlp(arguments.input_dim, arguments.hidden_dim, 4, dtype=torch.float32)
            for layer in (model[0], model[-1]):
                fully_shard(layer)
            fully_shard(model)
            results["parameter_bytes"] = sum(p.numel() * p.element_size()  # DTensor: global
                                             for p in model.parameters())
            probe = HeldGradientProbe(model)
            AccumulationTrainer(model, sample_classification_loss,
                                torch.optim.SGD(model.parameters(), lr=0.1),
                                accumulation_steps=2, progress=False, observers=[probe],
                                sync_every_micro_step=sync_every).step_window(window)
            results[name] = probe.held
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
