"""Memory: what a training step holds, measured and modelled.

- :func:`activation_bytes` measures the bytes autograd saves for backward during one forward
  pass, on any device, with ``torch.autograd.graph.saved_tensors_hooks``: tensors are
  de-duplicated by storage (a view and its base count once) and parameters are excluded.
  ``tracemalloc`` cannot do this: it does not see torch's allocations.
- :func:`static_bytes` measures what does not depend on the batch: parameters, gradients and
  optimizer state, by summing the tensors themselves.
- :func:`memory_budget` is the model: parameters + gradients + optimizer state (+ fp32 master
  weights in mixed precision) (+ DDP's bucket copy of the gradients) + the activations of ONE
  micro-batch. Accumulation shrinks only the last term.
- :func:`tensor_peak_bytes` reports, on any device, the peak bytes of the tensors a step
  allocates and holds at once, counted exactly from the operators' outputs (a
  ``TorchDispatchMode``): the same number on every run, unlike a process's resident memory,
  which the C allocator decides when to hand back. :func:`counting_tensor_bytes` is the same
  count as a context manager, to read what is held at a chosen point (``.live``): it sees the
  buffers DDP's reducer allocates, which a parameter or ``.grad`` walk cannot.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradaccum_lib.batches import Batch, LossFn, check_loss_output
from gradaccum_lib.gradients import model_restored
from gradaccum_lib.runtime import check_bool, check_choice, check_number, check_positive_int, is_int

__all__ = [
    "activation_bytes",
    "counting_tensor_bytes",
    "memory_budget",
    "MemoryBreakdown",
    "Optimizer",
    "Precision",
    "static_bytes",
    "tensor_peak_bytes",
]


Optimizer = Literal["sgd", "sgd_momentum", "adam", "adamw"]

Precision = Literal["fp32", "autocast", "mixed"]

# fp32 state tensors the optimizer keeps per parameter
_OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}

# bytes per parameter for (weights, gradients, fp32 master copy). "autocast" is
# torch.autocast: fp32 weights and gradients (16-bit copies of the weights made during the
# step are activations: measure them). "mixed" is the Megatron/DeepSpeed layout: 16-bit
# weights and gradients plus an fp32 master copy that the optimizer updates. Activations are
# never scaled by an assumed factor: pass bytes measured in the precision you will use.
_PRECISIONS: dict[str, tuple[int, int, int]] = {
    "fp32": (4, 4, 0),
    "autocast": (4, 4, 0),
    "mixed": (2, 2, 4),
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held during a training step, by what holds them."""

    parameters: int
    gradients: int
    optimizer_state: int
    master_weights: int
    activations: int
    #: DDP's reducer keeps its gradient buckets as a second copy of the gradients unless the
    #: model is wrapped with ``gradient_as_bucket_view=True`` (then ``.grad`` are views into them)
    ddp_buckets: int = 0

    @property
    def total(self) -> int:
        """Return the sum of every part, in bytes."""
        return (self.parameters + self.gradients + self.optimizer_state + self.master_weights
                + self.activations + self.ddp_buckets)

    def as_dict(self) -> dict[str, int]:
        """Return the parts as a plain dict (plus ``total``)."""
        return {**asdict(self), "total": self.total}


def _tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Return the summed ``numel * element_size`` of ``tensors``."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, Iterable):
        raise TypeError(f"tensors must be an iterable of Tensors (e.g. model.parameters()); got "
                        f"{type(tensors).__name__}")
    total = 0
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"tensors[{index}] must be a Tensor; got {type(tensor).__name__}")
        total += tensor.numel() * tensor.element_size()
    return total


def _storage_key(tensor: Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _byte_extent(tensor: Tensor) -> tuple[int, int]:
    """[start, end) bytes of its storage that ``tensor`` (possibly a view) can reach."""
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    if tensor.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + (last + 1) * size


def activation_bytes(model: nn.Module, loss_fn: LossFn, batch: Batch,
                     *, autocast_dtype: torch.dtype | None = None) -> int:
    """Return the bytes autograd saves for backward in one forward pass of ``loss_fn`` on
    ``batch`` (parameters excluded, shared storages counted once, views counted by the part
    of their storage they reach). The model is left as found; no backward is run.
    """
    if not isinstance(model, nn.Module) or next(model.parameters(), None) is None:
        raise TypeError(f"model must be a torch.nn.Module with parameters; got "
                        f"{type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, batch) -> (summed_loss, "
                        f"num_items); got {type(loss_fn).__name__}")
    if autocast_dtype not in (None, torch.float16, torch.bfloat16):
        raise ValueError("autocast_dtype must be None, torch.float16 or torch.bfloat16; got "
                         f"{autocast_dtype!r}")
    parameter_storages = {_storage_key(p) for p in model.parameters()}
    extents: dict[int, tuple[int, int]] = {}

    def pack(tensor: Tensor) -> Tensor:
        if tensor.device.type == "meta" or tensor.layout != torch.strided:
            return tensor
        key = _storage_key(tensor)
        if key in parameter_storages:
            return tensor
        start, end = _byte_extent(tensor)
        if key in extents:
            old_start, old_end = extents[key]
            start, end = min(start, old_start), max(end, old_end)
        extents[key] = (start, end)
        return tensor

    device_type = next(model.parameters()).device.type
    with model_restored(model), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device_type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            summed_loss, _ = check_loss_output(loss_fn(model, batch), 0)
        del summed_loss
    return sum(end - start for start, end in extents.values())


def static_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Return measured bytes of parameters, gradients (those present now) and optimizer state
    (state tensors present now; run a step first to create them).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be None or a torch.optim.Optimizer; got "
                        f"{type(optimizer).__name__}")
    parameters = list(model.parameters())
    state = []
    if optimizer is not None:
        for parameter_state in optimizer.state.values():
            state.extend(v for v in parameter_state.values()
                         if isinstance(v, Tensor) and v.dim() > 0)
    return {
        "parameters": _tensor_bytes(parameters),
        "gradients": _tensor_bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer_state": _tensor_bytes(state),
    }


def memory_budget(
    num_parameters: int,
    *,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
    activation_bytes_per_sample: float = 0.0,
    micro_batch_size: int = 1,
    activation_bytes_fixed: float = 0.0,
    ddp_bucket_copy: bool = False,
) -> MemoryBreakdown:
    """Return the modelled bytes of one training step with micro-batches of
    ``micro_batch_size`` samples: activations are ``activation_bytes_fixed`` (what a step
    holds whatever its batch, e.g. autocast's 16-bit weight copies) plus the measured bytes
    per sample times the micro-batch; ``ddp_bucket_copy=True`` adds DDP's buckets, one more
    copy of the gradients (DDP's default; ``gradient_as_bucket_view=True`` removes it). The
    accumulation steps do not appear: that is the point.
    """
    if not is_int(num_parameters) or num_parameters < 0:
        raise ValueError(f"num_parameters must be an int >= 0; got {num_parameters!r}")
    check_choice("optimizer", optimizer, _OPTIMIZER_STATES)
    check_choice("precision", precision, _PRECISIONS)
    check_positive_int("micro_batch_size", micro_batch_size)
    check_number("activation_bytes_per_sample", activation_bytes_per_sample, low=0)
    check_number("activation_bytes_fixed", activation_bytes_fixed, low=0)
    check_bool("ddp_bucket_copy", ddp_bucket_copy)
    weight_bytes, grad_bytes, master_bytes = _PRECISIONS[precision]
    return MemoryBreakdown(
        parameters=num_parameters * weight_bytes,
        gradients=num_parameters * grad_bytes,
        optimizer_state=num_parameters * 4 * _OPTIMIZER_STATES[optimizer],
        master_weights=num_parameters * master_bytes,
        activations=round(activation_bytes_fixed + activation_bytes_per_sample * micro_batch_size),
        ddp_buckets=num_parameters * grad_bytes if ddp_bucket_copy else 0,
    )


class _LiveStorageBytes(TorchDispatchMode):
    """Counts the bytes of the storages operators create while active: live now, and peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._references: dict[int, weakref.ref] = {}  # id(storage) -> a ref that frees it
        self._lock = threading.RLock()  # CUDA's backward runs ops (and frees) on its own thread

    def _freed(self, key: int, nbytes: int) -> None:
        with self._lock:
            if self._references.pop(key, None) is not None:
                self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        outputs = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, Tensor) and t.layout == torch.strided}
        for tensor in tree_flatten(outputs)[0]:
            if (not isinstance(tensor, Tensor) or tensor.layout != torch.strided
                    or tensor.device.type == "meta"):
                continue
            storage = tensor.untyped_storage()
            key, nbytes = id(storage), storage.nbytes()
            if key in inputs or key in self._references or nbytes == 0:
                continue  # a view, an in-place result, or a storage counted already
            with self._lock:
                self._references[key] = weakref.ref(
                    storage, lambda _, key=key, nbytes=nbytes: self._freed(key, nbytes))
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        return outputs


@contextmanager
def counting_tensor_bytes() -> Iterator[_LiveStorageBytes]:
    """Count, while active, the bytes of the tensor storages operators create (on any device;
    kernels' private scratch buffers are not seen): yields a counter whose ``.live`` is what
    is held now and ``.peak`` the most held at once. Garbage collection is paused meanwhile
    (cyclic garbage freed mid-step would make the count vary) and restored after."""
    tracker = _LiveStorageBytes()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with tracker:
            yield tracker
    finally:
        tracker._references.clear()  # its refs die with it: no callback after this
        if collecting:
            gc.enable()


def tensor_peak_bytes(step: Callable[[], object]) -> int:
    """Return the peak bytes of tensor storages that ``step()`` allocates and holds at once,
    on any device (tensors that existed before the call, e.g. parameters, are not counted;
    kernels' private scratch buffers are not seen).
    """
    if not callable(step):
        raise TypeError(f"step must be a callable taking no argument; got {type(step).__name__}")
    with counting_tensor_bytes() as tracker:
        step()
    return tracker.peak
