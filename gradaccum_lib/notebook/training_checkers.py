"""The exercises' checkers of notebooks 04b-08: they run the audited frameworks, a real
``DistributedSampler``, DDP, a pipeline schedule and the engine (see
:mod:`gradaccum_lib.notebook.checkers` for the contract: compute the truth, return what was
checked, or raise ``WrongAnswer`` with a hint in English and in Chinese)."""

from __future__ import annotations

import math
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from ..accumulation import AccumulationTrainer
from ..audits.frameworks import accelerate_step, hf_trainer_step
from ..batches import split_into_micro_batches, windows_of
from ..equivalence import audit_update
from ..losses import bert_classification_loss, sample_classification_loss
from ..measure.comm import CommCounter
from ..measure.noise import scaled_learning_rate
from ..workloads.models import make_mlp, make_tiny_bert
from .checkers import _number, _require

__all__ = [
    "accelerate_partial_window", "allreduce_bytes", "engine_steps", "leftover_micro_batches",
    "pipeline_steps_ratio", "schedule_length", "sqrt_learning_rate", "steps_per_epoch",
    "trainer_factor", "window_load_balancing_loss",
]


# ---- 04b: the framework audit ---------------------------------------------------------------

def _tiny_bert_window(micro_batches: int) -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    model = make_tiny_bert(30, 2, hidden_size=16, num_layers=1, num_heads=2, max_length=16)
    generator = torch.Generator().manual_seed(3)
    return model, [{"input_ids": torch.randint(1, 30, (2, 8), generator=generator),
                    "attention_mask": torch.ones(2, 8, dtype=torch.long),
                    "labels": torch.randint(0, 2, (2,), generator=generator)}
                   for _ in range(micro_batches)]


def trainer_factor(answer: object) -> str:
    model, micro_batches = _tiny_bert_window(4)
    result = audit_update(hf_trainer_step(4), model, bert_classification_loss, micro_batches,
                          lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    _require(abs(_number(answer, "answer (ratio)", "answer（比值）") - result.norm_ratio) <= 1e-3,
             f"{answer} is not the measured ratio; section 1 of notebook 04b audits the "
             "🤗 Trainer against the ground truth",
             zh=f"{answer} 不是测得的比值；笔记本 04b 第 1 节用基准真值审计了 🤗 Trainer")
    return f"the Trainer's SGD update is {result.norm_ratio:.4f} x the true one"


def accelerate_partial_window(answer: object) -> str:
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

def allreduce_bytes(answer: object) -> str:
    model = make_mlp(10, 32, 4, seed=0)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            ddp = DistributedDataParallel(model)
            counter = CommCounter()
            counter.register(ddp)
            trainer = AccumulationTrainer(ddp, sample_classification_loss,
                                          torch.optim.SGD(ddp.parameters(), lr=0.1),
                                          accumulation_steps=4, progress=False)
            inputs = torch.randn(48, 10, generator=torch.Generator().manual_seed(4),
                                 dtype=torch.float64)
            trainer.train_epoch(split_into_micro_batches((inputs, torch.arange(48) % 4),
                                                        micro_batch_size=4))
            sent = counter.take()["bytes"]
        finally:
            dist.destroy_process_group()
    _require(_number(answer, "answer (bytes)", "answer（字节数）") == sent,
             f"{answer} bytes is not what DDP handed to all-reduce; count the all-reduces "
             "of an epoch (the engine syncs under no_sync) and the float64 gradient of each",
             zh=f"{answer} 字节不是 DDP 交给全规约的字节数；数一数一个 epoch 里有几次全规约"
                "（本库的引擎用 no_sync 控制梯度同步），以及每次全规约的 float64 梯度")
    return (f"{sent} bytes = 3 windows x {parameter_bytes} bytes of gradients: one all-reduce "
            "per window, whatever k")


def steps_per_epoch(answer: object) -> str:
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


# ---- 06: beyond ---------------------------------------------------------------------------

def sqrt_learning_rate(answer: object) -> str:
    lr = scaled_learning_rate(2e-5, 32, 256, "sqrt")
    _require(abs(_number(answer, "answer (learning rate)", "answer（学习率）") - lr) <= 1e-3 * lr,
             f"{answer} is not the square-root rule's learning rate; it multiplies the rate "
             "by the square root of the batch's growth",
             zh=f"{answer} 不是平方根规则给出的学习率；这条规则把学习率乘以批大小增长倍数的"
                "平方根")
    return f"the square-root rule gives {lr:.4g} for an effective batch of 256"


def _engine_steps(samples: int, micro_batch_size: int, epochs: int) -> tuple[int, int]:
    """The engine's optimizer and scheduler steps over ``epochs`` of ``samples``, k = 4 (a
    partial last window steps)."""
    model = make_mlp(4, 6, 2, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer = AccumulationTrainer(model, sample_classification_loss, optimizer,
                                  accumulation_steps=4, scheduler=scheduler, progress=False,
                                  track_grad_norm=False)
    inputs = torch.randn(samples, 4, generator=torch.Generator().manual_seed(5),
                         dtype=torch.float64)
    for _epoch in range(epochs):
        trainer.train_epoch(split_into_micro_batches((inputs, torch.arange(samples) % 2),
                                                    micro_batch_size=micro_batch_size))
    return trainer.optimizer_steps, scheduler.last_epoch


def engine_steps(answer: object) -> str:
    steps, scheduled = _engine_steps(20, 2, epochs=1)
    _require(scheduled == steps, "the scheduler and optimizer counts disagree",
             zh="学习率调度器与优化器的更新次数不一致")
    _require(_number(answer, "answer (optimizer steps)", "answer（优化器更新次数）") == steps,
             f"{answer} is not the number of optimizer steps the engine took; does the "
             "partial last window step?",
             zh=f"{answer} 不是本库的引擎做的优化器更新次数；最后一个不满的窗口会不会更新？")
    return f"10 micro-batches with k = 4: {steps} optimizer and scheduler steps"


# ---- 07: the interviewer's follow-ups -----------------------------------------------------

def leftover_micro_batches(answer: object) -> str:
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


def schedule_length(answer: object) -> str:
    steps, _ = _engine_steps(1000, 8, epochs=3)
    _require(_number(answer, "answer (schedule steps)", "answer（调度步数）") == steps,
             f"{answer} steps is not the optimizer steps the engine takes; count the windows "
             "of one epoch (its partial one steps too), then multiply by the epochs",
             zh=f"{answer} 步不是本库的引擎做的优化器更新次数；先数一个 epoch 的窗口数"
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


def pipeline_steps_ratio(answer: object) -> str:
    a, b = _two_schedule_steps()
    _require(abs(_number(answer, "answer (a / b)", "answer（a / b）") - a / b) <= 1e-3,
             f"{answer} is not a / b; ask what scale_grads divides at the end of each step: "
             "only what that step added, or everything in .grad?",
             zh=f"{answer} 不是 a / b；想一想 scale_grads 在每次更新结束时除的是什么：只是这次"
                "更新新加进来的梯度，还是 .grad 里的全部？")
    return (f"after two schedule steps the gradient is {a:.3f} g1 + {b:.3f} g2: a / b = "
            f"{a / b:.3f}, the first window divided by 4 twice")


def window_load_balancing_loss(answer: object) -> str:
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
