"""What accumulation costs under FSDP2: gradient bytes each rank holds, measured.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m gradaccum_lib.fsdp_probe \\
        --json out.json

With ``set_requires_gradient_sync(False)`` (FSDP2's ``no_sync``) the backward pass skips the
reduce-scatter, so each rank keeps the UNSHARDED gradient of every parameter until the window's
last micro-batch: world_size times the bytes of the sharded gradient it holds when it syncs
every micro-step. The probe reads the gradients FSDP2 holds (its parameter groups are internal
API, stable for the pinned torch) after one backward each way. Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from .distributed import init_distributed, run_worker
from .models import make_mlp


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


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both ways and write JSON on rank 0."""
    from torch.distributed.fsdp import fully_shard

    parser = argparse.ArgumentParser(prog="python -m gradaccum_lib.fsdp_probe")
    parser.add_argument("--json", required=True)
    parser.add_argument("--input-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=256)
    arguments = parser.parse_args(argv)
    ctx = init_distributed()
    if ctx.world_size < 2:
        parser.error("run under torchrun with at least 2 processes")
    try:
        model = make_mlp(arguments.input_dim, arguments.hidden_dim, 4, dtype=torch.float32)
        for layer in (model[0], model[-1]):
            fully_shard(layer)
        fully_shard(model)
        generator = torch.Generator().manual_seed(ctx.rank)
        inputs = torch.randn(8, arguments.input_dim, generator=generator)
        labels = torch.randint(0, 4, (8,), generator=generator)
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        results = {"world_size": ctx.world_size, "parameter_bytes": parameter_bytes}
        for name, sync in (("no_sync", False), ("sync", True)):
            model.zero_grad(set_to_none=True)
            model.set_requires_gradient_sync(sync)
            nn.functional.cross_entropy(model(inputs), labels).backward()
            results[name] = held_gradient_bytes(model)
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_worker(main)
