"""Notebook 07's exercises (the interviewer's follow-ups)."""

import math

from gradaccum_course.exercises import Numeric, register
from gradaccum_course.exercises.ex06 import count_loop_steps


def _leftover_micro_batches() -> dict:
    # the exercise's loop, counted: 11 micro-batches an epoch, a step when (index + 1) % 4 == 0
    # with index from each epoch's start, the gradients zeroed only after a step
    held, pending = [], 0  # micro-batches added up in each optimizer step; in .grad now
    for _epoch in range(2):
        for index in range(11):
            pending += 1  # a backward adds this micro-batch's gradient
            if (index + 1) % 4 == 0:
                held.append(pending)
                pending = 0  # step, then zero_grad
    return {"truth": held[11 // 4], "left": 11 % 4}


register("07.1", ("micro-batches in the first step of an epoch", "一个 epoch 第一次更新里的微批次"),
         ("a number: how many micro-batches' gradients the first optimizer step of the second "
          "epoch adds up (11 micro-batches an epoch, k = 4, counted from each epoch's start)",
          "一个数：第二个 epoch 的第一次优化器更新累加了多少个微批次的梯度（每个 epoch 11 个"
          "微批次，k = 4，从每个 epoch 开头数起）"),
         ("the first step of epoch 2 adds up {truth} micro-batches: {left} left over from epoch 1 "
          "and 4 of its own",
          "第 2 个 epoch 的第一次更新累加了 {truth} 个微批次：{left} 个是第 1 个 epoch 剩下的，4 "
          "个是它自己的"),
         Numeric(_leftover_micro_batches, ("micro-batches", "微批次数"), 0, (
             "{answer} is not what that step adds up; count what is still in the gradients when "
             "the first epoch ends",
             "{answer} 不是那次更新累加的微批次数；数一数第一个 epoch 结束时梯度里还留着什么")))
register("07.2", ("the length of a learning-rate schedule", "学习率调度的长度"),
         ("a number: the optimizer steps of 3 epochs of 1,000 samples in micro-batches of 8 with "
          "k = 4, partial windows stepped",
          "一个数：1,000 个样本、微批次 8、k = 4，3 个 epoch 的优化器更新次数（不满的窗口也更新）"),
         ("3 epochs of {micro} micro-batches with k = 4: {truth} optimizer steps, so a schedule "
          "{truth} steps long",
          "3 个 epoch、每个 {micro} 个微批次、k = 4：优化器更新 {truth} 次，所以调度长 {truth} 步"),
         Numeric(lambda: {"truth": count_loop_steps(1000, 8, epochs=3),
                          "micro": math.ceil(1000 / 8)},
                 ("schedule steps", "调度步数"), 0, (
             "{answer} steps is not the optimizer steps the library's loop takes; count the "
             "windows of one epoch (its partial one steps too), then multiply by the epochs",
             "{answer} 步不是本库的循环做的优化器更新次数；先数一个 epoch 的窗口数（其中不满的那"
             "个也会更新），再乘以 epoch 数")))
