"""The exercises' checkers of notebooks 00-04 (:mod:`gradaccum_lib.notebook.exercises` grades
with them; those of 04b-07, which run frameworks, DDP and the engine, are in
:mod:`gradaccum_lib.notebook.training_checkers`).

``checker(answer, **context)`` computes the true answer itself, by running the library (the
budget model, the engine, the ground truth, a real ``DistributedSampler``, the real 🤗
``Trainer``...), never from a stored value; it returns what it checked, the true value
included, or raises :class:`WrongAnswer` with a hint that does not give the value away.
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
    """

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


def _number(answer: object, label: str) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise WrongAnswer(f"{label} must be a number; got {type(answer).__name__} {answer!r}")
    return float(answer)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise WrongAnswer(message)


# ---- 00: the article ----------------------------------------------------------------------

def bert_base_parameters(answer: object) -> str:
    millions = count_bert_parameters(BERT_BASE_CHINESE, num_labels=2) / 1e6
    given = _number(answer, "answer (millions of parameters)")
    _require(abs(given - millions) <= 1.0,
             f"{given:g}M is not within 1M of the count; count the embeddings (vocabulary x "
             "hidden), then 12 layers of attention (4 h x h) and feed-forward (2 h x 4h)")
    return f"bert-base-chinese with a 2-class head has {millions:.2f}M parameters"


def ddp_effective_batch(answer: object) -> str:
    micro, k, world = 32, 8, 8
    seen = 0
    for rank in range(world):  # what each rank's loader feeds into its first window
        sampler = DistributedSampler(range(100_000), num_replicas=world, rank=rank,
                                     shuffle=False)
        loader = DataLoader(range(100_000), batch_size=micro, sampler=sampler)
        seen += sum(len(batch) for batch in next(windows_of(loader, k)))
    _require(_number(answer, "answer (samples)") == seen,
             f"{answer} is not it: under DDP every one of the {world} ranks runs the whole loop "
             "on its own share of the data")
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
    _require(answer in loops, f"answer must be one of {sorted(loops)}; got {answer!r}")
    _require([answer] == wrong, f"loop {answer} takes the large-batch step; look again")
    return f"loop {answer} is the only one whose step differs from the large batch's"


def decomposing_loss(answer: object) -> str:
    _require(callable(answer), "answer must be a loss function (model, batch) -> (sum, count)")
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
                                 f"{error:.2e} away from the token mean of the whole batch")
    # the bound, not the error: a right answer's error is rounding noise (2.8e-17 on one CPU,
    # 3.5e-17 on another), whose digits a committed output must not print
    return (f"your loss decomposes: accumulated = whole-batch token mean to within "
            f"{tolerance:.0e}")


# ---- 02: one device -----------------------------------------------------------------------

def fit_a_gpu(answer: object) -> str:
    _require(isinstance(answer, (tuple, list)) and len(answer) == 2
             and all(isinstance(n, Integral) and not isinstance(n, bool) and n > 0
                     for n in answer),
             f"answer must be a pair of positive integers (micro_batch, k); got {answer!r}")
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
        raise WrongAnswer(f"{hint}; {_k_hint(given_micro, given_k)}")
    _require(given_k == k, _k_hint(micro, given_k))
    return f"micro-batch {micro} fits, and k = {k} gives {micro * k} samples per step"


def _k_hint(micro: int, k: int) -> str:
    """What is wrong with ``k`` for micro-batches of ``micro`` (02.1), in words."""
    samples, smallest = micro * k, accumulation_steps_for(256, micro)
    if k < smallest:
        return f"k={k} is too small for micro-batches of {micro}: {micro} x {k} = {samples} < 256"
    if k > smallest:
        return (f"k={k} is more than micro-batches of {micro} need: {micro} x {k} = {samples}, "
                "and a smaller k reaches 256 too")
    return (f"k={k} would be right for micro-batches of {micro}: take the smallest k for the "
            "micro-batch that fits")


def forgot_to_divide(answer: object, *, loop: Callable) -> str:
    _, ratio = _sgd_step_error(loop, 4, 2)
    _require(abs(_number(answer, "answer (ratio)") - ratio) <= 1e-6 * ratio,
             f"{answer} is not the measured ratio; each micro-batch's mean loss has the "
             "large batch's scale already, and the loop adds k of them")
    return f"the update is {ratio:.6f} x the large batch's: k times too large"


# ---- 03: tokens ---------------------------------------------------------------------------

def mean_of_means_weight(answer: object) -> str:
    token_losses = torch.rand(40, dtype=torch.float64, requires_grad=True)
    mean_of_means = (token_losses[:10].mean() + token_losses[10:].mean()) / 2
    (mean_of_means_weights,) = torch.autograd.grad(mean_of_means, token_losses)
    (true_weights,) = torch.autograd.grad(token_losses.mean(), token_losses)
    ratio = (mean_of_means_weights[0] / true_weights[0]).item()
    _require(abs(_number(answer, "answer (ratio)") - ratio) <= 1e-9,
             f"{answer} is not the weight ratio; write both means as weights on each token")
    return f"each token of the short micro-batch weighs {ratio:g} x its true weight"


def global_normaliser(answer: object) -> str:
    counts = {0: (120, 40), 1: (80, 10)}
    token_losses = torch.rand(sum(map(sum, counts.values())), dtype=torch.float64,
                              requires_grad=True)
    given = _number(answer, "answer (divisor)")
    _require(given > 0, "a divisor must be positive")
    per_rank, start = [], 0
    for rank_counts in counts.values():  # each rank divides its own sum by the answer
        size = sum(rank_counts)
        per_rank.append(token_losses[start:start + size].sum() / given)
        start += size
    (ranks,) = torch.autograd.grad(sum(per_rank) / len(counts), token_losses)  # DDP averages
    (truth,) = torch.autograd.grad(token_losses.mean(), token_losses)
    _require(torch.allclose(ranks, truth, rtol=1e-12, atol=0),
             f"dividing by {given:g} gives each token weight {ranks[0].item():.3g}, not "
             f"{truth[0].item():.3g}; remember DDP averages the ranks' gradients")
    return (f"dividing by {given:g} = {sum(map(sum, counts.values()))} window tokens / "
            f"{len(counts)} ranks on each rank, then DDP's average over ranks, gives every "
            "token the weight of the window's token mean")


# ---- 04: the case study -------------------------------------------------------------------

def k_for_the_cluster(answer: object) -> str:
    k = accumulation_steps_for(256, 4, world_size=8)
    _require(_number(answer, "answer (k)") == k, f"k={answer} gives {4 * 8 * answer} samples")
    return f"k = {k}: 4 per GPU x 8 GPUs x {k} = {4 * 8 * k} samples per optimizer step"


def adamw_state_gigabytes(answer: object) -> str:
    parameters = count_bert_parameters(ROBERTA_WWM_EXT_LARGE, num_labels=10)
    gigabytes = memory_budget(parameters, optimizer="adamw", precision="fp32").total / 1e9
    given = _number(answer, "answer (GB)")
    _require(abs(given - gigabytes) <= 0.1,
             f"{given:g} GB is not within 0.1 GB of the state; k moves only the activations, "
             "and fp32 weights, gradients and AdamW's two moments take 4 bytes each per parameter")
    return (f"{parameters / 1e6:.1f}M parameters x 16 bytes = {gigabytes:.2f} GB per GPU, "
            "at k = 16 as at k = 8")
