"""Planning: time x memory models of accumulation and of a data-parallel cluster.

- :class:`StepTimeModel` / :func:`fit_step_time`: a window's time from measured micro-step times;
- :class:`DdpStepModel` / :func:`fit_ddp_step_model`: a DDP step with one sync per window or
  one per micro-step, fitted to the medians of step times that :func:`time_ddp_steps`
  measures interleaved;
- :func:`plan_accumulation`, :func:`max_micro_batch_size`, :func:`accumulation_steps_for`:
  choosing the micro-batch and k on one device;
- :func:`measure_bert_shape` / :func:`fit_transformer_activations` / :func:`plan_cluster`: a
  BERT family's parameters and MEASURED activations, scaled to a cluster of devices (they live
  in :mod:`gradaccum_lib.measure.cluster` and are re-exported here).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ..runtime import check_number, check_positive_int
from .cluster import (
    ClusterPlan,
    TransformerActivations,
    TransformerShape,
    fit_transformer_activations,
    measure_bert_shape,
    plan_cluster,
)
from .memory import MemoryBreakdown, Optimizer, Precision, memory_budget

__all__ = [
    "accumulation_steps_for",
    "AccumulationPlan",
    "ClusterPlan",
    "DdpStepModel",
    "ddp_relative_residuals",
    "fit_ddp_step_model",
    "fit_step_time",
    "fit_transformer_activations",
    "max_micro_batch_size",
    "measure_bert_shape",
    "plan_accumulation",
    "plan_cluster",
    "StepTimeModel",
    "TransformerActivations",
    "TransformerShape",
]


def _check_seconds(model: object) -> None:
    """Every field of a time model: a finite number of seconds >= 0."""
    for field in fields(model):
        check_number(f"{type(model).__name__}.{field.name}", getattr(model, field.name), low=0)


def _measurements(label: str, values: object, *, sizes: bool = False) -> list[float]:
    """A sequence of measured seconds (finite, >= 0) or of sizes (positive ints)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{label} must be a list of {'ints' if sizes else 'numbers'}; got "
                        f"{type(values).__name__}")
    for index, value in enumerate(values):
        if sizes:
            check_positive_int(f"{label}[{index}]", value)
        else:
            check_number(f"{label}[{index}]", value, low=0)
    return [float(value) for value in values]


@dataclass(frozen=True)
class StepTimeModel:
    """Time of a window: ``k * (overhead_per_micro_step + b * seconds_per_sample)
    + seconds_per_optimizer_step`` for k micro-batches of b samples.
    """

    overhead_per_micro_step: float
    seconds_per_sample: float
    seconds_per_optimizer_step: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self)

    def window_seconds(self, micro_batch_size: int, accumulation_steps: int) -> float:
        """Return the modelled seconds of one window (one optimizer step)."""
        check_positive_int("micro_batch_size", micro_batch_size)
        check_positive_int("accumulation_steps", accumulation_steps)
        per_micro_step = self.overhead_per_micro_step + micro_batch_size * self.seconds_per_sample
        return accumulation_steps * per_micro_step + self.seconds_per_optimizer_step


def fit_step_time(
    micro_batch_sizes: Sequence[int],
    seconds_per_micro_step: Sequence[float],
    *,
    seconds_per_optimizer_step: float = 0.0,
) -> StepTimeModel:
    """Return the least-squares line ``seconds = overhead + size * per_sample`` through the
    measured forward+backward times (both coefficients clipped at 0).
    """
    sizes = _measurements("micro_batch_sizes", micro_batch_sizes, sizes=True)
    seconds = _measurements("seconds_per_micro_step", seconds_per_micro_step)
    check_number("seconds_per_optimizer_step", seconds_per_optimizer_step, low=0)
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("need at least two (micro_batch_size, seconds) pairs of equal length; "
                         f"got {len(sizes)} micro_batch_sizes and {len(seconds)} "
                         "seconds_per_micro_step")
    sizes = torch.tensor(sizes, dtype=torch.float64)
    seconds = torch.tensor(seconds, dtype=torch.float64)
    if bool((sizes == sizes[0]).all()):
        raise ValueError("micro_batch_sizes must not all be equal")
    design = torch.stack([torch.ones_like(sizes), sizes], dim=1)
    overhead, per_sample = torch.linalg.lstsq(design, seconds[:, None]).solution[:, 0].tolist()
    return StepTimeModel(max(overhead, 0.0), max(per_sample, 0.0), seconds_per_optimizer_step)


@dataclass(frozen=True)
class DdpStepModel:
    """Time of one data-parallel optimizer step with k micro-steps:
    ``k * compute_per_micro_step + syncs * comm_per_sync + per_step`` where syncs is 1 when
    gradients are synchronised once per window and k when every micro-step synchronises.
    ``comm_per_sync`` is the part of an all-reduce that compute does not hide.
    """

    compute_per_micro_step: float
    comm_per_sync: float
    per_step: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self)

    @classmethod
    def from_comm_share(cls, compute_per_micro_step: float, comm_share: float) -> DdpStepModel:
        """Return the model of a cluster where, at k = 1, communication takes ``comm_share``
        of the step (e.g. 0.6: 60%)."""
        check_number("comm_share", comm_share, low=0, high=1, high_open=True)
        check_number("compute_per_micro_step", compute_per_micro_step, low=0, low_open=True)
        return cls(compute_per_micro_step,
                   compute_per_micro_step * comm_share / (1.0 - comm_share))

    def step_seconds(self, accumulation_steps: int, sync: str = "window") -> float:
        """Return the modelled seconds of one optimizer step."""
        if sync not in ("window", "every"):
            raise ValueError(f"sync must be 'window' or 'every'; got {sync!r}")
        check_positive_int("accumulation_steps", accumulation_steps)
        syncs = 1 if sync == "window" else accumulation_steps
        return (accumulation_steps * self.compute_per_micro_step + syncs * self.comm_per_sync
                + self.per_step)

    def comm_fraction(self, accumulation_steps: int, sync: str = "window") -> float:
        """Return the share of the step spent in (unhidden) communication."""
        seconds = self.step_seconds(accumulation_steps, sync)  # checks the arguments
        if seconds == 0:
            raise ValueError("the modelled step takes 0 seconds; there is no share to take")
        syncs = 1 if sync == "window" else accumulation_steps
        return syncs * self.comm_per_sync / seconds


def _nonnegative_least_squares(design: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Return the x >= 0 that minimises |design x - targets| (exact: the best least-squares
    solution over every subset of free columns whose solution is >= 0; few columns only)."""
    columns = design.shape[1]
    best, best_residual = [0.0] * columns, float(targets.square().sum())
    for size in range(1, columns + 1):
        for free in itertools.combinations(range(columns), size):
            solution = torch.linalg.lstsq(design[:, free], targets[:, None]).solution[:, 0]
            if bool((solution < 0).any()):
                continue
            residual = float((design[:, free] @ solution - targets).square().sum())
            if residual < best_residual:
                best, best_residual = [0.0] * columns, residual
                for column, value in zip(free, solution.tolist(), strict=True):
                    best[column] = value
    return best


def _ddp_times(accumulation_steps: object, window_seconds: object, every_seconds: object
               ) -> list[tuple[int, str, float]]:
    """Checked (k, sync, seconds) rows of measured DDP step times (all > 0)."""
    _measurements("accumulation_steps", accumulation_steps, sizes=True)
    for label, values in (("window_seconds", window_seconds), ("every_seconds", every_seconds)):
        _measurements(label, values)
        for index, value in enumerate(values):
            check_number(f"{label}[{index}]", value, low=0, low_open=True)
    if not len(accumulation_steps) == len(window_seconds) == len(every_seconds) >= 2:
        raise ValueError("need at least two k values, each with a window and an every time; got "
                         f"{len(accumulation_steps)} accumulation_steps, {len(window_seconds)} "
                         f"window_seconds and {len(every_seconds)} every_seconds")
    return [row for k, window, every in zip(accumulation_steps, window_seconds, every_seconds,
                                            strict=True)
            for row in ((k, "window", float(window)), (k, "every", float(every)))]


def fit_ddp_step_model(
    accumulation_steps: Sequence[int],
    window_seconds: Sequence[float],
    every_seconds: Sequence[float],
) -> DdpStepModel:
    """Return the :class:`DdpStepModel` (every term >= 0) closest to measured step times
    (e.g. medians from :func:`~gradaccum_lib.jobs.step_times.time_ddp_steps`) with one sync per
    window (``k c + m + o``) and one per micro-step (``k c + k m + o``), in relative terms:
    least squares of
    ``(model - measured) / measured``, so that short and long steps weigh alike.
    """
    rows = _ddp_times(accumulation_steps, window_seconds, every_seconds)
    design = torch.tensor([[float(k), float(k if sync == "every" else 1), 1.0]
                           for k, sync, _ in rows], dtype=torch.float64)
    if torch.linalg.matrix_rank(design) < 3:
        raise ValueError("the k values must differ (at least one k > 1) to separate the terms")
    seconds = torch.tensor([value for _, _, value in rows], dtype=torch.float64)
    compute, comm, per_step = _nonnegative_least_squares(design / seconds[:, None],
                                                        torch.ones_like(seconds))
    return DdpStepModel(compute, comm, per_step)


def ddp_relative_residuals(
    model: DdpStepModel,
    accumulation_steps: Sequence[int],
    window_seconds: Sequence[float],
    every_seconds: Sequence[float],
) -> dict[tuple[int, str], float]:
    """Return ``(modelled - measured) / measured`` for each (k, sync) measured."""
    if not isinstance(model, DdpStepModel):
        raise TypeError(f"model must be a DdpStepModel (e.g. from fit_ddp_step_model); got "
                        f"{type(model).__name__}")
    return {(k, sync): model.step_seconds(k, sync) / seconds - 1.0
            for k, sync, seconds in _ddp_times(accumulation_steps, window_seconds,
                                               every_seconds)}


@dataclass(frozen=True)
class AccumulationPlan:
    """One choice of micro-batch size and accumulation steps: its memory and time."""

    micro_batch_size: int
    accumulation_steps: int
    memory: MemoryBreakdown
    window_seconds: float

    @property
    def effective_batch_size(self) -> int:
        """Return the samples per optimizer step: micro-batch size x accumulation steps."""
        return self.micro_batch_size * self.accumulation_steps

    @property
    def seconds_per_sample(self) -> float:
        """Return the modelled seconds per training sample."""
        return self.window_seconds / self.effective_batch_size


def plan_accumulation(
    *,
    num_parameters: int,
    activation_bytes_per_sample: float,
    step_time: StepTimeModel,
    micro_batch_size: int,
    accumulation_steps: int,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
) -> AccumulationPlan:
    """Return the memory budget and the modelled window time of one (micro-batch, k) choice."""
    if not isinstance(step_time, StepTimeModel):
        raise TypeError(f"step_time must be a StepTimeModel (e.g. from fit_step_time); got "
                        f"{type(step_time).__name__}")
    memory = memory_budget(
        num_parameters,
        optimizer=optimizer,
        precision=precision,
        activation_bytes_per_sample=activation_bytes_per_sample,
        micro_batch_size=micro_batch_size,
    )
    seconds = step_time.window_seconds(micro_batch_size, accumulation_steps)
    return AccumulationPlan(micro_batch_size, accumulation_steps, memory, seconds)


def max_micro_batch_size(
    device_bytes: float,
    num_parameters: int,
    activation_bytes_per_sample: float,
    *,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
    reserved_bytes: float = 0.0,
    activation_bytes_fixed: float = 0.0,
    ddp_bucket_copy: bool = False,
) -> int:
    """Return the largest micro-batch whose :func:`memory_budget` fits in ``device_bytes``
    minus ``reserved_bytes`` (runtime context, workspace, fragmentation); 0 if even the
    parameters, gradients, optimizer state, fixed activations (and, with
    ``ddp_bucket_copy=True``, DDP's default copy of the gradients) do not fit.
    """
    check_number("activation_bytes_per_sample", activation_bytes_per_sample, low=0,
                 low_open=True)
    check_number("device_bytes", device_bytes, low=0, low_open=True)
    check_number("reserved_bytes", reserved_bytes, low=0)
    static = memory_budget(num_parameters, optimizer=optimizer, precision=precision,
                           activation_bytes_fixed=activation_bytes_fixed,
                           ddp_bucket_copy=ddp_bucket_copy).total
    free = device_bytes - reserved_bytes - static
    return max(0, int(free // activation_bytes_per_sample))


def accumulation_steps_for(effective_batch_size: int, micro_batch_size: int,
                           world_size: int = 1) -> int:
    """Return the smallest k with micro_batch_size * k * world_size >= effective_batch_size."""
    for label, value in (("effective_batch_size", effective_batch_size),
                         ("micro_batch_size", micro_batch_size), ("world_size", world_size)):
        check_positive_int(label, value)
    return -(-effective_batch_size // (micro_batch_size * world_size))
