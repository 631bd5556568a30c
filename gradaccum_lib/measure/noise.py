"""The gradient noise scale from the gradients accumulation already computes, and batch-size
rules for the learning rate.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv:1812.06162):
the simple noise scale B_simple = tr(Σ) / |G|², where G is the true gradient and Σ the
per-sample gradient covariance, predicts the critical batch size. With gradients measured at
two batch sizes b (a micro-batch) and B (the window), unbiased estimators are

    |G|²  ≈ (B |G_B|² - b |G_b|²) / (B - b)          tr(Σ) ≈ (|G_b|² - |G_B|²) / (1/b - 1/B)

Accumulation computes both for free: each micro-batch's gradient is the difference of the
accumulated gradient before and after its backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from gradaccum_lib.runtime import check_choice, check_number, check_positive_int

__all__ = [
    "NoiseScaleTracker",
    "brute_force_noise_scale",
    "scaled_learning_rate",
]


def _noise_scale_estimates(small_squared_norm: float, big_squared_norm: float,
                          small_batch: float, big_batch: float) -> tuple[float, float]:
    """Return the unbiased estimates (|G|², tr Σ) from squared gradient norms measured at a
    small and a big batch size (McCandlish et al. 2018, appendix A.1)."""
    check_number("small_squared_norm", small_squared_norm, low=0)
    check_number("big_squared_norm", big_squared_norm, low=0)
    check_number("small_batch", small_batch, low=0, low_open=True)
    check_number("big_batch", big_batch, low=0, low_open=True)
    if not small_batch < big_batch:
        raise ValueError(f"need 0 < small_batch < big_batch; got small_batch={small_batch}, "
                         f"big_batch={big_batch}")
    squared_gradient = ((big_batch * big_squared_norm - small_batch * small_squared_norm)
                        / (big_batch - small_batch))
    trace = (small_squared_norm - big_squared_norm) / (1 / small_batch - 1 / big_batch)
    return squared_gradient, trace


def _flat_gradient(parameters: list[nn.Parameter]) -> Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                      .reshape(-1).to(torch.float64) for p in parameters])


class NoiseScaleTracker:
    """The noise scale of every window, from the gradients accumulation computes anyway: pass
    ``after_backward=tracker.after_backward`` to
    :func:`~gradaccum_lib.accumulation.accumulate_window`, then call ``tracker.end_window()``.
    Exponential moving averages of |G|² and tr Σ smooth the ratio's numerator and denominator
    separately, as the paper recommends. Costs two flat copies of the gradient. One process
    only: under DDP the last micro-step's gradient is already averaged over the ranks, so the
    micro-batch estimates would mix ranks.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], *, smoothing: float = 0.9) -> None:
        self.smoothing = check_number("smoothing", smoothing, low=0, high=1, high_open=True)
        self.parameters = list(parameters)
        if not self.parameters or not all(isinstance(p, Tensor) for p in self.parameters):
            raise TypeError("parameters must be the model's parameters (model.parameters()), "
                            "at least one tensor")
        self.records: list[dict[str, float]] = []
        self._summed: Tensor | None = None  # the window's gradient sum after the last backward
        self._micro_squared: list[float] = []
        self._micro_items: list[float] = []
        self._ema: tuple[float, float] | None = None

    def after_backward(self, micro_step: int, num_items: float) -> None:
        """Record the squared norm of this micro-batch's mean-loss gradient: what its backward
        added to the gradients' running sum of summed-loss gradients, over its items."""
        summed = _flat_gradient(self.parameters)
        if micro_step == 0:
            self._summed = torch.zeros_like(summed)
            self._micro_squared, self._micro_items = [], []
        elif self._summed is None:
            raise ValueError(f"micro_step {micro_step} came first; a window starts at "
                             "micro_step 0")
        if num_items > 0:
            micro = (summed - self._summed) / num_items
            self._micro_squared.append(float(micro.pow(2).sum()))
            self._micro_items.append(num_items)
        self._summed = summed

    def end_window(self) -> None:
        """Combine the window's gradient (the sum over all its items, divided by their count)
        with its micro-batches' into one estimate; call it after accumulate_window returns."""
        if self._summed is None:
            raise ValueError("end_window() came with no after_backward since the last window; "
                             "pass after_backward=tracker.after_backward to accumulate_window")
        summed, self._summed = self._summed, None
        if len(self._micro_squared) < 2:
            return  # a window of one micro-batch has only one batch size
        total_items = sum(self._micro_items)
        window = summed / total_items
        small = total_items / len(self._micro_items)
        squared_gradient, trace = _noise_scale_estimates(
            sum(self._micro_squared) / len(self._micro_squared), float(window.pow(2).sum()),
            small, total_items)
        if self._ema is None:
            self._ema = (squared_gradient, trace)
        else:
            a = self.smoothing
            self._ema = (a * self._ema[0] + (1 - a) * squared_gradient,
                         a * self._ema[1] + (1 - a) * trace)
        smoothed = self._ema[1] / self._ema[0] if self._ema[0] > 0 else math.inf
        self.records.append({"squared_gradient": squared_gradient, "trace": trace,
                             "b_simple": trace / squared_gradient if squared_gradient > 0
                             else math.inf, "b_simple_smoothed": smoothed})


def brute_force_noise_scale(per_sample_gradients: Tensor) -> float:
    """Return tr(Σ) / |G|² from per-sample gradients (rows): the ground truth the estimator
    is checked against."""
    if not isinstance(per_sample_gradients, Tensor):
        raise TypeError("per_sample_gradients must be a 2-dim Tensor (one row per sample); got "
                        f"{type(per_sample_gradients).__name__}")
    if per_sample_gradients.dim() != 2 or len(per_sample_gradients) < 2:
        raise ValueError("per_sample_gradients must be a 2-dim tensor with at least 2 rows; got "
                         f"shape {tuple(per_sample_gradients.shape)}")
    g = per_sample_gradients.to(torch.float64)
    if not bool(torch.isfinite(g).all()):
        raise ValueError("per_sample_gradients holds a NaN or an inf")
    mean = g.mean(dim=0)
    trace = (g - mean).pow(2).sum(dim=1).mean()
    squared_mean = mean.pow(2).sum()
    if squared_mean == 0:
        raise ValueError("per_sample_gradients average to exactly zero: |G|^2 = 0, so the noise "
                         "scale tr(Sigma)/|G|^2 is undefined")
    return float(trace / squared_mean)


def scaled_learning_rate(base_lr: float, base_batch: int, batch: int, rule: str) -> float:
    """Return the learning rate for ``batch`` from one tuned at ``base_batch``: ``none``
    keeps it, ``linear`` scales it by batch/base (Goyal et al. 2017, arXiv:1706.02677),
    ``sqrt`` by its square root (the rule usually argued for Adam-type optimizers)."""
    check_choice("rule", rule, ("none", "linear", "sqrt"))
    check_number("base_lr", base_lr, low=0, low_open=True)
    check_positive_int("base_batch", base_batch)
    check_positive_int("batch", batch)
    ratio = batch / base_batch
    rules = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}
    return base_lr * rules[rule]
