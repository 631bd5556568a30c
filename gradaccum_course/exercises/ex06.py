"""Notebook 06's exercises (beyond), and the loop's step count that 07's share."""

import torch

from gradaccum_course.exercises import Numeric, register, require
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import split_into_micro_batches, windows_of
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.noise import scaled_learning_rate
from gradaccum_lib.workloads.models import make_mlp

__all__ = ["count_loop_steps"]


def count_loop_steps(samples: int, micro_batch_size: int, epochs: int) -> int:
    """The library loop's optimizer steps (as many scheduler steps) over ``epochs`` of
    ``samples``, k = 4."""
    model = make_mlp(4, 6, 2, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    inputs = torch.randn(samples, 4, generator=torch.Generator().manual_seed(5),
                         dtype=torch.float64)
    micro_batches = split_into_micro_batches((inputs, torch.arange(samples) % 2),
                                             micro_batch_size=micro_batch_size)
    steps = 0
    for _epoch in range(epochs):
        for window in windows_of(micro_batches, 4):
            steps += accumulate_window(model, optimizer, window, sample_classification_loss,
                                       scheduler=scheduler).stepped
    require(scheduler.last_epoch == steps, ("the scheduler and optimizer counts disagree",
                                            "学习率调度器与优化器的更新次数不一致"))
    return steps


register("06.1", ("the square-root learning-rate rule", "学习率的平方根缩放规则"),
         ("the square-root rule's learning rate for a batch of 256, from 2e-5 at 32",
          "按平方根规则，从批大小 32 时的 2e-5 推出批大小 256 时的学习率"),
         ("the square-root rule gives {truth:.4g} for an effective batch of 256",
          "有效批大小为 256 时，平方根规则给出 {truth}"),
         Numeric(lambda: {"truth": scaled_learning_rate(2e-5, 32, 256, "sqrt")},
                 ("learning rate", "学习率"), 1e-3, relative=True, hint=(
             "{answer} is not the square-root rule's learning rate; it multiplies the rate by the "
             "square root of the batch's growth",
             "{answer} 不是平方根规则给出的学习率；这条规则把学习率乘以批大小增长倍数的平方根")))
register("06.2", ("optimizer steps for an epoch with a partial window",
                  "带不满窗口的 epoch 的优化器更新次数"),
         ("the optimizer (and scheduler) steps of 10 micro-batches with k = 4",
          "10 个微批次、k = 4 时的优化器（以及调度器）更新次数"),
         ("10 micro-batches with k = 4: {truth} optimizer and scheduler steps",
          "10 个微批次、k = 4：优化器更新 {truth} 次，调度器也步进 {truth} 次"),
         Numeric(lambda: {"truth": count_loop_steps(20, 2, epochs=1)},
                 ("optimizer steps", "优化器更新次数"), 0, (
             "{answer} is not the number of optimizer steps the library's loop took; does the "
             "partial last window step?",
             "{answer} 不是本库的循环做的优化器更新次数；最后一个不满的窗口会不会更新？")))
