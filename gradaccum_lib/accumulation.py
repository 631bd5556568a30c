"""The engine: gradient accumulation for a plain module, a DDP model or an FSDP2 module.

One window (:meth:`AccumulationTrainer.step_window`), on every rank:

1. **zero** the gradients once;
2. **accumulate**: forward and backward per micro-batch, each summed loss divided by the
   provisional normaliser; gradients sync across ranks on the LAST micro-step only, a flag set
   BEFORE the forward pass (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``);
3. **totals**: the window's items, summed loss and error flags over every rank, one plain
   ``dist.all_reduce`` started before the last backward; a bad loss or count raises, no step;
4. **rescale** once to the mean over the GLOBAL window's items (exact: gradients are linear in
   the loss; uneven micro-batches and ranks, token losses, a partial window included);
5. **clip** the accumulated gradient (not finite: an error, or GradScaler's skip);
6. **step** the optimizer and the scheduler, once.

The provisional normaliser (the first micro-batch's items times k, fixed at the first window,
across ranks the largest) is for fp16: its gradients and loss scale must stay near mean-loss
scale while they add up. Step 4 corrects it: no pass at all when items are even.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from .batches import (  # the loss contract
    Batch,
    LossFn,
    NonFiniteGradientError,
    NonFiniteLossError,
    check_num_items,
    loss_pair,
    windows_of,
)
from .runtime import check_bool, check_model, check_positive_int

__all__ = ["AccumulationTrainer", "TrainingHistory", "WindowRecord"]
_NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it does nothing
_STATE = ("accumulation_steps", "world_size", "epoch", "windows_done", "optimizer_steps",
          "normaliser")  # the first two must match; the rest are restored


@dataclass(frozen=True)
class WindowRecord:
    """One optimizer step: window, items, item-weighted loss, norm before clipping, lr."""

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

    def __len__(self) -> int:
        return len(self.records)


class AccumulationTrainer:
    """Gradient accumulation done right, for one process, DDP or FSDP2 (see the module doc).

    Pass the model as you have it (plain, DDP or ``fully_shard``-ed; a comm hook of yours stays
    and works); on each rank :meth:`step_window` takes its micro-batches of the global window.
    ``observers`` have ``on_micro_step(parameters, micro_step, num_items, provisional)`` and
    ``on_window_end(parameters, total_items, provisional)`` and see gradients before step 4.
    ``track_grad_norm=False`` skips the norm when not clipping (the history holds NaN) and
    with it the finiteness check; ``sync_every_micro_step=True`` syncs every micro-step.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, optimizer: torch.optim.Optimizer, *,
                 accumulation_steps: int,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 max_grad_norm: float | None = None, amp_dtype: torch.dtype | None = None,
                 progress: bool = True, observers: Sequence[Any] = (),
                 track_grad_norm: bool = True, sync_every_micro_step: bool = False) -> None:
        _check_model_and_optimizer(model, loss_fn, optimizer, scheduler)
        _check_options(max_grad_norm, amp_dtype, progress, observers, track_grad_norm,
                       sync_every_micro_step)
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.scheduler = scheduler
        self.accumulation_steps = check_positive_int("accumulation_steps", accumulation_steps)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.amp_dtype, self.progress, self.observers = amp_dtype, progress, list(observers)
        self.track_grad_norm, self.sync_every_micro_step = track_grad_norm, sync_every_micro_step
        self.sync_kind = _sync_kind(model)
        self._skip_sync = _SkippedSync(model) if self.sync_kind == "ddp" else _NO_CONTEXT
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if distributed else 1
        _check_world(model, self.sync_kind, self.world_size)
        self.rank = dist.get_rank() if distributed else 0
        self.device_type = next(model.parameters()).device.type
        self._device = torch.device("cuda", torch.cuda.current_device()) if (  # of all-reduces
            distributed and dist.get_backend() == "nccl") else torch.device("cpu")
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range
        self.scaler = (torch.amp.GradScaler(self.device_type)
                       if amp_dtype == torch.float16 and self.device_type == "cuda" else None)
        self.normaliser: float | None = None  # the provisional one, fixed at the first window
        self._seed: tuple[tuple[float, torch.dtype], float] | None = None  # backward's seed
        self.history = TrainingHistory()
        self.epoch = self.windows_done = self.optimizer_steps = 0

    def _parameters(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def train_epoch(self, micro_batches: Iterable[Batch], *, max_windows: int | None = None,
                    after_window: Callable[[Sequence[Batch]], None] | None = None,
                    ) -> TrainingHistory:
        """Train on (the rest of) one epoch; return the history so far. Windows count on from
        :attr:`windows_done`: ``max_windows`` stops after that many of the epoch (the next call
        goes on), ``after_window(window)`` runs after each step (``jobs.resume`` checkpoints
        and replays an interrupted epoch's remaining micro-batches with these)."""
        if max_windows is not None:
            check_positive_int("max_windows", max_windows)
        windows = windows_of(micro_batches, self.accumulation_steps)  # checks micro_batches
        started = self.windows_done
        total = (started + math.ceil(len(micro_batches) / self.accumulation_steps)
                 if hasattr(micro_batches, "__len__") else None)
        stopped, record = False, None
        # at most one redraw a second: each is a message to a notebook's front end
        with tqdm(total=total, initial=started, desc=f"epoch {self.epoch}", unit="step",
                  disable=not self.progress or self.rank != 0, mininterval=1.0) as bar:
            for window in windows:
                if max_windows is not None and self.windows_done >= max_windows:
                    stopped = True
                    break
                record = self.step_window(window)
                self.windows_done += 1
                if after_window is not None:
                    after_window(window)
                if not bar.disable:  # a hidden bar formats nothing
                    _count_window(bar, record)
            if record is not None and not bar.disable:
                _set_postfix(bar, record)  # the last window's, for the bar's final redraw
        if stopped:
            return self.history
        if self.windows_done == 0:
            raise ValueError("micro_batches is empty: an epoch needs at least one micro-batch")
        self.epoch, self.windows_done = self.epoch + 1, 0
        return self.history

    def step_window(self, window: Sequence[Batch]) -> WindowRecord:
        """Accumulate over ``window``'s micro-batches and take one optimizer step."""
        _check_window(window, self.accumulation_steps)
        self.optimizer.zero_grad(set_to_none=True)
        parameters = self._parameters()  # once a window; the observers get this list
        losses, counts, totals = self._accumulate(window, parameters)
        try:
            if isinstance(totals, tuple):  # an all-reduce under way since the last backward
                totals[1].wait()
                totals = totals[0].tolist()
            items, loss_sum = _check_window_totals(totals, losses, counts, self.windows_done)
        except (ValueError, NonFiniteLossError):
            self.optimizer.zero_grad(set_to_none=True)
            raise
        for observer in self.observers:
            observer.on_window_end(parameters, items, self.normaliser)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once per window, before clipping
        grads = [grad for p in parameters if (grad := p.grad) is not None]
        factor = self.normaliser * self.world_size / items  # DDP/FSDP2 averaged over ranks
        if factor != 1.0:  # every micro-batch as many items: nothing to rescale
            _scale_gradients_(grads, factor)
        grad_norm = self._clip(parameters, grads)
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        self._step()
        record = WindowRecord(self.epoch, self.windows_done, len(window), items,
                              loss_sum / items, grad_norm, learning_rate)
        self.history.records.append(record)
        return record

    def _accumulate(self, window: Sequence[Batch], parameters: list[nn.Parameter],
                    ) -> tuple[list, list, Any]:
        """Forward and backward every micro-batch; return the summed losses and counts (numbers
        on a CPU, tensors elsewhere: no host sync) and the totals (local, or being summed)."""
        losses: list[Tensor | float] = []
        counts: list[Tensor | float] = []
        last = len(window) - 1
        for micro_step, micro_batch in enumerate(window):
            sync = micro_step == last or self.sync_every_micro_step
            if self.sync_kind == "fsdp2":
                self.model.set_requires_gradient_sync(sync)
            with _NO_CONTEXT if sync else self._skip_sync:  # before the forward pass
                with (_NO_CONTEXT if self.amp_dtype is None
                      else torch.autocast(self.device_type, dtype=self.amp_dtype)):
                    output = self.loss_fn(self.model, micro_batch)
                summed_loss, count = loss_pair(output, micro_step)
                if not summed_loss.requires_grad:
                    raise ValueError(
                        f"the loss of micro-batch {micro_step} does not require grad: loss_fn "
                        "must not detach it or run under torch.no_grad()")
                losses.append(summed_loss.item() if summed_loss.is_cpu
                              else _fp32(summed_loss.detach()))
                counts.append(count.item() if isinstance(count, Tensor) and count.is_cpu
                              else count)
                if self.normaliser is None:
                    self.normaliser = self._first_normaliser(float(count))
                if micro_step == last:
                    totals = _window_totals(losses, counts)
                    if self.world_size > 1:  # one all-reduce, under way during the backward
                        totals = torch.as_tensor(totals, dtype=torch.float64).to(self._device)
                        totals = (totals, dist.all_reduce(totals, async_op=True))
                self._backward(_fp32(summed_loss))
            for observer in self.observers:
                observer.on_micro_step(parameters, micro_step, float(count), self.normaliser)
        return losses, counts, totals

    def _first_normaliser(self, count: float) -> float:
        """The first micro-batch's items (at least 1) times k; across ranks the largest."""
        value = (count if math.isfinite(count) and count >= 1 else 1.0) * self.accumulation_steps
        if self.world_size > 1:
            value = torch.tensor([value], dtype=torch.float64, device=self._device)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value)

    def _backward(self, loss: Tensor) -> None:
        """Backward of ``loss`` / the provisional normaliser. Without GradScaler the quotient
        is not built: its gradient, 1 / normaliser, is backward's seed (the very bits a
        division's backward passes on; no division forward, no node for it in the graph, no
        ``ones_like``), made anew each time (a graph of views could hand it to a ``.grad``)."""
        if self.scaler is not None:
            self.scaler.scale(loss / self.normaliser).backward()
            return
        key = (self.normaliser, loss.dtype)
        if self._seed is None or self._seed[0] != key:
            self._seed = key, (torch.ones((), dtype=loss.dtype) / self.normaliser).item()
        loss.backward(torch.full_like(loss, self._seed[1]))

    def _clip(self, parameters: list[nn.Parameter], grads: list[Tensor]) -> float:
        """Clip once, on the accumulated gradient; return its norm before clipping. A norm
        that is not finite raises (gradients cleared, no step), unless GradScaler skips."""
        if self.max_grad_norm is not None:
            norm = float(_full_value(torch.nn.utils.clip_grad_norm_(parameters,
                                                                    self.max_grad_norm)))
        elif self.track_grad_norm:
            norm = _gradient_norm(grads)
        else:
            return float("nan")
        if not math.isfinite(norm) and self.scaler is None:
            name = _first_non_finite_gradient(self.model)
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteGradientError(
                f"window {self.windows_done}: the accumulated gradient is not finite (first at "
                f"parameter {name!r}); no step was taken and the gradients were cleared. A "
                "16-bit model needs float32 parameters and amp_dtype (fp16: with a GradScaler)")
        return norm

    def _step(self) -> None:
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # inf/NaN gradients: GradScaler skipped it
                return  # no optimizer step was taken: the schedule does not advance
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()  # per optimizer step, never per micro-batch
        self.optimizer_steps += 1

    def state_dict(self) -> dict[str, Any]:
        """Return the engine's own state (counters, history, normaliser) as plain data; the
        model, optimizer, scheduler and scaler keep theirs (``jobs.resume`` saves them all)."""
        return {key: getattr(self, key) for key in _STATE} | {
            "history": [astuple(record) for record in self.history.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; raise a ValueError, restoring nothing, when it
        was taken with another k or world size, or is malformed."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict; got {type(state).__name__}")
        problems = [f"{key}: checkpoint {state.get(key)!r}, trainer {getattr(self, key)!r}"
                    for key in _STATE[:2] if state.get(key) != getattr(self, key)]
        problems += _state_problems(state)
        history = None if problems else TrainingHistory(
            [WindowRecord(*row) for row in state["history"]])
        if problems:
            raise ValueError("trainer state does not fit this trainer; nothing was restored: "
                             + "; ".join(problems))
        for key in _STATE[2:]:
            setattr(self, key, state[key])
        self.history = history


def _count_window(bar: tqdm, record: WindowRecord) -> None:
    """Count a window on a shown bar; format its loss and lr only when the bar may redraw now
    (tqdm checks ``n - last_print_n >= miniters`` first; ``miniters`` follows the rate, so
    after the first second that is about once per ``mininterval``)."""
    if bar.n + 1 - bar.last_print_n >= bar.miniters:
        _set_postfix(bar, record)
    bar.update(1)


def _set_postfix(bar: tqdm, record: WindowRecord) -> None:
    bar.set_postfix(loss=f"{record.loss:.4f}", lr=f"{record.learning_rate:.2e}", refresh=False)


# The engine's own steps, in the order a window calls them. ------------------------------------

def _check_model_and_optimizer(model: object, loss_fn: object, optimizer: object,
                               scheduler: object) -> None:
    """Raise a TypeError or ValueError naming the first bad one of the four."""
    check_model(model)
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, micro_batch) -> "
                        f"(summed_loss, num_items); got {type(loss_fn).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer; got "
                        f"{type(optimizer).__name__}")
    owned = {id(p) for p in model.parameters()}
    strangers = sum(id(p) not in owned for g in optimizer.param_groups for p in g["params"])
    if strangers:
        raise ValueError(f"optimizer holds {strangers} parameter(s) that are not the "
                         "model's; build it from model.parameters()")
    if scheduler is not None and not (callable(getattr(scheduler, "step", None))
                                      and getattr(scheduler, "optimizer", None) is optimizer):
        raise ValueError("scheduler must be None or an LR scheduler built on this optimizer; "
                         f"got {type(scheduler).__name__}")


def _check_options(max_grad_norm: object, amp_dtype: object, progress: object,  # noqa: PLR0913
                   observers: object, track_grad_norm: object,
                   sync_every_micro_step: object) -> None:
    """Raise a TypeError or ValueError naming the first bad keyword argument."""
    if max_grad_norm is not None:
        if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)):
            raise TypeError(f"max_grad_norm must be a positive number or None; got "
                            f"{max_grad_norm!r} of type {type(max_grad_norm).__name__}")
        if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a finite number > 0 or None; got "
                             f"{max_grad_norm!r}")
    if amp_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(
            f"amp_dtype must be None, torch.bfloat16 or torch.float16; got {amp_dtype!r}")
    check_bool("progress", progress)
    check_bool("track_grad_norm", track_grad_norm)
    check_bool("sync_every_micro_step", sync_every_micro_step)
    if not isinstance(observers, (list, tuple)):
        raise TypeError("observers must be a list or tuple of observer objects (with "
                        f"on_micro_step and on_window_end); got {type(observers).__name__}")
    for observer in observers:
        if not all(callable(getattr(observer, name, None))
                   for name in ("on_micro_step", "on_window_end")):
            raise TypeError("each observer needs on_micro_step and on_window_end methods; "
                            f"got {type(observer).__name__}")


def _sync_kind(model: nn.Module) -> str:
    """How ``model`` synchronises gradients: ``"ddp"``, ``"fsdp2"`` or ``"none"``."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "ddp"
    if callable(getattr(model, "set_requires_gradient_sync", None)):
        return "fsdp2"
    return "none"


def _check_world(model: nn.Module, sync_kind: str, world_size: int) -> None:
    if world_size > 1 and sync_kind == "none":
        raise ValueError(
            f"model is a plain {type(model).__name__} but the process group has {world_size} "
            "ranks: its gradients would never be synchronised and the ranks would drift apart; "
            "wrap it in DistributedDataParallel or shard it with fully_shard (FSDP2)")


class _SkippedSync:
    """DDP's ``no_sync()`` as one reusable object: ``with skipped:`` turns the model's sync
    flag off for the forward and backward inside it and restores it after (nested too). It
    sets the flag DDP's own ``no_sync()`` sets (a public attribute); a subclass's override of
    ``no_sync()`` is not called. The engine enters it on every micro-step but a window's last,
    so it is a class, not a generator made anew each time."""

    __slots__ = ("model", "_saved")

    def __init__(self, model: nn.parallel.DistributedDataParallel) -> None:
        self.model, self._saved = model, []

    def __enter__(self) -> None:
        self._saved.append(self.model.require_backward_grad_sync)
        self.model.require_backward_grad_sync = False

    def __exit__(self, *exc_info: object) -> None:
        self.model.require_backward_grad_sync = self._saved.pop()


def _check_window(window: object, accumulation_steps: int) -> None:
    if isinstance(window, (Tensor, dict)) or not isinstance(window, Sequence):
        raise TypeError("window must be a list of micro-batches (e.g. from "
                        f"split_into_micro_batches); got {type(window).__name__}")
    if not window:
        raise ValueError("window is empty; it needs at least one micro-batch")
    if len(window) > accumulation_steps:
        raise ValueError(f"window holds {len(window)} micro-batches but accumulation_steps "
                         f"is {accumulation_steps}; pass at most that many")


def _fp32(tensor: Tensor) -> Tensor:  # a 16-bit (autocast) loss is summed in float32
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _window_totals(losses: list, counts: list) -> Tensor | list[float]:
    """One rank's window totals, ``[items, finite loss sum, non-finite losses, invalid
    counts]``, from its micro-batches' summed losses and counts: numbers when every value is
    one (read on a CPU), else a float64 tensor computed on their device (no host sync)."""
    if not any(isinstance(value, Tensor) for value in (*losses, *counts)):
        valid = [c for c in counts if math.isfinite(c) and c >= 0]
        finite = [loss for loss in losses if math.isfinite(loss)]
        return [float(sum(valid)), float(sum(finite)), float(len(losses) - len(finite)),
                float(len(counts) - len(valid))]
    device = next(v.device for v in (*losses, *counts) if isinstance(v, Tensor))
    loss, items = (torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device)
                                for v in values]) for values in (losses, counts))
    valid, finite = torch.isfinite(items) & (items >= 0), torch.isfinite(loss)
    return torch.stack([torch.where(valid, items, 0.0).sum(), torch.where(finite, loss, 0.0).sum(),
                        (~finite).sum().double(), (~valid).sum().double()])


def _check_window_totals(totals: Sequence[float], summed_losses: Sequence[Tensor | float],
                         counts: Sequence[Tensor | float], window: int) -> tuple[float, float]:
    """A window's (items, summed loss) from its totals summed over every rank; raise on a
    non-finite loss, an invalid count or no items, naming the micro-batch when this rank's
    own ``summed_losses`` and ``counts`` hold it."""
    items, loss_sum, bad_losses, bad_counts = totals
    if bad_counts:
        for micro_step, count in enumerate(counts):
            check_num_items(float(count), micro_step)
        raise ValueError("a micro-batch on another rank returned an invalid num_items "
                         "(negative or not finite)")
    if bad_losses:
        for micro_step, loss in enumerate(summed_losses):
            if not math.isfinite(float(loss)):
                raise NonFiniteLossError(micro_step, float(loss))
        raise NonFiniteLossError(-1, float("nan"), where="on another rank")
    if items <= 0:
        raise ValueError(f"window {window} covers no items (every num_items was 0 on every "
                         "rank)")
    return items, loss_sum


def _scale_gradients_(grads: list[Tensor], factor: float) -> None:
    """Multiply every gradient by ``factor`` in place (one ``_foreach_mul_``; DTensor shards
    one by one)."""
    with torch.no_grad():
        if any(hasattr(g, "full_tensor") for g in grads):
            for grad in grads:
                grad.mul_(factor)
        elif grads:
            torch._foreach_mul_(grads, factor)


def _gradient_norm(grads: list[Tensor]) -> float:
    """The L2 norm of all of ``grads`` together (0 for none), from one ``_foreach_norm``: on a
    CPU its norms are read and combined as numbers (``math.hypot``: no overflow, no more
    dispatches), elsewhere by one ``vector_norm`` and one read; ``get_total_norm`` for
    DTensor shards (their full value: every rank must call it) and, off the CPU, for grads
    of more than one device or dtype."""
    if not grads:
        return 0.0
    if any(hasattr(g, "full_tensor") for g in grads):
        return float(_full_value(torch.nn.utils.get_total_norm(grads)))
    if grads[0].is_cpu:
        return math.hypot(*[norm.item() for norm in torch._foreach_norm(grads)])
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return float(torch.nn.utils.get_total_norm(grads))
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))


def _full_value(tensor: Tensor) -> Tensor:
    """The full value of a DTensor (an FSDP2 shard: every rank must call it), else itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _first_non_finite_gradient(model: nn.Module) -> str | None:
    """The name of the first parameter whose ``.grad`` holds a NaN or an inf, or None (an
    FSDP2 shard is checked whole: every rank must call it)."""
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grad = _full_value(parameter.grad)
            values = grad.coalesce().values() if grad.is_sparse else grad
            if not bool(torch.isfinite(values).all()):
                return name
    return None


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _state_problems(state: Mapping[str, Any]) -> list[str]:
    """What is wrong with a state's counters, normaliser and history (types included)."""
    problems = [f"{key} must be an int >= 0; got {state.get(key)!r}" for key in _STATE[2:5]
                if not _is_count(state.get(key))]
    normaliser = state.get("normaliser")
    if normaliser is not None and not (_is_number(normaliser) and normaliser > 0
                                       and math.isfinite(normaliser)):
        problems.append(f"normaliser must be None or a finite number > 0; got {normaliser!r}")
    history = state.get("history")
    if not isinstance(history, (list, tuple)):
        return [*problems, f"history must be a list of records; got {type(history).__name__}"]
    fields = len(WindowRecord.__dataclass_fields__)
    for index, row in enumerate(history):
        if not (isinstance(row, (list, tuple)) and len(row) == fields
                and all(_is_count(v) for v in row[:3]) and all(_is_number(v) for v in row[3:])):
            problems.append(f"history[{index}] must be {fields} fields (3 ints >= 0, then 4 "
                            f"numbers: {', '.join(WindowRecord.__dataclass_fields__)}); "
                            f"got {row!r}")
            break
    return problems
