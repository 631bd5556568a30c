"""The Chinese page's words (docs/zh/conformance.md, terms as in docs/zh/glossary.md). The
table's numbers come from the same JSON as the English page's; every English sentence the
page draws from the JSON (a scenario's title, a thread's summary, a note, a reason) is looked up
here, so an English sentence changed without its Chinese stops ``make conformance``."""

from __future__ import annotations

__all__ = ["TRANSLATED", "WORDS"]

#: the page's own words, by key (the English page's are in table.py's ``_ENGLISH``)
WORDS = {
    "title": "# 一致性表",
    "intro": (
        "每个框架的梯度累积路径都按其文档的写法，在一个小 GPT-2 上跑一次优化器更新（float64，"
        "SGD），再与本库的基准真值（`full_batch_gradients`）算出的大批次更新对比：每个单元格是"
        "这次更新的相对误差，旁边是框架记录的损失与窗口真实平均 token 损失的对比。✅ 表示一致"
        "（相对误差 ≤ {tolerance}），❌ 表示偏差，并链接上游讨论（issue）和复现程序；找不到"
        "讨论的写作“原因不明”。"),
    "pinned": (
        "固定版本：{versions}。由 `make conformance`（`gradaccum_course/audits/conformance/`）"
        "写出，[英文版](../conformance.md)与本页出自同一份 JSON。`Trainer` 记录的损失来自一次"
        "使用默认（随机）采样器的运行（2 个进程时用顺序采样器），与它放进窗口的样本的真实"
        "均值对比；Lightning 记录的是 "
        "`self.log(..., on_epoch=True)` 的值（2 个进程时取 0 号进程的）；TRL 记录的是 "
        "SFTTrainer 每步的 `loss`（顺序采样器；2 个进程时取 0 号进程的）。"),
    "figure": (
        "两张表的热力图（`docs/conformance/conformance.png`；笔记本 04b 在"
        "[最后一节](../../notebooks/zh/04b_framework_audit.zh.ipynb)里也画了它）："),
    "scenarios": "## 场景",
    "scenario_line": "- `{key}`：{title}；k = {k}，每个微批次预测的 token 数：{tokens}",
    "gradient": "## 更新与大批次更新的比较",
    "logged": "## 记录的损失与窗口真实均值的比较",
    "framework": "框架",
    "deviations": "## 每个偏差，以及未运行的部分",
    "not run": "未运行",
    "unexplained": "原因不明",
    "program": "复现程序",
    "logged not run": "记录的损失未运行：{reason}",
    "cell not run": "未运行：{reason}",
    "program line": "复现程序：{links}（"
                    "`python -m gradaccum_course.audits.conformance.repro.名称`，"
                    "偏差消失或改变时以非零状态退出）",
    "not yet": "尚未纳入本表：TRL 的其他 trainer（DPO、KTO、RLOO、奖励模型）、MoE 路由器的辅助"
               "损失；GRPO 系列那一行在表中但未运行（原因见上）。",
}

#: English sentence -> its Chinese
TRANSLATED = {
    # scenarios
    "equal micro-batches": "微批次相同",
    "uneven tokens across micro-batches": "各微批次的 token 数不均",
    "a partial last window (2 of k = 4 micro-batches)":
        "最后一个不满的窗口（k = 4 个微批次中只有 2 个）",
    "clipping at 1.0 (equal micro-batches)": "梯度裁剪阈值 1.0（微批次相同）",
    "uneven tokens, forward without num_items_in_batch":
        "token 数不均，`forward` 不接受 num_items_in_batch",
    "uneven tokens, forward takes **kwargs but drops num_items_in_batch":
        "token 数不均，`forward` 接受 **kwargs 但丢掉 num_items_in_batch",
    "equal micro-batches, labels = input_ids (position 0 labelled)":
        "微批次相同，labels = input_ids（位置 0 也有标签）",
    "uneven tokens across 2 gloo ranks (k = 2 micro-batches per rank)":
        "token 数不均，分布在 2 个 gloo 进程上（每个进程 k = 2 个微批次）",
    # threads
    "the last, incomplete window was divided by the configured k":
        "最后一个不满的窗口被除以配置的 k",
    "merged: divide by the micro-batches the window really holds; the pinned version has it "
    "(this cell matches)":
        "已合并：除以窗口实际包含的微批次数；固定版本已包含此修复（本单元格一致）",
    "a model whose forward does not accept loss kwargs gets no window count: each micro-batch's "
    "mean loss divided by k":
        "`forward` 不接受损失参数的模型拿不到窗口的 token 数：每个微批次的平均损失除以 k",
    "open: heads that declare **kwargs but drop num_items_in_batch train with a loss inflated "
    "by about k":
        "未解决：声明 **kwargs 却丢掉 num_items_in_batch 的头，训练时损失约被放大 k 倍",
    "open: accumulate_grad_batches is not normalised as the large batch is (the token-count "
    "issue transformers fixed in 2024); padded uneven-length samples train worse than with the "
    "larger batch":
        "未解决：accumulate_grad_batches 的归一化与大批次不同（transformers 在 2024 年修复的 "
        "token 计数问题）；长度不均、带填充的样本训练效果不如更大的批"
        "大小",
    "open: the reporter finds the last, incomplete window of an epoch scaled by "
    "accumulate_grad_batches instead of by the batches it holds":
        "未解决：报告者发现一个 epoch 最后一个不满的窗口按 accumulate_grad_batches 缩放，"
        "而不是按它实际包含的批次数",
    # notes
    "no thread found (unexplained upstream). Measured: the update is 56/64 of the truth's, the "
    "56 predicted tokens over the 64 labelled positions: GPT2LMHeadModel's loss_type is None, "
    "so the Trainer counts position 0, which the shifted loss never predicts":
        "没有找到上游讨论（原因不明）。实测：更新是基准真值的 56/64，即 56 个被预测的 token 比 "
        "64 个有标签的位置：GPT2LMHeadModel 的 loss_type 为 None，`Trainer` 把位置 0 也计入，"
        "而移位后的损失从不预测它",
    "no thread found (unexplained). Measured: the update is the mean of the micro-batch means' "
    "(accelerator.backward divides each mean loss by k)":
        "没有找到上游讨论（原因不明）。实测：更新是微批次均值的均值给出的更新"
        "（accelerator.backward 把每个平均损失除以 k）",
    "no thread found (unexplained). Measured: the update is 2/4 of the truth's: the 2 "
    "micro-batches of the last window are each divided by the configured k = 4":
        "没有找到上游讨论（原因不明）。实测：更新是基准真值的 2/4：最后一个窗口的 2 个微批次"
        "各自除以配置的 k = 4",
    "the logged train_loss (on_epoch) is the micro-batch means averaged by the batch size "
    "Lightning infers (sequences), not by tokens: no thread found for the logged value":
        "记录的 train_loss（on_epoch）是按 Lightning 推断的批大小（序列数）加权的微批次均值，"
        "而不是按 token 加权：没有找到关于这个记录值的上游讨论",
    "no thread found (unexplained). Measured: on 2 gloo ranks, k = 2 each, the update is the "
    "mean of the 4 micro-batch means', as in one process":
        "没有找到上游讨论（原因不明）。实测：在 2 个 gloo 进程上、每个 k = 2 时，更新是 4 个"
        "微批次均值的均值给出的更新，与单进程相同",
    "no thread found (unexplained). Measured: on 2 gloo ranks, k = 2 each, the update is the "
    "mean of the 4 micro-batch means' (the cause of Lightning #20350, over ranks), of other "
    "micro-batches than one process's: under DDP Lightning shuffles the training samples "
    "(DistributedSampler, seed 0) though the loader given does not; the train_loss logged on "
    "rank 0 is that rank's own mean of its 2 micro-batch means (self.log's sync_dist is off "
    "by default)":
        "没有找到上游讨论（原因不明）。实测：在 2 个 gloo 进程上、每个 k = 2 时，更新是 4 个"
        "微批次均值的均值给出的更新（即 Lightning #20350 的原因，跨进程），但微批次与单进程的"
        "不同：DDP 下 Lightning 会打乱训练样本（DistributedSampler，seed 0），即使传入的 "
        "DataLoader 不打乱；0 号进程记录的 train_loss 是它自己 2 个微批次均值的均值"
        "（self.log 的 sync_dist 默认关闭）",
    # TRL
    "merged: causal-LM losses never predict position 0, so the Trainer counts labels[..., 1:] "
    "for num_items_in_batch, but only for models whose loss_type maps to ForCausalLMLoss":
        "已合并：因果语言模型的损失从不预测位置 0，所以 `Trainer` 计算 num_items_in_batch 时只数 "
        "labels[..., 1:]，但仅限 loss_type 对应 ForCausalLMLoss 的模型",
    "Measured: GPT2LMHeadModel's loss_type is None and SFTTrainer's collator labels position 0 "
    "(labels = input_ids), so num_items_in_batch counts the labelled positions: the update and "
    "the logged loss are the predicted tokens over them (56/64 equal, 30/38 uneven, 28/32 "
    "partial, 30/38 on 2 ranks); with model.loss_type = \"ForCausalLM\" the update matches":
        "实测：GPT2LMHeadModel 的 loss_type 为 None，而 SFTTrainer 的整理函数（collator）给位置 0 "
        "也打了标签（labels = input_ids），所以 num_items_in_batch 数的是有标签的位置：更新和记录"
        "的损失都是被预测的 token 数与它之比（微批次相同时 56/64，不均时 30/38，不满的窗口 "
        "28/32，2 个进程时 30/38）；设 model.loss_type = \"ForCausalLM\" 后更新一致",
    "Measured: clipping at 1.0 rescales the 56/64 update to the large batch's (same direction, "
    "norm above 1), so the update matches; the logged loss is still 56/64 of the true mean":
        "实测：阈值 1.0 的梯度裁剪把 56/64 的更新缩放回大批次的更新（方向相同，范数大于 1），"
        "所以更新一致；记录的损失仍是真实均值的 56/64",
    "asks why the dapo loss is not divided by the accumulation steps; the maintainer: "
    "num_items_in_batch counts the whole accumulated batch":
        "提问者问 dapo 的损失为何不除以累积步数；维护者答：num_items_in_batch 数的是整个累积"
        "后的批次",
    "merged: dapo, cispo and vespo were scaled by gradient_accumulation_steps / "
    "steps_per_generation; the pinned source has the rescaling (read, not measured here)":
        "已合并：dapo、cispo 和 vespo 曾被多乘了 gradient_accumulation_steps / "
        "steps_per_generation；固定版本的源码已有这一修正（读过源码，本表未测量）",
    # reasons
    "does not apply: SFTTrainer computes the token loss itself (its fused LM head, not the "
    "model's forward) and its collator always labels position 0 (labels = input_ids)":
        "不适用：SFTTrainer 自己计算 token 损失（用它融合的 LM 头，而不是模型的 `forward`），"
        "且它的整理函数总给位置 0 打标签（labels = input_ids）",
    "TRL 1.16.0 aggregates the GRPO-family losses (grpo, bnpo, dr_grpo, dapo, cispo, vespo) in "
    "the private GRPOTrainer._compute_loss, on the batch that generation and reward scoring "
    "build; the public compute_loss takes that undocumented batch and training_step generates "
    "first, so no public or documented entry point runs the aggregation without generation":
        "TRL 1.16.0 在私有的 GRPOTrainer._compute_loss 里汇总 GRPO 系列损失（grpo、bnpo、"
        "dr_grpo、dapo、cispo、vespo），输入是生成和奖励打分构造的批次；公开的 compute_loss "
        "接收的正是这个没有文档的批次，training_step 又会先生成，所以没有任何公开或有文档的"
        "入口能在不生成的情况下运行这段汇总",
    "Accelerate logs no loss: the loop's user logs what they compute":
        "Accelerate 自己不记录损失：记录什么由写循环的人决定",
}
