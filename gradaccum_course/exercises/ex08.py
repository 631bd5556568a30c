"""Notebook 08's exercises (the interviewer's follow-ups, 2026)."""

import torch
from torch import nn

from gradaccum_course.exercises import Numeric, one_process_group, register
from gradaccum_lib.workloads.models import make_mlp


def _two_schedule_steps() -> dict:
    """a / b, with a g1 + b g2 the gradient after two GPipe steps not zeroed in between (g1, g2:
    each step's alone); one stage on a one-process gloo group."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model = make_mlp(6, 8, 3, seed=0)
    inputs = torch.randn(16, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    labels = torch.arange(16) % 3

    def schedule_step(window: slice) -> None:
        stage = PipelineStage(model, 0, 1, torch.device("cpu"))
        ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy).step(
            inputs[window], target=labels[window])

    gradients = []
    with one_process_group():
        for windows in ([slice(0, 8)], [slice(8, 16)], [slice(0, 8), slice(8, 16)]):
            model.zero_grad()
            for window in windows:
                schedule_step(window)
            gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    first, second, both = gradients
    a, b = torch.linalg.lstsq(torch.stack([first, second], dim=1),
                              both[:, None]).solution[:, 0].tolist()
    return {"truth": a / b, "a": a, "b": b}


def _window_load_balancing_loss() -> dict:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    probabilities = {"A": [0.75, 0.25], "B": [0.25, 0.75]}  # 4 tokens each, top-1 of 2 experts
    logits = {name: torch.tensor([p], dtype=torch.float64).log().expand(4, 2)
              for name, p in probabilities.items()}

    def loss(*names: str) -> float:  # transformers' Qwen3-MoE load-balancing loss
        return load_balancing_loss_func((torch.cat([logits[name] for name in names]),),
                                        num_experts=2, top_k=1).item()

    return {"truth": loss("A", "B"), "each": loss("A")}


register("08.1", ("two pipeline schedule steps without zeroing", "不清零的两个流水线调度步"),
         ("a number: a / b, where a g1 + b g2 is the gradient after two GPipe steps of 4 "
          "micro-batches (mean losses, scale_grads=True) with no zero_grad between them",
          "一个数：a / b，其中 a g1 + b g2 是两个各 4 个微批次的 GPipe 调度步（平均损失，"
          "scale_grads=True）之间不清零时的梯度"),
         ("after two schedule steps the gradient is {a:.3f} g1 + {b:.3f} g2: a / b = {truth:.3f}, "
          "the first window divided by 4 twice",
          "两个调度步之后，梯度是 {a} g1 + {b} g2：a / b = {truth}，第一个窗口被除了两次 4"),
         Numeric(_two_schedule_steps, ("a / b", "a / b"), 1e-3, (
             "{answer} is not a / b; ask what scale_grads divides at the end of each step: only "
             "what that step added, or everything in .grad?",
             "{answer} 不是 a / b；想一想 scale_grads 在每次更新结束时除的是什么：只是这次更新新"
             "加进来的梯度，还是 .grad 里的全部？")))
register("08.2", ("the load-balancing loss of a window", "一个窗口的负载均衡损失"),
         ("a number: the window's load-balancing loss 2 sum_e f_e P_e from the window's token "
          "shares and mean probabilities, over both micro-batches",
          "一个数：由窗口的 token 占比和平均概率算出的、覆盖两个微批次的窗口负载均衡损失 2 sum_e "
          "f_e P_e"),
         ("the window routes half its tokens to each expert, with mean probabilities (0.5, 0.5): "
          "loss {truth:.3f}, where each micro-batch's own is {each:.3f}",
          "窗口把一半的 token 路由给每个专家，平均概率为 (0.5, 0.5)：损失 {truth}，而每个微批次"
          "自己的损失是 {each}"),
         Numeric(_window_load_balancing_loss, ("loss", "损失"), 1e-6, (
             "{answer} is not the window's loss ({each:g} is each micro-batch's own); compute f "
             "and P as means over all 8 tokens of the window, then the loss",
             "{answer} 不是窗口的损失（{each:g} 是每个微批次各自的损失）；先在窗口的全部 8 个 "
             "token 上把 f 和 P 求成均值，再算损失")))
