"""The program that exercise 05.3's checker runs under torchrun, on 2 gloo ranks: it imports
the reader's ``ddp_window(model, window)`` from each file named on its command line and
measures what it does to a DDP model, for the checker to name the kind of mistake.

Each rank holds 3 micro-batches of uneven sizes (its own window, the ranks' totals differ);
the truth is the gradient of the mean loss over both ranks' samples, computed in-process.
Per window and micro-step it records the sync flag the forward read (a forward pre-hook), the
flag at that micro-step's backward (a hook on the model's output) and whether that backward
all-reduced (a communication hook); then it compares the gradient with the truth and across
ranks. A second run sets the default device apart from the model's (``meta``; on a GPU
machine it is the CPU) and records the device of every tensor handed to ``dist.all_reduce``.
Rank 0 writes ``{path: measurements}`` to the JSON file that ends the command line.
Run: ``torchrun --nproc_per_node=2 -m gradaccum_course.programs.ddp_window_check FILE...
--json PATH``
(:func:`gradaccum_course.launch.launch` does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.launch import run_worker
from gradaccum_lib.distributed import init_distributed
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.models import make_mlp

#: each rank's micro-batch sizes in a window: uneven, and the ranks' totals differ
_SIZES = {0: (3, 1, 4), 1: (2, 5, 2)}
_ORIGINAL_ALL_REDUCE = dist.all_reduce


class _OffDevice(RuntimeError):
    """A tensor handed to ``dist.all_reduce`` that is not on the model's device."""


def _windows(seed: int) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every rank's micro-batches of one window (each process builds them all)."""
    generator = torch.Generator().manual_seed(seed)
    return {rank: [(torch.randn(n, 6, generator=generator, dtype=torch.float64),
                    torch.randint(0, 3, (n,), generator=generator)) for n in sizes]
            for rank, sizes in _SIZES.items()}


def _truth(model: nn.Module, windows: dict[int, list]) -> torch.Tensor:
    """The gradient of the mean loss over all ranks' samples of the window (the large batch)."""
    inputs = torch.cat([x for window in windows.values() for x, _ in window])
    labels = torch.cat([y for window in windows.values() for _, y in window])
    gradients = full_batch_gradients(model, sample_classification_loss, (inputs, labels))
    return torch.cat([g.flatten() for g in gradients.values()])


def _sync_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    """DDP's average of a bucket, recording that this micro-step synchronised."""
    state["synced"].add(state["step"])
    buffer = bucket.buffer().div_(dist.get_world_size())
    return _ORIGINAL_ALL_REDUCE(buffer, async_op=True).get_future().then(
        lambda future: future.value()[0])


def _instrumented(model: nn.Module, record: dict) -> DistributedDataParallel:
    """``model`` wrapped in DDP, recording per micro-step the flag its forward read, the flag
    at its backward, and whether its backward all-reduced."""
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(record, _sync_hook)

    def at_backward(gradient: torch.Tensor, step: int) -> None:
        record["step"] = step
        record["backward"][step] = ddp.require_backward_grad_sync

    def before_forward(module: nn.Module, args: tuple) -> None:
        record["forward"].append(ddp.require_backward_grad_sync)

    def after_forward(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        step = len(record["forward"]) - 1
        record["backward"].append(None)
        if output.requires_grad:
            output.register_hook(lambda gradient: at_backward(gradient, step))

    ddp.register_forward_pre_hook(before_forward)
    ddp.register_forward_hook(after_forward)
    return ddp


def _gradient_run(ddp_window: Callable, rank: int) -> list[dict]:
    """Two windows through the reader's ``ddp_window``: flags, syncs and the gradient's
    cosine and norm ratio to the truth, and its largest difference across ranks."""
    results = []
    for seed in (1, 2):
        windows, model = _windows(seed), make_mlp(6, 8, 3, seed=0)
        truth = _truth(model, windows)
        record: dict = {"forward": [], "backward": [], "synced": set(), "step": None}
        ddp = _instrumented(model, record)
        ddp_window(ddp, windows[rank])
        gradient = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                              for p in model.parameters()])
        reference = gradient.clone()
        dist.broadcast(reference, src=0)
        across = (gradient - reference).abs().max()
        _ORIGINAL_ALL_REDUCE(across, op=dist.ReduceOp.MAX)
        results.append({
            "forward_flags": record["forward"], "backward_flags": record["backward"],
            "synced": [step in record["synced"] for step in range(len(record["forward"]))],
            "cosine": nn.functional.cosine_similarity(gradient, truth, dim=0).item(),
            "ratio": (gradient @ truth / (truth @ truth)).item(), "across_ranks": across.item()})
    return results


def _device_run(ddp_window: Callable, rank: int) -> list[str]:
    """The devices of the tensors the reader's window hands to ``dist.all_reduce`` while the
    default device is not the model's; raises :class:`_OffDevice` at the first one off it."""
    devices = []

    def recording_all_reduce(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        devices.append(str(tensor.device))
        if tensor.device != torch.device("cpu"):  # the model's device
            raise _OffDevice(f"dist.all_reduce got a tensor on {tensor.device}")
        return _ORIGINAL_ALL_REDUCE(tensor, *args, **kwargs)

    dist.all_reduce = recording_all_reduce
    try:
        ddp, window = DistributedDataParallel(make_mlp(6, 8, 3, seed=0)), _windows(3)[rank]
        with torch.device("meta"):  # a tensor made without device= lands here
            ddp_window(ddp, window)
    except _OffDevice:
        pass
    finally:
        dist.all_reduce = _ORIGINAL_ALL_REDUCE
    return devices


def _load(target: str, index: int) -> Callable:
    """The function ``NAME`` of the file ``PATH`` that ``target`` (``PATH::NAME``) names."""
    path, _, name = target.partition("::")
    spec = importlib.util.spec_from_file_location(f"reader_window_{index}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name or "ddp_window")


def _measure(target: str, index: int, rank: int) -> dict:
    """What the window ``target`` (``PATH::NAME``) does, or the error it raised (symmetric on
    both ranks)."""
    try:
        ddp_window = _load(target, index)
        windows = _gradient_run(ddp_window, rank)
    except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
        return {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
    try:
        devices = _device_run(ddp_window, rank)
    except Exception as error:  # noqa: BLE001
        return {"windows": windows, "device_error": f"{type(error).__name__}: {error}"
                .splitlines()[0][:300]}
    return {"windows": windows, "all_reduce_devices": devices}


def _main() -> int:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # 2 gloo ranks on the CPU, on any machine
    context = init_distributed(timeout_seconds=30)
    targets, json_path = sys.argv[1:-2], sys.argv[-1]
    results = {target: _measure(target, index, context.rank)
               for index, target in enumerate(targets)}
    if context.is_main:
        Path(json_path).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_worker(_main)
