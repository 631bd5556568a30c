"""What accumulation holds in gradient memory under DDP and FSDP2, measured on each rank.

    torchrun --standalone --nproc_per_node=2 -m gradaccum_course.programs.memory_probe \
        --json out.json

**DDP.** The reducer allocates its gradient buckets when the model is wrapped. By default they
are a second copy of the gradients: each backward writes ``.grad`` and copies it into a bucket
for the all-reduce. With ``gradient_as_bucket_view=True`` each ``.grad`` is a view into its
bucket, so the copy is gone. The probe wraps the model both ways and trains one window
(``accumulate_window``), counting every tensor storage allocated from the wrap onwards
(``measure.memory.counting_tensor_bytes``: exact bytes, the buckets included, unlike the
process's resident memory); it reads what is held after the window's last backward, before
the optimizer step.

**FSDP2.** With ``set_requires_gradient_sync(False)`` (FSDP2's ``no_sync``) the backward pass
skips the reduce-scatter, so each rank keeps the UNSHARDED gradient of every parameter until
the window's last micro-batch: world_size times the bytes of the sharded gradient it holds when
it syncs every micro-step. The probe trains one window of two micro-batches each way (once per
window, and with its sync switch made a no-op, ``syncing_every_micro_step``) and reads the
gradients FSDP2 holds after the first micro-step (when the loop asks the loss of the second)
(its parameter groups are internal API, stable for the pinned torch). Rank 0 writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.launch import run_worker
from gradaccum_course.programs import syncing_every_micro_step
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.distributed import init_distributed, process_group_session
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.memory import counting_tensor_bytes
from gradaccum_lib.workloads.models import make_mlp


def _held_gradient_bytes(model: nn.Module) -> dict[str, int]:
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


def _held_after(model: nn.Module, window: list, read: Callable[[], object],
                micro_step: int) -> object:
    """Train one window (SGD) and return what ``read()`` saw after ``micro_step``'s backward:
    when the loop asks for the next micro-batch's loss, or, after the last one, just before
    the optimizer steps."""
    held, calls = [], []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(model: nn.Module, micro_batch: object) -> object:
        if len(calls) == micro_step + 1:
            held.append(read())
        calls.append(None)
        return sample_classification_loss(model, micro_batch)

    if micro_step == len(window) - 1:
        optimizer.register_step_pre_hook(lambda *_: held.append(read()))
    accumulate_window(model, optimizer, window, loss_fn)
    return held[0]


def _settled_cuda_bytes(device: torch.device) -> int:
    """Return the CUDA allocator's allocated bytes once the previous measurement's tensors are
    gone: its cyclic garbage collected, and the bucket its last all-reduce handed to NCCL
    released (it was still allocated after garbage collection and freed during the next
    wrap: read before that, a default-versus-views difference came out 0 or 3 copies instead
    of 1 on an H200)."""
    gc.collect()
    dist.barrier()
    torch.cuda.synchronize(device)
    allocated = torch.cuda.memory_allocated(device)
    for _ in range(40):  # at most 2 s: until two readings 50 ms apart agree
        time.sleep(0.05)
        now = torch.cuda.memory_allocated(device)
        if now == allocated:
            break
        allocated = now
    return allocated


def _ddp_held_bytes(input_dim: int, hidden_dim: int, window: list, device: torch.device, *,
                   gradient_as_bucket_view: bool) -> dict[str, int | None]:
    """Return the tensor bytes held after the last backward of one window on a model
    wrapped in DDP (counted from the wrap on: buckets, gradients, what else is alive), the
    model's gradient bytes, and on CUDA the allocator's bytes over the same span: held after
    the last backward, at the wrap (the buckets), and peak (None on a CPU)."""
    cuda = device.type == "cuda"
    model = make_mlp(input_dim, hidden_dim, 4, dtype=torch.float32).to(device)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    allocated = _settled_cuda_bytes(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def cuda_bytes() -> int | None:
        return torch.cuda.memory_allocated(device) - allocated if cuda else None

    def read() -> tuple[int, int | None]:
        return counted.live, cuda_bytes()

    with counting_tensor_bytes() as counted:
        wrapped = DistributedDataParallel(model, gradient_as_bucket_view=gradient_as_bucket_view)
        cuda_wrap = cuda_bytes()
        held, cuda_held = _held_after(wrapped, window, read, micro_step=len(window) - 1)
    return {"k": len(window), "held_bytes": held, "gradient_bytes": gradient_bytes,
            "cuda_held_bytes": cuda_held, "cuda_wrap_bytes": cuda_wrap,
            "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) - allocated if cuda
            else None}


def _fsdp2_held_bytes(input_dim: int, hidden_dim: int, window: list,
                     device: torch.device) -> dict[str, object]:
    """Return the gradient bytes FSDP2 holds after a window's first micro-step, syncing once
    per window (``no_sync``) and every micro-step (``sync``), and the parameter bytes."""
    from torch.distributed.fsdp import fully_shard

    results: dict[str, object] = {}
    for name, sync_every in (("no_sync", False), ("sync", True)):
        model = make_mlp(input_dim, hidden_dim, 4, dtype=torch.float32).to(device)
        for layer in (model[0], model[-1]):
            fully_shard(layer)
        fully_shard(model)
        results["parameter_bytes"] = sum(p.numel() * p.element_size()  # DTensor: global
                                         for p in model.parameters())
        if sync_every:
            syncing_every_micro_step(model)
        results[name] = _held_after(model, window, lambda model=model:
                                    _held_gradient_bytes(model), micro_step=0)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Measure DDP both ways and FSDP2 both ways; write JSON on rank 0."""
    parser = argparse.ArgumentParser(prog="python -m gradaccum_course.programs.memory_probe")
    parser.add_argument("--json", required=True)
    parser.add_argument("--input-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--ks", type=int, nargs="*", default=[],
                        help="also measure DDP both ways at these k (windows of k micro-batches "
                             "of 8 samples each): 'ddp_per_k' in the JSON")
    arguments = parser.parse_args(argv)
    if any(k < 1 for k in arguments.ks):
        parser.error(f"--ks must be >= 1; got {arguments.ks}")
    ctx = init_distributed()
    with process_group_session():
        generator = torch.Generator().manual_seed(ctx.rank)
        size = 8 * max([2, *arguments.ks])
        inputs = torch.randn(size, arguments.input_dim, generator=generator).to(ctx.device)
        labels = torch.randint(0, 4, (size,), generator=generator).to(ctx.device)
        windows = {k: [(inputs[8 * i:8 * i + 8], labels[8 * i:8 * i + 8]) for i in range(k)]
                   for k in {2, *arguments.ks}}
        dims = (arguments.input_dim, arguments.hidden_dim)

        def both_ways(k: int) -> dict[str, dict]:
            return {view_name: _ddp_held_bytes(*dims, windows[k], ctx.device,
                                               gradient_as_bucket_view=view)
                    for view_name, view in (("default", False),
                                            ("gradient_as_bucket_view", True))}

        results: dict[str, object] = {
            "world_size": ctx.world_size, "ddp": both_ways(2),
            "ddp_per_k": [both_ways(k) for k in arguments.ks],
            **_fsdp2_held_bytes(*dims, windows[2], ctx.device)}
        if ctx.is_main:
            with open(arguments.json, "w") as handle:
                json.dump(results, handle)
    return 0


if __name__ == "__main__":
    run_worker(main)
