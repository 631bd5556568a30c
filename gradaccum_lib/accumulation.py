"""The engine: gradient accumulation for a plain module, a DDP model or an FSDP2 module.

Per window of up to ``accumulation_steps`` micro-batches, on every rank:

1. ``zero_grad`` once;
2. forward and backward after EVERY micro-batch (one graph alive at a time), each summed loss
   divided by a provisional normaliser; the gradient is synchronised across ranks only on the
   window's LAST micro-step (DDP: the others run forward AND backward inside ``no_sync()``;
   FSDP2: ``set_requires_gradient_sync(False)``);
3. the window's item count and loss summed over every rank (``totals``): under DDP inside the
   last gradient all-reduce (``comm_hooks``), else one small all-reduce before that backward;
4. the gradient rescaled once to the mean over the GLOBAL window's items (gradients are
   linear in the loss, so this is exact: uneven micro-batches, uneven ranks, variable-length
   token losses and a partial last window included);
5. fp16 ``GradScaler`` unscale, clipping, one optimizer step, one scheduler step.

The provisional normaliser keeps gradients near mean-loss scale during the window (fp16 loss
scaling needs that): the first micro-batch's item count times the window length; across ranks
(where it must be one number) the largest of those, fixed once by an all-reduce at the first
window. DDP's average then divides by the world size, so when every micro-batch holds the same
number of items the gradient is already the global mean and step 4 does nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from .batches import Batch, LossFn, NonFiniteLossError, _checked_output, windows_of
from .comm_hooks import attach_window_totals
from .distributed import SkippedSync, full_value, gradient_sync_kind
from .gradients import gradient_norm, scale_gradients_
from .history import TrainingHistory, WindowRecord
from .resume import ResumeState
from .runtime import check_positive_int, check_trainer_arguments
from .totals import checked_totals, device_totals, local_totals

__all__ = ["AccumulationTrainer", "TrainingHistory", "WindowRecord"]
_NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it does nothing


def _at_least_fp32(tensor: Tensor) -> Tensor:  # a 16-bit (autocast) loss, summed in fp32
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class AccumulationTrainer(ResumeState):
    """Gradient accumulation done right, for one process, DDP or FSDP2 (see the module doc).

    Pass the model as you have it (a plain ``nn.Module``, a ``DistributedDataParallel``
    wrapper, or a module sharded with ``fully_shard``); on each rank :meth:`step_window` takes
    that rank's own micro-batches of the global window. ``observers`` are objects with
    ``on_micro_step(parameters, micro_step, num_items, provisional)`` and
    ``on_window_end(parameters, total_items, provisional)`` (e.g. ``noise.NoiseScaleTracker``);
    they see gradients in provisional units, before the window's rescale: this rank's own
    until the last micro-step, averaged over ranks after it (DDP/FSDP2), and still multiplied
    by the loss scale under fp16 ``GradScaler``.
    ``track_grad_norm=False`` skips the norm when not clipping (the history then holds NaN).
    ``sync_every_micro_step=True`` synchronises after every micro-step instead of once per
    window: the same gradient for k times the communication (for comparison only).
    Under DDP the engine registers its own comm hook at the first window (DDP's averaging,
    carrying the window's totals) unless the model has one: register yours before that (a
    ``CommCounter.register``-ed counter carries them too; any other costs one all-reduce).
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
        track_grad_norm: bool = True,
        sync_every_micro_step: bool = False,
    ) -> None:
        check_trainer_arguments(model, loss_fn, optimizer, scheduler, max_grad_norm, amp_dtype,
                                progress, observers, track_grad_norm, sync_every_micro_step)
        check_positive_int("accumulation_steps", accumulation_steps)
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.accumulation_steps = accumulation_steps
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.amp_dtype = amp_dtype
        self.progress = progress
        self.observers = list(observers)
        self.track_grad_norm = track_grad_norm
        self.sync_every_micro_step = sync_every_micro_step
        self.sync_kind = gradient_sync_kind(model)
        self._skip_sync = SkippedSync(model) if self.sync_kind == "ddp" else None
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if distributed else 1
        self.rank = dist.get_rank() if distributed else 0
        if self.world_size > 1 and self.sync_kind == "none":
            raise ValueError(
                f"model is a plain {type(model).__name__} but the process group has "
                f"{self.world_size} ranks: its gradients would never be synchronised and the "
                "ranks would drift apart; wrap it in DistributedDataParallel or shard it with "
                "fully_shard (FSDP2)"
            )
        self.device_type = next(model.parameters()).device.type
        self._reduce_device = torch.device(
            "cuda", torch.cuda.current_device()) if (
            distributed and dist.get_backend() == "nccl") else torch.device("cpu")
        self._common_normaliser: float | None = None  # across ranks, fixed at the first window
        self._carrier: Any = ...  # DDP: the WindowTotals its gradient all-reduce carries, or
        # None; ... until the first window looks (a hook registered after __init__ counts)
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range
        self.scaler = (torch.amp.GradScaler(self.device_type)
                       if amp_dtype == torch.float16 and self.device_type == "cuda" else None)
        self.history = TrainingHistory()
        self.epoch = 0
        self.windows_done = 0  # windows finished in the current epoch (for resuming)
        self.optimizer_steps = 0
        self._init_resume_state()

    def _parameters(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def train_epoch(self, micro_batches: Iterable[Batch], *, max_windows: int | None = None,
                    checkpoint_path: str | os.PathLike | None = None,
                    checkpoint_every: int | None = None,
                    ) -> TrainingHistory:
        """Train on one epoch of micro-batches; return the history so far.

        ``max_windows`` stops early (after that many windows of this epoch, counting resumed
        ones); every ``checkpoint_every`` windows a checkpoint is written to
        ``checkpoint_path``. After :meth:`load_checkpoint` the windows already done are
        skipped: pass the same micro-batches (a shuffling ``DataLoader`` or a
        ``DistributedSampler`` is replayed exactly; an order that cannot be replayed is
        refused with an error, never trained on)."""
        if (checkpoint_path is None) != (checkpoint_every is None):
            raise ValueError("give both checkpoint_path and checkpoint_every, or neither")
        if checkpoint_every is not None:
            check_positive_int("checkpoint_every", checkpoint_every)
        if max_windows is not None:
            check_positive_int("max_windows", max_windows)
        if checkpoint_path is not None and not isinstance(checkpoint_path, (str, os.PathLike)):
            raise TypeError(f"checkpoint_path must be a path (str or os.PathLike); got "
                            f"{type(checkpoint_path).__name__}")
        if isinstance(micro_batches, (Tensor, dict)) or not isinstance(micro_batches, Iterable):
            raise TypeError("micro_batches must be an iterable of micro-batches (a list, a "
                            f"DataLoader...); got {type(micro_batches).__name__}")
        total = (math.ceil(len(micro_batches) / self.accumulation_steps)
                 if hasattr(micro_batches, "__len__") else None)
        # at most one redraw a second: a notebook bar is a widget, and every redraw is a
        # message to the front end (thousands of them overflow a kernel's output channel)
        bar = tqdm(total=total, initial=self.windows_done, desc=f"epoch {self.epoch}",
                   disable=not self.progress or self.rank != 0, unit="step", mininterval=1.0)
        windows = windows_of(self._replayed(micro_batches), self.accumulation_steps)
        index = -1
        for index, window in enumerate(windows):
            if index < self.windows_done:
                self._check_replay(index, window)  # already trained before a resume
                continue
            if max_windows is not None and index >= max_windows:
                bar.close()
                return self.history
            record = self.step_window(window)
            self.windows_done = index + 1
            self._remember_window(window)
            bar.update(1)
            bar.set_postfix(loss=f"{record.loss:.4f}", lr=f"{record.learning_rate:.2e}",
                            refresh=False)  # redrawn by update, at most once a second
            if checkpoint_every is not None and self.windows_done % checkpoint_every == 0:
                self.save_checkpoint(checkpoint_path)
        bar.close()
        if index < 0:
            raise ValueError("micro_batches is empty: an epoch needs at least one micro-batch")
        if index + 1 < self.windows_done:
            raise ValueError(f"micro_batches hold {index + 1} windows but the checkpoint had "
                             f"already trained {self.windows_done} of this epoch; pass the "
                             "same micro-batches as before the interruption")
        self.epoch += 1
        self.windows_done = 0
        return self.history

    def step_window(self, window: Sequence[Batch]) -> WindowRecord:
        """Accumulate over ``window``'s micro-batches and take one optimizer step."""
        if isinstance(window, (Tensor, dict)) or not isinstance(window, Sequence):
            raise TypeError("window must be a list of micro-batches (e.g. from "
                            f"split_into_micro_batches); got {type(window).__name__}")
        if not window:
            raise ValueError("window is empty; it needs at least one micro-batch")
        if len(window) > self.accumulation_steps:
            raise ValueError(f"window holds {len(window)} micro-batches but accumulation_steps "
                             f"is {self.accumulation_steps}; pass at most that many")
        self.optimizer.zero_grad(set_to_none=True)
        if self._carrier is ...:
            self._carrier = attach_window_totals(self.model) if self.world_size > 1 else None
        if self._carrier is not None:
            self._carrier.take()  # nothing left over from a window that raised
        summed_losses, counts, normaliser, totals = self._accumulate(window)
        total_items, total_loss = self._window_totals(summed_losses, counts, totals)
        for observer in self.observers:
            observer.on_window_end(self._parameters(), total_items, normaliser)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once per window, before clipping
        self._rescale(normaliser * self.world_size / total_items)  # DDP/FSDP2 average ranks
        grad_norm = self._clip()
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        self._optimizer_step()
        record = WindowRecord(epoch=self.epoch, window=self.windows_done,
                              micro_steps=len(window), items=total_items,
                              loss=total_loss / total_items, grad_norm=grad_norm,
                              learning_rate=learning_rate)
        self.history.records.append(record)
        return record

    def _gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        """DDP decides at FORWARD time whether the next backward synchronises; FSDP2 reads
        its flag at backward time. Either way the flag is set before the forward pass."""
        if self.sync_kind == "ddp" and not sync:
            return self._skip_sync
        if self.sync_kind == "fsdp2":
            self.model.set_requires_gradient_sync(sync)
        return _NO_CONTEXT

    def _autocast(self) -> contextlib.AbstractContextManager:
        return (_NO_CONTEXT if self.amp_dtype is None
                else torch.autocast(self.device_type, dtype=self.amp_dtype))

    def _accumulate(self, window: Sequence[Batch]) -> tuple[list, list, float, Any]:
        """Forward and backward every micro-batch; return the summed losses, the item counts,
        the provisional normaliser they were divided by, and, across ranks, this rank's totals
        handed to the last backward's gradient all-reduce or to an all-reduce of their own
        started before it (None in one process: they are summed after the window)."""
        summed_losses: list[Tensor | float] = []  # numbers when on the CPU (read at once:
        counts: list[Tensor | float] = []  # no device to wait for), tensors on an accelerator
        normaliser: Any = None
        totals: Any = None
        last = len(window) - 1
        for micro_step, micro_batch in enumerate(window):
            with self._gradient_sync(micro_step == last or self.sync_every_micro_step):
                with self._autocast():
                    output = self.loss_fn(self.model, micro_batch)
                summed_loss, count = _checked_output(output, micro_step)
                if normaliser is None:
                    normaliser = self._provisional(count, len(window))
                if not summed_loss.requires_grad:
                    raise ValueError(
                        f"the loss of micro-batch {micro_step} does not require grad: loss_fn "
                        "must not detach it or run under torch.no_grad()")
                summed_losses.append(summed_loss.item() if summed_loss.device.type == "cpu"
                                     else _at_least_fp32(summed_loss.detach()))
                counts.append(count.item() if isinstance(count, Tensor)
                              and count.device.type == "cpu" else count)
                if micro_step == last and self.world_size > 1:
                    totals = self._start_totals(summed_losses, counts)
                loss = _at_least_fp32(summed_loss) / normaliser
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            for observer in self.observers:
                observer.on_micro_step(self._parameters(), micro_step, float(count),
                                       float(normaliser))
        return summed_losses, counts, float(normaliser), totals

    def _provisional(self, first_count: Tensor | float, window_length: int) -> Any:
        """The provisional normaliser: per window in one process; one constant across ranks."""
        if self.world_size == 1:
            if isinstance(first_count, Tensor):
                if first_count.device.type != "cpu":
                    return first_count.clamp(min=1.0) * window_length  # no host sync
                first_count = first_count.item()  # on the CPU: a number, no tensor operators
            return (first_count if first_count >= 1.0 else 1.0) * window_length
        if self._common_normaliser is None:
            count = float(first_count)  # an invalid count is refused after the window; the
            count = count if math.isfinite(count) and count >= 1.0 else 1.0  # cache stays sane
            local = count * window_length  # DDP's average supplies the world size
            value = torch.tensor([local], dtype=torch.float64, device=self._reduce_device)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            self._common_normaliser = float(value.item())
        return self._common_normaliser

    def _start_totals(self, summed_losses: list, counts: list) -> Any:
        """This rank's totals (``totals.local_totals``, float64, no host sync), and the handle
        of their all-reduce: None when the last backward's gradient all-reduce carries them."""
        if any(isinstance(value, Tensor) for value in (*summed_losses, *counts)):
            local = device_totals(summed_losses, counts).to(self._reduce_device)
        else:
            local = torch.tensor(local_totals(summed_losses, counts), dtype=torch.float64,
                                 device=self._reduce_device)
        if self._carrier is not None:
            self._carrier.pending = local
            return local, None
        return local, dist.all_reduce(local, async_op=True)

    def _window_totals(self, summed_losses: list, counts: list,
                       totals: Any) -> tuple[float, float]:
        """The GLOBAL window's item count and summed loss (one sync); raise on every rank,
        with no step taken and the gradients cleared, on a non-finite loss, an invalid count
        or a window without items (``totals.checked_totals``)."""
        if totals is None:
            values = local_totals(summed_losses, counts)
        else:
            packed, work = totals
            if work is not None:
                work.wait()
            elif self._carrier is not None:
                received = self._carrier.take()
                if received is None:  # no float32/float64 bucket carried them: every rank
                    dist.all_reduce(packed)  # sees the same buckets, so all come here
                else:
                    packed = received
            values = packed.tolist()
        try:
            return checked_totals(values, summed_losses, counts, self.windows_done)
        except (ValueError, NonFiniteLossError):
            self.optimizer.zero_grad(set_to_none=True)
            raise

    def _rescale(self, factor: float) -> None:
        if factor != 1.0:  # equal counts (common): nothing to rescale
            scale_gradients_([p.grad for p in self._parameters() if p.grad is not None], factor)

    def _clip(self) -> float:
        """Clip once, on the accumulated gradient; return its norm before clipping."""
        parameters = self._parameters()
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.max_grad_norm)
        elif self.track_grad_norm:  # the norm only, for the history: no pass that multiplies
            norm = gradient_norm([p.grad for p in parameters if p.grad is not None])
        else:
            return float("nan")
        return float(full_value(norm))

    def _optimizer_step(self) -> None:
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
