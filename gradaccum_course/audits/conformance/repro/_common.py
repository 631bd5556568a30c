"""What the reproduction programs share: a scenario by key, the audit of a step against the
large batch's update, the plain loop that explains a deviation, and the verdict (exit status)."""

from __future__ import annotations

import torch

from gradaccum_lib.batches import concatenate_micro_batches
from gradaccum_lib.equivalence import audit_update

from ..scenarios import SCENARIOS, make_optimizer, window_mean_loss
from ..verdicts import TOLERANCE

__all__ = ["audit", "logged_report", "model_losses", "report", "trainer_logged_loss",
           "weighted_mean_losses_step"]


def audit(step, key: str, order: list[int] | None = None):  # noqa: ANN001, ANN201
    """Audit ``step`` (one optimizer step over the window) on the scenario ``key``; with
    ``order``, on the window's samples regrouped in that order into micro-batches of 2 (the
    large batch, and so the truth, is the same)."""
    (scenario,) = [s for s in SCENARIOS if s.key == key]
    parts = scenario.micro_batches()
    if order is not None:
        window = concatenate_micro_batches(parts)
        parts = [{name: value[order[i:i + 2]] for name, value in window.items()}
                 for i in range(0, len(order), 2)]
    return audit_update(step, scenario.model(), scenario.loss_fn, parts, make_optimizer,
                        max_grad_norm=scenario.max_grad_norm or None)


def weighted_mean_losses_step(weights, **forward_kwargs):  # noqa: ANN001, ANN003, ANN201
    """The explaining loop: backpropagate each micro-batch's own model loss (a mean) times its
    weight, then one SGD step."""
    def step(model, micro_batches, make_optimizer) -> None:  # noqa: ANN001
        optimizer = make_optimizer(model.parameters())
        for weight, micro_batch in zip(weights, micro_batches, strict=True):
            (model(**micro_batch, **forward_kwargs).loss * weight).backward()
        optimizer.step()

    return step


def report(cell: str, measured, explained) -> int:  # noqa: ANN001
    """Print the measured ratio and the explaining loop's; return 0 if the deviation is
    reproduced as explained, 1 if it is gone or has changed."""
    print(f"{cell}: update norm / large batch's = {measured.norm_ratio:.4f} (relative error "
          f"{measured.relative_difference:.3g}); the explaining loop: {explained.norm_ratio:.4f} "
          f"(relative error {explained.relative_difference:.3g})")
    if measured.relative_difference <= TOLERANCE:
        print(f"{cell}: the deviation is GONE (relative error <= {TOLERANCE:g}): update the table")
        return 1
    if (abs(measured.norm_ratio - explained.norm_ratio) > TOLERANCE
            or abs(measured.relative_difference - explained.relative_difference) > TOLERANCE):
        print(f"{cell}: the deviation has CHANGED: it is no longer the explaining loop's")
        return 1
    print(f"{cell}: reproduced")
    return 0


def model_losses(key: str, **forward_kwargs) -> list[float]:  # noqa: ANN003
    """Each micro-batch's own model loss at the scenario's starting parameters."""
    (scenario,) = [s for s in SCENARIOS if s.key == key]
    model = scenario.model()
    with torch.no_grad():
        return [float(model(**mb, **forward_kwargs).loss) for mb in scenario.micro_batches()]


def trainer_logged_loss(key: str) -> tuple[float, float]:
    """The loss the 🤗 Trainer (k = 4, sequential order) logs for its one step on the scenario
    ``key``, and the window's true mean token loss."""
    from ..trainer import logging_step

    (scenario,) = [s for s in SCENARIOS if s.key == key]
    logged: dict[str, float] = {}
    audit(logging_step(scenario.accumulation_steps, logged), key)
    return logged["train_loss"], window_mean_loss(scenario.model(), scenario.micro_batches(),
                                                  scenario.loss_fn)


def logged_report(cell: str, logged: float, explained: float, true: float) -> int:
    """Print a logged loss next to the value that explains it and the window's true mean;
    return 0 if it deviates as explained, 1 if it is gone or has changed."""
    print(f"{cell}: logged {logged:.6f}; the explaining value {explained:.6f}; the window's "
          f"token mean {true:.6f}")
    if abs(logged - true) <= TOLERANCE * true:
        print(f"{cell}: the deviation is GONE: update the table")
        return 1
    if abs(logged - explained) > TOLERANCE * true:
        print(f"{cell}: the deviation has CHANGED: it is no longer the explaining value")
        return 1
    return 0
