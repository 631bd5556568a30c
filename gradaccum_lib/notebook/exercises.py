"""The notebooks' exercises, and the checkers that grade a reader's answer.

Each notebook ends with exercises. A reader writes an answer into ``answer`` and runs the
checker cell, ``check_exercise("02.1", answer)``:

* with ``answer = None`` (not attempted yet) the checker says so and passes;
* with a right answer it prints ``✓``, what was checked and the true value, and returns None
  (so a notebook shows no ``Out:`` line);
* with a wrong one it raises :class:`WrongAnswer` (an ``AssertionError``, so a solution notebook
  fails under nbval), whose message is three lines: ``✗`` and the exercise, what answer was
  expected in words, and a hint. IPython shows that message alone, without a traceback. In the
  Chinese edition all three are in Chinese.

Every checker (in :mod:`gradaccum_lib.notebook.checkers` and
:mod:`~gradaccum_lib.notebook.training_checkers`) computes the true answer itself, by
running the library (the budget model, the engine, the ground truth, a real
``DistributedSampler``, the real 🤗 ``Trainer``...), never from a stored value. The worked
solutions live in ``notebooks/solutions/`` and are executed and checked by nbval in ``make
test``, like the notebooks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
__all__ = ["BERT_BASE_CHINESE", "EXERCISES", "EXPECTS_ZH", "GIB", "TITLES_ZH", "Exercise",
           "WrongAnswer",
           "check_exercise", "correct_message", "language", "no_answer_message", "wrong_message"]


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


#: each exercise's title in the Chinese edition (notebooks/zh/)
TITLES_ZH: dict[str, str] = {
    "00.1": "bert-base-chinese 的参数量，以百万计",
    "00.2": "DDP 下一次优化器更新的样本数",
    "01.1": "找出更新出错的那个循环",
    "01.2": "让 token 损失可以分解",
    "02.1": "16 GiB GPU 上的微批次和 k",
    "02.2": "从不除以 k 的循环的更新",
    "03.1": "微批次均值的均值中一个 token 的权重",
    "03.2": "每个 DDP 进程的除数",
    "04.1": "8 张 GPU 上 256 个样本所需的 k",
    "04.2": "k 缩小不了的状态",
    "04b.1": "Hugging Face Trainer 的更新与真实更新之比",
    "04b.2": "Accelerate 在最后一个不满的窗口上",
    "05.1": "一个 epoch 里 DDP 全规约的字节数",
    "05.2": "DistributedSampler 下每个 epoch 的优化器更新次数",
    "06.1": "学习率的平方根缩放规则",
    "06.2": "带不满窗口的 epoch 的优化器更新次数",
    "07.1": "一个 epoch 第一次更新里的微批次",
    "07.2": "学习率调度的长度",
    "08.1": "不清零的两次流水线调度更新",
    "08.2": "一个窗口的负载均衡损失",
}


#: the answer each exercise expects, in words, in the Chinese edition
EXPECTS_ZH: dict[str, str] = {
    "00.1": "带 2 分类任务头的 bert-base-chinese 的参数量，以百万计（误差在一百万以内）",
    "00.2": "一次优化器更新的样本数：微批次 32、k = 8、8 个 DDP 进程",
    "01.1": '更新与大批次不同的那个循环的名字，"A" 或 "B"',
    "01.2": "一个损失函数 (model, batch) -> (求和损失, 真实 token 数)，"
            "累积起来等于整个批次的 token 均值",
    "02.1": "一个二元组 (micro_batch, k)：放得下的最大微批次，以及达到 256 个样本的最小 k",
    "02.2": "一个数：这个循环的更新是大批次更新的多少倍",
    "03.1": "一个数：短微批次中一个 token 在微批次均值的均值里的权重，"
            "与它在窗口 token 均值里的权重之比",
    "03.2": "每个进程用来除自己求和 token 损失的那个数，使 DDP 取平均后正好是窗口的 token 均值",
    "04.1": "使 每张 GPU 4 个样本 × 8 张 GPU × k >= 256 个样本 成立的最小 k",
    "04.2": "一个数：带 10 分类任务头的 RoBERTa-wwm-ext-large 在 k = 16 时，"
            "每张卡上 fp32 权重、梯度和 AdamW 状态共多少 GB（1e9 字节）",
    "04b.1": "一个数：Trainer 的 SGD 更新是真实更新的多少倍",
    "04b.2": "一个数：在 k = 4、只有 2 个微批次的窗口上，Accelerate 的 SGD 更新是真实更新的多少倍",
    "05.1": "一个进程在整个 epoch 里交给全规约的梯度字节数",
    "05.2": "一个 epoch 的优化器更新次数：50 个样本、2 个进程、微批次 4、k = 2",
    "06.1": "按平方根规则，从批大小 32 时的 2e-5 推出批大小 256 时的学习率",
    "06.2": "10 个微批次、k = 4 时的优化器（以及调度器）更新次数",
    "07.1": "一个数：第二个 epoch 的第一次优化器更新累加了多少个微批次的梯度"
            "（每个 epoch 11 个微批次，k = 4，从每个 epoch 开头数起）",
    "07.2": "一个数：1,000 个样本、微批次 8、k = 4，3 个 epoch 的优化器更新次数"
            "（不满的窗口也更新）",
    "08.1": "一个数：a / b，其中 a g1 + b g2 是两次各 4 个微批次的 GPipe 更新"
            "（平均损失，scale_grads=True）之间不清零时的梯度",
    "08.2": "一个数：由窗口的 token 占比和平均概率算出的、覆盖两个微批次的"
            "窗口负载均衡损失 2 sum_e f_e P_e",
}


def language() -> str:
    """Return the language exercise feedback is given in: ``"zh"`` in a kernel started in the
    Chinese edition (``notebooks/zh/`` or its ``solutions/``), else ``"en"``;
    ``GRADACCUM_LANGUAGE=en|zh`` overrides."""
    chosen = os.environ.get("GRADACCUM_LANGUAGE")
    if chosen in ("en", "zh"):
        return chosen
    parts = Path.cwd().parts
    return "zh" if "notebooks" in parts and "zh" in parts[parts.index("notebooks"):] else "en"


def no_answer_message(exercise_id: str, lang: str = "en") -> str:
    """Return what the checker says when ``answer`` is None."""
    if lang == "zh":
        return (f"练习 {exercise_id}（{TITLES_ZH.get(exercise_id, EXERCISES[exercise_id].title)}"
                "）：还没有答案。在上面的单元格里设置 `answer`，再运行这个单元格；参考答案在 "
                "notebooks/zh/solutions/。")
    return (f"Exercise {exercise_id} ({EXERCISES[exercise_id].title}): no answer yet. Set "
            "`answer` in the cell above and run this cell again; the solution is in "
            "notebooks/solutions/.")


def correct_message(exercise_id: str, checked: str, lang: str = "en") -> str:
    """Return what the checker prints for a right answer (``checked``: what it checked, as the
    checker says it)."""
    if lang == "zh":
        return f"✓ 练习 {exercise_id}：正确。{checked}"
    return f"✓ Exercise {exercise_id}: correct. {checked}"


def wrong_message(exercise_id: str, hint: str, lang: str = "en") -> str:
    """Return the three lines of a wrong answer: ✗, the answer expected, the hint."""
    exercise = EXERCISES[exercise_id]
    if lang == "zh":
        return (f"✗ 练习 {exercise_id}（{TITLES_ZH.get(exercise_id, exercise.title)}）：还不对。\n"
                f"应当给出：{EXPECTS_ZH.get(exercise_id, exercise.expects)}。\n提示：{hint}")
    return (f"✗ Exercise {exercise_id} ({exercise.title}): not right yet.\n"
            f"Expected: {exercise.expects}.\nHint: {hint}")


def check_exercise(exercise_id: str, answer: object, **context: object) -> None:
    """Grade ``answer`` to exercise ``exercise_id`` (e.g. ``"02.1"``).

    With ``answer`` None it says that there is no answer yet; with a right answer it prints
    ``✓`` and the true value. Either way it returns None. A wrong answer raises
    :class:`WrongAnswer`: ``✗``, the answer expected in words, and a hint. ``context`` passes
    what an exercise needs from its notebook cell (01.1: ``loops={"A": ..., ...}``; 02.2:
    ``loop=...``). In the Chinese edition (:func:`language`) the framing is in Chinese, and so
    is the hint (the checker's ``WrongAnswer.zh``; its English one where it gives none); what a
    checker says it checked, the true value included, stays as it says it.
    """
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; known: {sorted(EXERCISES)}")
    lang = language()
    if answer is None:
        print(no_answer_message(exercise_id, lang))
        return
    try:
        checked = EXERCISES[exercise_id].checker(answer, **context)
    except WrongAnswer as wrong:  # one short message, not a chain of two tracebacks
        hint = wrong.zh if lang == "zh" and wrong.zh else str(wrong)
        raise WrongAnswer(wrong_message(exercise_id, hint, lang)) from None
    print(correct_message(exercise_id, checked, lang))
