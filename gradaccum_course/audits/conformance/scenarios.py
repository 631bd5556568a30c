"""The scenarios of the conformance table: one window of a tiny causal LM's token data, laid
out so that a single accumulation choice decides whether a framework gets the large batch's
gradient.

Every scenario is one optimizer step (SGD, so the update's relative error is the gradient's)
over 8 sequences of 8 token ids in micro-batches of 2. The ground truth is the library's:
:func:`gradaccum_lib.equivalence.full_batch_gradients` of :func:`token_loss` (the series'
contract: summed token cross-entropy and the token count) over the concatenated window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gradaccum_lib.batches import concatenate_micro_batches
from gradaccum_lib.losses import cross_entropy_sum
from gradaccum_lib.workloads.models import make_tiny_causal_lm

__all__ = ["LEARNING_RATE", "SCENARIOS", "Scenario", "make_optimizer", "token_loss",
           "window_mean_loss"]

VOCABULARY, SEQUENCE_LENGTH, MICRO_BATCH_SIZE = 32, 8, 2
LEARNING_RATE = 0.1  # make_optimizer's SGD
#: the GPT-2 model's parameters are multiplied by this after initialisation, so that the
#: window gradient's norm (about 4) is above the clipping threshold of 1.0
PARAMETER_SCALE = 4.0
#: real tokens of each of the 8 sequences (the rest is padding, label -100)
EQUAL_LENGTHS = (8,) * 8
UNEVEN_LENGTHS = (8, 8, 2, 2, 8, 3, 5, 2)  # 14, 2, 9 and 5 predicted tokens per micro-batch


class _ForwardWithoutLossKwargs(nn.Module):
    """A causal LM whose ``forward`` names its arguments and takes no ``**kwargs``: the 🤗
    Trainer's signature check then says it does not accept ``num_items_in_batch``."""

    def __init__(self, language_model: nn.Module) -> None:
        super().__init__()
        self.language_model = language_model

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                labels: Tensor | None = None):  # noqa: ANN201
        return self.language_model(input_ids=input_ids, attention_mask=attention_mask,
                                   labels=labels)


class _ForwardDroppingLossKwargs(_ForwardWithoutLossKwargs):
    """A causal LM whose ``forward`` declares ``**kwargs`` but drops them, as a head that
    ignores ``num_items_in_batch`` does: it returns its micro-batch's mean loss."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, **kwargs):  # noqa: ANN003, ANN201, ARG002
        return super().forward(input_ids, attention_mask, labels)


_MODELS = {"takes num_items_in_batch": None, "no **kwargs": _ForwardWithoutLossKwargs,
           "drops num_items_in_batch": _ForwardDroppingLossKwargs}


@dataclass(frozen=True)
class Scenario:
    """One column of the table: a window's layout and the options the frameworks get."""

    key: str  # the column's short name (JSON key, test ids)
    title: str  # what the column shows, in words
    lengths: tuple[int, ...] = EQUAL_LENGTHS  # real tokens per sequence
    accumulation_steps: int = 4  # the k each framework is configured with
    max_grad_norm: float = 0.0  # 0: no clipping
    model_forward: str = "takes num_items_in_batch"  # a key of _MODELS
    label_first_token: bool = False  # labels = input_ids (else position 0 is labelled -100)
    ranks: int = 1  # 2: the window is spread over 2 gloo ranks (torchrun)
    #: > 0: the model is a tiny Qwen3-MoE whose loss adds this times its router's
    #: load-balancing loss (:mod:`.moe`), and the truth's loss does too
    router_aux_coefficient: float = 0.0
    not_run: str = ""  # why the scenario is not run yet (empty: it runs)

    def model(self) -> nn.Module:
        """Return the scenario's model (float64, no dropout), the same weights every call."""
        if self.router_aux_coefficient:
            from .moe import make_tiny_moe

            return make_tiny_moe(VOCABULARY, SEQUENCE_LENGTH, self.router_aux_coefficient)
        language_model = make_tiny_causal_lm(VOCABULARY, hidden_size=8, max_length=SEQUENCE_LENGTH,
                                             dtype=torch.float64, seed=0)
        with torch.no_grad():
            for parameter in language_model.parameters():
                parameter.mul_(PARAMETER_SCALE)
        wrapper = _MODELS[self.model_forward]
        return language_model if wrapper is None else wrapper(language_model)

    def micro_batches(self) -> list[dict[str, Tensor]]:
        """Return the window's micro-batches: ``input_ids``, ``attention_mask``, ``labels``
        (padding after each sequence's real tokens: id 0, mask 0, label -100). Position 0,
        which no causal-LM loss predicts, is labelled -100 too unless ``label_first_token``."""
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(4, VOCABULARY, (len(self.lengths), SEQUENCE_LENGTH),
                                  generator=generator)
        real = torch.arange(SEQUENCE_LENGTH) < torch.tensor(self.lengths)[:, None]
        batch = {"input_ids": torch.where(real, input_ids, 0), "attention_mask": real.long(),
                 "labels": torch.where(real, input_ids, -100)}
        if not self.label_first_token:
            batch["labels"][:, 0] = -100
        return [{key: value[start:start + MICRO_BATCH_SIZE] for key, value in batch.items()}
                for start in range(0, len(self.lengths), MICRO_BATCH_SIZE)]

    @property
    def loss_fn(self):  # noqa: ANN201
        """The ground truth's loss: :func:`token_loss`, or for the MoE scenario
        :func:`.moe.moe_loss` (the window's load-balancing loss added)."""
        if self.router_aux_coefficient:
            from .moe import moe_loss

            return moe_loss
        return token_loss

    def predicted_tokens(self) -> list[int]:
        """Return the tokens each micro-batch's loss covers (labels shifted by one)."""
        return [int((mb["labels"][:, 1:] != -100).sum()) for mb in self.micro_batches()]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("equal", "equal micro-batches"),
    Scenario("uneven", "uneven tokens across micro-batches", lengths=UNEVEN_LENGTHS),
    Scenario("partial", "a partial last window (2 of k = 4 micro-batches)",
             lengths=EQUAL_LENGTHS[:4]),
    Scenario("clip", "clipping at 1.0 (equal micro-batches)", max_grad_norm=1.0),
    Scenario("no_kwargs", "uneven tokens, forward without num_items_in_batch",
             lengths=UNEVEN_LENGTHS, model_forward="no **kwargs"),
    Scenario("drops_kwargs", "uneven tokens, forward takes **kwargs but drops "
             "num_items_in_batch", lengths=UNEVEN_LENGTHS,
             model_forward="drops num_items_in_batch"),
    Scenario("position_0", "equal micro-batches, labels = input_ids (position 0 labelled)",
             label_first_token=True),
    Scenario("two_ranks", "uneven tokens across 2 gloo ranks (k = 2 micro-batches per rank)",
             lengths=UNEVEN_LENGTHS, accumulation_steps=2, ranks=2),
    Scenario("moe_aux", "equal micro-batches, a Qwen3-MoE whose loss adds its router's "
             "load-balancing loss (coefficient 0.001)", router_aux_coefficient=0.001),
)


def token_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The ground truth's loss (the series' contract): the summed next-token cross-entropy
    over the real tokens and their count."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return cross_entropy_sum(logits[:, :-1], batch["labels"][:, 1:])


def window_mean_loss(model: nn.Module, micro_batches: list[Mapping[str, Tensor]],
                     loss_fn=token_loss) -> float:  # noqa: ANN001
    """Return the window's true mean token loss at the model's parameters (with ``loss_fn``
    :func:`.moe.moe_loss`, plus the coefficient times the window's load-balancing loss)."""
    with torch.no_grad():
        summed, count = loss_fn(model, concatenate_micro_batches(micro_batches))
    return float(summed) / float(count)


def make_optimizer(parameters) -> torch.optim.Optimizer:  # noqa: ANN001
    """SGD at :data:`LEARNING_RATE`: an update is the gradient times -0.1."""
    return torch.optim.SGD(parameters, lr=LEARNING_RATE)
