"""The gradient noise scale from the gradients accumulation already computes, and batch-size
rules for the learning rate.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv:1812.06162):
the simple noise scale B_simple = tr(Σ) / |G|², where G is the true gradient and Σ the
per-sample gradient covariance, predicts the critical batch size. With gradients measured at
two batch sizes b (a micro-batch) and B (the window), unbiased estimators are

    |G|²  ≈ (B |G_B|² - b |G_b|²) / (B - b)          tr(Σ) ≈ (|G_b|² - |G_B|²) / (1/b - 1/B)

Accumulation computes both for free: each micro-batch's backward produces its own gradient
(read by a hook on the parameters) before it is added into ``.grad``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

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


class NoiseScaleTracker:
    """The noise scale of every window, from the gradients accumulation computes anyway: pass
    ``tracker.counting(loss_fn)`` as the loss to
    :func:`~gradaccum_lib.accumulation.accumulate_window`, then call ``tracker.end_window()``.
    A hook on the parameters reads each micro-batch's own gradient as its backward computes it
    (``torch.autograd.graph.register_multi_grad_hook``; ``close()`` removes it). Exponential
    moving averages of |G|² and tr Σ smooth the ratio's numerator and denominator separately,
    as the paper recommends. Costs one flat copy of the gradient. One process only: under DDP
    the micro-batch estimates would be one rank's.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], *, smoothing: float = 0.9) -> None:
        self.smoothing = check_number("smoothing", smoothing, low=0, high=1, high_open=True)
        self.parameters = list(parameters)
        if not self.parameters or not all(isinstance(p, Tensor) for p in self.parameters):
            raise TypeError("parameters must be the model's parameters (model.parameters()), "
                            "at least one tensor")
        self.records: list[dict[str, float]] = []
        self._summed: Tensor | None = None  # the window's summed-loss gradient so far
        self._items: float | None = None  # the item count of the micro-batch in flight
        self._micro_squared: list[float] = []
        self._micro_items: list[float] = []
        self._ema: tuple[float, float] | None = None
        self._hook = torch.autograd.graph.register_multi_grad_hook(
            self.parameters, self._after_backward, mode="all")

    def counting(self, loss_fn: Callable[[nn.Module, object], tuple[Tensor, object]]
                 ) -> Callable[[nn.Module, object], tuple[Tensor, object]]:
        """Return ``loss_fn`` that also tells the tracker each micro-batch's item count (read
        on the host: a measurement, not a training run's loss)."""

        def counted(model: nn.Module, micro_batch: object) -> tuple[Tensor, object]:
            summed_loss, num_items = loss_fn(model, micro_batch)
            self._items = float(num_items)
            return summed_loss, num_items

        return counted

    def _after_backward(self, gradients: Sequence[Tensor | None]) -> None:
        """Record one micro-batch: the squared norm of its mean-loss gradient (its summed-loss
        gradient over its items), and add it to the window's sum."""
        if self._items is None:
            raise ValueError("a backward ran through the tracked parameters without "
                             "tracker.counting(loss_fn) as accumulate_window's loss")
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).detach().reshape(-1)
                          .to(torch.float64) for g, p in zip(gradients, self.parameters,
                                                             strict=True)])
        self._summed = flat if self._summed is None else self._summed + flat
        if self._items > 0:
            self._micro_squared.append(float((flat / self._items).pow(2).sum()))
            self._micro_items.append(self._items)
        self._items = None

    def end_window(self) -> None:
        """Combine the window's gradient (the sum over all its items, divided by their count)
        with its micro-batches' into one estimate; call it after accumulate_window returns."""
        if self._summed is None:
            raise ValueError("end_window() came with no backward since the last window; pass "
                             "tracker.counting(loss_fn) as accumulate_window's loss")
        summed, micro_squared, micro_items = self._summed, self._micro_squared, self._micro_items
        self._summed, self._micro_squared, self._micro_items = None, [], []
        if len(micro_squared) < 2:
            return  # a window of one micro-batch has only one batch size
        total_items = sum(micro_items)
        window = summed / total_items
        small = total_items / len(micro_items)
        squared_gradient, trace = _noise_scale_estimates(
            sum(micro_squared) / len(micro_squared), float(window.pow(2).sum()),
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

    def close(self) -> None:
        """Remove the hook on the parameters."""
        self._hook.remove()


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
