"""Notebook 04's exercises (the case study)."""

from gradaccum_course.exercises import Numeric, register
from gradaccum_lib.measure.memory import memory_budget
from gradaccum_lib.measure.planning import accumulation_steps_for
from gradaccum_lib.workloads.models import ROBERTA_WWM_EXT_LARGE, count_bert_parameters


def _adamw_state() -> dict:
    parameters = count_bert_parameters(ROBERTA_WWM_EXT_LARGE, num_labels=10)
    return {"truth": memory_budget(parameters, optimizer="adamw", precision="fp32").total / 1e9,
            "millions": parameters / 1e6}


register("04.1", ("k for 256 samples on 8 GPUs", "8 张 GPU 上 256 个样本所需的 k"),
         ("the smallest k with 4 per GPU x 8 GPUs x k >= 256 samples",
          "使 每张 GPU 4 个样本 × 8 张 GPU × k >= 256 个样本 成立的最小 k"),
         ("k = {truth}: 4 per GPU x 8 GPUs x {truth} = {samples} samples per optimizer step",
          "k = {truth}：每张 GPU 4 个 x 8 张 GPU x {truth} = 每次优化器更新 {samples} 个样本"),
         Numeric(lambda: {"truth": (k := accumulation_steps_for(256, 4, world_size=8)),
                          "samples": 4 * 8 * k, "given_samples": lambda answer: 4 * 8 * answer},
                 ("k", "k"), 0, (
             "k={answer} gives {given_samples} samples",
             "k={answer} 给出的是 {given_samples} 个样本")))
register("04.2", ("the state that k does not shrink", "k 缩小不了的状态"),
         ("a number: GB (1e9 bytes) of fp32 weights, gradients and AdamW state per GPU for "
          "RoBERTa-wwm-ext-large with a 10-class head, at k = 16",
          "一个数：带 10 分类任务头的 RoBERTa-wwm-ext-large 在 k = 16 时，每张卡上 fp32 权重、"
          "梯度和 AdamW 状态共多少 GB（1e9 字节）"),
         ("{millions:.1f}M parameters x 16 bytes = {truth:.2f} GB per GPU, at k = 16 as at k = 8",
          "{millions}M 个参数 x 16 字节 = 每张 GPU {truth} GB，k = 16 和 k = 8 时一样"),
         Numeric(_adamw_state, ("GB", "GB"), 0.1, (
             "{given:g} GB is not within 0.1 GB of the state; k moves only the activations, and "
             "fp32 weights, gradients and AdamW's two moments take 4 bytes each per parameter",
             "{given:g} GB 与状态的大小相差超过 0.1 GB；k 只改变激活值，而 fp32 的权重、梯度以及 "
             "AdamW 的一阶矩和二阶矩，每个参数各占 4 字节")))
