"""Notebook 03's exercises (tokens)."""

import torch

from gradaccum_course.exercises import Numeric, number, register, require

#: 03.2's hints, English and Chinese
_HINTS = {
    "not positive": ("a divisor must be positive", "除数必须为正"),
    "weight": ("dividing by {given:g} gives each token weight {weight:.3g}, not {truth:.3g}; "
               "remember DDP averages the ranks' gradients",
               "除以 {given:g} 时每个 token 的权重是 {weight:.3g}，而不是 {truth:.3g}；别忘了 "
               "DDP 会对各进程的梯度取平均"),
}


def _mean_of_means_weight() -> dict:
    token_losses = torch.rand(40, dtype=torch.float64, requires_grad=True)
    mean_of_means = (token_losses[:10].mean() + token_losses[10:].mean()) / 2
    (mean_of_means_weights,) = torch.autograd.grad(mean_of_means, token_losses)
    (true_weights,) = torch.autograd.grad(token_losses.mean(), token_losses)
    return {"truth": (mean_of_means_weights[0] / true_weights[0]).item()}


def _global_normaliser(answer: object) -> dict:
    """03.2: the reader's divisor, run through each rank's sum and DDP's average over ranks."""
    counts = {0: (120, 40), 1: (80, 10)}
    token_losses = torch.rand(sum(map(sum, counts.values())), dtype=torch.float64,
                              requires_grad=True)
    given = number(answer, ("divisor", "除数"))
    require(given > 0, _HINTS["not positive"])
    per_rank, start = [], 0
    for rank_counts in counts.values():  # each rank divides its own sum by the answer
        size = sum(rank_counts)
        per_rank.append(token_losses[start:start + size].sum() / given)
        start += size
    (ranks,) = torch.autograd.grad(sum(per_rank) / len(counts), token_losses)  # DDP averages
    (truth,) = torch.autograd.grad(token_losses.mean(), token_losses)
    require(torch.allclose(ranks, truth, rtol=1e-12, atol=0), _HINTS["weight"], given=given,
            weight=ranks[0].item(), truth=truth[0].item())
    return {"given": given, "tokens": sum(map(sum, counts.values())), "ranks": len(counts)}


register("03.1", ("a token's weight in the mean of micro-batch means",
                  "微批次均值的均值中一个 token 的权重"),
         ("a number: a short micro-batch token's weight in the mean of micro-batch means, over "
          "its weight in the window's token mean",
          "一个数：短微批次中一个 token 在微批次均值的均值里的权重，与它在窗口 token 均值里的权重"
          "之比"),
         ("each token of the short micro-batch weighs {truth:g} x its true weight",
          "短微批次里每个 token 的权重是它真实权重的 {truth} 倍"),
         Numeric(_mean_of_means_weight, ("ratio", "比值"), 1e-9, (
             "{answer} is not the weight ratio; write both means as weights on each token",
             "{answer} 不是权重之比；把两种均值都写成每个 token 上的权重")))
register("03.2", ("the divisor on each DDP rank", "每个 DDP 进程的除数"),
         ("the number each rank divides its summed token loss by, so that DDP's average is the "
          "window's token mean",
          "每个进程用来除自己求和 token 损失的那个数，使 DDP 取平均后正好是窗口的 token 均值"),
         ("dividing by {given:g} = {tokens} window tokens / {ranks} ranks on each rank, then "
          "DDP's average over ranks, gives every token the weight of the window's token mean",
          "每个进程都除以 {given} = 窗口的 {tokens} 个 token / {ranks} 个进程，再经 DDP 在进程间"
          "取平均，每个 token 得到的正是它在窗口 token 均值里的权重"),
         _global_normaliser)
