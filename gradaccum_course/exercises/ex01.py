"""Notebook 01's exercises (the math), and the toy window and hints that 02's share."""

import copy
from collections.abc import Callable, Mapping
from typing import NoReturn

import torch
from torch import nn

from gradaccum_course.exercises import Hint, register, require, wrong
from gradaccum_lib.batches import split_into_micro_batches
from gradaccum_lib.equivalence import accumulated_gradients, full_batch_gradients
from gradaccum_lib.gradients import max_gradient_difference
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

__all__ = ["HINTS", "WINDOW_SIZES", "fill_stale_gradients", "raise_off_the_large_batch", "same",
           "sgd_step_error", "summed_loss_gradients", "toy_window"]

#: the hints, English and Chinese (02.3 names three of its mistakes with 01.3's)
HINTS: dict[str, Hint] = {
    "not a loop": ("answer must be one of {loops}; got {answer!r}",
                   "answer 必须是 {loops} 之一；实际得到的是 {answer!r}"),
    "right loop": ("loop {answer} takes the large-batch step; look again",
                   "循环 {answer} 做的正是大批次的那次更新；再仔细看看"),
    "not a loss": ("answer must be a loss function (model, batch) -> (sum, count)",
                   "answer 必须是一个损失函数 (model, batch) -> (求和损失, 计数)"),
    "no decomposition": ("accumulating your loss over 3 micro-batches is {error:.2e} away from "
                         "the token mean of the whole batch",
                         "把你的损失在 3 个微批次上累积，结果与整个批次的 token 均值相差 "
                         "{error:.2e}"),
    "not a function": ("answer must be a function window_gradient(model, micro_batches)",
                       "answer 必须是一个函数 window_gradient(model, micro_batches)"),
    "empty": (".grad is empty after your function: call backward() on each micro-batch's loss",
              "运行你的函数之后 .grad 是空的：对每个微批次的损失调用 backward()"),
    "untouched": (".grad is as your function found it: nothing was backpropagated into it",
                  ".grad 还是你的函数拿到它时的样子：没有任何梯度被反向传播进去"),
    "no zero_grad": ("your gradient was added to the one .grad already held (an earlier "
                     "window's): zero the gradients before the first micro-batch",
                     "你的梯度被加到了 .grad 里原有的梯度（上一个窗口的）上：在第一个微批次之前先"
                     "把梯度清零"),
    "mean / k": ("you divided each micro-batch's mean loss by k: exact only on equal "
                 "micro-batches, and these hold {sizes} samples; divide each summed loss by the "
                 "window's count",
                 "你把每个微批次的平均损失除以了 k：只有微批次大小相等时才精确，而这里的微批次"
                 "分别有 {sizes_zh} 个样本；应当把每个求和损失除以整个窗口的样本数"),
    "no divisor": ("you added the micro-batches' mean losses without dividing: k means, each "
                   "already on the large batch's scale",
                   "你把各微批次的平均损失直接加了起来，没有做除法：k 个均值，每一个本身就已经是"
                   "大批次损失的量级"),
    "last only": ("only the last micro-batch's gradient reached .grad (backward ran on it alone, "
                  "or the gradients were zeroed inside the loop): every micro-batch must add its "
                  "own",
                  "只有最后一个微批次的梯度进了 .grad（只对它调用了 backward，或者在循环里清零了"
                  "梯度）：每个微批次都要把自己的梯度加进去"),
    "scale": ("your gradient points the right way but is {ratio:.3g} x the large batch's: divide "
              "the summed losses by the window's {items} samples, once",
              "你的梯度方向对了，但大小是大批次梯度的 {ratio:.3g} 倍：把求和损失除以整个窗口的 "
              "{items} 个样本，只除这一次"),
    "off": ("your {what[0]} is {error:.0%} off the large batch's: backward each micro-batch's "
            "summed loss divided by the window's {items} samples{steps[0]}",
            "你的{what[1]}与大批次的{what[1]}相差 {error:.0%}：对每个微批次的求和损失除以整个窗口"
            "的 {items} 个样本，再调用 backward{steps[1]}"),
}


def sgd_step_error(loop: Callable, accumulation_steps: int, seed: int) -> tuple[float, float]:
    """Run ``loop(model, SGD(lr=1), micro_batches, k)`` on a toy window: its update's largest
    difference from the large batch's, and the ratio of their norms."""
    inputs = torch.randn(16, 5, generator=torch.Generator().manual_seed(seed),
                         dtype=torch.float64)
    labels = torch.arange(16) % 3
    micro_batches = split_into_micro_batches((inputs, labels),
                                             accumulation_steps=accumulation_steps)
    model = make_mlp(5, 8, 3, seed=0)
    truth = {name: -g for name, g in
             full_batch_gradients(model, sample_classification_loss, (inputs, labels)).items()}
    candidate = copy.deepcopy(model)
    loop(candidate, torch.optim.SGD(candidate.parameters(), lr=1.0), micro_batches,
         accumulation_steps)
    before = dict(model.named_parameters())
    update = {n: p.detach() - before[n].detach() for n, p in candidate.named_parameters()}
    norm = (torch.cat([u.reshape(-1) for u in update.values()]).norm()
            / torch.cat([t.reshape(-1) for t in truth.values()]).norm()).item()
    return max_gradient_difference(update, truth), norm


def _find_the_bug(answer: object, *, loops: Mapping[str, Callable]) -> dict:
    wrong_loops = [name for name, loop in loops.items() if sgd_step_error(loop, 4, 0)[0] > 1e-10]
    require(answer in loops, HINTS["not a loop"], loops=sorted(loops), answer=answer)
    require([answer] == wrong_loops, HINTS["right loop"], answer=answer)
    return {"loop": answer}


def _decomposing_loss(answer: object) -> dict:
    require(callable(answer), HINTS["not a loss"])
    model = TokenTagger(20, 6, 4, seed=0)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 20, (6, 9), generator=generator)
    labels = torch.randint(0, 4, (6, 9), generator=generator)
    for row, length in enumerate((9, 2, 5, 1, 7, 3)):  # very uneven real lengths
        input_ids[row, length:], labels[row, length:] = 0, -100
    batch = {"input_ids": input_ids, "labels": labels}
    mask = labels != -100

    def token_mean(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple:
        logits = model(batch["input_ids"])
        return nn.functional.cross_entropy(logits[mask], labels[mask]), 1

    truth = full_batch_gradients(model, token_mean, batch)
    micro = [{"input_ids": input_ids[i:i + 2], "labels": labels[i:i + 2]} for i in (0, 2, 4)]
    error = max_gradient_difference(accumulated_gradients(model, answer, micro), truth)
    require(error <= 1e-10, HINTS["no decomposition"], error=error)
    # the bound, not the error: a right answer's error is rounding noise (2.8e-17 on one CPU,
    # 3.5e-17 on another), whose digits a committed output must not print
    return {"tolerance": 1e-10}


WINDOW_SIZES = (7, 3, 5, 1)  # uneven micro-batches (01.3, 02.3): where dividing by k is wrong


def toy_window(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) micro-batches of :data:`WINDOW_SIZES` samples, for ``make_mlp(5, 8, 3)``."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(sum(WINDOW_SIZES), 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (sum(WINDOW_SIZES),), generator=generator)
    return list(zip(inputs.split(WINDOW_SIZES), labels.split(WINDOW_SIZES), strict=True))


def summed_loss_gradients(model: nn.Module, window: list) -> list[torch.Tensor]:
    """Each micro-batch's gradient of its SUMMED cross-entropy, flattened (``.grad`` untouched)."""
    return [torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        nn.functional.cross_entropy(model(x), y, reduction="sum"), list(model.parameters()))])
        for x, y in window]


def fill_stale_gradients(model: nn.Module, seed: int) -> torch.Tensor:
    """Put an earlier window's (random) gradient into ``.grad``; return it flattened."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float64 rounding."""
    return (a - b).abs().max().item() <= 1e-9 * b.abs().max().item()


def _parallel(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same direction, whatever the length."""
    return nn.functional.cosine_similarity(a, b, dim=0).item() > 1 - 1e-9


def _large_batch_gradient(model: nn.Module, window: list) -> torch.Tensor:
    """The library's ground truth on the window's micro-batches joined, flattened."""
    batch = tuple(torch.cat(parts) for parts in zip(*window, strict=True))
    return torch.cat([g.reshape(-1) for g in full_batch_gradients(
        model, sample_classification_loss, batch).values()])


def raise_off_the_large_batch(got: torch.Tensor, truth: torch.Tensor, items: int, what: Hint,
                              steps: Hint = ("", "")) -> NoReturn:
    """The hint when no known mistake explains the answer: how far off it is, and the recipe."""
    raise wrong(HINTS["off"], error=((got - truth).norm() / truth.norm()).item(), items=items,
                what=what, steps=steps)


def _window_gradient(answer: object) -> dict:
    """01.3: each usual mistake is recognised by what it leaves in ``.grad``."""
    require(callable(answer), HINTS["not a function"])
    window, model = toy_window(seed=3), make_mlp(5, 8, 3, seed=0)
    summed = summed_loss_gradients(model, window)
    items, k = sum(WINDOW_SIZES), len(WINDOW_SIZES)
    truth = _large_batch_gradient(model, window)
    means = [g / n for g, n in zip(summed, WINDOW_SIZES, strict=True)]
    stale = fill_stale_gradients(model, seed=4)
    answer(model, window)
    grads = [p.grad for p in model.parameters()]
    require(any(g is not None for g in grads), HINTS["empty"])
    got = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                     for p, g in zip(model.parameters(), grads, strict=True)]).detach()
    if same(got, truth):
        return {"k": k, "items": items}
    fresh = got - stale
    require(fresh.abs().max().item() > 0, HINTS["untouched"])
    require(not any(same(fresh, p) for p in (truth, sum(means) / k, sum(means)))
            and not any(_parallel(fresh, p) for p in (truth, means[-1])), HINTS["no zero_grad"])
    *first, last = map(str, WINDOW_SIZES)
    require(not same(got, sum(means) / k), HINTS["mean / k"],
            sizes=", ".join(first) + f" and {last}", sizes_zh="、".join(first) + f" 和 {last}")
    require(not same(got, sum(means)), HINTS["no divisor"])
    require(not _parallel(got, means[-1]), HINTS["last only"])
    require(not _parallel(got, truth), HINTS["scale"], items=items,
            ratio=(got.norm() / truth.norm()).item())
    raise_off_the_large_batch(got, truth, items, ("gradient", "梯度"))


register("01.1", ("find the loop whose step is wrong", "找出更新出错的那个循环"),
         ('the name of the loop whose step is not the large batch\'s, "A" or "B"',
          '更新与大批次不同的那个循环的名字，"A" 或 "B"'),
         ("loop {loop} is the only one whose step differs from the large batch's",
          "只有循环 {loop} 的更新与大批次的不同"),
         _find_the_bug)
register("01.2", ("make a token loss decompose", "让 token 损失可以分解"),
         ("a loss function (model, batch) -> (summed loss, number of real tokens) that "
          "accumulates to the whole batch's token mean",
          "一个损失函数 (model, batch) -> (求和损失, 真实 token 数)，累积起来等于整个批次的 "
          "token 均值"),
         ("your loss decomposes: accumulated = whole-batch token mean to within {tolerance:.0e}",
          "你的损失可以分解：累积的结果等于整个批次的 token 均值，误差在 {tolerance} 以内"),
         _decomposing_loss)
register("01.3", ("write the window's gradient", "写出一个窗口的梯度"),
         ("a function window_gradient(model, micro_batches) that leaves in .grad the gradient of "
          "the mean cross-entropy over all the window's samples",
          "一个函数 window_gradient(model, micro_batches)，在 .grad 中留下整个窗口所有样本平均"
          "交叉熵的梯度"),
         ("your function leaves the large batch's gradient in .grad to within 1e-09, on {k} "
          "uneven micro-batches of {items} samples in all",
          "你的函数留下的正是大批次的梯度，误差在 1e-09 以内：{k} 个大小不等的微批次，共 {items} "
          "个样本"),
         _window_gradient)
