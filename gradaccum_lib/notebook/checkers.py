"""The exercises' checkers of notebooks 00-04 (:mod:`gradaccum_lib.notebook.exercises` grades
with them; those of 04b-07, which run frameworks, DDP and the engine, are in
:mod:`gradaccum_lib.notebook.training_checkers`).

``checker(answer, **context)`` computes the true answer itself, by running the library (the
budget model, the engine, the ground truth, a real ``DistributedSampler``, the real 🤗
``Trainer``...), never from a stored value; it returns what it checked, the true value
included, or raises :class:`WrongAnswer` with a hint that does not give the value away, in
English and in Chinese (its ``zh``, from the same values, for the Chinese edition).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from numbers import Integral

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from ..batches import split_into_micro_batches, windows_of
from ..equivalence import accumulated_gradients, full_batch_gradients
from ..gradients import max_gradient_difference
from ..losses import sample_classification_loss
from ..measure.memory import memory_budget
from ..measure.planning import accumulation_steps_for, max_micro_batch_size
from ..workloads.models import (
    ROBERTA_WWM_EXT_LARGE,
    TokenTagger,
    count_bert_parameters,
    make_mlp,
)

__all__ = [
    "BERT_BASE_CHINESE", "GIB", "WrongAnswer", "adamw_state_gigabytes", "bert_base_parameters",
    "ddp_effective_batch", "decomposing_loss", "find_the_bug", "fit_a_gpu", "forgot_to_divide",
    "global_normaliser", "k_for_the_cluster", "mean_of_means_weight",
]

GIB = 1024**3
# bert-base-chinese's published configuration (its config.json on the Hugging Face Hub)
BERT_BASE_CHINESE: dict[str, int] = {
    "vocab_size": 21128, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


class WrongAnswer(AssertionError):
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


def _number(answer: object, label: str, label_zh: str) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        got = f"{type(answer).__name__} {answer!r}"
        raise WrongAnswer(f"{label} must be a number; got {got}",
                          zh=f"{label_zh}必须是一个数；实际得到的是 {got}")
    return float(answer)


def _require(condition: bool, message: str, *, zh: str) -> None:
    """Raise :class:`WrongAnswer` with ``message`` and its Chinese ``zh`` unless ``condition``
    (every hint has both: the Chinese edition shows ``zh``)."""
    if not condition:
        raise WrongAnswer(message, zh=zh)


# ---- 00: the article ----------------------------------------------------------------------

def bert_base_parameters(answer: object) -> str:
    millions = count_bert_parameters(BERT_BASE_CHINESE, num_labels=2) / 1e6
    given = _number(answer, "answer (millions of parameters)", "answer（参数量，以百万计）")
    _require(abs(given - millions) <= 1.0,
             f"{given:g}M is not within 1M of the count; count the embeddings (vocabulary x "
             "hidden), then 12 layers of attention (4 h x h) and feed-forward (2 h x 4h)",
             zh=f"{given:g}M 与实际参数量相差超过 1M；先数嵌入层（词表大小 x 隐藏维度），"
                "再数 12 层的注意力（4 h x h）和前馈层（2 h x 4h）")
    return f"bert-base-chinese with a 2-class head has {millions:.2f}M parameters"


def ddp_effective_batch(answer: object) -> str:
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


def find_the_bug(answer: object, *, loops: Mapping[str, Callable]) -> str:
    wrong = [name for name, loop in loops.items() if _sgd_step_error(loop, 4, 0)[0] > 1e-10]
    _require(answer in loops, f"answer must be one of {sorted(loops)}; got {answer!r}",
             zh=f"answer 必须是 {sorted(loops)} 之一；实际得到的是 {answer!r}")
    _require([answer] == wrong, f"loop {answer} takes the large-batch step; look again",
             zh=f"循环 {answer} 做的正是大批次的那次更新；再仔细看看")
    return f"loop {answer} is the only one whose step differs from the large batch's"


def decomposing_loss(answer: object) -> str:
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


# ---- 02: one device -----------------------------------------------------------------------

def fit_a_gpu(answer: object) -> str:
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
        raise WrongAnswer(f"{hint}; {k_hint}", zh=f"{hint_zh}；{k_hint_zh}")
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


def forgot_to_divide(answer: object, *, loop: Callable) -> str:
    _, ratio = _sgd_step_error(loop, 4, 2)
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - ratio) <= 1e-6 * ratio,
             f"{answer} is not the measured ratio; each micro-batch's mean loss has the "
             "large batch's scale already, and the loop adds k of them",
             zh=f"{answer} 不是测得的比值；每个微批次的平均损失本身就已经是大批次损失的量级，"
                "而循环把 k 个这样的损失加了起来")
    return f"the update is {ratio:.6f} x the large batch's: k times too large"


# ---- 03: tokens ---------------------------------------------------------------------------

def mean_of_means_weight(answer: object) -> str:
    token_losses = torch.rand(40, dtype=torch.float64, requires_grad=True)
    mean_of_means = (token_losses[:10].mean() + token_losses[10:].mean()) / 2
    (mean_of_means_weights,) = torch.autograd.grad(mean_of_means, token_losses)
    (true_weights,) = torch.autograd.grad(token_losses.mean(), token_losses)
    ratio = (mean_of_means_weights[0] / true_weights[0]).item()
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - ratio) <= 1e-9,
             f"{answer} is not the weight ratio; write both means as weights on each token",
             zh=f"{answer} 不是权重之比；把两种均值都写成每个 token 上的权重")
    return f"each token of the short micro-batch weighs {ratio:g} x its true weight"


def global_normaliser(answer: object) -> str:
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

def k_for_the_cluster(answer: object) -> str:
    k = accumulation_steps_for(256, 4, world_size=8)
    _require(_number(answer, "answer (k)", "answer（k）") == k,
             f"k={answer} gives {4 * 8 * answer} samples",
             zh=f"k={answer} 给出的是 {4 * 8 * answer} 个样本")
    return f"k = {k}: 4 per GPU x 8 GPUs x {k} = {4 * 8 * k} samples per optimizer step"


def adamw_state_gigabytes(answer: object) -> str:
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
