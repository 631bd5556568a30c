"""Timing harness: interleaved repeats, medians with min-max.

These machines are noisy, so comparisons are measured side by side in one run, A and B
interleaved (the order rotated each repeat), after a warm-up; report ratios, not absolute
times.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .runtime import check_positive_int

__all__ = [
    "time_interleaved",
    "Timing",
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
