"""The notebooks' exercises, and the checkers that grade a reader's answer.

Each notebook ends with exercises. A reader writes an answer into ``answer`` and runs the
checker cell, ``check_exercise("02.1", answer)``:

* with ``answer = None`` (not attempted yet) the checker says so and passes;
* with a right answer it prints ``✓``, what was checked and the true value, and returns None
  (so a notebook shows no ``Out:`` line);
* with a wrong one it raises :class:`WrongAnswer` (an ``AssertionError``, so a solution notebook
  fails under nbval), whose message is three lines: ``✗`` and the exercise, what answer was
  expected in words, and a hint. IPython shows that message alone, without a traceback.

Every checker (in :mod:`gradaccum_lib.notebook.checkers` and
:mod:`~gradaccum_lib.notebook.training_checkers`) computes the true answer itself, by
running the library (the budget model, the engine, the ground truth, a real
``DistributedSampler``, the real 🤗 ``Trainer``...), never from a stored value. The worked
solutions live in ``notebooks/solutions/`` and are executed and checked by nbval in ``make
test``, like the notebooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .checkers import (
    BERT_BASE_CHINESE,
    GIB,
    WrongAnswer,
    adamw_state_gigabytes,
    bert_base_parameters,
    ddp_effective_batch,
    decomposing_loss,
    find_the_bug,
    fit_a_gpu,
    forgot_to_divide,
    global_normaliser,
    k_for_the_cluster,
    mean_of_means_weight,
)
from .training_checkers import (
    accelerate_partial_window,
    allreduce_bytes,
    engine_steps,
    leftover_micro_batches,
    pipeline_steps_ratio,
    schedule_length,
    sqrt_learning_rate,
    steps_per_epoch,
    trainer_factor,
    window_load_balancing_loss,
)

# BERT_BASE_CHINESE and GIB: the notebooks' exercise cells import them from here
__all__ = ["BERT_BASE_CHINESE", "EXERCISES", "GIB", "Exercise", "WrongAnswer", "check_exercise"]


@dataclass(frozen=True)
class Exercise:
    title: str
    expects: str  # the answer wanted, in words (never its value)
    checker: Callable[..., str]  # checker(answer, **context) -> what was checked; raises if wrong


EXERCISES: dict[str, Exercise] = {
    "00.1": Exercise("parameters of bert-base-chinese, in millions",
                     "the parameters of bert-base-chinese with a 2-class head, in millions (±1M)",
                     bert_base_parameters),
    "00.2": Exercise("samples per optimizer step under DDP",
                     "the samples in one optimizer step: micro-batches of 32, k = 8, 8 DDP ranks",
                     ddp_effective_batch),
    "01.1": Exercise("find the loop whose step is wrong",
                     'the name of the loop whose step is not the large batch\'s, "A" or "B"',
                     find_the_bug),
    "01.2": Exercise("make a token loss decompose",
                     "a loss function (model, batch) -> (summed loss, number of real tokens) "
                     "that accumulates to the whole batch's token mean", decomposing_loss),
    "02.1": Exercise("the micro-batch and k for a 16 GiB GPU",
                     "a pair (micro_batch, k): the largest micro-batch that fits, and the "
                     "smallest k reaching 256 samples", fit_a_gpu),
    "02.2": Exercise("the update of a loop that never divides by k",
                     "a number: how many times the large batch's update the loop's update is",
                     forgot_to_divide),
    "03.1": Exercise("a token's weight in the mean of micro-batch means",
                     "a number: a short micro-batch token's weight in the mean of micro-batch "
                     "means, over its weight in the window's token mean", mean_of_means_weight),
    "03.2": Exercise("the divisor on each DDP rank",
                     "the number each rank divides its summed token loss by, so that DDP's "
                     "average is the window's token mean", global_normaliser),
    "04.1": Exercise("k for 256 samples on 8 GPUs",
                     "the smallest k with 4 per GPU x 8 GPUs x k >= 256 samples",
                     k_for_the_cluster),
    "04.2": Exercise("the state that k does not shrink",
                     "a number: GB (1e9 bytes) of fp32 weights, gradients and AdamW state per "
                     "GPU for RoBERTa-wwm-ext-large with a 10-class head, at k = 16",
                     adamw_state_gigabytes),
    "04b.1": Exercise("the 🤗 Trainer's update against the truth",
                      "a number: how many times the true update the Trainer's SGD update is",
                      trainer_factor),
    "04b.2": Exercise("Accelerate on a partial last window",
                      "a number: how many times the true update Accelerate's SGD update is, "
                      "on a window of 2 micro-batches with k = 4", accelerate_partial_window),
    "05.1": Exercise("bytes DDP all-reduces in an epoch",
                     "the bytes of gradients DDP hands to all-reduce on one rank over the epoch",
                     allreduce_bytes),
    "05.2": Exercise("optimizer steps per epoch under DistributedSampler",
                     "the optimizer steps of one epoch: 50 samples, 2 ranks, micro-batches of 4, "
                     "k = 2", steps_per_epoch),
    "06.1": Exercise("the square-root learning-rate rule",
                     "the square-root rule's learning rate for a batch of 256, from 2e-5 at 32",
                     sqrt_learning_rate),
    "06.2": Exercise("optimizer steps for an epoch with a partial window",
                     "the optimizer (and scheduler) steps of 10 micro-batches with k = 4",
                     engine_steps),
    "07.1": Exercise("micro-batches in the first step of an epoch",
                     "a number: how many micro-batches' gradients the first optimizer step of "
                     "the second epoch adds up (11 micro-batches an epoch, k = 4, counted from "
                     "each epoch's start)", leftover_micro_batches),
    "07.2": Exercise("the length of a learning-rate schedule",
                     "a number: the optimizer steps of 3 epochs of 1,000 samples in "
                     "micro-batches of 8 with k = 4, partial windows stepped", schedule_length),
    "08.1": Exercise("two pipeline schedule steps without zeroing",
                     "a number: a / b, where a g1 + b g2 is the gradient after two GPipe steps "
                     "of 4 micro-batches (mean losses, scale_grads=True) with no zero_grad "
                     "between them", pipeline_steps_ratio),
    "08.2": Exercise("the load-balancing loss of a window",
                     "a number: the window's load-balancing loss 2 sum_e f_e P_e from the "
                     "window's token shares and mean probabilities, over both micro-batches",
                     window_load_balancing_loss),
}


def check_exercise(exercise_id: str, answer: object, **context: object) -> None:
    """Grade ``answer`` to exercise ``exercise_id`` (e.g. ``"02.1"``).

    With ``answer`` None it says that there is no answer yet; with a right answer it prints
    ``✓`` and the true value. Either way it returns None. A wrong answer raises
    :class:`WrongAnswer`: ``✗``, the answer expected in words, and a hint. ``context`` passes
    what an exercise needs from its notebook cell (01.1: ``loops={"A": ..., ...}``; 02.2:
    ``loop=...``).
    """
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; known: {sorted(EXERCISES)}")
    exercise = EXERCISES[exercise_id]
    if answer is None:
        print(f"Exercise {exercise_id} ({exercise.title}): no answer yet. Set `answer` in the "
              "cell above and run this cell again; the solution is in notebooks/solutions/.")
        return
    try:
        checked = exercise.checker(answer, **context)
    except WrongAnswer as wrong:  # one short message, not a chain of two tracebacks
        raise WrongAnswer(f"✗ Exercise {exercise_id} ({exercise.title}): not right yet.\n"
                          f"Expected: {exercise.expects}.\nHint: {wrong}") from None
    print(f"✓ Exercise {exercise_id}: correct. {checked}")
