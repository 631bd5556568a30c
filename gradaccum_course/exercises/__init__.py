"""The notebooks' exercises, and the checkers that grade a reader's answer.

Each notebook ends with exercises. A reader writes an answer into ``answer`` and runs the
checker cell, ``check_exercise("02.1", answer)``:

* with ``answer = None`` (not attempted yet) the checker says so and passes;
* with a right answer it prints ``✓``, what was checked and the true value, and returns None
  (so a notebook shows no ``Out:`` line);
* with a wrong one it raises :class:`_WrongAnswer` (an ``AssertionError``, so a solution notebook
  fails under nbval), whose message is three lines: ``✗`` and the exercise, what answer was
  expected in words, and a hint. IPython shows that message alone, without a traceback. In the
  Chinese edition all three are in Chinese.

The checkers follow, notebook by notebook, and the table of exercises (:data:`_EXERCISES`) ends
the file. ``checker(answer, **context)`` computes the true answer itself, by running the
library (the budget model, the loop, the ground truth, a real ``DistributedSampler``, the
audited frameworks, a pipeline schedule...), never from a stored value; it returns what it
checked, the true value included, or raises :class:`_WrongAnswer` with a hint that does not
give the value away, in English and in Chinese (its ``zh``, from the same values, for the
Chinese edition). The worked solutions live in ``notebooks/solutions/`` and are executed and
checked by nbval in ``make test``, like the notebooks.
"""

from __future__ import annotations

import copy
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from gradaccum_course.audits.frameworks import accelerate_step
from gradaccum_course.audits.hf_trainer import hf_trainer_step
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import split_into_micro_batches, windows_of
from gradaccum_lib.equivalence import accumulated_gradients, audit_update, full_batch_gradients
from gradaccum_lib.gradients import max_gradient_difference
from gradaccum_lib.losses import bert_classification_loss, sample_classification_loss
from gradaccum_lib.measure.comm import CommCounter
from gradaccum_lib.measure.memory import memory_budget
from gradaccum_lib.measure.noise import scaled_learning_rate
from gradaccum_lib.measure.planning import (
    DdpStepModel,
    accumulation_steps_for,
    max_micro_batch_size,
)
from gradaccum_lib.workloads.models import (
    ROBERTA_WWM_EXT_LARGE,
    TokenTagger,
    count_bert_parameters,
    make_mlp,
    make_tiny_bert,
)

__all__ = ["BERT_BASE_CHINESE", "GIB", "check_exercise"]

GIB = 1024**3
# bert-base-chinese's published configuration (its config.json on the Hugging Face Hub)
BERT_BASE_CHINESE: dict[str, int] = {
    "vocab_size": 21128, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


class _WrongAnswer(AssertionError):
    """A reader's answer that the checker computed to be wrong (the message says how).

    IPython (a notebook's kernel) calls ``_render_traceback_`` instead of printing a traceback,
    so a reader sees the message alone; plain Python prints it under the usual traceback.
    ``zh``: the message in Chinese, where the checker gives one (the Chinese edition's hint);
    ``str(error)`` stays the English message.
    """

    def __init__(self, message: str = "", *, zh: str | None = None) -> None:
        super().__init__(message)
        self.zh = zh

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


@dataclass(frozen=True)
class _Exercise:
    """One exercise: its title, the answer it expects in words, and its checker."""

    title: str
    expects: str  # the answer wanted, in words (never its value)
    checker: Callable[..., str]  # checker(answer, **context) -> what was checked; raises if wrong


def check_exercise(exercise_id: str, answer: object, **context: object) -> None:
    """Grade ``answer`` to exercise ``exercise_id`` (e.g. ``"02.1"``).

    With ``answer`` None it says that there is no answer yet; with a right answer it prints
    ``✓`` and the true value. Either way it returns None. A wrong answer raises
    :class:`_WrongAnswer`: ``✗``, the answer expected in words, and a hint. ``context`` passes
    what an exercise needs from its notebook cell (01.1: ``loops={"A": ..., ...}``; 02.2:
    ``loop=...``). In the Chinese edition (:func:`_language`) the framing is in Chinese, and so
    is the hint (the checker's ``_WrongAnswer.zh``; its English one where it gives none) and what
    the checker says it checked, the true value included (:data:`_CHECKED_ZH`).
    """
    if exercise_id not in _EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; known: {sorted(_EXERCISES)}")
    lang = _language()
    if answer is None:
        print(_no_answer_message(exercise_id, lang))
        return
    try:
        checked = _EXERCISES[exercise_id].checker(answer, **context)
    except _WrongAnswer as wrong:  # one short message, not a chain of two tracebacks
        hint = wrong.zh if lang == "zh" and wrong.zh else str(wrong)
        raise _WrongAnswer(_wrong_message(exercise_id, hint, lang)) from None
    print(_correct_message(exercise_id, checked, lang))


def _language() -> str:
    """Return the language exercise feedback is given in: ``"zh"`` in a kernel started in the
    Chinese edition (``notebooks/zh/`` or its ``solutions/``), else ``"en"``;
    ``GRADACCUM_LANGUAGE=en|zh`` overrides."""
    chosen = os.environ.get("GRADACCUM_LANGUAGE")
    if chosen in ("en", "zh"):
        return chosen
    parts = Path.cwd().parts
    return "zh" if "notebooks" in parts and "zh" in parts[parts.index("notebooks"):] else "en"


def _no_answer_message(exercise_id: str, lang: str = "en") -> str:
    """Return what the checker says when ``answer`` is None."""
    if lang == "zh":
        return (f"练习 {exercise_id}（{_TITLES_ZH.get(exercise_id, _EXERCISES[exercise_id].title)}"
                "）：还没有答案。在上面的单元格里设置 `answer`，再运行这个单元格；参考答案在 "
                "notebooks/zh/solutions/。")
    return (f"Exercise {exercise_id} ({_EXERCISES[exercise_id].title}): no answer yet. Set "
            "`answer` in the cell above and run this cell again; the solution is in "
            "notebooks/solutions/.")


def _correct_message(exercise_id: str, checked: str, lang: str = "en") -> str:
    """Return what the checker prints for a right answer (``checked``: what it checked, as the
    checker says it; in Chinese through :data:`_CHECKED_ZH`)."""
    if lang == "zh":
        return f"✓ 练习 {exercise_id}：正确。{_checked_in_chinese(exercise_id, checked)}"
    return f"✓ Exercise {exercise_id}: correct. {checked}"


_N = r"[-+\d.e]+"  # a number as the checkers print it
#: what each checker says it checked, read back from its English sentence and said in Chinese
#: (the same numbers; tests/test_exercises.py holds every solution's ✓ line to it)
_CHECKED_ZH: dict[str, tuple[str, str]] = {
    "00.1": (rf"bert-base-chinese with a 2-class head has (?P<m>{_N})M parameters",
             "带 2 类分类头的 bert-base-chinese 有 {m}M 个参数"),
    "00.2": (rf"one optimizer step sees (?P<n>{_N}) samples: (?P<b>{_N}) per micro-batch x "
             rf"k=(?P<k>{_N}) x (?P<w>{_N}) ranks",
             "一次优化器更新看到 {n} 个样本：每个微批次 {b} 个 x k={k} x {w} 个进程"),
    "01.1": (r"loop (?P<loop>\w+) is the only one whose step differs from the large batch's",
             "只有循环 {loop} 的更新与大批次的不同"),
    "01.2": (rf"your loss decomposes: accumulated = whole-batch token mean to within (?P<t>{_N})",
             "你的损失可以分解：累积的结果等于整个批次的 token 均值，误差在 {t} 以内"),
    "01.3": (rf"your function leaves the large batch's gradient in \.grad to within (?P<t>{_N}), "
             rf"on (?P<k>{_N}) uneven micro-batches of (?P<n>{_N}) samples in all",
             "你的函数留下的正是大批次的梯度，误差在 {t} 以内：{k} 个大小不等的微批次，"
             "共 {n} 个样本"),
    "02.1": (rf"micro-batch (?P<b>{_N}) fits, and k = (?P<k>{_N}) gives (?P<n>{_N}) samples per "
             "step", "微批次 {b} 放得下，k = {k} 时每次更新 {n} 个样本"),
    "02.2": (rf"the update is (?P<r>{_N}) x the large batch's: k times too large",
             "更新是大批次更新的 {r} 倍：是应有大小的 k 倍"),
    "02.3": (rf"one optimizer step and one scheduler step for a window of (?P<k>{_N}) uneven "
             rf"micro-batches, clipped once: the large batch's update to within (?P<t>{_N})",
             "{k} 个大小不等的微批次组成的窗口：优化器更新一次、调度器步进一次、只裁剪一次，"
             "更新与大批次的相同，误差在 {t} 以内"),
    "03.1": (rf"each token of the short micro-batch weighs (?P<r>{_N}) x its true weight",
             "短微批次里每个 token 的权重是它真实权重的 {r} 倍"),
    "03.2": (rf"dividing by (?P<d>{_N}) = (?P<t>{_N}) window tokens / (?P<w>{_N}) ranks on each "
             "rank, then DDP's average over ranks, gives every token the weight of the "
             "window's token mean",
             "每个进程都除以 {d} = 窗口的 {t} 个 token / {w} 个进程，再经 DDP 在进程间取平均，"
             "每个 token 得到的正是它在窗口 token 均值里的权重"),
    "04.1": (rf"k = (?P<k>{_N}): 4 per GPU x 8 GPUs x (?P<k2>{_N}) = (?P<n>{_N}) samples per "
             "optimizer step",
             "k = {k}：每张 GPU 4 个 x 8 张 GPU x {k2} = 每次优化器更新 {n} 个样本"),
    "04.2": (rf"(?P<p>{_N})M parameters x 16 bytes = (?P<g>{_N}) GB per GPU, at k = 16 as at "
             "k = 8", "{p}M 个参数 x 16 字节 = 每张 GPU {g} GB，k = 16 和 k = 8 时一样"),
    "04b.1": (rf"the Trainer's SGD update is (?P<r>{_N}) x the true one",
              "Trainer 的 SGD 更新是真实更新的 {r} 倍"),
    "04b.2": (rf"Accelerate's SGD update on 2 of 4 micro-batches is (?P<r>{_N}) x the true one: "
              "each loss divided by 4, though 2 came",
              "4 个微批次只来了 2 个时，Accelerate 的 SGD 更新是真实更新的 {r} 倍：每个损失都"
              "除以 4，尽管只来了 2 个"),
    "05.1": (rf"(?P<b>{_N}) bytes = 3 windows x (?P<p>{_N}) bytes of gradients: one all-reduce "
             "per window, whatever k",
             "{b} 字节 = 3 个窗口 x 每个窗口 {p} 字节的梯度：不论 k 是多少，每个窗口全规约一次"),
    "05.2": (rf"rank 0 gets (?P<s>{_N}) samples, (?P<m>{_N}) micro-batches, (?P<w>{_N}) windows: "
             rf"(?P<n>{_N}) optimizer steps \(the last window is partial\)",
             "0 号进程分到 {s} 个样本、{m} 个微批次、{w} 个窗口：{n} 次优化器更新（最后一个"
             "窗口不满）"),
    "05.3": (rf"your ddp_window on (?P<w>{_N}) gloo ranks, (?P<n>{_N}) windows of (?P<k>{_N}) "
             "uneven micro-batches: one all-reduce per window, at the last micro-step; the "
             rf"gradient is the large batch's within (?P<t>{_N}); the count all-reduced on the "
             "model's device",
             "你的窗口函数在 {w} 个进程上跑了 {n} 个窗口，每个窗口 {k} 个大小不一的微批次：每个"
             "窗口只全规约一次，就在最后一个微步；梯度与大批次的梯度相差在 {t} 以内；计数在模型"
             "所在的设备上全规约"),
    "06.1": (rf"the square-root rule gives (?P<lr>{_N}) for an effective batch of (?P<b>{_N})",
             "有效批大小为 {b} 时，平方根规则给出 {lr}"),
    "06.2": (rf"(?P<m>{_N}) micro-batches with k = (?P<k>{_N}): (?P<n>{_N}) optimizer and "
             "scheduler steps", "{m} 个微批次、k = {k}：优化器更新 {n} 次，调度器也步进 {n} 次"),
    "07.1": (rf"the first step of epoch 2 adds up (?P<n>{_N}) micro-batches: (?P<l>{_N}) left "
             rf"over from epoch 1 and (?P<o>{_N}) of its own",
             "第 2 个 epoch 的第一次更新累加了 {n} 个微批次：{l} 个是第 1 个 epoch 剩下的，"
             "{o} 个是它自己的"),
    "07.2": (rf"(?P<e>{_N}) epochs of (?P<m>{_N}) micro-batches with k = (?P<k>{_N}): "
             rf"(?P<n>{_N}) optimizer steps, so a schedule (?P<n2>{_N}) steps long",
             "{e} 个 epoch、每个 {m} 个微批次、k = {k}：优化器更新 {n} 次，所以调度长 {n2} 步"),
    "08.1": (rf"after two schedule steps the gradient is (?P<a>{_N}) g1 \+ (?P<b>{_N}) g2: "
             rf"a / b = (?P<r>{_N}), the first window divided by 4 twice",
             "两个调度步之后，梯度是 {a} g1 + {b} g2：a / b = {r}，第一个窗口被除了两次 4"),
    "08.2": (rf"the window routes half its tokens to each expert, with mean probabilities "
             rf"\((?P<p>[^)]*)\): loss (?P<l>{_N}), where each micro-batch's own is (?P<e>{_N})",
             "窗口把一半的 token 路由给每个专家，平均概率为 ({p})：损失 {l}，而每个微批次自己"
             "的损失是 {e}"),
    "09.1": (rf"at k = 4 with no_sync, communication is (?P<s>{_N}) of the step \(0.6 at k = 1\)",
             "每个窗口只同步一次、k = 4 时，通信占一步的 {s}（k = 1 时是 0.6）"),
    "09.2": (rf"each rank gets (?P<r>{_N}) records, (?P<m>{_N}) micro-batches: (?P<n>{_N}) "
             "optimizer steps", "每个进程分到 {r} 条病历、{m} 个微批次：{n} 次优化器更新"),
}


def _checked_in_chinese(exercise_id: str, checked: str) -> str:
    """``checked`` said in Chinese, with its numbers; as it is where no pattern reads it."""
    pattern, chinese = _CHECKED_ZH.get(exercise_id, (None, None))
    found = re.fullmatch(pattern, checked) if pattern else None
    return chinese.format(**found.groupdict()) if found else checked


def _wrong_message(exercise_id: str, hint: str, lang: str = "en") -> str:
    """Return the three lines of a wrong answer: ✗, the answer expected, the hint."""
    exercise = _EXERCISES[exercise_id]
    if lang == "zh":
        return (f"✗ 练习 {exercise_id}（{_TITLES_ZH.get(exercise_id, exercise.title)}）：还不对。\n"
                f"应当给出：{_EXPECTS_ZH.get(exercise_id, exercise.expects)}。\n提示：{hint}")
    return (f"✗ Exercise {exercise_id} ({exercise.title}): not right yet.\n"
            f"Expected: {exercise.expects}.\nHint: {hint}")


# ---- the checkers, notebook by notebook ------------------------------------------------

def _number(answer: object, label: str, label_zh: str) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        got = f"{type(answer).__name__} {answer!r}"
        raise _WrongAnswer(f"{label} must be a number; got {got}",
                          zh=f"{label_zh}必须是一个数；实际得到的是 {got}")
    return float(answer)


def _require(condition: bool, message: str, *, zh: str) -> None:
    """Raise :class:`_WrongAnswer` with ``message`` and its Chinese ``zh`` unless ``condition``
    (every hint has both: the Chinese edition shows ``zh``)."""
    if not condition:
        raise _WrongAnswer(message, zh=zh)



# ---- 00: the article ----------------------------------------------------------------------

def _bert_base_parameters(answer: object) -> str:
    millions = count_bert_parameters(BERT_BASE_CHINESE, num_labels=2) / 1e6
    given = _number(answer, "answer (millions of parameters)", "answer（参数量，以百万计）")
    _require(abs(given - millions) <= 1.0,
             f"{given:g}M is not within 1M of the count; count the embeddings (vocabulary x "
             "hidden), then 12 layers of attention (4 h x h) and feed-forward (2 h x 4h)",
             zh=f"{given:g}M 与实际参数量相差超过 1M；先数嵌入层（词表大小 x 隐藏维度），"
                "再数 12 层的注意力（4 h x h）和前馈层（2 h x 4h）")
    return f"bert-base-chinese with a 2-class head has {millions:.2f}M parameters"


def _ddp_effective_batch(answer: object) -> str:
    micro, k, world = 32, 8, 8
    seen = 0
    for rank in range(world):  # what each rank's loader feeds into its first window
        sampler = DistributedSampler(range(100_000), num_replicas=world, rank=rank,
                                     shuffle=False)
        loader = DataLoader(range(100_000), batch_size=micro, sampler=sampler)
        seen += sum(len(batch) for batch in next(windows_of(loader, k)))
    _require(_number(answer, "answer (samples)", "answer（样本数）") == seen,
             f"{answer} is not it: under DDP every one of the {world} ranks runs the whole loop "
             "on its own share of the data",
             zh=f"{answer} 不对：在 DDP 下，{world} 个进程每个都在自己分到的那份数据上跑完整的"
                "循环")
    return (f"one optimizer step sees {seen} samples: {micro} per micro-batch x k={k} x "
            f"{world} ranks")


# ---- 01: the math -------------------------------------------------------------------------

def _sgd_step_error(loop: Callable, accumulation_steps: int, seed: int) -> tuple[float, float]:
    """Run ``loop(model, SGD(lr=1), micro_batches, k)`` for one window of a toy problem;
    return the largest difference of its update from the large batch's step, and the ratio of
    the two updates' norms."""
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


def _find_the_bug(answer: object, *, loops: Mapping[str, Callable]) -> str:
    wrong = [name for name, loop in loops.items() if _sgd_step_error(loop, 4, 0)[0] > 1e-10]
    _require(answer in loops, f"answer must be one of {sorted(loops)}; got {answer!r}",
             zh=f"answer 必须是 {sorted(loops)} 之一；实际得到的是 {answer!r}")
    _require([answer] == wrong, f"loop {answer} takes the large-batch step; look again",
             zh=f"循环 {answer} 做的正是大批次的那次更新；再仔细看看")
    return f"loop {answer} is the only one whose step differs from the large batch's"


def _decomposing_loss(answer: object) -> str:
    _require(callable(answer), "answer must be a loss function (model, batch) -> (sum, count)",
             zh="answer 必须是一个损失函数 (model, batch) -> (求和损失, 计数)")
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
    tolerance = 1e-10
    _require(error <= tolerance, f"accumulating your loss over 3 micro-batches is "
                                 f"{error:.2e} away from the token mean of the whole batch",
             zh=f"把你的损失在 3 个微批次上累积，结果与整个批次的 token 均值相差 {error:.2e}")
    # the bound, not the error: a right answer's error is rounding noise (2.8e-17 on one CPU,
    # 3.5e-17 on another), whose digits a committed output must not print
    return (f"your loss decomposes: accumulated = whole-batch token mean to within "
            f"{tolerance:.0e}")


_WINDOW_SIZES = (7, 3, 5, 1)  # uneven micro-batches (01.3, 02.3): where dividing by k is wrong


def _toy_window(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A window of (inputs, labels) micro-batches of :data:`_WINDOW_SIZES` samples (float64
    inputs of 5 features, 3 classes), for :func:`make_mlp` ``(5, 8, 3)``."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(sum(_WINDOW_SIZES), 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (sum(_WINDOW_SIZES),), generator=generator)
    return list(zip(inputs.split(_WINDOW_SIZES), labels.split(_WINDOW_SIZES), strict=True))


def _summed_loss_gradients(model: nn.Module, window: list) -> list[torch.Tensor]:
    """Each micro-batch's gradient of its SUMMED cross-entropy, flattened (``.grad`` untouched)."""
    return [torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        nn.functional.cross_entropy(model(x), y, reduction="sum"), list(model.parameters()))])
        for x, y in window]


def _fill_stale_gradients(model: nn.Module, seed: int) -> torch.Tensor:
    """Put an earlier window's gradient (random) into ``.grad``, as training leaves it; return
    it flattened."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float64 rounding."""
    return (a - b).abs().max().item() <= 1e-9 * b.abs().max().item()


def _parallel(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same direction, whatever the length."""
    return nn.functional.cosine_similarity(a, b, dim=0).item() > 1 - 1e-9


def _large_batch_gradient(model: nn.Module, window: list) -> torch.Tensor:
    """The gradient of the mean cross-entropy over every sample of ``window``, flattened: the
    library's ground truth (:func:`full_batch_gradients`) on the window's micro-batches joined."""
    batch = tuple(torch.cat(parts) for parts in zip(*window, strict=True))
    return torch.cat([g.reshape(-1) for g in full_batch_gradients(
        model, sample_classification_loss, batch).values()])


def _raise_off_the_large_batch(got: torch.Tensor, truth: torch.Tensor, what: str, what_zh: str,
                               items: int, *, clip_and_step: bool = False) -> None:
    """The hint when no known mistake explains the answer: how far off it is, and the recipe."""
    error = ((got - truth).norm() / truth.norm()).item()
    steps, steps_zh = ((", clip once, step once", "；只裁剪一次，只更新一次") if clip_and_step
                       else ("", ""))
    raise _WrongAnswer(
        f"your {what} is {error:.0%} off the large batch's: backward each micro-batch's summed "
        f"loss divided by the window's {items} samples{steps}",
        zh=f"你的{what_zh}与大批次的{what_zh}相差 {error:.0%}：对每个微批次的求和损失除以整个"
           f"窗口的 {items} 个样本，再调用 backward{steps_zh}")


def _window_gradient(answer: object) -> str:
    """01.3: ``answer(model, micro_batches)`` must leave in ``.grad`` the gradient of the mean
    cross-entropy over the window; each usual mistake is recognised by what it leaves there."""
    _require(callable(answer), "answer must be a function window_gradient(model, micro_batches)",
             zh="answer 必须是一个函数 window_gradient(model, micro_batches)")
    window, model = _toy_window(seed=3), make_mlp(5, 8, 3, seed=0)
    summed = _summed_loss_gradients(model, window)
    items, k = sum(_WINDOW_SIZES), len(_WINDOW_SIZES)
    truth = _large_batch_gradient(model, window)
    means = [g / n for g, n in zip(summed, _WINDOW_SIZES, strict=True)]
    stale = _fill_stale_gradients(model, seed=4)
    answer(model, window)
    grads = [p.grad for p in model.parameters()]
    _require(any(g is not None for g in grads),
             ".grad is empty after your function: call backward() on each micro-batch's loss",
             zh="运行你的函数之后 .grad 是空的：对每个微批次的损失调用 backward()")
    got = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                     for p, g in zip(model.parameters(), grads, strict=True)]).detach()
    if _same(got, truth):
        return (f"your function leaves the large batch's gradient in .grad to within 1e-09, "
                f"on {k} uneven micro-batches of {items} samples in all")
    fresh = got - stale
    _require(fresh.abs().max().item() > 0,
             ".grad is as your function found it: nothing was backpropagated into it",
             zh=".grad 还是你的函数拿到它时的样子：没有任何梯度被反向传播进去")
    _require(not any(_same(fresh, p) for p in (truth, sum(means) / k, sum(means)))
             and not any(_parallel(fresh, p) for p in (truth, means[-1])),
             "your gradient was added to the one .grad already held (an earlier window's): "
             "zero the gradients before the first micro-batch",
             zh="你的梯度被加到了 .grad 里原有的梯度（上一个窗口的）上：在第一个微批次之前先把"
                "梯度清零")
    sizes = ", ".join(map(str, _WINDOW_SIZES[:-1])) + f" and {_WINDOW_SIZES[-1]}"
    sizes_zh = "、".join(map(str, _WINDOW_SIZES[:-1])) + f" 和 {_WINDOW_SIZES[-1]}"
    _require(not _same(got, sum(means) / k),
             f"you divided each micro-batch's mean loss by k: exact only on equal micro-batches, "
             f"and these hold {sizes} samples; divide each summed loss by the window's count",
             zh=f"你把每个微批次的平均损失除以了 k：只有微批次大小相等时才精确，而这里的微批次"
                f"分别有 {sizes_zh} 个样本；应当把每个求和损失除以整个窗口的样本数")
    _require(not _same(got, sum(means)),
             "you added the micro-batches' mean losses without dividing: k means, each already "
             "on the large batch's scale",
             zh="你把各微批次的平均损失直接加了起来，没有做除法：k 个均值，每一个本身就已经是"
                "大批次损失的量级")
    _require(not _parallel(got, means[-1]),
             "only the last micro-batch's gradient reached .grad (backward ran on it alone, or "
             "the gradients were zeroed inside the loop): every micro-batch must add its own",
             zh="只有最后一个微批次的梯度进了 .grad（只对它调用了 backward，或者在循环里清零了"
                "梯度）：每个微批次都要把自己的梯度加进去")
    ratio = (got.norm() / truth.norm()).item()
    _require(not _parallel(got, truth),
             f"your gradient points the right way but is {ratio:.3g} x the large batch's: divide "
             f"the summed losses by the window's {items} samples, once",
             zh=f"你的梯度方向对了，但大小是大批次梯度的 {ratio:.3g} 倍：把求和损失除以整个窗口"
                f"的 {items} 个样本，只除这一次")
    _raise_off_the_large_batch(got, truth, "gradient", "梯度", items)


# ---- 02: one device -----------------------------------------------------------------------

def _fit_a_gpu(answer: object) -> str:
    _require(isinstance(answer, (tuple, list)) and len(answer) == 2
             and all(isinstance(n, Integral) and not isinstance(n, bool) and n > 0
                     for n in answer),
             f"answer must be a pair of positive integers (micro_batch, k); got {answer!r}",
             zh=f"answer 必须是一对正整数 (micro_batch, k)；实际得到的是 {answer!r}")
    given_micro, given_k = (int(n) for n in answer)
    device, reserve, per_sample = 16 * GIB, 1 * GIB, 1.1 * GIB
    parameters = count_bert_parameters(BERT_BASE_CHINESE, num_labels=10)
    state = memory_budget(parameters, optimizer="adamw", precision="fp32").total
    micro = max_micro_batch_size(device, parameters, per_sample, optimizer="adamw",
                                 precision="fp32", reserved_bytes=reserve)
    k = accumulation_steps_for(256, micro)
    if given_micro != micro:  # the micro-batch first; then whether k matches the reader's own
        needed = (state + reserve + given_micro * per_sample) / GIB
        hint = (f"micro-batch {given_micro} does not fit: its activations, the state (16 bytes "
                f"per parameter, AdamW in fp32) and the reserve need {needed:.1f} GiB, more "
                "than 16" if given_micro > micro else
                f"micro-batch {given_micro} fits ({needed:.1f} GiB of 16) but is not the "
                "largest: divide what the state (16 bytes per parameter) and the reserve leave "
                "by the activations per sample")
        hint_zh = (f"微批次 {given_micro} 放不下：它的激活值、状态（每个参数 16 字节，fp32 下的 "
                   f"AdamW）和预留显存共需 {needed:.1f} GiB，超过 16 GiB" if given_micro > micro
                   else f"微批次 {given_micro} 放得下（16 GiB 中用了 {needed:.1f} GiB），但不是"
                   "最大的：用状态（每个参数 16 字节）和预留显存之外剩下的显存，除以每个样本的"
                   "激活值")
        k_hint, k_hint_zh = _k_hint(given_micro, given_k)
        raise _WrongAnswer(f"{hint}; {k_hint}", zh=f"{hint_zh}；{k_hint_zh}")
    k_hint, k_hint_zh = _k_hint(micro, given_k)
    _require(given_k == k, k_hint, zh=k_hint_zh)
    return f"micro-batch {micro} fits, and k = {k} gives {micro * k} samples per step"


def _k_hint(micro: int, k: int) -> tuple[str, str]:
    """What is wrong with ``k`` for micro-batches of ``micro`` (02.1), in words: in English and
    in Chinese."""
    samples, smallest = micro * k, accumulation_steps_for(256, micro)
    if k < smallest:
        return (f"k={k} is too small for micro-batches of {micro}: {micro} x {k} = {samples} "
                "< 256",
                f"k={k} 对大小为 {micro} 的微批次太小：{micro} x {k} = {samples} < 256")
    if k > smallest:
        return (f"k={k} is more than micro-batches of {micro} need: {micro} x {k} = {samples}, "
                "and a smaller k reaches 256 too",
                f"k={k} 超出了大小为 {micro} 的微批次所需：{micro} x {k} = {samples}，更小的 k "
                "也能达到 256")
    return (f"k={k} would be right for micro-batches of {micro}: take the smallest k for the "
            "micro-batch that fits",
            f"k={k} 对大小为 {micro} 的微批次是对的：应当为放得下的那个微批次取最小的 k")


def _forgot_to_divide(answer: object, *, loop: Callable) -> str:
    _, ratio = _sgd_step_error(loop, 4, 2)
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - ratio) <= 1e-6 * ratio,
             f"{answer} is not the measured ratio; each micro-batch's mean loss has the "
             "large batch's scale already, and the loop adds k of them",
             zh=f"{answer} 不是测得的比值；每个微批次的平均损失本身就已经是大批次损失的量级，"
                "而循环把 k 个这样的损失加了起来")
    return f"the update is {ratio:.6f} x the large batch's: k times too large"


class _RecordedSchedule(torch.optim.lr_scheduler.LambdaLR):
    """A schedule that halves the learning rate every step and writes each step into
    ``events`` (02.3)."""

    def __init__(self, optimizer: torch.optim.Optimizer, events: list[str]) -> None:
        super().__init__(optimizer, lambda step: 0.5**step)
        self.events = events

    def step(self, *args: object, **kwargs: object) -> None:
        if hasattr(self, "events"):  # not the step LambdaLR takes when it is made
            self.events.append("scheduler")
        super().step(*args, **kwargs)


def _right_window(model: nn.Module, optimizer: torch.optim.Optimizer,
                  scheduler: torch.optim.lr_scheduler.LRScheduler, window: list,
                  max_grad_norm: float) -> None:
    """The window step 02.3 asks for: the library's loop (the summed cross-entropy, divided by
    the window's count)."""
    accumulate_window(model, optimizer, window, sample_classification_loss, scheduler=scheduler,
                      max_grad_norm=max_grad_norm)


def _mistaken_window(model: nn.Module, optimizer: torch.optim.Optimizer,  # noqa: PLR0913
                     scheduler: torch.optim.lr_scheduler.LRScheduler, window: list,
                     max_grad_norm: float, *, mistake: str) -> None:
    """One usual mistake of 02.3's window step, deliberately wrong, to measure what it does:
    ``"no zero_grad"``, ``"mean / k"``, ``"no divisor"``, ``"clip every micro-step"`` or
    ``"no clip"`` (the right step is :func:`_right_window`)."""
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
    """Run ``step(model, optimizer, scheduler, window, max_grad_norm, **options)`` on a fresh
    toy model with an earlier window's gradient in ``.grad``, SGD and a halving schedule; return
    the update it made (flattened) and the order of its optimizer and scheduler steps."""
    window, model, events = _toy_window(seed=5), make_mlp(5, 8, 3, seed=0), []
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    _fill_stale_gradients(model, seed=6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = _RecordedSchedule(optimizer, events)
    optimizer.register_step_post_hook(lambda *_: events.append("optimizer"))
    step(model, optimizer, scheduler, window, max_grad_norm, **options)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return after - before, events


def _check_step_counts(events: list[str], k: int) -> None:
    """02.3: one optimizer step, then one scheduler step, per window of ``k`` micro-batches."""
    for name, count in (("optimizer", events.count("optimizer")),
                        ("scheduler", events.count("scheduler"))):
        _require(count > 0, f"{name}.step() never ran: step it once, after the last micro-batch",
                 zh=f"{name}.step() 一次都没有运行：在最后一个微批次之后调用它一次")
        _require(count == 1,
                 f"{name}.step() ran {count} times for one window of {k} micro-batches"
                 + (" (once per micro-batch)" if count == k else "")
                 + ": step it once per window, after the last micro-batch",
                 zh=f"{name}.step() 在一个有 {k} 个微批次的窗口里运行了 {count} 次"
                    + ("（每个微批次一次）" if count == k else "")
                    + "：每个窗口只调用它一次，在最后一个微批次之后")
    _require(events == ["optimizer", "scheduler"],
             "scheduler.step() ran before optimizer.step(), so the step used the next step's "
             "learning rate: step the scheduler after the optimizer",
             zh="scheduler.step() 在 optimizer.step() 之前运行了，于是这次更新用了下一步的学习率"
                "：应当先更新优化器，再步进调度器")


_UNCLIPPED_MISTAKES = {  # what 02.3's usual mistakes do to the update, with clipping idle
    "no zero_grad": ("your gradient was added to the one .grad already held (an earlier "
                     "window's): zero the gradients before the first micro-batch",
                     "你的梯度被加到了 .grad 里原有的梯度（上一个窗口的）上：在第一个微批次之前先"
                     "把梯度清零"),
    "mean / k": ("you divided each micro-batch's mean loss by k: exact only on equal "
                 "micro-batches; divide each summed loss by the window's {items} samples",
                 "你把每个微批次的平均损失除以了 k：只有微批次大小相等时才精确；应当把每个"
                 "求和损失除以整个窗口的 {items} 个样本"),
    "no divisor": ("you added the micro-batches' mean losses without dividing: k means, each "
                   "already on the large batch's scale",
                   "你把各微批次的平均损失直接加了起来，没有做除法：k 个均值，每一个本身就已经"
                   "是大批次损失的量级"),
}


def _window_step(answer: object) -> str:
    """02.3: ``answer(model, optimizer, scheduler, micro_batches, max_grad_norm)`` must take the
    large batch's step; each usual mistake is recognised by its step counts or its update,
    first with clipping idle, then with clipping that bites."""
    _require(callable(answer), "answer must be a function train_window(model, optimizer, "
                               "scheduler, micro_batches, max_grad_norm)",
             zh="answer 必须是一个函数 train_window(model、optimizer、scheduler、micro_batches、"
                "max_grad_norm)")
    k, items = len(_WINDOW_SIZES), sum(_WINDOW_SIZES)
    got, events = _run_window_step(answer, max_grad_norm=1e3)  # a norm no clipping reaches
    _check_step_counts(events, k)
    _check_update(got, _run_window_step(_right_window, 1e3)[0], 1e3, _UNCLIPPED_MISTAKES)
    norm = torch.stack(_summed_loss_gradients(make_mlp(5, 8, 3, seed=0), _toy_window(seed=5))
                       ).sum(0).norm().item() / items
    clip = norm / 4  # clipping bites: the right step's gradient is cut to a quarter
    _check_update(_run_window_step(answer, clip)[0], _run_window_step(_right_window, clip)[0],
                  clip, _CLIPPING_MISTAKES)
    return (f"one optimizer step and one scheduler step for a window of {k} uneven "
            f"micro-batches, clipped once: the large batch's update to within 1e-09")


_CLIPPING_MISTAKES = {  # what 02.3's clipping mistakes do to the update, with clipping biting
    "clip every micro-step": ("you clipped after every micro-batch: each clip cuts a partial "
                              "sum; clip once, the window's whole gradient, after the last "
                              "backward",
                              "你在每个微批次之后都做了裁剪：每次裁剪的都只是部分和；应当在最后"
                              "一次 backward 之后，对整个窗口的梯度只裁剪一次"),
    "no clip": ("your step did not clip: call clip_grad_norm_ with max_grad_norm once, after "
                "the last backward and before optimizer.step()",
                "你的这一步没有裁剪：在最后一次 backward 之后、optimizer.step() 之前，用 "
                "max_grad_norm 调用一次 clip_grad_norm_"),
}


def _check_update(got: torch.Tensor, truth: torch.Tensor, max_grad_norm: float,
                  mistakes: Mapping[str, tuple[str, str]]) -> None:
    """Pass when ``got`` is the right step's update; else name the mistake whose update it is
    (measured on the same window), or say how far off it is."""
    if _same(got, truth):
        return
    items = sum(_WINDOW_SIZES)
    for mistake, (hint, hint_zh) in mistakes.items():
        measured, _ = _run_window_step(_mistaken_window, max_grad_norm, mistake=mistake)
        _require(not _same(got, measured), hint.format(items=items),
                 zh=hint_zh.format(items=items))
    _raise_off_the_large_batch(got, truth, "update", "更新", items, clip_and_step=True)


# ---- 03: tokens ---------------------------------------------------------------------------

def _mean_of_means_weight(answer: object) -> str:
    token_losses = torch.rand(40, dtype=torch.float64, requires_grad=True)
    mean_of_means = (token_losses[:10].mean() + token_losses[10:].mean()) / 2
    (mean_of_means_weights,) = torch.autograd.grad(mean_of_means, token_losses)
    (true_weights,) = torch.autograd.grad(token_losses.mean(), token_losses)
    ratio = (mean_of_means_weights[0] / true_weights[0]).item()
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - ratio) <= 1e-9,
             f"{answer} is not the weight ratio; write both means as weights on each token",
             zh=f"{answer} 不是权重之比；把两种均值都写成每个 token 上的权重")
    return f"each token of the short micro-batch weighs {ratio:g} x its true weight"


def _global_normaliser(answer: object) -> str:
    counts = {0: (120, 40), 1: (80, 10)}
    token_losses = torch.rand(sum(map(sum, counts.values())), dtype=torch.float64,
                              requires_grad=True)
    given = _number(answer, "answer (divisor)", "answer（除数）")
    _require(given > 0, "a divisor must be positive", zh="除数必须为正")
    per_rank, start = [], 0
    for rank_counts in counts.values():  # each rank divides its own sum by the answer
        size = sum(rank_counts)
        per_rank.append(token_losses[start:start + size].sum() / given)
        start += size
    (ranks,) = torch.autograd.grad(sum(per_rank) / len(counts), token_losses)  # DDP averages
    (truth,) = torch.autograd.grad(token_losses.mean(), token_losses)
    _require(torch.allclose(ranks, truth, rtol=1e-12, atol=0),
             f"dividing by {given:g} gives each token weight {ranks[0].item():.3g}, not "
             f"{truth[0].item():.3g}; remember DDP averages the ranks' gradients",
             zh=f"除以 {given:g} 时每个 token 的权重是 {ranks[0].item():.3g}，而不是 "
                f"{truth[0].item():.3g}；别忘了 DDP 会对各进程的梯度取平均")
    return (f"dividing by {given:g} = {sum(map(sum, counts.values()))} window tokens / "
            f"{len(counts)} ranks on each rank, then DDP's average over ranks, gives every "
            "token the weight of the window's token mean")


# ---- 04: the case study -------------------------------------------------------------------

def _k_for_the_cluster(answer: object) -> str:
    k = accumulation_steps_for(256, 4, world_size=8)
    _require(_number(answer, "answer (k)", "answer（k）") == k,
             f"k={answer} gives {4 * 8 * answer} samples",
             zh=f"k={answer} 给出的是 {4 * 8 * answer} 个样本")
    return f"k = {k}: 4 per GPU x 8 GPUs x {k} = {4 * 8 * k} samples per optimizer step"


def _adamw_state_gigabytes(answer: object) -> str:
    parameters = count_bert_parameters(ROBERTA_WWM_EXT_LARGE, num_labels=10)
    gigabytes = memory_budget(parameters, optimizer="adamw", precision="fp32").total / 1e9
    given = _number(answer, "answer (GB)", "answer（GB）")
    _require(abs(given - gigabytes) <= 0.1,
             f"{given:g} GB is not within 0.1 GB of the state; k moves only the activations, "
             "and fp32 weights, gradients and AdamW's two moments take 4 bytes each per parameter",
             zh=f"{given:g} GB 与状态的大小相差超过 0.1 GB；k 只改变激活值，而 fp32 的权重、梯度"
                "以及 AdamW 的一阶矩和二阶矩，每个参数各占 4 字节")
    return (f"{parameters / 1e6:.1f}M parameters x 16 bytes = {gigabytes:.2f} GB per GPU, "
            "at k = 16 as at k = 8")


# ---- 04b: the framework audit ---------------------------------------------------------------

def _tiny_bert_window(micro_batches: int) -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    model = make_tiny_bert(30, 2, hidden_size=16, num_layers=1, num_heads=2, max_length=16)
    generator = torch.Generator().manual_seed(3)
    return model, [{"input_ids": torch.randint(1, 30, (2, 8), generator=generator),
                    "attention_mask": torch.ones(2, 8, dtype=torch.long),
                    "labels": torch.randint(0, 2, (2,), generator=generator)}
                   for _ in range(micro_batches)]


def _trainer_factor(answer: object) -> str:
    model, micro_batches = _tiny_bert_window(4)
    result = audit_update(hf_trainer_step(4), model, bert_classification_loss, micro_batches,
                          lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - result.norm_ratio) <= 1e-3,
             f"{answer} is not the measured ratio; section 1 of notebook 04b audits the "
             "🤗 Trainer against the ground truth",
             zh=f"{answer} 不是测得的比值；笔记本 04b 第 1 节用基准真值审计了 🤗 Trainer")
    return f"the Trainer's SGD update is {result.norm_ratio:.4f} x the true one"


def _accelerate_partial_window(answer: object) -> str:
    model, micro_batches = _tiny_bert_window(2)
    result = audit_update(accelerate_step(4), model, bert_classification_loss, micro_batches,
                          lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - result.norm_ratio) <= 1e-3,
             f"{answer} is not the measured ratio; ask what `accelerator.backward` divides "
             "each loss by, and how many micro-batches came",
             zh=f"{answer} 不是测得的比值；想一想 `accelerator.backward` 把每个损失除以了多少，"
                "而实际来了几个微批次")
    return (f"Accelerate's SGD update on 2 of 4 micro-batches is {result.norm_ratio:.4f} x the "
            "true one: each loss divided by 4, though 2 came")


# ---- 05: DDP ------------------------------------------------------------------------------

def _allreduce_bytes(answer: object) -> str:
    model = make_mlp(10, 32, 4, seed=0)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            ddp = DistributedDataParallel(model)
            counter = CommCounter()
            counter.register(ddp)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            inputs = torch.randn(48, 10, generator=torch.Generator().manual_seed(4),
                                 dtype=torch.float64)
            micro_batches = split_into_micro_batches((inputs, torch.arange(48) % 4),
                                                     micro_batch_size=4)
            for window in windows_of(micro_batches, 4):
                accumulate_window(ddp, optimizer, window, sample_classification_loss)
            sent = counter.take()["bytes"]
            del ddp, optimizer, counter  # the reducer goes before its process group does
        finally:
            dist.destroy_process_group()
    _require(_number(answer, "answer (bytes)", "answer（字节数）") == sent,
             f"{answer} bytes is not what DDP handed to all-reduce; count the all-reduces "
             "of an epoch (the library's loop syncs under no_sync) and the float64 gradient of "
             "each",
             zh=f"{answer} 字节不是 DDP 交给全规约的字节数；数一数一个 epoch 里有几次全规约"
                "（本库的循环用 no_sync 控制梯度同步），以及每次全规约的 float64 梯度")
    return (f"{sent} bytes = 3 windows x {parameter_bytes} bytes of gradients: one all-reduce "
            "per window, whatever k")


def _steps_per_epoch(answer: object) -> str:
    steps = 0
    sampler = DistributedSampler(range(50), num_replicas=2, rank=0, shuffle=False)
    for _window in windows_of(DataLoader(range(50), batch_size=4, sampler=sampler), 2):
        steps += 1
    _require(_number(answer, "answer (optimizer steps)", "answer（优化器更新次数）") == steps,
             f"{answer} is not the number of windows rank 0 sees; count its samples, then "
             "its micro-batches, then windows of k (a partial last window steps too)",
             zh=f"{answer} 不是 0 号进程看到的窗口数；先数它的样本，再数它的微批次，最后数 k 个"
                "微批次一组的窗口（最后一个不满的窗口也会更新）")
    return (f"rank 0 gets {len(sampler)} samples, {math.ceil(len(sampler) / 4)} micro-batches, "
            f"{steps} windows: {steps} optimizer steps (the last window is partial)")


#: what exercise 05.3's runs measured, by the file's text and the function's name (a test or a
#: reader checking the same window twice launches once)
_DDP_WINDOW_RUNS: dict[str, dict] = {}


def _ddp_window_target(answer: object) -> str:
    """``PATH::NAME`` of the reader's window: a file defining ``ddp_window``, or a function
    defined in a file."""
    import inspect

    path, name = None, "ddp_window"
    if isinstance(answer, (str, Path)):  # PATH, or PATH::NAME for a function of another name
        path, _, named = str(answer).partition("::")
        path, name = Path(path), named or name
    elif callable(answer):
        source = inspect.getsourcefile(answer)
        path, name = (Path(source) if source else None), answer.__name__
    _require(path is not None and path.suffix == ".py" and path.is_file(),
             f"answer must be the path of the .py file that defines ddp_window(model, window) "
             f"(what %%writefile wrote), or a function defined in such a file; got {answer!r}",
             zh=f"answer 必须是定义了 ddp_window(model, window) 的 .py 文件的路径（%%writefile "
                f"写出的那个），或者是在这样的文件里定义的函数；实际得到的是 {answer!r}")
    return f"{path.resolve()}::{name}"


#: the program exercise 05.3 runs under torchrun: the repository's scripts/ (a source checkout,
#: as the README sets up)
_DDP_WINDOW_CHECK = "gradaccum_course.programs.ddp_window_check"  # torchrun -m


def _measure_ddp_windows(*answers: object) -> list[dict]:
    """Run each window under torchrun on 2 gloo ranks (one launch for those not measured yet;
    ``gradaccum_course/programs/ddp_window_check.py``) and return what was measured."""
    from gradaccum_course.launch import LaunchError, LaunchTimeout, launch

    targets = [_ddp_window_target(answer) for answer in answers]
    keys = {target: Path(target.split("::")[0]).read_text(encoding="utf-8") + target
            for target in targets}
    missing = [target for target in targets if keys[target] not in _DDP_WINDOW_RUNS]
    if missing:
        try:
            runs = launch(str(_DDP_WINDOW_CHECK), missing,
                          nproc_per_node=2, timeout_seconds=180)
        except LaunchTimeout:
            raise _WrongAnswer(
                "the run did not finish within 180 s on 2 ranks: does every rank call the same "
                "collectives (all_reduce, a synchronised backward) the same number of times?",
                zh="在 2 个进程上运行 180 秒仍未结束：每个进程调用的集合通信（all_reduce、同步的"
                   "反向传播）次数都一样吗？") from None
        except LaunchError as error:
            stderr = error.rank_stderr.get(error.root_cause_rank or 0, "").strip()
            last = stderr.splitlines()[-1] if stderr else str(error).splitlines()[0]
            raise _WrongAnswer(f"the run on 2 ranks failed: {last}",
                               zh=f"在 2 个进程上运行失败：{last}") from None
        _DDP_WINDOW_RUNS.update({keys[target]: runs[target] for target in missing})
    return [_DDP_WINDOW_RUNS[keys[target]] for target in targets]


def _steps(flags: list) -> str:
    """The 1-based micro-steps where ``flags`` is true, as ``1, 3`` (or ``none``)."""
    return ", ".join(str(i + 1) for i, flag in enumerate(flags) if flag) or "none"


def _sync_flag_hint(window: dict) -> None:
    """Name the sync-flag mistake a window's flags and syncs show, if any."""
    forward, backward, synced = (window[key] for key in ("forward_flags", "backward_flags",
                                                         "synced"))
    last_only = [False] * (len(forward) - 1) + [True]
    if forward == last_only and synced == last_only:
        return
    k, across = len(forward), window["across_ranks"]
    if all(synced):
        symptom = (f"all {k} micro-steps all-reduced: the gradient is right and nothing is saved",
                   f"{k} 个微步全都做了全规约：梯度是对的，却什么也没省下")
    else:
        symptom = (f"micro-step(s) {_steps(synced)} all-reduced, a partial gradient, and the "
                   f"ranks' gradients differ by up to {across:.2g}",
                   f"第 {_steps(synced)} 个微步做了全规约，同步的只是部分梯度，各进程的梯度最多"
                   f"相差 {across:.2g}")
    if backward != forward:
        raise _WrongAnswer(
            f"sync flag set after the forward: the forward of micro-step(s) {_steps(forward)} "
            f"read the flag on, but at the backward it was on at {_steps(backward)}; DDP's "
            "forward reads the flag and tells the reducer whether the coming backward "
            "all-reduces, so enter model.no_sync() before the forward. Measured: " + symptom[0],
            zh=f"同步标志在前向之后才设置：第 {_steps(forward)} 个微步的前向读到的标志是开的，"
               f"而到反向时开着的是第 {_steps(backward)} 个；DDP 的前向读取这个标志，并告诉 "
               "reducer 接下来的反向要不要全规约，所以要在前向之前进入 model.no_sync()。"
               "测得：" + symptom[1])
    raise _WrongAnswer(
        f"sync on the wrong micro-step: micro-step(s) {_steps(synced)} synchronised, where only "
        f"the last ({k}) should; under no_sync a backward only accumulates locally. Keep "
        "no_sync around forward and backward of every micro-step but the last. Measured: "
        + symptom[0],
        zh=f"在错误的微步上同步：同步的是第 {_steps(synced)} 个微步，而应当只同步最后一个"
           f"（第 {k} 个）；在 no_sync 下反向传播只在本地累积。除最后一个微步外，每个微步的前向"
           "和反向都要放在 no_sync 里。测得：" + symptom[1])


def _divisor_hint(window: dict) -> None:
    """Name the divisor mistake a window's gradient shows against the large batch's, if any."""
    cosine, ratio = window["cosine"], window["ratio"]
    if abs(cosine - 1) <= 1e-9 and abs(ratio - 1) <= 1e-9:
        return
    _require(not (abs(cosine - 1) <= 1e-9 and abs(ratio - 0.5) <= 1e-9),
             f"no world factor: your gradient is {ratio:.3f} x the large batch's, 1/2 of it. "
             "DDP averages the gradients of the 2 ranks, so multiply each rank's summed loss "
             "by the world size as well as dividing it by the window's global count",
             zh=f"少了进程数这个因子：你的梯度是大批次梯度的 {ratio:.3f} 倍，即 1/2。DDP 会对 2 "
                "个进程的梯度取平均，所以每个进程的求和损失除以窗口的全局计数之外，还要乘以进程数")
    raise _WrongAnswer(
        f"wrong divisor: your gradient's cosine with the large batch's is {cosine:.4f} and its "
        f"norm ratio {ratio:.4f}. On micro-batches of uneven sizes, a micro-batch mean divided "
        "by k (or a count of one rank's samples) weighs samples unequally: divide each "
        "micro-batch's summed loss by the window's sample count, all-reduced over the ranks, "
        "times the world size",
        zh=f"除数不对：你的梯度与大批次梯度的余弦相似度是 {cosine:.4f}，范数之比是 {ratio:.4f}。"
           "微批次大小不一时，把微批次均值除以 k（或除以单个进程的样本数）会让样本的权重不等："
           "应当把每个微批次的求和损失除以窗口的样本数（在各进程间全规约后），再乘以进程数")


def _write_the_ddp_window(answer: object) -> str:
    (run,) = _measure_ddp_windows(answer)
    _require("error" not in run, f"your ddp_window raised {run.get('error')}",
             zh=f"你的 ddp_window 抛出了异常：{run.get('error')}")
    for window in run["windows"]:
        _sync_flag_hint(window)
    for window in run["windows"]:
        _require(window["across_ranks"] <= 1e-12,
                 f"the ranks' gradients differ by up to {window['across_ranks']:.2g}",
                 zh=f"各进程的梯度最多相差 {window['across_ranks']:.2g}")
        _divisor_hint(window)
    off = sorted({device for device in run.get("all_reduce_devices", []) if device != "cpu"})
    nccl = ("Gloo on the CPU takes any CPU tensor; NCCL all-reduces CUDA tensors only, and a "
            "count left on the CPU fails there ('No backend type associated with device type "
            "cpu')", "CPU 上的 gloo 什么 CPU 张量都接受；NCCL 只对 CUDA 张量做全规约，留在 CPU "
            "上的计数在那里会出错（报错说 cpu 这种设备类型没有对应的后端）")
    _require("device_error" not in run,
             f"with the default device set apart from the model's, your window raised "
             f"{run.get('device_error')}: a tensor made without device= lands on the default "
             f"device, not the model's. {nccl[0]}",
             zh=f"把默认设备设成与模型所在设备不同之后，你的窗口抛出了异常 "
                f"{run.get('device_error')}：不带 device= 创建的张量落在默认设备上，而不是模型"
                f"所在的设备上。{nccl[1]}")
    _require(not off,
             f"count tensor off the model's device: with the default device set apart from the "
             f"model's (cpu), dist.all_reduce got a tensor on {', '.join(off)}; create the count "
             f"on next(model.parameters()).device. {nccl[0]}",
             zh=f"计数张量不在模型所在的设备上：把默认设备设成与模型的（cpu）不同之后，"
                f"dist.all_reduce 收到的张量在 {', '.join(off)} 上；应当在 "
                f"next(model.parameters()).device 上创建计数。{nccl[1]}")
    return ("your ddp_window on 2 gloo ranks, 2 windows of 3 uneven micro-batches: one "
            "all-reduce per window, at the last micro-step; the gradient is the large batch's "
            "within 1e-09; the count all-reduced on the model's device")


# ---- 06: beyond ---------------------------------------------------------------------------

def _sqrt_learning_rate(answer: object) -> str:
    lr = scaled_learning_rate(2e-5, 32, 256, "sqrt")
    _require(abs(_number(answer, "answer (learning rate)", "answer（学习率）") - lr) <= 1e-3 * lr,
             f"{answer} is not the square-root rule's learning rate; it multiplies the rate "
             "by the square root of the batch's growth",
             zh=f"{answer} 不是平方根规则给出的学习率；这条规则把学习率乘以批大小增长倍数的"
                "平方根")
    return f"the square-root rule gives {lr:.4g} for an effective batch of 256"


def _count_loop_steps(samples: int, micro_batch_size: int, epochs: int) -> tuple[int, int]:
    """The library loop's optimizer and scheduler steps over ``epochs`` of ``samples``, k = 4
    (a partial last window steps)."""
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
    return steps, scheduler.last_epoch


def _partial_window_steps(answer: object) -> str:
    steps, scheduled = _count_loop_steps(20, 2, epochs=1)
    _require(scheduled == steps, "the scheduler and optimizer counts disagree",
             zh="学习率调度器与优化器的更新次数不一致")
    _require(_number(answer, "answer (optimizer steps)", "answer（优化器更新次数）") == steps,
             f"{answer} is not the number of optimizer steps the library's loop took; does the "
             "partial last window step?",
             zh=f"{answer} 不是本库的循环做的优化器更新次数；最后一个不满的窗口会不会更新？")
    return f"10 micro-batches with k = 4: {steps} optimizer and scheduler steps"


# ---- 07: the interviewer's follow-ups -----------------------------------------------------

def _leftover_micro_batches(answer: object) -> str:
    # the exercise's loop, counted: 11 micro-batches an epoch, a step when (index + 1) % 4 == 0
    # with index from each epoch's start, the gradients zeroed only after a step
    held, pending = [], 0  # micro-batches added up in each optimizer step; in .grad now
    for _epoch in range(2):
        for index in range(11):
            pending += 1  # a backward adds this micro-batch's gradient
            if (index + 1) % 4 == 0:
                held.append(pending)
                pending = 0  # step, then zero_grad
    first_of_epoch_2 = held[11 // 4]
    _require(_number(answer, "answer (micro-batches)", "answer（微批次数）") == first_of_epoch_2,
             f"{answer} is not what that step adds up; count what is still in the gradients "
             "when the first epoch ends",
             zh=f"{answer} 不是那次更新累加的微批次数；数一数第一个 epoch 结束时梯度里还留着"
                "什么")
    return (f"the first step of epoch 2 adds up {first_of_epoch_2} micro-batches: "
            f"{11 % 4} left over from epoch 1 and 4 of its own")


def _schedule_length(answer: object) -> str:
    steps, _ = _count_loop_steps(1000, 8, epochs=3)
    _require(_number(answer, "answer (schedule steps)", "answer（调度步数）") == steps,
             f"{answer} steps is not the optimizer steps the library's loop takes; count the "
             "windows of one epoch (its partial one steps too), then multiply by the epochs",
             zh=f"{answer} 步不是本库的循环做的优化器更新次数；先数一个 epoch 的窗口数"
                "（其中不满的那个也会更新），再乘以 epoch 数")
    return (f"3 epochs of {math.ceil(1000 / 8)} micro-batches with k = 4: {steps} optimizer "
            f"steps, so a schedule {steps} steps long")


# ---- 08: the interviewer's follow-ups, 2026 -----------------------------------------------

def _two_schedule_steps() -> tuple[float, float]:
    """(a, b) with a g1 + b g2 the gradient after two GPipe steps of 4 micro-batches (mean
    losses, scale_grads=True) without zeroing in between; g1, g2: each step's gradient alone.
    One stage on a one-process gloo group."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model = make_mlp(6, 8, 3, seed=0)
    inputs = torch.randn(16, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    labels = torch.arange(16) % 3

    def schedule_step(window: slice) -> None:
        stage = PipelineStage(model, 0, 1, torch.device("cpu"))
        ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy).step(
            inputs[window], target=labels[window])

    gradients = []
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            for windows in ([slice(0, 8)], [slice(8, 16)], [slice(0, 8), slice(8, 16)]):
                model.zero_grad()
                for window in windows:
                    schedule_step(window)
                gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        finally:
            dist.destroy_process_group()
    first, second, both = gradients
    a, b = torch.linalg.lstsq(torch.stack([first, second], dim=1),
                              both[:, None]).solution[:, 0].tolist()
    return a, b


def _pipeline_steps_ratio(answer: object) -> str:
    a, b = _two_schedule_steps()
    _require(abs(_number(answer, "answer (a / b)", "answer（a / b）") - a / b) <= 1e-3,
             f"{answer} is not a / b; ask what scale_grads divides at the end of each step: "
             "only what that step added, or everything in .grad?",
             zh=f"{answer} 不是 a / b；想一想 scale_grads 在每次更新结束时除的是什么：只是这次"
                "更新新加进来的梯度，还是 .grad 里的全部？")
    return (f"after two schedule steps the gradient is {a:.3f} g1 + {b:.3f} g2: a / b = "
            f"{a / b:.3f}, the first window divided by 4 twice")


def _window_load_balancing_loss(answer: object) -> str:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    probabilities = {"A": [0.75, 0.25], "B": [0.25, 0.75]}  # 4 tokens each, top-1 of 2 experts
    logits = {name: torch.tensor([p], dtype=torch.float64).log().expand(4, 2)
              for name, p in probabilities.items()}

    def loss(*names: str) -> float:  # transformers' Qwen3-MoE load-balancing loss
        return load_balancing_loss_func((torch.cat([logits[name] for name in names]),),
                                        num_experts=2, top_k=1).item()

    window, each = loss("A", "B"), loss("A")
    _require(abs(_number(answer, "answer (loss)", "answer（损失）") - window) <= 1e-6,
             f"{answer} is not the window's loss ({each:g} is each micro-batch's own); compute "
             "f and P as means over all 8 tokens of the window, then the loss",
             zh=f"{answer} 不是窗口的损失（{each:g} 是每个微批次各自的损失）；先在窗口的全部 "
                "8 个 token 上把 f 和 P 求成均值，再算损失")
    return (f"the window routes half its tokens to each expert, with mean probabilities "
            f"(0.5, 0.5): loss {window:.3f}, where each micro-batch's own is {each:.3f}")


# ---- 09: the article, checked ----------------------------------------------------------

def _communication_share(answer: object) -> str:
    step = DdpStepModel.from_comm_share(compute_per_micro_step=1.0, comm_share=0.6)
    share, every = step.comm_fraction(4, "window"), step.comm_fraction(4, "every")
    given = _number(answer, "answer (a fraction)", "answer（一个比例）")
    _require(given <= 1, f"{given:g} is a percentage; give the share as a fraction of 1",
             zh=f"{given:g} 是百分数；请给出 0 到 1 之间的比例")
    _require(abs(given - every) > 0.005,
             f"{given:g} is the share without no_sync: then every micro-step all-reduces",
             zh=f"{given:g} 是不用 no_sync 时的占比：那样每个微步都要全规约")
    _require(abs(given - share) <= 0.005,
             f"{given:g} is not it; at k = 1 one all-reduce costs 0.6 / 0.4 = 1.5 micro-steps of "
             "compute, and a window has k micro-steps of compute and one all-reduce",
             zh=f"{given:g} 不对；k = 1 时一次全规约的时间是 0.6 / 0.4 = 1.5 个微步的计算，而一个"
                "窗口有 k 个微步的计算和一次全规约")
    return f"at k = 4 with no_sync, communication is {share:.3f} of the step (0.6 at k = 1)"


def _article_epoch_steps(answer: object) -> str:
    records, micro, k, gpus = 1_000_000, 32, 8, 8
    sampler = DistributedSampler(range(records), num_replicas=gpus, rank=0, shuffle=False)
    micro_batches = math.ceil(len(sampler) / micro)
    steps = math.ceil(micro_batches / k)
    given = _number(answer, "answer (optimizer steps)", "answer（优化器更新次数）")
    _require(given not in (micro_batches, math.ceil(records / (micro * k))),
             f"{given:g} is one process's count of steps (and each rank's count of micro-steps "
             f"under DDP); under DDP each of the {gpus} ranks takes 1/{gpus} of the records, "
             "and a step takes k micro-steps",
             zh=f"{given:g} 是单进程的更新次数（也是 DDP 下每个进程的微步数）；在 DDP 下 {gpus} "
                f"个进程每个只分到 1/{gpus} 的数据，而一次更新要 k 个微步")
    _require(given == steps, f"{given:g} is not it; count rank 0's samples, its micro-batches, "
             "then windows of k (a partial last window steps too)",
             zh=f"{given:g} 不对；先数 0 号进程的样本，再数它的微批次，最后数 k 个一组的窗口"
                "（最后一个不满的窗口也会更新）")
    return (f"each rank gets {len(sampler)} records, {micro_batches} micro-batches: "
            f"{steps} optimizer steps")


# ---- the exercises --------------------------------------------------------------------

_EXERCISES: dict[str, _Exercise] = {
    "00.1": _Exercise("parameters of bert-base-chinese, in millions",
                     "the parameters of bert-base-chinese with a 2-class head, in millions (±1M)",
                     _bert_base_parameters),
    "00.2": _Exercise("samples per optimizer step under DDP",
                     "the samples in one optimizer step: micro-batches of 32, k = 8, 8 DDP ranks",
                     _ddp_effective_batch),
    "01.1": _Exercise("find the loop whose step is wrong",
                     'the name of the loop whose step is not the large batch\'s, "A" or "B"',
                     _find_the_bug),
    "01.2": _Exercise("make a token loss decompose",
                     "a loss function (model, batch) -> (summed loss, number of real tokens) "
                     "that accumulates to the whole batch's token mean", _decomposing_loss),
    "01.3": _Exercise("write the window's gradient",
                     "a function window_gradient(model, micro_batches) that leaves in .grad the "
                     "gradient of the mean cross-entropy over all the window's samples",
                     _window_gradient),
    "02.1": _Exercise("the micro-batch and k for a 16 GiB GPU",
                     "a pair (micro_batch, k): the largest micro-batch that fits, and the "
                     "smallest k reaching 256 samples", _fit_a_gpu),
    "02.2": _Exercise("the update of a loop that never divides by k",
                     "a number: how many times the large batch's update the loop's update is",
                     _forgot_to_divide),
    "02.3": _Exercise("write the window's step",
                     "a function train_window(model, optimizer, scheduler, micro_batches, "
                     "max_grad_norm) that takes the large batch's step: gradients zeroed, one "
                     "clip, one optimizer step, one scheduler step", _window_step),
    "03.1": _Exercise("a token's weight in the mean of micro-batch means",
                     "a number: a short micro-batch token's weight in the mean of micro-batch "
                     "means, over its weight in the window's token mean", _mean_of_means_weight),
    "03.2": _Exercise("the divisor on each DDP rank",
                     "the number each rank divides its summed token loss by, so that DDP's "
                     "average is the window's token mean", _global_normaliser),
    "04.1": _Exercise("k for 256 samples on 8 GPUs",
                     "the smallest k with 4 per GPU x 8 GPUs x k >= 256 samples",
                     _k_for_the_cluster),
    "04.2": _Exercise("the state that k does not shrink",
                     "a number: GB (1e9 bytes) of fp32 weights, gradients and AdamW state per "
                     "GPU for RoBERTa-wwm-ext-large with a 10-class head, at k = 16",
                     _adamw_state_gigabytes),
    "04b.1": _Exercise("the 🤗 Trainer's update against the truth",
                      "a number: how many times the true update the Trainer's SGD update is",
                      _trainer_factor),
    "04b.2": _Exercise("Accelerate on a partial last window",
                      "a number: how many times the true update Accelerate's SGD update is, "
                      "on a window of 2 micro-batches with k = 4", _accelerate_partial_window),
    "05.1": _Exercise("bytes DDP all-reduces in an epoch",
                     "the bytes of gradients DDP hands to all-reduce on one rank over the epoch",
                     _allreduce_bytes),
    "05.2": _Exercise("optimizer steps per epoch under DistributedSampler",
                     "the optimizer steps of one epoch: 50 samples, 2 ranks, micro-batches of 4, "
                     "k = 2", _steps_per_epoch),
    "05.3": _Exercise("write the DDP window",
                     "the path of a .py file defining ddp_window(model, window), which leaves in "
                     ".grad of the DDP model the gradient of the mean loss over all ranks' "
                     "samples of the window, all-reducing once, at the last micro-step",
                     _write_the_ddp_window),
    "06.1": _Exercise("the square-root learning-rate rule",
                     "the square-root rule's learning rate for a batch of 256, from 2e-5 at 32",
                     _sqrt_learning_rate),
    "06.2": _Exercise("optimizer steps for an epoch with a partial window",
                     "the optimizer (and scheduler) steps of 10 micro-batches with k = 4",
                     _partial_window_steps),
    "07.1": _Exercise("micro-batches in the first step of an epoch",
                     "a number: how many micro-batches' gradients the first optimizer step of "
                     "the second epoch adds up (11 micro-batches an epoch, k = 4, counted from "
                     "each epoch's start)", _leftover_micro_batches),
    "07.2": _Exercise("the length of a learning-rate schedule",
                     "a number: the optimizer steps of 3 epochs of 1,000 samples in "
                     "micro-batches of 8 with k = 4, partial windows stepped", _schedule_length),
    "08.1": _Exercise("two pipeline schedule steps without zeroing",
                     "a number: a / b, where a g1 + b g2 is the gradient after two GPipe steps "
                     "of 4 micro-batches (mean losses, scale_grads=True) with no zero_grad "
                     "between them", _pipeline_steps_ratio),
    "08.2": _Exercise("the load-balancing loss of a window",
                     "a number: the window's load-balancing loss 2 sum_e f_e P_e from the "
                     "window's token shares and mean probabilities, over both micro-batches",
                     _window_load_balancing_loss),
    "09.1": _Exercise("the communication share at k = 4",
                     "a fraction: the share of a step spent in all-reduce at k = 4 with no_sync, "
                     "if it is 0.6 at k = 1", _communication_share),
    "09.2": _Exercise("optimizer steps in an epoch of the article's records",
                     "a number: the optimizer steps of one epoch of 1,000,000 records, "
                     "micro-batches of 32, k = 8, 8 GPUs", _article_epoch_steps),
}


#: each exercise's title in the Chinese edition (notebooks/zh/)
_TITLES_ZH: dict[str, str] = {
    "00.1": "bert-base-chinese 的参数量，以百万计",
    "00.2": "DDP 下一次优化器更新的样本数",
    "01.1": "找出更新出错的那个循环",
    "01.2": "让 token 损失可以分解",
    "01.3": "写出一个窗口的梯度",
    "02.1": "16 GiB GPU 上的微批次和 k",
    "02.2": "从不除以 k 的循环的更新",
    "02.3": "写出一个窗口的训练步",
    "03.1": "微批次均值的均值中一个 token 的权重",
    "03.2": "每个 DDP 进程的除数",
    "04.1": "8 张 GPU 上 256 个样本所需的 k",
    "04.2": "k 缩小不了的状态",
    "04b.1": "Hugging Face Trainer 的更新与真实更新之比",
    "04b.2": "Accelerate 在最后一个不满的窗口上",
    "05.1": "一个 epoch 里 DDP 全规约的字节数",
    "05.2": "DistributedSampler 下每个 epoch 的优化器更新次数",
    "05.3": "写出 DDP 的累积窗口",
    "06.1": "学习率的平方根缩放规则",
    "06.2": "带不满窗口的 epoch 的优化器更新次数",
    "07.1": "一个 epoch 第一次更新里的微批次",
    "07.2": "学习率调度的长度",
    "08.1": "不清零的两个流水线调度步",
    "08.2": "一个窗口的负载均衡损失",
    "09.1": "k = 4 时通信所占的比例",
    "09.2": "文章的一百万条病历，一个 epoch 的优化器更新次数",
}


#: the answer each exercise expects, in words, in the Chinese edition
_EXPECTS_ZH: dict[str, str] = {
    "00.1": "带 2 分类任务头的 bert-base-chinese 的参数量，以百万计（误差在一百万以内）",
    "00.2": "一次优化器更新的样本数：微批次 32、k = 8、8 个 DDP 进程",
    "01.1": '更新与大批次不同的那个循环的名字，"A" 或 "B"',
    "01.2": "一个损失函数 (model, batch) -> (求和损失, 真实 token 数)，"
            "累积起来等于整个批次的 token 均值",
    "01.3": "一个函数 window_gradient(model, micro_batches)，在 .grad 中留下整个窗口所有样本"
            "平均交叉熵的梯度",
    "02.1": "一个二元组 (micro_batch, k)：放得下的最大微批次，以及达到 256 个样本的最小 k",
    "02.2": "一个数：这个循环的更新是大批次更新的多少倍",
    "02.3": "一个函数 train_window(model, optimizer, scheduler, micro_batches, max_grad_norm)，"
            "做出大批次的那次更新：先清零梯度，裁剪一次，优化器更新一次，调度器步进一次",
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
    "05.3": "一个定义了 ddp_window(model, window) 的 .py 文件的路径：它在 DDP 模型的 .grad 里"
            "留下窗口内所有进程全部样本的平均损失的梯度，只在最后一个微步全规约一次",
    "06.1": "按平方根规则，从批大小 32 时的 2e-5 推出批大小 256 时的学习率",
    "06.2": "10 个微批次、k = 4 时的优化器（以及调度器）更新次数",
    "07.1": "一个数：第二个 epoch 的第一次优化器更新累加了多少个微批次的梯度"
            "（每个 epoch 11 个微批次，k = 4，从每个 epoch 开头数起）",
    "07.2": "一个数：1,000 个样本、微批次 8、k = 4，3 个 epoch 的优化器更新次数"
            "（不满的窗口也更新）",
    "08.1": "一个数：a / b，其中 a g1 + b g2 是两个各 4 个微批次的 GPipe 调度步"
            "（平均损失，scale_grads=True）之间不清零时的梯度",
    "08.2": "一个数：由窗口的 token 占比和平均概率算出的、覆盖两个微批次的"
            "窗口负载均衡损失 2 sum_e f_e P_e",
    "09.1": "一个比例：若 k = 1 时全规约占一步的 0.6，用 no_sync、k = 4 时它占一步的多少",
    "09.2": "一个数：1,000,000 条病历、微批次 32、k = 8、8 张 GPU，一个 epoch 的优化器更新次数",
}
