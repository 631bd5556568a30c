"""The loop: one accumulation window, for a plain module, a DDP model or an FSDP2 module.

:func:`accumulate_window` is the loop the notebooks build step by step, with the additions a
real run needs. On every rank, for its micro-batches of the global window:

1. **zero** the gradients once;
2. **accumulate**: forward and backward per micro-batch, each micro-batch's SUMMED loss as it
   is; gradients sync across ranks on the LAST micro-step only, a flag set BEFORE the forward
   (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``);
3. **count**: the window's items and summed loss over every rank, one ``dist.all_reduce``
   started once the last forward has given the last count, so that it runs during the last
   backward; a non-finite loss or a bad count raises, no step;
4. **rescale** once, to the mean over the GLOBAL window's items (exact: gradients are linear in
   the loss; uneven micro-batches and ranks, token losses, a partial window included);
5. **clip** the accumulated gradient (not finite: an error, or GradScaler's skip);
6. **step** the optimizer and, if it stepped, the scheduler, once.

No collective hides in a check: the loop's only collectives are DDP's (or FSDP2's) own and
the one all-reduce of step 3. That every rank holds a window is the job of the program that
makes the windows: :func:`gradaccum_lib.distributed.agree_on_windows`, once per epoch, makes
every rank raise, naming the rank whose data runs out, where the others would otherwise wait
in a collective it never joins.

Why backward the sum and rescale after (torchtune's way) rather than count first
(torchtitan's): under the series' contract ``loss_fn(model, micro_batch) -> (summed_loss,
num_items)`` the count comes out of the forward pass, so it is known only once every
micro-batch has run, after the first backward. Summed losses add up to exactly the window's
summed loss, and one multiply by ``world_size / items`` turns DDP's average over ranks into the
mean over the window's items. The cost: one pass over the gradients a window. With fp16, a
summed loss is ``items`` times a mean loss, and fp16 overflows inside each micro-batch's own
backward, so the scale must allow for a micro-batch's summed loss, not the window's:
``init_scale=2**16 / items_per_micro_batch`` is a start that steps (notebook 09 measures it);
GradScaler's default, made for a mean loss, skips steps until it has come down.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .batches import (  # the loss contract
    Batch,
    LossFn,
    NonFiniteGradientError,
    NonFiniteLossError,
    loss_pair,
)
from .runtime import check_model

__all__ = ["WindowResult", "accumulate_window"]


@dataclass(frozen=True)
class WindowResult:
    """What one window did: items over every rank, their mean loss, the gradient's norm
    before clipping, and whether the optimizer stepped (GradScaler may skip a step)."""

    items: float
    loss: float
    grad_norm: float
    stepped: bool


def accumulate_window(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    window: Sequence[Batch],
    loss_fn: LossFn,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    scaler: torch.amp.GradScaler | None = None,
    max_grad_norm: float | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> WindowResult:
    """Accumulate over ``window`` (this rank's micro-batches) and take one optimizer step.

    ``loss_fn(model, micro_batch)`` returns ``(summed_loss, num_items)``; the gradient stepped
    on is the mean over the window's items on every rank. Pass the model as you train it
    (plain, DDP with your comm hook, or ``fully_shard``-ed). ``scaler``: a GradScaler for
    fp16; ``autocast_dtype``: the forward's autocast dtype (bf16 or fp16).
    """
    _check_arguments(model, optimizer, window, loss_fn, scheduler, scaler, max_grad_norm,
                     autocast_dtype)
    group = getattr(model, "process_group", None)  # DDP's group; None: the default one
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    device = next(model.parameters()).device
    # made once, entered every micro-step (a disabled torch.autocast still costs its entry)
    amp = (torch.autocast(device.type, autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    optimizer.zero_grad(set_to_none=True)
    # each micro-batch's summed loss (detached) and items (a number or a tensor), unread
    losses, counts = [], []
    totals, work = torch.zeros(3), None  # set at the last micro-step: a window is never empty
    for micro_step, micro_batch in enumerate(window):
        last = micro_step == len(window) - 1
        # DDP's forward tells its reducer whether this backward syncs: set the flag BEFORE it
        with _gradient_sync(model, sync=last):
            with amp:
                summed_loss, num_items = loss_pair(loss_fn(model, micro_batch), micro_step,
                                                   for_backward=True)
            losses.append(summed_loss.detach())
            counts.append(num_items)
            if last:  # every count is known: the totals in one collective, run while the
                # last backward runs, on the device the group reduces on (nccl: the GPU)
                totals = _window_totals(losses, counts, device, group, world_size)
                work = (dist.all_reduce(totals, group=group, async_op=True) if world_size > 1
                        else None)
            (summed_loss if scaler is None else scaler.scale(summed_loss)).backward()
    if work is not None:
        work.wait()
    items, loss_sum, bad = totals.tolist()  # the window's one host sync
    if bad or not (math.isfinite(items) and math.isfinite(loss_sum)) or items <= 0:
        optimizer.zero_grad(set_to_none=True)
        _raise_bad_window(losses, counts, items, bad)

    parameters = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    if scaler is not None:
        scaler.unscale_(optimizer)  # once per window, before the rescale and the clip
    with torch.no_grad():  # DDP and FSDP2 averaged the sums over ranks: undo it, divide
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(world_size / items)
    norm = (torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm) if max_grad_norm else
            torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None]))
    # under FSDP2 the norm is a DTensor of this rank's shards: full_tensor() sums the ranks'
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not math.isfinite(grad_norm) and scaler is None:  # no step; names the culprit
        _raise_non_finite_gradient(model, optimizer)
    if scaler is None:
        optimizer.step()
        stepped = True
    else:
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        stepped = scaler.get_scale() >= scale  # lower: it found an inf/NaN, skipped the step
    if stepped and scheduler is not None:
        scheduler.step()  # once per optimizer step, never per micro-batch
    return WindowResult(items, loss_sum / items, grad_norm, stepped)


def _totals_placement(device: torch.device, group: dist.ProcessGroup | None,
                      world_size: int) -> dict[str, object]:
    """Return the dtype and device of the window's totals, as keywords. The device is the one
    the process group reduces on: with nccl, the current CUDA device, even when FSDP2 offloads
    the parameters to the CPU; otherwise the parameters' (``device``). The dtype is float64
    (counts exact past 2**24 items), float32 on MPS, which has no float64."""
    if world_size > 1 and dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return {"dtype": torch.float32 if device.type == "mps" else torch.float64, "device": device}


def _window_totals(losses: list[Tensor], counts: list[Tensor | float], device: torch.device,
                   group: dist.ProcessGroup | None, world_size: int) -> Tensor:
    """Return this rank's totals of the window, one tensor for one all-reduce, on the device
    its process group reduces on (:func:`_totals_placement`): items, summed loss, and the
    counts' negative part (not 0 if a count is negative or NaN; an infinite count makes items
    infinite). Counts that are numbers add up on the host and go to the device as a fill
    (``torch.full``: no copy waits for the device); nothing is read from the device."""
    placement = _totals_placement(device, group, world_size)
    loss = torch.stack(losses).sum(dtype=placement["dtype"]).to(placement["device"])
    if all(isinstance(count, float) for count in counts):  # loss_pair made numbers floats
        items = sum(counts, 0.0)  # not math.fsum: an overflow must give inf, not raise
        bad = sum((count for count in counts if not count >= 0), 0.0)  # NaN is not >= 0
        return torch.stack([torch.full((), items, **placement), loss,
                            torch.full((), bad, **placement)])
    stacked = torch.stack([torch.as_tensor(count, **placement) for count in counts])
    return torch.stack([stacked.sum(), loss, stacked.clamp(max=0).sum()])


def _gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """A context in which ``model``'s backward syncs gradients across ranks only if ``sync``:
    DDP's ``no_sync()``; FSDP2's ``set_requires_gradient_sync`` (a setting, not a context)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if sync else model.no_sync()
    if callable(getattr(type(model), "set_requires_gradient_sync", None)):  # FSDP2's class
        return _fsdp2_sync(model, sync)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp2_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """FSDP2's setting as a context, as DDP's ``no_sync`` is: set before the forward, back to
    its default (sync) after the backward, or when ``loss_fn`` or the backward raises."""
    model.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


# Checks at the door, and the errors of a bad window. ------------------------------------------

def _check_arguments(model: object, optimizer: object, window: object,  # noqa: PLR0913
                     loss_fn: object, scheduler: object, scaler: object, max_grad_norm: object,
                     autocast_dtype: object) -> None:
    """Raise a TypeError or ValueError naming the first bad argument."""
    check_model(model)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer; got "
                        f"{type(optimizer).__name__}")
    parameters = list(model.parameters())
    owned = {id(p) for p in parameters}
    strangers = sum(id(p) not in owned for g in optimizer.param_groups for p in g["params"])
    if strangers:
        raise ValueError(f"optimizer holds {strangers} parameter(s) that are not the "
                         "model's; build it from model.parameters()")
    if isinstance(window, (Tensor, dict, str)) or not isinstance(window, Sequence):
        raise TypeError("window must be a list of micro-batches (e.g. from "
                        f"split_into_micro_batches); got {type(window).__name__}")
    if isinstance(window, tuple) and window and all(isinstance(x, Tensor) for x in window):
        raise TypeError("window is a tuple of tensors: one batch such as (inputs, labels), not "
                        "a list of micro-batches; pass [batch] or split_into_micro_batches(batch, "
                        "accumulation_steps=k)")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, micro_batch) -> "
                        f"(summed_loss, num_items); got {type(loss_fn).__name__}")
    if scheduler is not None and not (callable(getattr(scheduler, "step", None))
                                      and getattr(scheduler, "optimizer", None) is optimizer):
        raise ValueError("scheduler must be None or an LR scheduler built on this optimizer; "
                         f"got {type(scheduler).__name__}")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be None or a torch.amp.GradScaler; got "
                        f"{type(scaler).__name__}")
    if max_grad_norm is not None and not (
            isinstance(max_grad_norm, (int, float)) and not isinstance(max_grad_norm, bool)
            and math.isfinite(max_grad_norm) and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be a finite number > 0 or None; got "
                         f"{max_grad_norm!r}")
    if autocast_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError("autocast_dtype must be None, torch.bfloat16 or torch.float16; got "
                         f"{autocast_dtype!r}")
    on_cuda = parameters[0].device.type == "cuda"
    if autocast_dtype == torch.float16 and on_cuda and scaler is None:
        raise ValueError("autocast_dtype=torch.float16 on CUDA needs scaler="
                         "torch.amp.GradScaler('cuda'): fp16 gradients underflow without it")
    group = getattr(model, "process_group", None)  # DDP's group; None: the default one
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    if not window:  # on several ranks the others would wait for this one: agree_on_windows
        raise ValueError("window is empty; it needs at least one micro-batch (on several ranks, "
                         "agree_on_windows once per epoch stops every rank before this)")
    if world_size > 1 and not (isinstance(model, nn.parallel.DistributedDataParallel)
                               or callable(getattr(model, "set_requires_gradient_sync", None))):
        raise ValueError(
            f"model is a plain {type(model).__name__} but the process group has {world_size} "
            "ranks: its gradients would never be synchronised and the ranks would drift apart; "
            "wrap it in DistributedDataParallel or shard it with fully_shard (FSDP2)")


def _raise_bad_window(losses: list[Tensor], counts: list[Tensor | float], items: float,
                      bad: float) -> None:
    """Raise for a window with a non-finite loss, a bad count (``bad`` not 0, or ``items`` not
    finite) or no items, naming this rank's micro-batch when it holds the culprit (every rank
    raises: the totals are shared)."""
    for micro_step, count in enumerate(counts):
        if not (math.isfinite(float(count)) and float(count) >= 0):
            raise ValueError(f"loss_fn's num_items must be finite and >= 0; got "
                             f"{float(count)} at micro-batch {micro_step}")
    if not bad and math.isinf(items) and all(math.isfinite(float(c)) for c in counts):
        raise ValueError(f"the window's item count overflowed to {items}: loss_fn's num_items "
                         "are finite but too large to add up")
    if bad or not math.isfinite(items):
        raise ValueError("loss_fn's num_items must be finite and >= 0; a micro-batch on "
                         "another rank returned an invalid one")
    for micro_step, loss in enumerate(losses):
        if not math.isfinite(float(loss)):
            raise NonFiniteLossError(micro_step, float(loss))
    if items > 0:
        raise NonFiniteLossError(-1, float("nan"), where="on another rank")
    raise ValueError("the window covers no items (every num_items was 0 on every rank)")


def _raise_non_finite_gradient(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Clear the gradients and raise, naming the first of the optimizer's parameters whose
    ``.grad`` holds a NaN or an inf (an FSDP2 shard is checked whole: every rank calls it)."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    name = None
    for candidate, parameter in model.named_parameters():
        grad = parameter.grad
        if id(parameter) in stepped and grad is not None and name is None:
            grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            name = None if bool(torch.isfinite(grad).all()) else candidate
    optimizer.zero_grad(set_to_none=True)
    raise NonFiniteGradientError(
        f"the accumulated gradient is not finite (first at parameter {name!r}); no step, "
        "gradients cleared. A 16-bit model needs float32 parameters and autocast_dtype")
