"""TRL's column of the conformance table: ``SFTTrainer`` with its default ``loss_type="nll"``
(the token loss: TRL's fused LM head, summed, divided by the Trainer's ``num_items_in_batch``)
as its documentation shows it: a pre-tokenised language-modelling dataset (each sequence's real
tokens, no padding), TRL's own ``DataCollatorForLanguageModeling`` (labels = input_ids, padding
-100), ``SFTConfig(gradient_accumulation_steps=k)``, the sequential sampler so that the
micro-batches are the scenario's. The tokenizer is a word-level one over the 32 token ids
(SFTTrainer requires one; it only gives the pad id 0). The logged loss is the step's ``loss``
as the Trainer hands it to its callbacks.

The GRPO-family row's cells are not run: GRPOTrainer trains on completions it generates and
rewards, not on the scenarios' token windows; its loss types are measured through
``GRPOTrainer(...).train()`` on a generated window of their own (``grpo.py``, the page's GRPO
table; see :data:`GRPO_NOT_RUN`)."""

from __future__ import annotations

import tempfile
from importlib.metadata import version
from types import SimpleNamespace

from gradaccum_lib.equivalence import audit_update

from .grpo import ACCUMULATION_STEPS, LOSS_TYPES, MICRO_BATCH_SIZE
from .scenarios import (
    SCENARIOS,
    VOCABULARY,
    Scenario,
    make_optimizer,
    window_mean_loss,
)

__all__ = ["GRPO", "GRPO_NOT_RUN", "NAME", "NOT_RUN", "PACKAGE", "make_tokenizer", "run",
           "sft_step"]

NAME, PACKAGE = "TRL SFTTrainer", "trl"
GRPO_NOT_RUN = (
    "GRPOTrainer does not train on the scenarios' token windows: it generates its own "
    f"completions and rewards them, so its loss types ({', '.join(LOSS_TYPES)}) are measured "
    "on a generated window of their own, in the GRPO table: GRPOTrainer(...).train() with "
    f"k = {ACCUMULATION_STEPS} micro-batches of {MICRO_BATCH_SIZE} against one batch of "
    f"{ACCUMULATION_STEPS * MICRO_BATCH_SIZE} on the same completions (the update only; not "
    "its logged loss, several processes, more than one iteration or a partial window)")
_OWN_LOSS = (
    "does not apply: SFTTrainer computes the token loss itself (its fused LM head, not the "
    "model's forward) and its collator always labels position 0 (labels = input_ids)")
#: the scenarios SFTTrainer is not run on, and why
NOT_RUN = {"no_kwargs": _OWN_LOSS, "drops_kwargs": _OWN_LOSS, "position_0": _OWN_LOSS}
#: the GRPO-family row of the table: every cell not run, with the reason
GRPO = SimpleNamespace(NAME="TRL GRPOTrainer", PACKAGE=PACKAGE,
                       NOT_RUN={scenario.key: GRPO_NOT_RUN for scenario in SCENARIOS})


def make_tokenizer():  # noqa: ANN201
    """The table's word-level tokenizer: token ``tI`` is id I (pad ``t0``, unknown ``t1``, EOS
    ``t2``), for TRL's trainers, which take a tokenizer."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocabulary = {f"t{i}": i for i in range(VOCABULARY)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocabulary, "t1")),
                                   pad_token="t0", eos_token="t2")


def sft_step(accumulation_steps: int, max_grad_norm: float = 0.0,
             logged: dict[str, float] | None = None):  # noqa: ANN201
    """A step function: one epoch of ``SFTTrainer`` over the window's sequences (their real
    tokens), k = ``accumulation_steps``; its logged step ``loss`` goes to ``logged``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    kept = {} if logged is None else logged

    class KeepLoss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003, ANN201, ARG002
            if logs and "loss" in logs:
                kept.setdefault("train_loss", float(logs["loss"]))

    def step(model, micro_batches: list, make_optimizer) -> None:  # noqa: ANN001
        import torch

        sequences = [ids[mask.bool()].tolist() for mb in micro_batches
                     for ids, mask in zip(mb["input_ids"], mb["attention_mask"], strict=True)]
        optimizer = make_optimizer(model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        with tempfile.TemporaryDirectory() as output_dir:
            config = SFTConfig(
                output_dir=output_dir,
                per_device_train_batch_size=len(micro_batches[0]["input_ids"]),
                gradient_accumulation_steps=accumulation_steps, num_train_epochs=1,
                max_grad_norm=max_grad_norm, use_cpu=True, report_to="none", save_strategy="no",
                logging_strategy="steps", logging_steps=1, disable_tqdm=True, seed=0,
                dataloader_num_workers=0, train_sampling_strategy="sequential",
                max_length=None, bf16=False)
            trainer = SFTTrainer(model=model, args=config, processing_class=make_tokenizer(),
                                 train_dataset=Dataset.from_dict({"input_ids": sequences}),
                                 optimizers=(optimizer, scheduler), callbacks=[KeepLoss()])
            trainer.remove_callback(PrinterCallback)
            trainer.train()

    return step


def run(scenario: Scenario) -> dict[str, float | None | str]:
    """Return SFTTrainer's cell for ``scenario``: the update's relative error against the
    large batch's, and the loss it logs next to the window's true mean."""
    model, parts = scenario.model(), scenario.micro_batches()
    logged: dict[str, float] = {}
    audit = audit_update(sft_step(scenario.accumulation_steps, scenario.max_grad_norm, logged),
                         model, scenario.loss_fn, parts, make_optimizer,
                         max_grad_norm=scenario.max_grad_norm or None)
    return {"gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "logged_loss": logged["train_loss"],
            "true_loss": window_mean_loss(scenario.model(), parts, scenario.loss_fn),
            "version": version(PACKAGE)}
