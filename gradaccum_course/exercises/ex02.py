"""Notebook 02's exercises (one device): 02.3 names each usual mistake by its update."""

from collections.abc import Callable
from numbers import Integral

import torch
from torch import nn

import gradaccum_course.exercises.ex01 as ex01  # the toy window, and hints of the same mistakes
from gradaccum_course.exercises import BERT_BASE_CHINESE, GIB, Hint, Numeric, register, require, say
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.memory import memory_budget
from gradaccum_lib.measure.planning import accumulation_steps_for, max_micro_batch_size
from gradaccum_lib.workloads.models import count_bert_parameters, make_mlp

#: the hints, English and Chinese: 02.1's on the micro-batch (then k), on k (the smallest with
#: micro_batch x k >= 256: at least 256 samples, not exactly 256); 02.3's on the
#: steps, on the update (the usual mistakes, with clipping idle and biting)
_HINTS: dict[str, Hint] = {
    "not a pair": ("answer must be a pair of positive integers (micro_batch, k); got {answer!r}",
                   "answer 必须是一对正整数 (micro_batch, k)；实际得到的是 {answer!r}"),
    "does not fit": ("micro-batch {micro} does not fit: its activations, the state (16 bytes per "
                     "parameter, AdamW in fp32) and the reserve need {needed:.1f} GiB, more than "
                     "16; {k_hint[0]}",
                     "微批次 {micro} 放不下：它的激活值、状态（每个参数 16 字节，fp32 下的 "
                     "AdamW）和预留显存共需 {needed:.1f} GiB，超过 16 GiB；{k_hint[1]}"),
    "not the largest": ("micro-batch {micro} fits ({needed:.1f} GiB of 16) but is not the "
                        "largest: divide what the state (16 bytes per parameter) and the reserve "
                        "leave by the activations per sample; {k_hint[0]}",
                        "微批次 {micro} 放得下（16 GiB 中用了 {needed:.1f} GiB），但不是最大的："
                        "用状态（每个参数 16 字节）和预留显存之外剩下的显存，除以每个样本的激活值"
                        "；{k_hint[1]}"),
    "k too small": ("k={k} is too small for micro-batches of {micro}: {micro} x {k} = {samples} < "
                    "256; the effective batch must be at least 256 samples",
                    "k={k} 对大小为 {micro} 的微批次太小：{micro} x {k} = {samples} < 256；"
                    "有效批大小至少要有 256 个样本"),
    "k too large": ("k={k} is more than micro-batches of {micro} need: {micro} x {k} = {samples}, "
                    "and a smaller k also gives at least 256 samples",
                    "k={k} 超出了大小为 {micro} 的微批次所需：{micro} x {k} = {samples}，更小的 "
                    "k 也能凑够至少 256 个样本"),
    "k for another": ("k={k} would be right for micro-batches of {micro}: take the smallest k for "
                      "the micro-batch that fits",
                      "k={k} 对大小为 {micro} 的微批次是对的：应当为放得下的那个微批次取最小的 k"),
    "not a function": ("answer must be a function train_window(model, optimizer, scheduler, "
                       "micro_batches, max_grad_norm)",
                       "answer 必须是一个函数 train_window(model、optimizer、scheduler、"
                       "micro_batches、max_grad_norm)"),
    "never": ("{name}.step() never ran: step it once, after the last micro-batch",
              "{name}.step() 一次都没有运行：在最后一个微批次之后调用它一次"),
    "more than once": ("{name}.step() ran {count} times for one window of {k} "
                       "micro-batches{each[0]}: step it once per window, after the last "
                       "micro-batch",
                       "{name}.step() 在一个有 {k} 个微批次的窗口里运行了 {count} 次{each[1]}："
                       "每个窗口只调用它一次，在最后一个微批次之后"),
    "scheduler first": ("scheduler.step() ran before optimizer.step(), so the step used the next "
                        "step's learning rate: step the scheduler after the optimizer",
                        "scheduler.step() 在 optimizer.step() 之前运行了，于是这次更新用了下一步"
                        "的学习率：应当先更新优化器，再步进调度器"),
    "no zero_grad": ex01.HINTS["no zero_grad"],
    "mean / k": ("you divided each micro-batch's mean loss by k: exact only on equal "
                 "micro-batches; divide each summed loss by the window's {items} samples",
                 "你把每个微批次的平均损失除以了 k：只有微批次大小相等时才精确；应当把每个"
                 "求和损失除以整个窗口的 {items} 个样本"),
    "no divisor": ex01.HINTS["no divisor"],
    "clip every micro-step": ("you clipped after every micro-batch: each clip cuts a partial sum; "
                              "clip once, the window's whole gradient, after the last backward",
                              "你在每个微批次之后都做了裁剪：每次裁剪的都只是部分和；"
                              "应当在最后一次 backward 之后，对整个窗口的梯度只裁剪一次"),
    "no clip": ("your step did not clip: call clip_grad_norm_ with max_grad_norm once, after the "
                "last backward and before optimizer.step()",
                "你的这一步没有裁剪：在最后一次 backward 之后、optimizer.step() 之前，用 "
                "max_grad_norm 调用一次 clip_grad_norm_"),
}
_UNCLIPPED_MISTAKES, _CLIPPING_MISTAKES = (("no zero_grad", "mean / k", "no divisor"),
                                           ("clip every micro-step", "no clip"))


def _fit_a_gpu(answer: object) -> dict:
    require(isinstance(answer, (tuple, list)) and len(answer) == 2
            and all(isinstance(n, Integral) and not isinstance(n, bool) and n > 0
                    for n in answer), _HINTS["not a pair"], answer=answer)
    given_micro, given_k = (int(n) for n in answer)
    device, reserve, per_sample = 16 * GIB, 1 * GIB, 1.1 * GIB
    parameters = count_bert_parameters(BERT_BASE_CHINESE, num_labels=10)
    state = memory_budget(parameters, optimizer="adamw", precision="fp32").total
    micro = max_micro_batch_size(device, parameters, per_sample, optimizer="adamw",
                                 precision="fp32", reserved_bytes=reserve)
    k, own_k = accumulation_steps_for(256, micro), accumulation_steps_for(256, given_micro)
    k_values = {"k": given_k, "micro": given_micro, "samples": given_micro * given_k}
    k_kind = ("k too small" if given_k < own_k else "k too large" if given_k > own_k
              else "k for another")  # what is wrong with k, for the reader's own micro-batch
    k_hint = say(_HINTS[k_kind], **k_values)
    needed = (state + reserve + given_micro * per_sample) / GIB
    require(given_micro <= micro, _HINTS["does not fit"], micro=given_micro, needed=needed,
            k_hint=k_hint)  # the micro-batch first, then k
    require(given_micro >= micro, _HINTS["not the largest"], micro=given_micro,
            needed=needed, k_hint=k_hint)
    require(given_k == k, _HINTS[k_kind], **k_values)
    return {"micro": micro, "k": k, "samples": micro * k}


def _right_window(model: nn.Module, optimizer: torch.optim.Optimizer,
                  scheduler: torch.optim.lr_scheduler.LRScheduler, window: list,
                  max_grad_norm: float) -> None:
    """The window step 02.3 asks for: the library's loop."""
    accumulate_window(model, optimizer, window, sample_classification_loss, scheduler=scheduler,
                      max_grad_norm=max_grad_norm)


def _mistaken_window(model: nn.Module, optimizer: torch.optim.Optimizer,  # noqa: PLR0913
                     scheduler: torch.optim.lr_scheduler.LRScheduler, window: list,
                     max_grad_norm: float, *, mistake: str) -> None:
    """02.3's window step with one usual ``mistake``, deliberately, to measure what it does."""
    if mistake not in (*_UNCLIPPED_MISTAKES, *_CLIPPING_MISTAKES):  # else it is the right loop
        raise ValueError(f"mistake must be one of 02.3's usual mistakes; got {mistake!r}")
    if mistake != "no zero_grad":
        optimizer.zero_grad()
    items = sum(len(labels) for _, labels in window)
    for inputs, labels in window:
        loss = nn.functional.cross_entropy(model(inputs), labels)  # a micro-batch's mean
        divisor = {"mean / k": len(window), "no divisor": 1}.get(mistake, items / len(labels))
        (loss / divisor).backward()
        if mistake == "clip every micro-step":
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if mistake not in ("clip every micro-step", "no clip"):
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()


def _run_window_step(step: Callable, max_grad_norm: float,
                     **options: object) -> tuple[torch.Tensor, list[str]]:
    """Run ``step(model, optimizer, scheduler, window, max_grad_norm, **options)`` on a toy
    model with stale gradients: the update it made, and its optimizer and scheduler steps."""
    window, model, events = ex01.toy_window(seed=5), make_mlp(5, 8, 3, seed=0), []
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ex01.fill_stale_gradients(model, seed=6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # halving; each of its steps recorded
        optimizer, lambda step: events.append("scheduler") or 0.5**step)
    events.clear()  # not the step LambdaLR takes when it is made
    optimizer.register_step_post_hook(lambda *_: events.append("optimizer"))
    step(model, optimizer, scheduler, window, max_grad_norm, **options)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return after - before, events


def _check_step_counts(events: list[str], k: int) -> None:
    """02.3: one optimizer step, then one scheduler step, per window of ``k`` micro-batches."""
    for name in ("optimizer", "scheduler"):
        count = events.count(name)
        require(count > 0, _HINTS["never"], name=name)
        require(count == 1, _HINTS["more than once"], name=name, count=count, k=k,
                each=(" (once per micro-batch)", "（每个微批次一次）") if count == k else ("", ""))
    require(events == ["optimizer", "scheduler"], _HINTS["scheduler first"])


def _window_step(answer: object) -> dict:
    """02.3: a usual mistake is named by its steps or its update, clipping idle, then biting."""
    require(callable(answer), _HINTS["not a function"])
    k, items = len(ex01.WINDOW_SIZES), sum(ex01.WINDOW_SIZES)
    got, events = _run_window_step(answer, max_grad_norm=1e3)  # a norm no clipping reaches
    _check_step_counts(events, k)
    _check_update(got, _run_window_step(_right_window, 1e3)[0], 1e3, _UNCLIPPED_MISTAKES)
    norm = torch.stack(ex01.summed_loss_gradients(make_mlp(5, 8, 3, seed=0),
                                                  ex01.toy_window(seed=5))).sum(0).norm().item()
    clip = norm / items / 4  # clipping bites: the right step's gradient is cut to a quarter
    _check_update(_run_window_step(answer, clip)[0], _run_window_step(_right_window, clip)[0],
                  clip, _CLIPPING_MISTAKES)
    return {"k": k}


def _check_update(got: torch.Tensor, truth: torch.Tensor, max_grad_norm: float,
                  mistakes: tuple[str, ...]) -> None:
    """Name the mistake whose update ``got`` is, unless it is the right one (``truth``)."""
    if ex01.same(got, truth):
        return
    items = sum(ex01.WINDOW_SIZES)
    for mistake in mistakes:
        measured, _ = _run_window_step(_mistaken_window, max_grad_norm, mistake=mistake)
        require(not ex01.same(got, measured), _HINTS[mistake], items=items)
    ex01.raise_off_the_large_batch(got, truth, items, ("update", "更新"),
                                   (", clip once, step once", "；只裁剪一次，只更新一次"))


register("02.1", ("the micro-batch and k for a 16 GiB GPU", "16 GiB GPU 上的微批次和 k"),
         ("a pair (micro_batch, k): the largest micro-batch that fits, and the smallest k with "
          "micro_batch x k >= 256 (at least 256 samples per step, not exactly 256)",
          "一个二元组 (micro_batch, k)：放得下的最大微批次，以及满足 micro_batch x k >= 256 的"
          "最小 k（每次更新至少 256 个样本，不必恰好是 256）"),
         ("micro-batch {micro} fits, and k = {k} gives {samples} samples per step (at least 256)",
          "微批次 {micro} 放得下，k = {k} 时每次更新 {samples} 个样本（至少 256 个）"),
         _fit_a_gpu)
register("02.2", ("the update of a loop that never divides by k", "从不除以 k 的循环的更新"),
         ("a number: how many times the large batch's update the loop's update is",
          "一个数：这个循环的更新是大批次更新的多少倍"),
         ("the update is {truth:.6f} x the large batch's: k times too large",
          "更新是大批次更新的 {truth} 倍：是应有大小的 k 倍"),
         Numeric(lambda loop: {"truth": ex01.sgd_step_error(loop, 4, 2)[1]},
                 ("ratio", "比值"), 1e-6, relative=True, hint=(
             "{answer} is not the measured ratio; each micro-batch's mean loss has the large "
             "batch's scale already, and the loop adds k of them",
             "{answer} 不是测得的比值；每个微批次的平均损失本身就已经是大批次损失的量级，"
             "而循环把 k 个这样的损失加了起来")))
register("02.3", ("write the window's step", "写出一个窗口的训练步"),
         ("a function train_window(model, optimizer, scheduler, micro_batches, max_grad_norm) "
          "that takes the large batch's step: gradients zeroed, one clip, one optimizer step, one "
          "scheduler step",
          "一个函数 train_window(model, optimizer, scheduler, micro_batches, max_grad_norm)，做出"
          "大批次的那次更新：先清零梯度，裁剪一次，优化器更新一次，调度器步进一次"),
         ("one optimizer step and one scheduler step for a window of {k} uneven micro-batches, "
          "clipped once: the large batch's update to within 1e-09",
          "{k} 个大小不等的微批次组成的窗口：优化器更新一次、调度器步进一次、只裁剪一次，更新与大"
          "批次的相同，误差在 1e-09 以内"),
         _window_step)
