"""The 🤗 ``Trainer`` as users run it, audited step by step against the ground truth.

:func:`hf_trainer_clipped_run` trains with the ``Trainer`` over several windows, with its
default sampler (random) and gradient clipping (``max_grad_norm``, 1.0 by default as in
``TrainingArguments``), and before each optimizer step computes, on the very samples the
``Trainer`` put in that window:

- the ground truth at the ``Trainer``'s own parameters: the full-batch gradient
  (:func:`gradaccum_lib.equivalence.full_batch_gradients`), clipped with the same
  ``clip_grad_norm_``, stepped by a copy of the ``Trainer``'s optimizer (same state), so the
  two updates start from the same point;
- and a reference run of its own: the large batch of the same windows, clipped, stepped by
  its own optimizer (the training curve the ``Trainer``'s should follow).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..batches import LossFn, concatenate_micro_batches
from ..equivalence import OptimizerFactory, full_batch_gradients
from ..losses import bert_classification_loss
from ..runtime import check_number, check_positive_int
from .frameworks import hf_trainer

__all__ = ["ClippedTrainerStep", "hf_trainer_clipped_run"]


@dataclass(frozen=True)
class ClippedTrainerStep:
    """One optimizer step of the ``Trainer`` next to the ground truth's step."""

    logged_loss: float  # the "loss" the Trainer logs for the step
    true_loss: float  # the window's mean loss at the Trainer's parameters
    logged_grad_norm: float  # the "grad_norm" it logs: its gradient's norm before clipping
    true_grad_norm: float  # the full-batch gradient's norm at the same parameters
    stepped_grad_norm: float  # the norm of the gradient its optimizer stepped on
    norm_ratio: float  # |Trainer update| / |true update|, from the same parameters and state
    cosine: float  # cosine similarity of the two updates
    reference_loss: float  # the window's mean loss along the reference (large-batch) run

    @property
    def clipped(self) -> bool:
        """True when the Trainer's step was clipped (its stepped norm is below its raw one)."""
        return self.stepped_grad_norm < self.logged_grad_norm * (1 - 1e-9)


def _vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().to("cpu", torch.float64).reshape(-1)
                      for p in model.parameters() if p.requires_grad])


def _window_loss(model: nn.Module, loss_fn: LossFn, window: Mapping[str, Tensor]) -> float:
    with torch.no_grad():
        summed, items = loss_fn(model, window)
    return float(summed) / float(items)


def _clipped_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                  window: Mapping[str, Tensor], max_grad_norm: float) -> float:
    """One large-batch step: the full-batch gradient, clipped as the Trainer clips, stepped.
    Returns the gradient's norm before clipping."""
    gradients = full_batch_gradients(model, loss_fn, window)
    for name, parameter in model.named_parameters():
        if name in gradients:
            parameter.grad = gradients[name].clone()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def _true_update(model: nn.Module, optimizer: torch.optim.Optimizer,
                 make_optimizer: OptimizerFactory, loss_fn: LossFn,
                 window: Mapping[str, Tensor], max_grad_norm: float) -> tuple[Tensor, float]:
    """The ground truth's update from the model's parameters and the optimizer's state, and
    its gradient's norm before clipping."""
    trial = copy.deepcopy(model)
    trial_optimizer = make_optimizer(trial.parameters())
    trial_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    before = _vector(trial)
    norm = _clipped_step(trial, trial_optimizer, loss_fn, window, max_grad_norm)
    return _vector(trial) - before, norm


def hf_trainer_clipped_run(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]],
                           make_optimizer: OptimizerFactory, accumulation_steps: int, *,
                           max_grad_norm: float = 1.0, workaround: str | None = None,
                           loss_fn: LossFn = bert_classification_loss) -> list[ClippedTrainerStep]:
    """Train a copy of ``model`` with the 🤗 ``Trainer`` (:func:`~.frameworks.hf_trainer`: its
    default sampler, ``gradient_accumulation_steps=k``, ``max_grad_norm``) for one epoch over
    the micro-batches' samples, and return one :class:`ClippedTrainerStep` per optimizer step.
    ``model`` is not touched; ``max_grad_norm=0`` turns clipping off (for both sides);
    ``workaround`` as in :func:`~.frameworks.hf_trainer_step`. The truth is computed in eval
    mode: audit a model without dropout.
    """
    from transformers import TrainerCallback

    check_positive_int("accumulation_steps", accumulation_steps)
    check_number("max_grad_norm", max_grad_norm, low=0)
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    trained = copy.deepcopy(model)
    reference = copy.deepcopy(model)
    reference_optimizer = make_optimizer(reference.parameters())
    optimizer = make_optimizer(trained.parameters())
    # the batches as collated (the loader may run one ahead) and the forward passes of the
    # current window: its micro-batches are the first `forwards` collated ones
    collated: list[dict[str, Tensor]] = []
    forwards = [0]
    steps: list[dict[str, float]] = []
    pending: dict[str, object] = {}

    def count_forward(module: nn.Module, _inputs: tuple) -> None:
        if module.training:
            forwards[0] += 1

    class Audit(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            trained.eval()  # the audit's own forward passes are not the Trainer's
            window = concatenate_micro_batches(collated[:forwards[0]])
            del collated[:forwards[0]]
            stepped = [p.grad for p in trained.parameters() if p.grad is not None]
            true_update, true_norm = _true_update(trained, optimizer, make_optimizer, loss_fn,
                                                  window, max_grad_norm)
            pending.update(
                before=_vector(trained), true_update=true_update,
                row={"true_loss": _window_loss(trained, loss_fn, window),
                     "true_grad_norm": true_norm,
                     "stepped_grad_norm": float(torch.nn.utils.get_total_norm(stepped)),
                     "reference_loss": _window_loss(reference, loss_fn, window)})
            _clipped_step(reference, reference_optimizer, loss_fn, window, max_grad_norm)
            forwards[0] = 0
            trained.train()

        def on_optimizer_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            update, truth = _vector(trained) - pending["before"], pending["true_update"]
            steps.append({**pending["row"],
                          "norm_ratio": (update.norm() / truth.norm()).item(),
                          "cosine": torch.nn.functional.cosine_similarity(update, truth,
                                                                          dim=0).item()})

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
            if logs and "loss" in logs:
                steps[-1].update(logged_loss=float(logs["loss"]),
                                 logged_grad_norm=float(logs.get("grad_norm", float("nan"))))

    handle = trained.register_forward_pre_hook(count_forward)
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            trainer = hf_trainer(trained, micro_batches, optimizer, accumulation_steps,
                                 output_dir, max_grad_norm=max_grad_norm, workaround=workaround,
                                 callbacks=[Audit()], log_every_step=True)
            collate = trainer.data_collator

            def collate_and_keep(features: list) -> dict[str, Tensor]:
                batch = collate(features)
                collated.append({key: batch[key] for key in ("input_ids", "attention_mask",
                                                              "labels") if key in batch})
                return batch

            trainer.data_collator = collate_and_keep
            trainer.train()
    finally:
        handle.remove()
    return [ClippedTrainerStep(**step) for step in steps]
