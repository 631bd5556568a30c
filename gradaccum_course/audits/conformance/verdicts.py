"""What the conformance table is expected to show at the pinned versions, and the upstream
thread each deviating cell corresponds to (each thread read before it was cited; a deviation
no thread was found for says "unexplained"). A version bump that changes a verdict fails
``make conformance`` and the tests with the cell's name and its thread."""

from __future__ import annotations

__all__ = ["EXPECTED", "GRADIENT_ONLY", "LOGGED_PROGRAMS", "NOTES", "PROGRAMS", "THREADS",
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
THREADS |= {("trl_grpo", key): (
    ("TRL #5619", f"{_TRL}/issues/5619",
     "asks why the dapo loss is not divided by the accumulation steps; the maintainer: "
     "num_items_in_batch counts the whole accumulated batch"),
    ("TRL PR #6024", f"{_TRL}/pull/6024",
     "merged: dapo, cispo and vespo were scaled by gradient_accumulation_steps / "
     "steps_per_generation; the pinned source has the rescaling (read, not measured here)"))
    for key in ("equal", "uneven", "partial", "clip", "no_kwargs", "drops_kwargs",
                "position_0", "two_ranks")}

#: cells whose threads explain the update only: their logged loss is "unexplained"
GRADIENT_ONLY = {("lightning", "uneven"), ("lightning", "no_kwargs"),
                 ("lightning", "drops_kwargs")}

#: what the measurement itself shows for cells no thread explains (the tests assert the numbers)
NOTES: dict[tuple[str, str], str] = {
    ("trainer", "position_0"): (
        "no thread found (unexplained upstream). Measured: the update is 56/64 of the truth's, "
        "the 56 predicted tokens over the 64 labelled positions: GPT2LMHeadModel's loss_type "
        "is None, so the Trainer counts position 0, which the shifted loss never predicts"),
    ("accelerate", "uneven"): (
        "no thread found (unexplained). Measured: the update is the mean of the micro-batch "
        "means' (accelerator.backward divides each mean loss by k)"),
    ("accelerate", "partial"): (
        "no thread found (unexplained). Measured: the update is 2/4 of the truth's: the 2 "
        "micro-batches of the last window are each divided by the configured k = 4"),
    ("lightning", "uneven"): (
        "the logged train_loss (on_epoch) is the micro-batch means averaged by the batch size "
        "Lightning infers (sequences), not by tokens: no thread found for the logged value"),
}
NOTES[("accelerate", "two_ranks")] = (
    "no thread found (unexplained). Measured: on 2 gloo ranks, k = 2 each, the update is the "
    "mean of the 4 micro-batch means', as in one process")
NOTES[("lightning", "two_ranks")] = (
    "no thread found (unexplained). Measured: on 2 gloo ranks, k = 2 each, the update is the "
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
    **{("trl", key): "trl_position_0"
       for key in ("equal", "uneven", "partial", "clip", "two_ranks")},
    **{(framework, key): f"{framework}_mean_of_means" for framework in ("accelerate", "lightning")
       for key in ("uneven", "no_kwargs", "drops_kwargs")},
}

#: the programs that also reproduce the cell's logged loss (the others: its update only)
LOGGED_PROGRAMS = {"lightning_mean_of_means", "two_ranks", "trainer_no_kwargs",
                   "trainer_drops_kwargs", "trainer_position_0", "trl_position_0"}
