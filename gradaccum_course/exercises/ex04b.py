"""Notebook 04b's exercises (the framework audit)."""

import torch

from gradaccum_course.audits.frameworks import accelerate_step
from gradaccum_course.audits.hf_trainer import hf_trainer_step
from gradaccum_course.exercises import Numeric, register
from gradaccum_lib.equivalence import audit_update
from gradaccum_lib.losses import bert_classification_loss
from gradaccum_lib.workloads.models import make_tiny_bert


def _audited_ratio(step: object, micro_batches: int) -> dict:
    """``step``'s SGD update over the true one (norms), on a tiny BERT's window."""
    model = make_tiny_bert(30, 2, hidden_size=16, num_layers=1, num_heads=2, max_length=16)
    generator = torch.Generator().manual_seed(3)
    window = [{"input_ids": torch.randint(1, 30, (2, 8), generator=generator),
               "attention_mask": torch.ones(2, 8, dtype=torch.long),
               "labels": torch.randint(0, 2, (2,), generator=generator)}
              for _ in range(micro_batches)]
    result = audit_update(step, model, bert_classification_loss, window,
                          lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    return {"truth": result.norm_ratio}


register("04b.1", ("the 🤗 Trainer's update against the truth",
                  "Hugging Face Trainer 的更新与真实更新之比"),
         ("a number: how many times the true update the Trainer's SGD update is",
          "一个数：Trainer 的 SGD 更新是真实更新的多少倍"),
         ("the Trainer's SGD update is {truth:.4f} x the true one",
          "Trainer 的 SGD 更新是真实更新的 {truth} 倍"),
         Numeric(lambda: _audited_ratio(hf_trainer_step(4), 4), ("ratio", "比值"), 1e-3, (
             "{answer} is not the measured ratio; section 1 of notebook 04b audits the 🤗 Trainer "
             "against the ground truth",
             "{answer} 不是测得的比值；笔记本 04b 第 1 节用基准真值审计了 🤗 Trainer")))
register("04b.2", ("Accelerate on a partial last window", "Accelerate 在最后一个不满的窗口上"),
         ("a number: how many times the true update Accelerate's SGD update is, on a window of 2 "
          "micro-batches with k = 4",
          "一个数：在 k = 4、只有 2 个微批次的窗口上，Accelerate 的 SGD 更新是真实更新的多少倍"),
         ("Accelerate's SGD update on 2 of 4 micro-batches is {truth:.4f} x the true one: each "
          "loss divided by 4, though 2 came",
          "4 个微批次只来了 2 个时，Accelerate 的 SGD 更新是真实更新的 {truth} 倍：每个损失都"
          "除以 4，尽管只来了 2 个"),
         Numeric(lambda: _audited_ratio(accelerate_step(4), 2), ("ratio", "比值"), 1e-3, (
             "{answer} is not the measured ratio; ask what `accelerator.backward` divides each "
             "loss by, and how many micro-batches came",
             "{answer} 不是测得的比值；想一想 `accelerator.backward` 把每个损失除以了多少，"
             "而实际来了几个微批次")))
