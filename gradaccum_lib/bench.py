"""Timing harness: interleaved repeats, medians with min-max, and a linear step-time model.

These machines are noisy, so comparisons are measured side by side in one run, A and B
interleaved (the order rotated each repeat), after a warm-up; report ratios, not absolute
times.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .accumulation import check_positive_int

__all__ = [
    "DdpStepModel",
    "StepTimeModel",
    "Timing",
    "fit_ddp_step_model",
    "fit_step_time",
    "time_interleaved",
]


@dataclass(frozen=True)
class Timing:
    """Seconds of repeated calls: the raw samples and their median, min and max."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """Return the median of the samples."""
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        """Return the fastest sample."""
        return min(self.samples)

    @property
    def max(self) -> float:
        """Return the slowest sample."""
        return max(self.samples)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_interleaved(
    functions: Mapping[str, Callable[[], object]], *, repeats: int = 5, warmup: int = 1
) -> dict[str, Timing]:
    """Return a :class:`Timing` per named function: ``warmup`` untimed rounds, then ``repeats``
    rounds in which every function runs once, in an order rotated each round.
    """
    if not functions:
        raise ValueError("functions must name at least one callable")
    check_positive_int("repeats", repeats)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0; got {warmup!r}")
    names = list(functions)
    for _ in range(warmup):
        for name in names:
            functions[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            _synchronize()
            start = time.perf_counter()
            functions[name]()
            _synchronize()
            samples[name].append(time.perf_counter() - start)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


@dataclass(frozen=True)
class StepTimeModel:
    """Time of a window: ``k * (overhead_per_micro_step + b * seconds_per_sample)
    + seconds_per_optimizer_step`` for k micro-batches of b samples.
    """

    overhead_per_micro_step: float
    seconds_per_sample: float
    seconds_per_optimizer_step: float = 0.0

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
    if len(micro_batch_sizes) != len(seconds_per_micro_step) or len(micro_batch_sizes) < 2:
        raise ValueError("need at least two (micro_batch_size, seconds) pairs of equal length")
    sizes = torch.tensor([float(s) for s in micro_batch_sizes], dtype=torch.float64)
    seconds = torch.tensor([float(t) for t in seconds_per_micro_step], dtype=torch.float64)
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

    @classmethod
    def from_comm_share(cls, compute_per_micro_step: float, comm_share: float) -> DdpStepModel:
        """Return the model of a cluster where, at k = 1, communication takes ``comm_share``
        of the step (e.g. 0.6: 60%)."""
        if not 0.0 <= comm_share < 1.0:
            raise ValueError(f"comm_share must be in [0, 1); got {comm_share}")
        if not compute_per_micro_step > 0:
            raise ValueError(
                f"compute_per_micro_step must be > 0; got {compute_per_micro_step}"
            )
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
        syncs = 1 if sync == "window" else accumulation_steps
        return syncs * self.comm_per_sync / self.step_seconds(accumulation_steps, sync)


def fit_ddp_step_model(
    accumulation_steps: Sequence[int],
    window_seconds: Sequence[float],
    every_seconds: Sequence[float],
) -> DdpStepModel:
    """Return the least-squares :class:`DdpStepModel` through measured step times with one
    sync per window (``k c + m + o``) and one per micro-step (``k c + k m + o``), clipped at 0.
    """
    if not len(accumulation_steps) == len(window_seconds) == len(every_seconds) >= 2:
        raise ValueError("need at least two k values, each with a window and an every time")
    rows, times = [], []
    for k, window, every in zip(accumulation_steps, window_seconds, every_seconds, strict=True):
        rows += [[float(k), 1.0, 1.0], [float(k), float(k), 1.0]]
        times += [float(window), float(every)]
    design = torch.tensor(rows, dtype=torch.float64)
    if torch.linalg.matrix_rank(design) < 3:
        raise ValueError("the k values must differ (at least one k > 1) to separate the terms")
    solution = torch.linalg.lstsq(design, torch.tensor(times, dtype=torch.float64)[:, None])
    compute, comm, per_step = (max(v, 0.0) for v in solution.solution[:, 0].tolist())
    return DdpStepModel(compute, comm, per_step)
