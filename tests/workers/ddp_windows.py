"""Exercise 05.3's windows for the tests: the right one and one per kind of mistake the
checker names. Each leaves in .grad the window's gradient (or what its mistake makes of it)
for a DDP ``model`` and this rank's ``window`` of (inputs, labels) micro-batches."""

import contextlib

import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy


def _count(window, device=None):
    count = torch.tensor(float(sum(len(labels) for _, labels in window)), device=device)
    dist.all_reduce(count)  # the global window's samples
    return count


def right(model, window):
    count = _count(window, next(model.parameters()).device)
    for index, (inputs, labels) in enumerate(window):
        last = index == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            summed = cross_entropy(model(inputs), labels, reduction="sum")
            (summed * dist.get_world_size() / count).backward()


def mean_over_k(model, window):  # wrong divisor: each micro-batch's mean / k
    for index, (inputs, labels) in enumerate(window):
        last = index == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (cross_entropy(model(inputs), labels) * dist.get_world_size() / len(window)).backward()


def local_count(model, window):  # wrong divisor: this rank's samples, not the window's
    count = sum(len(labels) for _, labels in window)
    for index, (inputs, labels) in enumerate(window):
        last = index == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (cross_entropy(model(inputs), labels, reduction="sum") / count).backward()


def no_world_factor(model, window):
    count = _count(window, next(model.parameters()).device)
    for index, (inputs, labels) in enumerate(window):
        last = index == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (cross_entropy(model(inputs), labels, reduction="sum") / count).backward()


def flag_after_forward(model, window):
    count = _count(window, next(model.parameters()).device)
    for index, (inputs, labels) in enumerate(window):
        summed = cross_entropy(model(inputs), labels, reduction="sum")
        model.require_backward_grad_sync = index == len(window) - 1  # one micro-step late
        (summed * dist.get_world_size() / count).backward()


def no_sync_around_backward(model, window):  # the flag set after the forward, too
    count = _count(window, next(model.parameters()).device)
    for index, (inputs, labels) in enumerate(window):
        summed = cross_entropy(model(inputs), labels, reduction="sum")
        with contextlib.nullcontext() if index == len(window) - 1 else model.no_sync():
            (summed * dist.get_world_size() / count).backward()


def sync_first_not_last(model, window):
    count = _count(window, next(model.parameters()).device)
    for index, (inputs, labels) in enumerate(window):
        with contextlib.nullcontext() if index == 0 else model.no_sync():
            summed = cross_entropy(model(inputs), labels, reduction="sum")
            (summed * dist.get_world_size() / count).backward()


def count_off_device(model, window):  # the count on the default device, not the model's
    count = _count(window)
    for index, (inputs, labels) in enumerate(window):
        last = index == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            summed = cross_entropy(model(inputs), labels, reduction="sum")
            (summed * dist.get_world_size() / count).backward()
