"""Test worker: the device guard. Runs a reader's loop function (from the program a notebook
writes) on a CPU model while the DEFAULT device is ``meta``, so that a tensor built without
``device=`` lands on ``meta`` instead of on the model's device, and every collective the loop
calls checks that its tensor lives on the model's device.

On a CPU-only machine the model's device and the default device are both the CPU, so a plain
run cannot tell ``torch.tensor(n)`` from ``torch.tensor(n, device=model_device)``; under nccl
the first raises "No backend type associated with device type cpu". Here the two differ.

    python tests/workers/device_guard.py PROGRAM card|plain|sync_flag --json OUT

One process, a world-size-1 gloo group of its own (a FileStore in OUT's folder). Writes
{function: "ok" | the error} to OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "reduce")


class WrongDevice(RuntimeError):
    """A collective got a tensor that does not live on the model's device."""


def guard_collectives(model_device: torch.device) -> None:
    """Wrap ``torch.distributed``'s collectives: each checks its tensors' device first."""
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def checked(tensor, *args, _real=real, _name=name, **kwargs):  # noqa: ANN001, ANN202
            tensors = tensor if isinstance(tensor, (list, tuple)) else [tensor]
            for item in tensors:
                if isinstance(item, torch.Tensor) and item.device != model_device:
                    raise WrongDevice(f"dist.{_name} got a tensor on {item.device}; the model "
                                      f"is on {model_device} (nccl: 'No backend type "
                                      f"associated with device type {item.device.type}')")
            return _real(tensor, *args, **kwargs)

        setattr(dist, name, checked)


def card_calls(loops: dict) -> dict:
    """The answer card's train_window and train_window_fp16 on a DDP MLP, one window."""
    inputs, labels = make_toy_classification(32, 16, 4, seed=0, dtype=torch.float32)
    window = [(inputs[:10], labels[:10]), (inputs[10:], labels[10:])]

    def call(name: str):  # noqa: ANN202
        model = DistributedDataParallel(make_mlp(16, 32, 4, seed=1, dtype=torch.float32))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        if name == "train_window_fp16":
            scaler = torch.amp.GradScaler("cpu")
            return lambda: loops[name](model, optimizer, scheduler, scaler, window)
        return lambda: loops[name](model, optimizer, scheduler, window)

    return {name: call(name) for name in ("train_window", "train_window_fp16")}


def plain_calls(loops: dict) -> dict:
    """Notebook 05's plain train_window on a DDP token tagger, one window."""
    tokens = make_toy_token_batch(8, 24, 50, 4, seed=0)
    pairs = list(zip(tokens["input_ids"].split(4), tokens["labels"].split(4), strict=True))
    model = DistributedDataParallel(TokenTagger(50, 64, 4, seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    return {"train_window (ddp)": lambda: loops["train_window"](model, optimizer, pairs, "ddp")}


def sync_flag_calls(loops: dict) -> dict:
    """Notebook 05's sync_flag.py: train_window with the flag set before the forward (the
    loop its static_graph.py and set_epoch.py programs reuse) on a DDP MLP, one window."""
    inputs, labels = make_toy_classification(32, 16, 4, seed=0, dtype=torch.float64)
    window = [(inputs[i:i + 8], labels[i:i + 8]) for i in range(0, 32, 8)]
    model = DistributedDataParallel(make_mlp(16, 64, 4, seed=0, dtype=torch.float64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"train_window (flag before the forward)": lambda: loops["train_window"](
        model, optimizer, window, loops["flag_before_forward"])}


CALLS = {"card": card_calls, "plain": plain_calls, "sync_flag": sync_flag_calls}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("program", type=Path)
    parser.add_argument("kind", choices=tuple(CALLS))
    parser.add_argument("--json", type=Path, required=True)
    arguments = parser.parse_args()
    loops = runpy.run_path(str(arguments.program))  # its __main__ block does not run
    store = dist.FileStore(str(arguments.json.with_suffix(".store")), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    guard_collectives(torch.device("cpu"))
    calls = CALLS[arguments.kind](loops)
    results = {}
    for name, call in calls.items():
        torch.set_default_device("meta")  # a tensor made without device= lands here
        try:
            call()
            results[name] = "ok"
        except WrongDevice as error:
            results[name] = str(error)
        finally:
            torch.set_default_device(None)
    dist.destroy_process_group()
    arguments.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    status = main()
    # skip interpreter teardown, where gloo's threads can abort the process ("terminate called
    # without an active exception", seen once in a CI run); the results are written already
    sys.stdout.flush()
    os._exit(status)
