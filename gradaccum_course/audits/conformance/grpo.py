"""TRL ``GRPOTrainer``'s loss types in the conformance table, run through its public entry point,
``GRPOTrainer(...).train()``: one optimizer step (SGD, lr 0.1, no clipping, beta = 0, one
iteration) of the table's tiny float64 GPT-2 on 2 prompts × 4 generations, whose completions
(at most 6 tokens, EOS ``t2``) are rewarded by their length. Run A takes the generation batch of
8 in k = 4 micro-batches of 2 (``steps_per_generation`` defaults to k); run B takes it as one
batch of 8 (k = 1). Both generate the same 8 completions (same seed, same prompts, one
generation call of 8: asserted), so B's update is the large batch's under the loss type's own
definition, and a loss type's cell is A's update's relative error against B's.

Each run keeps a copy of what ``_generate_and_score_completions`` returns and of the
completion-token count of each micro-batch ``_prepare_inputs`` hands to the loss (read, never
changed)."""

from __future__ import annotations

import tempfile
from importlib.metadata import version

import torch

from .scenarios import SCENARIOS, make_optimizer
from .verdicts import GRPO_NOTES, GRPO_PROGRAMS, GRPO_THREADS, TOLERANCE

__all__ = ["LOSS_TYPES", "PROMPTS", "grpo_run", "grpo_table", "measure",
           "token_weighted_update"]

#: the loss types of TRL 1.16.0's GRPOTrainer, all run here
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")
#: the 2 prompts (token ids of the table's vocabulary), 4 completions each
PROMPTS = ((5, 6), (9, 4))
GENERATIONS, MAX_COMPLETION, MICRO_BATCH_SIZE, ACCUMULATION_STEPS = 4, 6, 2, 4


def _reward(completion_ids, **kwargs) -> list[float]:  # noqa: ANN001, ANN003, ARG001
    """A completion's reward: its length in tokens (deterministic; lengths differ, so the
    advantages are not zero)."""
    return [float(len(ids)) for ids in completion_ids]


def grpo_run(loss_type: str, batch_size: int, accumulation_steps: int) -> dict:
    """One optimizer step of ``GRPOTrainer`` with ``loss_type``; return the parameters'
    update (flattened), the generation batch and each micro-batch's inputs (copies)."""
    from datasets import Dataset
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from .trl import make_tokenizer

    kept: dict[str, list] = {"generated": [], "micro_batches": []}

    class Recording(GRPOTrainer):  # keeps copies of what the trainer builds; changes nothing
        def _generate_and_score_completions(self, inputs):  # noqa: ANN001, ANN202
            out = super()._generate_and_score_completions(inputs)
            kept["generated"].append({key: value.detach().clone() for key, value in out.items()
                                      if torch.is_tensor(value)})
            return out

        def _prepare_inputs(self, inputs):  # noqa: ANN001, ANN202
            out = super()._prepare_inputs(inputs)
            kept["micro_batches"].append({key: value.detach().clone()
                                          for key, value in out.items()
                                          if torch.is_tensor(value)})
            return out

    model = SCENARIOS[0].model()
    before = [parameter.detach().clone() for parameter in model.parameters()]
    optimizer = make_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    prompts = [" ".join(f"t{i}" for i in prompt) for prompt in PROMPTS]
    tokenizer = make_tokenizer()  # SFTTrainer's, split on spaces: "t5 t6" is ids 5, 6
    tokenizer.backend_tokenizer.pre_tokenizer = WhitespaceSplit()
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir, loss_type=loss_type, per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation_steps, max_steps=1,
            num_generations=GENERATIONS, max_completion_length=MAX_COMPLETION, beta=0.0,
            num_iterations=1, max_grad_norm=0.0, use_cpu=True, bf16=False, report_to="none",
            save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
            shuffle_dataset=False, use_vllm=False,
            importance_sampling_level="sequence" if loss_type == "luspo" else "token")
        trainer = Recording(model=model, reward_funcs=_reward, args=config,
                            train_dataset=Dataset.from_dict({"prompt": prompts}),
                            processing_class=tokenizer, optimizers=(optimizer, scheduler))
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before,
                                                                   strict=True)])
    return {"update": update, **kept, "steps_per_generation": config.steps_per_generation}


def _same_generation(a: dict, b: dict) -> None:
    (first,), (second,) = a["generated"], b["generated"]
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(first[key], second[key]), f"runs A and B generated different {key}"


def measure(loss_type: str) -> dict:
    """Return the loss type's line of the GRPO table: run A (k = 4 micro-batches of 2) against
    run B (one batch of 8) on the same generated completions."""
    a = grpo_run(loss_type, MICRO_BATCH_SIZE, ACCUMULATION_STEPS)
    b = grpo_run(loss_type, MICRO_BATCH_SIZE * ACCUMULATION_STEPS, 1)
    assert a["steps_per_generation"] == ACCUMULATION_STEPS and b["steps_per_generation"] == 1
    assert len(a["micro_batches"]) == ACCUMULATION_STEPS and len(b["micro_batches"]) == 1
    _same_generation(a, b)
    error = float((a["update"] - b["update"]).norm() / b["update"].norm())
    (generated,) = a["generated"]
    return {"loss_type": loss_type, "relative_error": float(f"{error:.3g}"),
            "norm_ratio": float(f"{float(a['update'].norm() / b['update'].norm()):.6g}"),
            "verdict": "match" if error <= TOLERANCE else "deviate",
            "completion_lengths": [int(n) for n in generated["completion_mask"].sum(1)],
            "tokens_per_micro_batch": [int(mb["completion_mask"].sum())
                                       for mb in a["micro_batches"]],
            "version": version("trl")}


def grpo_table(loss_types: tuple[str, ...] = LOSS_TYPES, *, progress: bool = False) -> dict:
    """The GRPO table's JSON: the window (prompts, lengths, k) and one line per loss type with
    its threads, note and program."""
    from tqdm.auto import tqdm

    lines = []
    for loss_type in tqdm(loss_types, desc="GRPO loss types", disable=not progress):
        line = measure(loss_type)
        line |= {"threads": [dict(zip(("label", "url", "says"), t, strict=True))
                             for t in GRPO_THREADS.get(loss_type, ())],
                 "note": GRPO_NOTES.get(loss_type, "")}
        if loss_type in GRPO_PROGRAMS:
            line["program"] = ("gradaccum_course/audits/conformance/repro/"
                               f"{GRPO_PROGRAMS[loss_type]}.py")
        lines.append(line)
    return {"version": lines[0]["version"], "prompts": [list(p) for p in PROMPTS],
            "generations": GENERATIONS, "max_completion_length": MAX_COMPLETION,
            "micro_batch_size": MICRO_BATCH_SIZE, "accumulation_steps": ACCUMULATION_STEPS,
            "completion_lengths": lines[0]["completion_lengths"], "lines": lines}


def token_weighted_update(micro_batches: list[dict], weights: list[float]) -> torch.Tensor:
    """The explaining loop: from the table's starting model, backpropagate each micro-batch's
    summed per-token policy-gradient loss (``-advantage × log p(token)``, the clipped loss's
    gradient at ratio 1) times its weight, then one SGD step; return the update."""
    model = SCENARIOS[0].model()
    before = [parameter.detach().clone() for parameter in model.parameters()]
    optimizer = make_optimizer(model.parameters())
    for weight, mb in zip(weights, micro_batches, strict=True):
        ids = torch.cat([mb["prompt_ids"], mb["completion_ids"]], dim=1)
        mask = torch.cat([mb["prompt_mask"], mb["completion_mask"]], dim=1)
        length = mb["completion_ids"].size(1)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -length - 1:-1]
        logp = logits.log_softmax(-1).gather(-1, mb["completion_ids"][..., None])[..., 0]
        advantages = mb["advantages"].to(logp.dtype)[:, None]
        (-(advantages * logp * mb["completion_mask"]).sum() * weight).backward()
    optimizer.step()
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before,
                                                                 strict=True)])
