"""The programs a notebook runs under torchrun: ``python -m gradaccum_course.programs.NAME``."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["syncing_every_micro_step"]


def syncing_every_micro_step(model: nn.Module) -> nn.Module:
    """Return ``model`` (a DDP or FSDP2 module the program built) with its sync switch turned
    into a no-op for this one object: DDP's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync``. The library's loop then all-reduces (or reduce-scatters)
    after every backward: the slow way the lessons compare with, not a flag of the loop."""
    if isinstance(model, DistributedDataParallel):
        model.no_sync = contextlib.nullcontext  # an instance attribute: this object only
    elif callable(getattr(model, "set_requires_gradient_sync", None)):
        model.set_requires_gradient_sync = lambda *arguments, **keywords: None
    else:
        raise TypeError("model must be DistributedDataParallel or an FSDP2 (fully_shard) "
                        f"module; got {type(model).__name__}")
    return model
