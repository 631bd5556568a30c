"""Splitting a batch into micro-batches and weighting their losses by the window's item count.

The loss contract of the whole series:

    loss_fn(model, batch) -> (summed_loss, num_items)

``summed_loss`` is the SUM of per-item losses (items are samples, or non-padding tokens) and
``num_items`` says how many items it covers. Because the library, not the loss function,
divides by the total item count of the whole accumulation window, uneven micro-batches and
variable-length sequences give exactly the large-batch gradient.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

Batch: TypeAlias = Tensor | Sequence[Tensor] | Mapping[str, Tensor]
LossFn: TypeAlias = Callable[[nn.Module, Any], tuple[Tensor, int | Tensor]]

__all__ = [
    "AccumulationTrainer",
    "Batch",
    "LossFn",
    "NonFiniteLossError",
    "batch_size",
    "check_loss_output",
    "check_positive_int",
    "concatenate_micro_batches",
    "evaluate_mean_loss",
    "split_into_micro_batches",
    "TrainingHistory",
    "WindowRecord",
    "windows_of",
]


class NonFiniteLossError(FloatingPointError):
    """A micro-step produced a NaN or infinite loss; ``micro_step`` is its 0-based index."""

    def __init__(self, micro_step: int, value: float) -> None:
        super().__init__(
            f"micro-batch {micro_step} produced a non-finite loss ({value}); "
            "refusing to accumulate it into the window's gradient"
        )
        self.micro_step = micro_step
        self.value = value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(label: str, value: object) -> int:
    """Return ``value`` if it is an int >= 1 (bools refused), else raise a ValueError that
    names ``label`` and the value."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{label} must be a positive int; got {value!r}")
    return value


def _tensors_of(batch: Batch) -> list[tuple[str, Tensor]]:
    """(label, tensor) pairs of a batch, after checking its kind."""
    if isinstance(batch, Tensor):
        return [("batch", batch)]
    if isinstance(batch, Mapping):
        pairs = [(f"batch[{key!r}]", value) for key, value in batch.items()]
    elif isinstance(batch, (tuple, list)):
        pairs = [(f"batch[{index}]", value) for index, value in enumerate(batch)]
    else:
        raise TypeError(
            "batch must be a Tensor, a tuple/list of Tensors or a dict of Tensors; "
            f"got {type(batch).__name__}"
        )
    if not pairs:
        raise ValueError("batch must hold at least one Tensor; got an empty container")
    for label, value in pairs:
        if not isinstance(value, Tensor):
            raise TypeError(f"{label} must be a Tensor; got {type(value).__name__}")
    return pairs


def batch_size(batch: Batch) -> int:
    """Return the size of dim 0 shared by every tensor of ``batch`` (checked)."""
    pairs = _tensors_of(batch)
    sizes = {}
    for label, tensor in pairs:
        if tensor.dim() == 0:
            raise ValueError(f"{label} is a 0-dim tensor; every tensor needs a batch dim 0")
        sizes[label] = tensor.shape[0]
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{label}: {size}" for label, size in sizes.items())
        raise ValueError(f"tensors in batch disagree on dim 0 ({listing}); they must be equal")
    size = next(iter(sizes.values()))
    if size == 0:
        raise ValueError("batch is empty (dim 0 has size 0); it needs at least one item")
    return size


def _rebuild(batch: Batch, parts_per_tensor: list[tuple[Tensor, ...]], index: int) -> Batch:
    """The ``index``-th micro-batch, of the same kind as ``batch``."""
    if isinstance(batch, Tensor):
        return parts_per_tensor[0][index]
    if isinstance(batch, Mapping):
        return type(batch)(
            (key, parts[index]) for key, parts in zip(batch, parts_per_tensor, strict=True)
        )
    items = [parts[index] for parts in parts_per_tensor]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*items)
    return type(batch)(items)


def split_into_micro_batches(
    batch: Batch,
    *,
    accumulation_steps: int | None = None,
    micro_batch_size: int | None = None,
) -> list[Batch]:
    """Return ``batch`` split along dim 0 into micro-batches of the same kind (views, no copy).

    Give exactly one of ``accumulation_steps`` (exactly that many micro-batches, sizes
    differing by at most one, as ``torch.tensor_split``) or ``micro_batch_size`` (chunks of
    that size, the last one possibly smaller).
    """
    total = batch_size(batch)
    if (accumulation_steps is None) == (micro_batch_size is None):
        raise ValueError(
            "give exactly one of accumulation_steps or micro_batch_size; got "
            f"accumulation_steps={accumulation_steps!r}, micro_batch_size={micro_batch_size!r}"
        )
    tensors = [tensor for _, tensor in _tensors_of(batch)]
    if accumulation_steps is not None:
        if not _is_int(accumulation_steps):
            raise TypeError(
                f"accumulation_steps must be a positive int no larger than the batch ({total}); "
                f"got {accumulation_steps!r} of type {type(accumulation_steps).__name__}"
            )
        if not 1 <= accumulation_steps <= total:
            raise ValueError(
                f"accumulation_steps must be a positive int no larger than the batch ({total}); "
                f"got {accumulation_steps}"
            )
        parts = [torch.tensor_split(tensor, accumulation_steps) for tensor in tensors]
        count = accumulation_steps
    else:
        if not _is_int(micro_batch_size):
            raise TypeError(
                f"micro_batch_size must be a positive int; got {micro_batch_size!r} "
                f"of type {type(micro_batch_size).__name__}"
            )
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be a positive int; got {micro_batch_size}")
        parts = [torch.split(tensor, micro_batch_size) for tensor in tensors]
        count = math.ceil(total / micro_batch_size)
    return [_rebuild(batch, parts, index) for index in range(count)]


def concatenate_micro_batches(micro_batches: Sequence[Batch]) -> Batch:
    """Return the window's whole batch: the micro-batches concatenated along dim 0, of the
    same kind (the inverse of :func:`split_into_micro_batches`).
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    first = micro_batches[0]
    for micro_batch in micro_batches:
        batch_size(micro_batch)  # checks its kind and shapes
    try:
        if isinstance(first, Tensor):
            return torch.cat(list(micro_batches))
        if isinstance(first, Mapping):
            return type(first)((key, torch.cat([mb[key] for mb in micro_batches])) for key in first)
        parts = [torch.cat([mb[i] for mb in micro_batches]) for i in range(len(first))]
    except (RuntimeError, KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"micro-batches cannot be concatenated (different keys, lengths or padded widths): "
            f"{error}"
        ) from error
    if hasattr(first, "_fields"):
        return type(first)(*parts)
    return type(first)(parts)


def _checked_output(output: object, micro_step: int) -> tuple[Tensor, Tensor | float]:
    """The (summed_loss, num_items) pair of a loss function, its kinds and shapes checked."""
    if not isinstance(output, tuple) or len(output) != 2:
        raise TypeError(
            "loss_fn must return a tuple (summed_loss, num_items); "
            f"got {type(output).__name__} at micro-batch {micro_step}"
        )
    summed_loss, num_items = output
    if not isinstance(summed_loss, Tensor) or summed_loss.dim() != 0:
        shape = tuple(summed_loss.shape) if isinstance(summed_loss, Tensor) else None
        raise TypeError(
            "loss_fn's summed_loss must be a 0-dim Tensor (the SUM of per-item losses); "
            f"got {type(summed_loss).__name__} with shape {shape} at micro-batch {micro_step}"
        )
    if isinstance(num_items, Tensor):
        if num_items.numel() != 1:
            raise ValueError(
                "loss_fn's num_items must be a single number (items, or total item weight); "
                f"got a tensor of shape {tuple(num_items.shape)} at micro-batch {micro_step}"
            )
        return summed_loss, num_items.detach().reshape(())
    if isinstance(num_items, numbers.Real) and not isinstance(num_items, bool):
        return summed_loss, float(num_items)
    raise TypeError(
        "loss_fn's num_items must be a number (int, float) or a one-element Tensor; "
        f"got {type(num_items).__name__} at micro-batch {micro_step}"
    )


def _check_count(count: float, micro_step: int) -> None:
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(
            f"loss_fn's num_items must be finite and >= 0; got {count} at micro-batch {micro_step}"
        )


def check_loss_output(output: object, micro_step: int) -> tuple[Tensor, float]:
    """Return ``(summed_loss, num_items)`` from a loss function's output, validated.

    ``num_items`` comes back as a Python float (exact for counts below 2**53). A non-finite
    loss raises :class:`NonFiniteLossError` naming ``micro_step``.
    """
    summed_loss, num_items = _checked_output(output, micro_step)
    count = float(num_items.item()) if isinstance(num_items, Tensor) else num_items
    _check_count(count, micro_step)
    if not torch.isfinite(summed_loss.detach()).item():
        raise NonFiniteLossError(micro_step, summed_loss.item())
    return summed_loss, count


def evaluate_mean_loss(model: nn.Module, loss_fn: LossFn, batches: Iterable[Batch]) -> float:
    """Return the item-weighted mean loss over ``batches`` (no gradients, mode unchanged)."""
    total_loss = 0.0
    total_items = 0.0
    with torch.no_grad():
        for index, batch in enumerate(batches):
            summed_loss, num_items = check_loss_output(loss_fn(model, batch), index)
            total_loss += summed_loss.double().item()
            total_items += num_items
    if total_items <= 0:
        raise ValueError("batches cover no items; there is no mean loss")
    return total_loss / total_items


# --------------------------------------------------------------------------------------------
# The training loop: one optimizer step per window of micro-batches.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowRecord:
    """What one optimizer step saw: its window, items, item-weighted loss, gradient norm
    (of the accumulated gradient, before clipping) and the learning rate it used.
    """

    epoch: int
    window: int
    micro_steps: int
    items: float
    loss: float
    grad_norm: float
    learning_rate: float


@dataclass
class TrainingHistory:
    """Per-window records of a training run, in order."""

    records: list[WindowRecord] = field(default_factory=list)

    def column(self, name: str) -> list[float]:
        """Return one field of every record, e.g. ``column("loss")``."""
        if name not in WindowRecord.__dataclass_fields__:
            raise ValueError(f"name must be one of {list(WindowRecord.__dataclass_fields__)}; "
                             f"got {name!r}")
        return [getattr(record, name) for record in self.records]

    def as_dict(self) -> dict[str, list[float]]:
        """Return the history as columns (a dict of lists, safe for ``weights_only`` loads)."""
        return {name: self.column(name) for name in WindowRecord.__dataclass_fields__}

    @classmethod
    def from_dict(cls, columns: Mapping[str, Sequence[float]]) -> TrainingHistory:
        """Rebuild a history from :meth:`as_dict`'s columns."""
        names = list(WindowRecord.__dataclass_fields__)
        rows = zip(*(columns[name] for name in names), strict=True)
        return cls([WindowRecord(**dict(zip(names, row, strict=True))) for row in rows])

    def __len__(self) -> int:
        return len(self.records)


def _at_least_fp32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 if it is in a 16-bit type (autocast), else unchanged."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def windows_of(micro_batches: Iterable[Batch], accumulation_steps: int) -> Iterator[list[Batch]]:
    """Yield lists of ``accumulation_steps`` consecutive micro-batches; the last may be shorter."""
    window: list[Batch] = []
    for micro_batch in micro_batches:
        window.append(micro_batch)
        if len(window) == accumulation_steps:
            yield window
            window = []
    if window:
        yield window


class AccumulationTrainer:
    """Gradient accumulation done right, for one process (DDP adds ``no_sync``: notebook 05).

    Per window of up to ``accumulation_steps`` micro-batches: ``zero_grad(set_to_none=True)``
    once; forward and backward after EVERY micro-batch (one graph alive at a time); then the
    accumulated gradient is rescaled to the mean over the window's real item count (so a partial
    last window and uneven token counts are exact); unscaled once (fp16 ``GradScaler``); clipped
    once; one optimizer step; one scheduler step.

    Each micro-batch's summed loss is backpropagated divided by a provisional normaliser (its
    item count times the window length) to keep gradients at mean-loss scale; at the end of
    the window, when the real count N is known, the gradient is multiplied by provisional/N.
    Gradients are linear in the loss, so this is exact.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        *,
        accumulation_steps: int,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = None,
        amp_dtype: torch.dtype | None = None,
        progress: bool = True,
        observers: Sequence[Any] = (),
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        check_positive_int("accumulation_steps", accumulation_steps)
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None; got {max_grad_norm!r}")
        if amp_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"amp_dtype must be None, torch.bfloat16 or torch.float16; got {amp_dtype!r}"
            )
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.accumulation_steps = accumulation_steps
        self.max_grad_norm = max_grad_norm
        self.amp_dtype = amp_dtype
        self.progress = progress
        # objects with on_micro_step(parameters, micro_step, num_items, provisional) and
        # on_window_end(parameters, total_items, provisional), e.g. noise.NoiseScaleTracker;
        # they see gradients in provisional units, before the window's rescale
        self.observers = list(observers)
        self.device_type = next(model.parameters()).device.type
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range
        self.scaler = (
            torch.amp.GradScaler(self.device_type)
            if amp_dtype == torch.float16 and self.device_type == "cuda"
            else None
        )
        self.history = TrainingHistory()
        self.epoch = 0
        self.windows_done = 0  # windows finished in the current epoch (for resuming)
        self.optimizer_steps = 0

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.amp_dtype)

    def _parameters(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def train_epoch(
        self,
        micro_batches: Iterable[Batch],
        *,
        max_windows: int | None = None,
        checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
    ) -> TrainingHistory:
        """Train on one epoch of micro-batches; return the history so far.

        ``max_windows`` stops early (after that many windows of this epoch, counting resumed
        ones); ``checkpoint_every`` windows a checkpoint is written to ``checkpoint_path``. A
        trainer restored with :meth:`load_checkpoint` skips the windows already done, so the
        same ``micro_batches`` must be passed in the same order.
        """
        if (checkpoint_path is None) != (checkpoint_every is None):
            raise ValueError("give both checkpoint_path and checkpoint_every, or neither")
        if checkpoint_every is not None:
            check_positive_int("checkpoint_every", checkpoint_every)
        total = None
        if hasattr(micro_batches, "__len__"):
            total = math.ceil(len(micro_batches) / self.accumulation_steps)
        # at most one redraw a second: a notebook bar is a widget, and every redraw is a
        # message to the front end (thousands of them overflow a kernel's output channel)
        bar = tqdm(total=total, initial=self.windows_done, disable=not self.progress,
                   desc=f"epoch {self.epoch}", unit="step", mininterval=1.0)
        for index, window in enumerate(windows_of(micro_batches, self.accumulation_steps)):
            if index < self.windows_done:
                continue  # already trained before a resume
            if max_windows is not None and index >= max_windows:
                bar.close()
                return self.history
            record = self.step_window(window)
            self.windows_done = index + 1
            bar.update(1)
            bar.set_postfix(loss=f"{record.loss:.4f}", lr=f"{record.learning_rate:.2e}")
            if checkpoint_every is not None and self.windows_done % checkpoint_every == 0:
                self.save_checkpoint(checkpoint_path)
        bar.close()
        self.epoch += 1
        self.windows_done = 0
        return self.history

    def step_window(self, window: Sequence[Batch]) -> WindowRecord:
        """Accumulate over ``window``'s micro-batches and take one optimizer step."""
        if not window:
            raise ValueError("window is empty; it needs at least one micro-batch")
        self.optimizer.zero_grad(set_to_none=True)
        summed_losses: list[Tensor] = []
        counts: list[Tensor | float] = []
        provisional: Tensor | float = 1.0
        for micro_step, micro_batch in enumerate(window):
            with self._autocast():
                output = self.loss_fn(self.model, micro_batch)
            # no host sync per micro-step: counts and losses are checked once per window
            summed_loss, count = _checked_output(output, micro_step)
            if micro_step == 0:
                provisional = (count.clamp(min=1.0) if isinstance(count, Tensor)
                               else max(count, 1.0)) * len(window)
            loss = _at_least_fp32(summed_loss) / provisional
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            summed_losses.append(_at_least_fp32(summed_loss.detach()))
            counts.append(count)
            for observer in self.observers:
                observer.on_micro_step(self._parameters(), micro_step, float(count), float(
                    provisional))
        losses = torch.stack([loss.to(summed_losses[0].dtype) for loss in summed_losses])
        finite = torch.isfinite(losses)
        if not bool(finite.all()):  # one sync per window, and never a silent step
            bad = int((~finite).nonzero()[0].item())
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(bad, losses[bad].item())
        count_values = [float(c.item()) if isinstance(c, Tensor) else c for c in counts]
        for micro_step, count in enumerate(count_values):
            _check_count(count, micro_step)
        total_items = sum(count_values)
        if total_items <= 0:
            self.optimizer.zero_grad(set_to_none=True)
            raise ValueError(f"window {self.windows_done} covers no items (every num_items was 0)")
        provisional = max(count_values[0], 1.0) * len(window)
        for observer in self.observers:
            observer.on_window_end(self._parameters(), total_items, provisional)
        parameters = self._parameters()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once per window, before clipping
        grads = [p.grad for p in parameters if p.grad is not None]
        if provisional != total_items and grads:  # equal counts (common): nothing to rescale
            with torch.no_grad():
                torch._foreach_mul_(grads, provisional / total_items)
        if self.max_grad_norm is not None:  # clip once, on the accumulated gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.max_grad_norm)
        else:  # the norm only, for the history: no pass that multiplies by 1
            grad_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()  # per optimizer step, never per micro-batch
        self.optimizer_steps += 1
        record = WindowRecord(
            epoch=self.epoch,
            window=self.windows_done,
            micro_steps=len(window),
            items=total_items,
            loss=losses.double().sum().item() / total_items,
            grad_norm=float(grad_norm),
            learning_rate=learning_rate,
        )
        self.history.records.append(record)
        return record

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to resume at this window boundary (tensors and plain data)."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "windows_done": self.windows_done,
            "optimizer_steps": self.optimizer_steps,
            "history": self.history.as_dict(),
            "cpu_rng_state": torch.get_rng_state(),
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if torch.cuda.is_available():
            state["cuda_rng_states"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for key, part in (("scheduler", self.scheduler), ("scaler", self.scaler)):
            if (key in state) != (part is not None):
                raise ValueError(f"checkpoint and trainer disagree on having a {key}")
            if part is not None:
                part.load_state_dict(state[key])
        self.epoch = int(state["epoch"])
        self.windows_done = int(state["windows_done"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.history = TrainingHistory.from_dict(state["history"])
        torch.set_rng_state(state["cpu_rng_state"])
        if "cuda_rng_states" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng_states"])

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path`` (via a temporary file, so a crash leaves the
        previous checkpoint intact)."""
        temporary = f"{os.fspath(path)}.tmp"
        torch.save(self.state_dict(), temporary)
        os.replace(temporary, path)

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore from a checkpoint, loading with ``torch.load(..., weights_only=True)``."""
        device = next(self.model.parameters()).device
        self.load_state_dict(torch.load(path, map_location=device, weights_only=True))
