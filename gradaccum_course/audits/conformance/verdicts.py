"""What the conformance table is expected to show at the pinned versions, and the upstream
thread each deviating cell corresponds to (each thread read before it was cited; a deviation
no thread was found for says "unexplained"). A version bump that changes a verdict fails
``make conformance`` and the tests with the cell's name and its thread."""

from __future__ import annotations

__all__ = ["CHECKED", "EXPECTED", "GRADIENT_ONLY", "GRPO_EXPECTED", "GRPO_NOTES",
           "GRPO_PROGRAMS", "GRPO_THREADS", "LOGGED_PROGRAMS", "NOTES", "PROGRAMS", "THREADS",
           "TOLERANCE", "Thread"]

#: a relative error at or below this is a match (the transformers causal-LM loss computes in
#: float32 even for a float64 model: its exact cells sit near 1e-7)
TOLERANCE = 1e-6

_TRANSFORMERS = "https://github.com/huggingface/transformers"
_LIGHTNING = "https://github.com/Lightning-AI/pytorch-lightning"

Thread = tuple[str, str, str]  # (label, address, what it says that the cell shows)

#: (framework, scenario) -> (gradient verdict, logged-loss verdict); "match", "deviate" or
#: "not run"
EXPECTED: dict[tuple[str, str], tuple[str, str]] = {
    ("trainer", "equal"): ("match", "match"),
    ("trainer", "uneven"): ("match", "match"),
    ("trainer", "partial"): ("match", "match"),
    ("trainer", "clip"): ("match", "match"),
    ("trainer", "no_kwargs"): ("deviate", "deviate"),
    ("trainer", "drops_kwargs"): ("deviate", "deviate"),
    ("trainer", "position_0"): ("deviate", "deviate"),
    ("accelerate", "equal"): ("match", "not run"),
    ("accelerate", "uneven"): ("deviate", "not run"),
    ("accelerate", "partial"): ("deviate", "not run"),
    ("accelerate", "clip"): ("match", "not run"),
    ("accelerate", "no_kwargs"): ("deviate", "not run"),
    ("accelerate", "drops_kwargs"): ("deviate", "not run"),
    ("accelerate", "position_0"): ("match", "not run"),
    ("lightning", "equal"): ("match", "match"),
    ("lightning", "uneven"): ("deviate", "deviate"),
    ("lightning", "partial"): ("deviate", "match"),
    ("lightning", "clip"): ("match", "match"),
    ("lightning", "no_kwargs"): ("deviate", "deviate"),
    ("lightning", "drops_kwargs"): ("deviate", "deviate"),
    ("lightning", "position_0"): ("match", "match"),
    ("trainer", "two_ranks"): ("match", "match"),
    ("accelerate", "two_ranks"): ("deviate", "not run"),
    ("lightning", "two_ranks"): ("deviate", "deviate"),
    ("trl", "equal"): ("deviate", "deviate"),
    ("trl", "uneven"): ("deviate", "deviate"),
    ("trl", "partial"): ("deviate", "deviate"),
    ("trl", "clip"): ("match", "deviate"),
    ("trl", "two_ranks"): ("deviate", "deviate"),
    ("trainer", "moe_aux"): ("deviate", "deviate"),
    ("accelerate", "moe_aux"): ("deviate", "not run"),
    ("lightning", "moe_aux"): ("deviate", "match"),
    ("trl", "moe_aux"): ("deviate", "match"),
}

_LIGHTNING_UNEVEN: Thread = (
    "Lightning #20350", f"{_LIGHTNING}/issues/20350",
    "open: accumulate_grad_batches is not normalised as the large batch is (the token-count "
    "issue transformers fixed in 2024); padded uneven-length samples train worse than with "
    "the larger batch")

#: (framework, scenario) -> the threads of that cell (its gradient and logged loss alike)
THREADS: dict[tuple[str, str], tuple[Thread, ...]] = {
    ("trainer", "partial"): (
        ("transformers #38837", f"{_TRANSFORMERS}/issues/38837",
         "the last, incomplete window was divided by the configured k"),
        ("transformers PR #39659", f"{_TRANSFORMERS}/pull/39659",
         "merged: divide by the micro-batches the window really holds; the pinned version "
         "has it (this cell matches)")),
    ("trainer", "no_kwargs"): (
        ("transformers #37766", f"{_TRANSFORMERS}/issues/37766",
         "a model whose forward does not accept loss kwargs gets no window count: each "
         "micro-batch's mean loss divided by k"),),
    ("trainer", "drops_kwargs"): (
        ("transformers #47688", f"{_TRANSFORMERS}/issues/47688",
         "open: heads that declare **kwargs but drop num_items_in_batch train with a loss "
         "inflated by about k"),),
    ("lightning", "uneven"): (_LIGHTNING_UNEVEN,),
    ("lightning", "no_kwargs"): (_LIGHTNING_UNEVEN,),
    ("lightning", "drops_kwargs"): (_LIGHTNING_UNEVEN,),
    ("lightning", "partial"): (
        ("Lightning #19987", f"{_LIGHTNING}/issues/19987",
         "open: the reporter finds the last, incomplete window of an epoch scaled by "
         "accumulate_grad_batches instead of by the batches it holds"),),
}

_TRL_COUNT: Thread = (
    "transformers PR #46204", f"{_TRANSFORMERS}/pull/46204",
    "merged: causal-LM losses never predict position 0, so the Trainer counts labels[..., 1:] "
    "for num_items_in_batch, but only for models whose loss_type maps to ForCausalLMLoss")
THREADS |= {("trl", key): (_TRL_COUNT,)
            for key in ("equal", "uneven", "partial", "clip", "two_ranks")}

_TRL = "https://github.com/huggingface/trl"
_TRL_5619: Thread = (
    "TRL #5619", f"{_TRL}/issues/5619",
    "asks why the dapo loss is not divided by the accumulation steps; the maintainer: "
    "num_items_in_batch counts the whole accumulated batch")
_TRL_6024: Thread = (
    "TRL PR #6024", f"{_TRL}/pull/6024",
    "merged: dapo, cispo and vespo were scaled by gradient_accumulation_steps / "
    "steps_per_generation; the pinned source has the rescaling, and the GRPO table measures "
    "these three loss types matching")

_ACCELERATE = "https://github.com/huggingface/accelerate"
_ACCELERATE_GUIDE: Thread = (
    "accelerate PR #3193", f"{_ACCELERATE}/pull/3193",
    "merged (documentation): the gradient-accumulation guide shows the loop summing the token "
    "loss and dividing by the window's token count, gathered over the processes, because "
    "accumulate() divides each micro-batch's loss by k")
THREADS |= {("accelerate", key): (_ACCELERATE_GUIDE,)
            for key in ("uneven", "no_kwargs", "drops_kwargs", "two_ranks")}
THREADS[("lightning", "two_ranks")] = (_LIGHTNING_UNEVEN,)
THREADS[("trainer", "position_0")] = (_TRL_COUNT,)

#: the paper behind the MoE cells that take each micro-batch's load-balancing loss
_GLOBAL_BATCH_BALANCING: Thread = (
    "Qiu et al. 2025, arXiv 2501.11873", "https://arxiv.org/abs/2501.11873",
    "paper (ACL 2025): MoE training frameworks compute the load-balancing loss within each "
    "micro-batch; the authors sync the experts' selection frequencies across micro-batches to "
    "compute it over the global batch, and report lower perplexity and more specialised experts")
THREADS |= {(framework, "moe_aux"): (_GLOBAL_BATCH_BALANCING,)
            for framework in ("accelerate", "lightning", "trl")}

#: cells whose threads explain the update only: their logged loss is "unexplained"
GRADIENT_ONLY = {("lightning", "uneven"), ("lightning", "no_kwargs"),
                 ("lightning", "drops_kwargs"), ("lightning", "two_ranks")}

#: what the measurement itself shows for cells no thread explains (the tests assert the numbers)
NOTES: dict[tuple[str, str], str] = {
    ("trainer", "position_0"): (
        "Measured: the update is 56/64 of the truth's, the 56 predicted tokens over the 64 "
        "labelled positions: GPT2LMHeadModel's loss_type is None, so PR #46204's shifted count "
        "does not apply and the Trainer counts position 0, which the shifted loss never "
        "predicts"),
    ("accelerate", "uneven"): (
        "Measured: the update is the mean of the micro-batch means' (accelerator.backward "
        "divides each mean loss by k); Accelerate's basic documented loop (accelerator.backward(l"
        "oss) per micro-batch) passes no token count"),
    ("accelerate", "partial"): (
        "no thread found for the scale (unexplained). Measured: the update is 2/4 of the "
        "truth's: the 2 micro-batches of the last window are each divided by the configured "
        "k = 4. accelerate #1847 (closed, documentation) says only that the last batch of the "
        "DataLoader makes the optimizer step however few micro-batches the window holds"),
    ("lightning", "uneven"): (
        "the logged train_loss (on_epoch) is the micro-batch means averaged by the batch size "
        "Lightning infers (sequences), not by tokens: no thread found for the logged value"),
}
NOTES[("accelerate", "two_ranks")] = (
    "Measured: on 2 gloo ranks, k = 2 each, the update is the mean of the 4 micro-batch "
    "means', as in one process")
NOTES[("lightning", "two_ranks")] = (
    "Measured: on 2 gloo ranks, k = 2 each, the update is the "
    "mean of the 4 micro-batch means' (the cause of Lightning #20350, over ranks), of other "
    "micro-batches than one process's: under DDP Lightning shuffles the training samples "
    "(DistributedSampler, seed 0) though the loader given does not; the train_loss logged on "
    "rank 0 is that rank's own mean of its 2 micro-batch means (self.log's sync_dist is off "
    "by default)")
NOTES |= {("trl", key): (
    "Measured: GPT2LMHeadModel's loss_type is None and SFTTrainer's collator labels position 0 "
    "(labels = input_ids), so num_items_in_batch counts the labelled positions: the update and "
    "the logged loss are the predicted tokens over them (56/64 equal, 30/38 uneven, 28/32 "
    "partial, 30/38 on 2 ranks); with model.loss_type = \"ForCausalLM\" the update matches")
    for key in ("equal", "uneven", "partial", "two_ranks")}
NOTES[("trl", "clip")] = (
    "Measured: clipping at 1.0 rescales the 56/64 update to the large batch's (same direction, "
    "norm above 1), so the update matches; the logged loss is still 56/64 of the true mean")
NOTES[("trainer", "moe_aux")] = (
    "no thread found in transformers (unexplained upstream). Measured: the cross-entropy part "
    "of the update matches (num_items_in_batch), but each micro-batch's load-balancing term is "
    "added unscaled, so the auxiliary part weighs about 4 times the large batch's (k = 4) and the "
    "logged loss carries it 4 times; NeMo AutoModel fixed the same mechanism in its own loop "
    "(NVIDIA-NeMo/Automodel PR #3359); transformers #48690 (open) is its 2-rank relative, the "
    "term multiplied by the world size")
_MOE_MEAN = (
    "a design choice, not a bug: the framework takes each micro-batch's load-balancing loss, "
    "as MoE training frameworks usually do (Qiu et al. 2025, who sync the routed counts over "
    "the global batch instead). Measured: the cross-entropy part matches and the auxiliary "
    "part has the large batch's weight (1.00), but it is the mean of the 4 micro-batches' "
    "load-balancing gradients, 30% off the window's: the loss is a product of two batch means, "
    "so no per-micro-batch scale gives the window's (notebook 08 §2: the window's routed "
    "counts do)")
NOTES[("accelerate", "moe_aux")] = _MOE_MEAN
NOTES[("lightning", "moe_aux")] = _MOE_MEAN + (
    "; the logged loss is within the tolerance (1e-6) of the window's true mean")
NOTES[("trl", "moe_aux")] = _MOE_MEAN + (
    "; SFTTrainer divides the term by the accumulation steps, and Qwen3-MoE's loss_type is "
    "ForCausalLM, so its count is right; the logged loss is within the tolerance (1e-6) of the "
    "window's true mean")
NOTES[("accelerate", "no_kwargs")] = NOTES[("accelerate", "drops_kwargs")] = NOTES[
    ("accelerate", "uneven")]
NOTES[("lightning", "no_kwargs")] = NOTES[("lightning", "drops_kwargs")] = NOTES[
    ("lightning", "uneven")]

#: (framework, scenario) -> the module under ``repro/`` that reproduces that deviating cell
#: (``python -m gradaccum_course.audits.conformance.repro.NAME``; tests/test_conformance.py
#: runs each): the update; those of LOGGED_PROGRAMS hold the logged loss too
PROGRAMS: dict[tuple[str, str], str] = {
    ("trainer", "no_kwargs"): "trainer_no_kwargs",
    ("trainer", "drops_kwargs"): "trainer_drops_kwargs",
    ("trainer", "position_0"): "trainer_position_0",
    ("accelerate", "partial"): "accelerate_partial",
    ("accelerate", "two_ranks"): "two_ranks",
    ("lightning", "partial"): "lightning_partial",
    ("lightning", "two_ranks"): "two_ranks",
    ("trainer", "moe_aux"): "trainer_moe_aux",
    **{(framework, "moe_aux"): "moe_mean_of_aux" for framework in ("accelerate", "lightning",
                                                                   "trl")},
    **{("trl", key): "trl_position_0"
       for key in ("equal", "uneven", "partial", "clip", "two_ranks")},
    **{(framework, key): f"{framework}_mean_of_means" for framework in ("accelerate", "lightning")
       for key in ("uneven", "no_kwargs", "drops_kwargs")},
}

#: the programs that also reproduce the cell's logged loss (the others: its update only)
LOGGED_PROGRAMS = {"lightning_mean_of_means", "two_ranks", "trainer_no_kwargs",
                   "trainer_drops_kwargs", "trainer_position_0", "trl_position_0",
                   "trainer_moe_aux"}

#: threads read that are not a cell of the table (a path the table does not run), each with its
#: state at the pinned versions and why it is not a cell
CHECKED: tuple[Thread, ...] = (
    ("transformers #37474", f"{_TRANSFORMERS}/issues/37474",
     "open: under nn.DataParallel (n_gpu > 1 in one process) each replica divides its summed "
     "loss by the whole batch's count and training_step then averages the replicas, so the "
     "loss is 1/n_gpu of the mean; the pinned 5.23.0 source still does both (read), and the "
     "fix PRs #40610, #40747, #41530 and #42150 were closed unmerged. Not a cell: "
     "DataParallel needs several GPUs in one process; the table's ranks are CPU processes"),
    ("transformers PR #43919", f"{_TRANSFORMERS}/pull/43919",
     "merged, fixes #43899 (the Trainer ignored sync_each_batch in AcceleratorConfig's "
     "gradient_accumulation_kwargs): first released in transformers 5.2.0 (5.1.0's trainer.py "
     "does not read it), and the pinned 5.23.0 reads it. Not a cell: it changes when DDP "
     "all-reduces the gradients, not what is summed (not measured here)"),
    ("accelerate #3552", "https://github.com/huggingface/accelerate/issues/3552",
     "open: with DeepSpeed, accelerator.backward runs the engine's backward and step, and the "
     "engine keeps its own accumulation boundary, which may disagree with Accelerate's "
     "sync_gradients; accelerate PR #3630 (merged; first in 1.8.0, whose deepspeed.py has it "
     "and 1.7.0's does not) sets the engine's boundary from sync_gradients, and the pinned "
     "1.15.0 does. Not a cell: DeepSpeed is not a column (below)"),
    ("TRL #7047", f"{_TRL}/issues/7047",
     "closed: GRPOTrainer appends its loss-path metrics (policy_loss, entropy) once per "
     "micro-batch and log() averages the entries, so windows of different sizes (an epoch's "
     "short last one) weigh by their micro-batch count; its PR #7053 was closed unmerged, and "
     "the pinned 1.16.0 still appends policy_loss once per micro-batch (read). Not a cell: it "
     "is about GRPO's logged metrics, and the GRPO table measures the update only"),
    ("torchtune PR #2980", "https://github.com/meta-pytorch/torchtune/pull/2980",
     "open: skip the gradient scaling when accumulation is 1; a reviewer shows that the "
     "distributed recipe scales the loss by the rank's own token count and the gradients by "
     "the world size over the global count, which cancel only when every rank holds the same "
     "tokens. Not a cell: torchtune is not a column (below: it does not import with the newest "
     "torchao)"),
    ("transformers #48690", f"{_TRANSFORMERS}/issues/48690",
     "open: with average_tokens_across_devices the Trainer multiplies Qwen3-MoE's whole loss, "
     "its router load-balancing term included, by the world size, so that term grows with the "
     "ranks; its fix PRs #48691 and #48706 are open. Not a cell: the MoE column runs one process "
     "(its "
     "accumulation counterpart is the Trainer × moe_aux cell)"),
)

#: TRL GRPOTrainer's loss types (the GRPO table, ``grpo.py``: k = 4 micro-batches of 2 against
#: one batch of 8 on the same generated completions) -> the update's expected verdict
GRPO_EXPECTED: dict[str, str] = {
    "grpo": "match", "bnpo": "deviate", "dr_grpo": "match", "dapo": "match", "cispo": "match",
    "sapo": "match", "vespo": "match", "luspo": "match"}

#: loss type -> its threads in the GRPO table
GRPO_THREADS: dict[str, tuple[Thread, ...]] = {
    "bnpo": (("TRL #3021", f"{_TRL}/issues/3021",
              "open: asks why GRPO trains worse with gradient accumulation; a comment reads the "
              "bnpo branch (each micro-batch's summed token loss over its own token count) as "
              "still differing from the large batch under accumulation"),),
    **{loss_type: (_TRL_5619, _TRL_6024) for loss_type in ("dapo", "cispo", "vespo")}}

_PER_SEQUENCE = (
    "Measured: a match. Why (read in the source): each micro-batch's mean over its "
    "sequences, divided by k, is the large batch's mean over sequences because every "
    "micro-batch holds 2 sequences")
#: loss type -> what the measurement shows (the tests assert the numbers)
GRPO_NOTES: dict[str, str] = {
    "bnpo": (
        "documented: GRPOConfig's loss_type docstring says bnpo normalises over the local "
        "batch only, so results may vary with the local batch size at a constant effective "
        "batch size. Measured: each micro-batch's token mean divided by k weighs the tokens of "
        "micro-batch i by 1/(4 n_i), n_i its completion tokens, instead of 1/N, N the "
        "window's, so the tokens of the micro-batches with fewer tokens weigh more"),
    "grpo": _PER_SEQUENCE, "sapo": _PER_SEQUENCE, "luspo": _PER_SEQUENCE,
    "dr_grpo": (
        "Measured: a match. Why (read in the source): each micro-batch's sum over (its 2 "
        "sequences × max_completion_length), divided by k, is the large batch's sum over (8 × "
        "max_completion_length)"),
}

#: loss type -> the module under ``repro/`` that reproduces its deviation
GRPO_PROGRAMS: dict[str, str] = {"bnpo": "trl_grpo_bnpo"}
