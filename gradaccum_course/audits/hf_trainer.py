"""The 🤗 ``Trainer`` as users run it, audited against the ground truth.

- :func:`hf_trainer_step` is a step function for :func:`gradaccum_lib.equivalence.audit_update`:
  a ``Trainer`` with ``gradient_accumulation_steps=k`` for one epoch over the window's samples,
  optionally with one of the workarounds users apply (:data:`_WORKAROUNDS`);
  :func:`hf_trainer_train_sampler` is the sampler it builds when the user sets none.
- :func:`hf_model_loss_gradients` is the window gradient the ``Trainer`` accumulates from the
  model's own loss, with or without the window's item count.
- :func:`hf_trainer_clipped_run` trains with the ``Trainer`` over several windows, with its
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gradaccum_lib.batches import LossFn, concatenate_micro_batches
from gradaccum_lib.equivalence import OptimizerFactory, full_batch_gradients
from gradaccum_lib.gradients import collected_gradients, model_restored
from gradaccum_lib.losses import bert_classification_loss
from gradaccum_lib.runtime import check_number, check_positive_int

from .frameworks import WindowDataset

__all__ = ["build_trainer", "hf_model_loss_gradients", "hf_trainer_clipped_run", "hf_trainer_step",
           "hf_trainer_train_sampler"]

_WORKAROUNDS = (None, "accepts_loss_kwargs=False", "loss_is_scaled_for_ga=False",
                "compute_loss_func")


def hf_trainer_step(accumulation_steps: int, *, workaround: str | None = None,  # noqa: ANN201
                    max_grad_norm: float = 0.0, shuffle: bool = True):
    """Return a step function for the HF ``Trainer`` with ``gradient_accumulation_steps=k``
    (:func:`build_trainer`): one epoch over the window's samples in its default (shuffled)
    order unless ``shuffle=False``, clipping off unless ``max_grad_norm`` is given, a
    constant learning rate, the optimizer passed in.

    ``workaround``: ``"accepts_loss_kwargs=False"`` tells the Trainer the model ignores
    ``num_items_in_batch`` (so it divides each micro-batch loss by k again);
    ``"loss_is_scaled_for_ga=False"`` sets that ``Trainer`` attribute (transformers 5.x), which
    makes ``training_step`` divide each micro-batch loss by k whatever the model accepts;
    ``"compute_loss_func"`` computes the loss outside the model as a sum divided by the
    Trainer's window item count.
    """
    _check_workaround(workaround)

    def step(model: nn.Module, micro_batches: list, make_optimizer: OptimizerFactory) -> None:
        with tempfile.TemporaryDirectory() as output_dir:
            build_trainer(model, micro_batches, make_optimizer(model.parameters()),
                           accumulation_steps, output_dir, max_grad_norm=max_grad_norm,
                           workaround=workaround, shuffle=shuffle).train()

    return step


def _check_workaround(workaround: object) -> None:
    if workaround not in _WORKAROUNDS:
        raise ValueError(f"workaround must be one of {_WORKAROUNDS}; got {workaround!r}")


def build_trainer(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]],
                   optimizer: torch.optim.Optimizer, accumulation_steps: int, output_dir: str, *,
                   max_grad_norm: float = 0.0, workaround: str | None = None,
                   callbacks: Sequence[Any] = (), log_every_step: bool = False,
                   shuffle: bool = True) -> Any:
    """Return a 🤗 ``Trainer`` over the window's samples as users build one: its default
    sampler (random, seeded; ``shuffle=False`` asks for its sequential one),
    ``gradient_accumulation_steps=k``, ``max_grad_norm`` (the
    ``TrainingArguments`` default is 1.0; 0 turns clipping off), a constant learning rate, the
    optimizer passed in, CPU, one epoch, nothing written but to ``output_dir``. The console
    printer is removed (``log_every_step`` still sends each step's logs to the callbacks).
    ``workaround`` as in :func:`hf_trainer_step`.
    """
    _check_workaround(workaround)
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    dataset = WindowDataset(micro_batches)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    arguments = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=dataset.micro_batch_size,
        gradient_accumulation_steps=accumulation_steps, num_train_epochs=1,
        max_grad_norm=max_grad_norm, use_cpu=True, report_to="none", save_strategy="no",
        logging_strategy="steps" if log_every_step else "no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, seed=0,
        train_sampling_strategy="random" if shuffle else "sequential",
    )
    if workaround == "accepts_loss_kwargs=False":
        model.accepts_loss_kwargs = False  # read by Trainer.__init__
    loss_func = _summed_cross_entropy_over_window if workaround == "compute_loss_func" else None
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset,
                      optimizers=(optimizer, scheduler), compute_loss_func=loss_func,
                      callbacks=list(callbacks))
    if workaround == "loss_is_scaled_for_ga=False":
        trainer.loss_is_scaled_for_ga = False  # read by Trainer.training_step
    trainer.remove_callback(PrinterCallback)  # its run summary goes to stdout otherwise
    return trainer


def _summed_cross_entropy_over_window(outputs, labels, num_items_in_batch=None):  # noqa: ANN001, ANN201
    """A ``compute_loss_func`` for the HF Trainer: summed cross-entropy divided by the
    window's item count that the Trainer counted (``num_items_in_batch``).
    """
    logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
    summed = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                         labels.reshape(-1), reduction="sum")
    if num_items_in_batch is None:
        return summed / labels.numel()
    return summed / num_items_in_batch


def hf_trainer_train_sampler(model: nn.Module,
                             micro_batches: Sequence[Mapping[str, Tensor]]) -> Any:
    """Return the sampler the installed 🤗 ``Trainer`` builds for its training data when the
    user sets nothing about sampling (``Trainer._get_train_sampler``); ``model`` is not
    touched (the Trainer gets a copy)."""
    model = copy.deepcopy(model)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build_trainer(model, micro_batches,
                                 torch.optim.SGD(model.parameters(), lr=0.1), 1, output_dir)
        return trainer._get_train_sampler()


def hf_model_loss_gradients(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]], *,
                            num_items_in_batch: Tensor | None = None) -> dict[str, Tensor]:
    """Return the window gradient the 🤗 ``Trainer`` accumulates from the model's own loss:
    ``model(**micro_batch).loss`` per micro-batch, divided by k when no window count is given
    (the pre-2024 behaviour, and what heads that drop the count still get), or with
    ``num_items_in_batch`` passed to the model. The model is left as found.
    """
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    with model_restored(model):
        for micro_batch in micro_batches:
            if num_items_in_batch is None:
                (model(**micro_batch).loss / len(micro_batches)).backward()
            else:
                model(**micro_batch, num_items_in_batch=num_items_in_batch).loss.backward()
        return collected_gradients(model, 1.0)


# ---- the clipped run: the Trainer's steps next to the ground truth's ----------------------

@dataclass(frozen=True)
class _ClippedTrainerStep:
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


def hf_trainer_clipped_run(model: nn.Module, micro_batches: Sequence[Mapping[str, Tensor]],
                           make_optimizer: OptimizerFactory, accumulation_steps: int, *,
                           max_grad_norm: float = 1.0, workaround: str | None = None,
                           loss_fn: LossFn = bert_classification_loss,
                           ) -> list[_ClippedTrainerStep]:
    """Train a copy of ``model`` with the 🤗 ``Trainer`` (:func:`build_trainer`: its default
    sampler, ``gradient_accumulation_steps=k``, ``max_grad_norm``) for one epoch over the
    micro-batches' samples, and return one step record per optimizer step (its logged and
    true loss and norm, the update's norm ratio and cosine to the truth, the reference run's
    loss, and whether it was ``clipped``). ``model`` is not touched; ``max_grad_norm=0``
    turns clipping off (for both sides); ``workaround`` as in :func:`hf_trainer_step`. The
    truth is computed in eval mode: audit a model without dropout.
    """
    check_positive_int("accumulation_steps", accumulation_steps)
    check_number("max_grad_norm", max_grad_norm, low=0)
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty; it needs at least one micro-batch")
    audit = _ClippedAudit(model, make_optimizer, loss_fn, max_grad_norm)
    handle = audit.trained.register_forward_pre_hook(audit.count_forward)
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            trainer = build_trainer(audit.trained, micro_batches, audit.optimizer,
                                     accumulation_steps, output_dir, max_grad_norm=max_grad_norm,
                                     workaround=workaround, callbacks=[_callback(audit)],
                                     log_every_step=True)
            trainer.data_collator = audit.keeping(trainer.data_collator)
            trainer.train()
    finally:
        handle.remove()
    return [_ClippedTrainerStep(**step) for step in audit.steps]


class _ClippedAudit:
    """What :func:`hf_trainer_clipped_run` keeps across the ``Trainer``'s callbacks: the
    trained copy and its optimizer, the reference copy and its own, the batches as collated
    (the loader may run one ahead), the forward passes of the current window (its
    micro-batches are the first ``forwards`` collated ones), and one row per step."""

    def __init__(self, model: nn.Module, make_optimizer: OptimizerFactory, loss_fn: LossFn,
                 max_grad_norm: float) -> None:
        self.trained, self.reference = copy.deepcopy(model), copy.deepcopy(model)
        self.reference_optimizer = make_optimizer(self.reference.parameters())
        self.optimizer = make_optimizer(self.trained.parameters())
        self.make_optimizer, self.loss_fn, self.max_grad_norm = (make_optimizer, loss_fn,
                                                                 max_grad_norm)
        self.collated: list[dict[str, Tensor]] = []
        self.forwards = 0
        self.steps: list[dict[str, float]] = []
        self.pending: dict[str, Any] = {}

    def count_forward(self, module: nn.Module, _inputs: tuple) -> None:
        if module.training:
            self.forwards += 1

    def keeping(self, collate: Callable[[list], Any]) -> Callable[[list], Any]:
        """Return ``collate`` that also keeps each batch's model inputs."""

        def collate_and_keep(features: list) -> Any:
            batch = collate(features)
            self.collated.append({key: batch[key] for key in ("input_ids", "attention_mask",
                                                               "labels") if key in batch})
            return batch

        return collate_and_keep

    def before_step(self) -> None:
        """The truth and the reference step for the window the ``Trainer`` is about to step."""
        self.trained.eval()  # the audit's own forward passes are not the Trainer's
        window = concatenate_micro_batches(self.collated[:self.forwards])
        del self.collated[:self.forwards]
        stepped = [p.grad for p in self.trained.parameters() if p.grad is not None]
        true_update, true_norm = _true_update(self.trained, self.optimizer, self.make_optimizer,
                                              self.loss_fn, window, self.max_grad_norm)
        self.pending.update(
            before=_vector(self.trained), true_update=true_update,
            row={"true_loss": _window_loss(self.trained, self.loss_fn, window),
                 "true_grad_norm": true_norm,
                 "stepped_grad_norm": float(torch.nn.utils.get_total_norm(stepped)),
                 "reference_loss": _window_loss(self.reference, self.loss_fn, window)})
        _clipped_step(self.reference, self.reference_optimizer, self.loss_fn, window,
                      self.max_grad_norm)
        self.forwards = 0
        self.trained.train()

    def after_step(self) -> None:
        """The ``Trainer``'s update against the truth's, from the same point."""
        update = _vector(self.trained) - self.pending["before"]
        truth = self.pending["true_update"]
        self.steps.append({**self.pending["row"],
                           "norm_ratio": (update.norm() / truth.norm()).item(),
                           "cosine": torch.nn.functional.cosine_similarity(update, truth,
                                                                           dim=0).item()})

    def logged(self, logs: Mapping[str, float] | None) -> None:
        if logs and "loss" in logs:
            self.steps[-1].update(logged_loss=float(logs["loss"]),
                                  logged_grad_norm=float(logs.get("grad_norm", float("nan"))))


def _callback(audit: _ClippedAudit) -> Any:
    """A ``TrainerCallback`` that hands the ``Trainer``'s step events to ``audit``
    (transformers is imported here, not with the module)."""
    from transformers import TrainerCallback

    class Audit(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            audit.before_step()

        def on_optimizer_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            audit.after_step()

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
            audit.logged(logs)

    return Audit()


def _vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().to("cpu", torch.float64).reshape(-1)
                      for p in model.parameters() if p.requires_grad])


def _window_loss(model: nn.Module, loss_fn: LossFn, window: Mapping[str, Tensor]) -> float:
    with torch.no_grad():
        summed, items = loss_fn(model, window)
    return float(summed) / float(items)


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
