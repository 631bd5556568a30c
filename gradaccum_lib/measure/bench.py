"""Timing harness: interleaved repeats, medians with min-max, paired ratios.

These machines are noisy, so comparisons are measured side by side in one run, A and B
interleaved (the order rotated each repeat), after a warm-up, with Python's garbage collector
paused while a round runs (as ``timeit`` does); report ratios, not absolute times:
:func:`paired_ratio` is the median of A's time over B's in the same round, so a slow minute
of the machine slows both sides of the ratio it lands in. :func:`steady_allocator` keeps
freed memory in the process, so that whether a step page-faults does not depend on the order
in which the interleaved contenders happen to free theirs.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from gradaccum_lib.runtime import check_positive_int

__all__ = [
    "paired_ratio",
    "steady_allocator",
    "time_interleaved",
    "Timing",
]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>


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
    functions: Mapping[str, Callable[[], object]], *, repeats: int = 5, warmup: int = 1,
    before: Callable[[], object] | None = None, calls_per_turn: int = 1,
) -> dict[str, Timing]:
    """Return a :class:`Timing` per named function: ``warmup`` untimed rounds, then ``repeats``
    rounds in which every function takes a turn, in an order rotated each round. A turn is
    ``calls_per_turn`` consecutive calls, each timed, and its sample is their mean: a training
    loop's windows follow one another, and one call per turn would charge a loop for what the
    others left in the caches and the allocator between its calls. ``before``, if given, runs
    untimed before every timed call: under DDP a barrier, so that each call's collectives start
    with every rank there (else one rank's lag lands on the next call). A warm-up round calls
    each function once, without ``before``.
    """
    if not functions:
        raise ValueError("functions must name at least one callable")
    check_positive_int("repeats", repeats)
    check_positive_int("calls_per_turn", calls_per_turn)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0; got {warmup!r}")
    if before is not None and not callable(before):
        raise TypeError(f"before must be a callable or None; got {type(before).__name__}")
    names = list(functions)
    for _ in range(warmup):
        for name in names:
            functions[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    collecting = gc.isenabled()
    try:
        for round_index in range(repeats):
            shift = round_index % len(names)
            gc.disable()  # a collection lands on whichever call triggers it: between rounds
            for name in names[shift:] + names[:shift]:
                seconds = 0.0
                for _ in range(calls_per_turn):
                    if before is not None:
                        before()
                    _synchronize()
                    start = time.perf_counter()
                    functions[name]()
                    _synchronize()
                    seconds += time.perf_counter() - start
                samples[name].append(seconds / calls_per_turn)
            if collecting:
                gc.enable()
    finally:
        if collecting:
            gc.enable()
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def paired_ratio(numerator: Timing, denominator: Timing) -> float:
    """Return the median over rounds of ``numerator``'s time over ``denominator``'s in the
    same round (both from one :func:`time_interleaved`)."""
    if len(numerator.samples) != len(denominator.samples) or not numerator.samples:
        raise ValueError("paired_ratio needs two timings of the same rounds; got "
                         f"{len(numerator.samples)} and {len(denominator.samples)} samples")
    return statistics.median(a / b for a, b in zip(numerator.samples, denominator.samples,
                                                     strict=True))


def steady_allocator(threshold_bytes: int = 256 * 2**20) -> bool:
    """Make glibc keep freed memory up to ``threshold_bytes`` in the process (its trim and
    mmap thresholds fixed, no longer adjusted as the program frees); return False where the C
    library is not glibc. By default a free may hand pages back to the kernel and the next
    allocation fault them in again, depending on the order of earlier frees: the library's
    loop then measured 1.03 and 1.15 times the bare loop's in two runs of the same code."""
    check_positive_int("threshold_bytes", threshold_bytes)
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return (mallopt(_M_TRIM_THRESHOLD, threshold_bytes) == 1
            and mallopt(_M_MMAP_THRESHOLD, min(threshold_bytes, 32 * 2**20)) == 1)
