"""The Chinese page's words (docs/zh/conformance.md, terms as in docs/zh/glossary.md). The
table's numbers come from the same JSON as the English page's; every English sentence the
page draws from the JSON (a scenario's title, a thread's summary, a note, a reason) is looked up
here, so an English sentence changed without its Chinese stops ``make conformance``."""

from __future__ import annotations

from .grpo import ACCUMULATION_STEPS, LOSS_TYPES, MICRO_BATCH_SIZE
from .trl import GRPO_NOT_RUN

__all__ = ["TRANSLATED", "WORDS"]

#: the page's own words, by key (the English page's are in table.py's ``_ENGLISH``)
WORDS = {
    "title": "# 一致性表",
    "intro": (
        "每个框架的梯度累积路径都按其文档的写法，在一个小 GPT-2 上跑一次优化器更新（float64，"
        "SGD；`moe_aux` 一列用一个小 Qwen3-MoE），再与本库的基准真值（`full_batch_gradients`）"
        "算出的大批次更新对比：每个单元格是"
        "这次更新的相对误差，旁边是框架记录的损失与窗口真实平均 token 损失"
        "（`moe_aux` 中再加上负载均衡项）的对比。✅ 表示一致"
        "（相对误差 ≤ {tolerance}），❌ 表示偏差，并链接上游讨论（issue，或一篇论文）和复现程序；"
        "找不到"
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
    "grpo": "## TRL GRPOTrainer 的各种损失类型：k 个微批次与一个批次的比较",
    "grpo intro": (
        "上面 GRPO 系列那一行不在这些场景上运行（GRPOTrainer 训练的是它自己生成的补全）；它的"
        "各种损失类型在这里通过 `GRPOTrainer(...).train()`（TRL {version}）运行：同一个小 "
        "float64 GPT-2 做一次 SGD 更新，beta = 0，一次迭代，不裁剪，{prompts} 个提示 × 每个 "
        "{generations} 个补全，补全最多 {max_length} 个 token，奖励是它的长度"
        "（补全长度：{lengths}）。"
        "运行 A 把它们分成 k = {k} 个每个 {b} 条的微批次，运行 B 作为一个 {large} 条的批次；"
        "两次生成的补全相同（有断言）。单元格是 A 的更新相对 B 的更新的相对误差，B 即按该损失"
        "类型自己的定义算出的大批次更新。未运行：记录的损失、多个进程、多于一次迭代、不满的窗口。"),
    "loss type": "损失类型",
    "grpo update": "更新与一个批次的比较",
    "grpo tokens": "每个微批次的补全 token 数（运行 A）",
    "threads checked": "## 已读、但未列入表中的上游讨论",
    "threads intro": ("每条都逐一读过；所述状态以固定版本为准；之所以没有列为单元格，是因为它涉及的"
                      "代码路径本表没有运行。"),
    "not yet": (
        "尚未纳入本表：TRL 的其他 trainer（DPO、KTO、RLOO、奖励模型）；GRPOTrainer 除了各损失"
        "类型在一个生成窗口上的更新（见上）之外的一切。其他框架在这台没有 GPU 的机器上、"
        "在项目环境之外试过：**DeepSpeed "
        "0.19.8 跑起来了**（用它的 CPU 加速器和 gloo，不编译它的算子；"
        "`scripts/try_deepspeed_cpu.py`、`benchmarks/deepspeed_cpu.txt`）：一个完整的 float32 "
        "窗口一致（2.5e-07），最后一个不满的窗口不做优化器更新（它的梯度被带进下一个窗口），且它"
        "拒绝 float64 梯度，所以不是这张 float64 表的一列。**torchtune 0.6.1 配最新的 torchao "
        "0.18.0 导入失败**：它要导入 `torchao.dtypes.nf4tensor`，torchao 0.17.0 有这个模块，"
        "0.18.0 已经没有；配 torchao 0.17.0 可以导入，但没有运行 torchtune 的任何训练流程"
        "（`benchmarks/torchtune_torchtitan_cpu.txt`）。**torchtitan 0.3.0 没有跑起来**（同一"
        "文件）：导入它的 trainer 需要 triton；装上 triton 后，由于没有加速器，它选用 CUDA 设备，"
        "在 `torch.cuda.set_device` 处报错；它的源码（读过源码，未运行）把每个微批次的求和损失"
        "除以整个窗口里未被损失忽略的 token 数，这个数对所有数据并行进程求和。"),
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
    "the logged train_loss (on_epoch) is the micro-batch means averaged by the batch size "
    "Lightning infers (sequences), not by tokens: no thread found for the logged value":
        "记录的 train_loss（on_epoch）是按 Lightning 推断的批大小（序列数）加权的微批次均值，"
        "而不是按 token 加权：没有找到关于这个记录值的上游讨论",
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
    "steps_per_generation; the pinned source has the rescaling, and the GRPO table measures "
    "these three loss types matching":
        "已合并：dapo、cispo 和 vespo 曾被多乘了 gradient_accumulation_steps / "
        "steps_per_generation；固定版本的源码已有这一修正，GRPO 表测得这三种损失类型一致",
    # reasons
    "does not apply: SFTTrainer computes the token loss itself (its fused LM head, not the "
    "model's forward) and its collator always labels position 0 (labels = input_ids)":
        "不适用：SFTTrainer 自己计算 token 损失（用它融合的 LM 头，而不是模型的 `forward`），"
        "且它的整理函数总给位置 0 打标签（labels = input_ids）",
    "Accelerate logs no loss: the loop's user logs what they compute":
        "Accelerate 自己不记录损失：记录什么由写循环的人决定",
    # added with the MoE scenario and the threads read in December 2026
    "equal micro-batches, a Qwen3-MoE whose loss adds its router's load-balancing loss "
    "(coefficient 0.001)":
        "微批次相同，一个 Qwen3-MoE 模型，其损失加上路由器的负载均衡损失（系数 0.001）",
    "merged (documentation): the gradient-accumulation guide shows the loop summing the token "
    "loss and dividing by the window's token count, gathered over the processes, because "
    "accumulate() divides each micro-batch's loss by k":
        "已合并（文档）：梯度累积指南里的循环先对 token 损失求和，再除以在各进程间汇总的窗口 "
        "token 数，因为 accumulate() 会把每个微批次的损失除以 k",
    "Measured: the update is 56/64 of the truth's, the 56 predicted tokens over the 64 "
    "labelled positions: GPT2LMHeadModel's loss_type is None, so PR #46204's shifted count "
    "does not apply and the Trainer counts position 0, which the shifted loss never predicts":
        "实测：更新是基准真值的 56/64，即被预测的 56 个 token 与有标签的 64 个位置之比："
        "GPT2LMHeadModel 的 loss_type 为 None，PR #46204 的移位计数不适用，`Trainer` 把位置 0 "
        "也计入，而移位后的损失从不预测它",
    "Measured: the update is the mean of the micro-batch means' (accelerator.backward divides "
    "each mean loss by k); Accelerate's basic documented loop (accelerator.backward(loss) per mic"
    "ro-batch) passes no token count":
        "实测：更新等于按微批次均值的均值算出的更新（accelerator.backward 把每个平均损失除以 k）；"
        "Accelerate 文档中最基本的循环（每个微批次 accelerator.backward(loss)）不传 token 数",
    "no thread found for the scale (unexplained). Measured: the update is 2/4 of the truth's: "
    "the 2 micro-batches of the last window are each divided by the configured k = 4. "
    "accelerate #1847 (closed, documentation) says only that the last batch of the DataLoader "
    "makes the optimizer step however few micro-batches the window holds":
        "没有找到关于这个缩放的上游讨论（原因不明）。实测：更新是基准真值的 2/4：最后一个窗口的 "
        "2 个微批次各自除以配置的 k = 4。accelerate #1847（已关闭，文档类）只说 DataLoader 的"
        "最后一个批次会触发一次优化器更新，不论窗口里有几个微批次",
    "Measured: on 2 gloo ranks, k = 2 each, the update is the mean of the 4 micro-batch "
    "means', as in one process":
        "实测：在 2 个 gloo 进程上、每个 k = 2 时，更新是 4 个微批次均值的均值给出的更新，与"
        "单进程相同",
    "Measured: on 2 gloo ranks, k = 2 each, the update is the mean of the 4 micro-batch means' "
    "(the cause of Lightning #20350, over ranks), of other micro-batches than one process's: "
    "under DDP Lightning shuffles the training samples (DistributedSampler, seed 0) though the "
    "loader given does not; the train_loss logged on rank 0 is that rank's own mean of its 2 "
    "micro-batch means (self.log's sync_dist is off by default)":
        "实测：在 2 个 gloo 进程上、每个 k = 2 时，更新是 4 个微批次均值的均值给出的更新（即 "
        "Lightning #20350 的原因，跨进程），但微批次与单进程的不同：DDP 下 Lightning 会打乱训练"
        "样本（DistributedSampler，seed 0），即使传入的 DataLoader 不打乱；0 号进程记录的 "
        "train_loss 是它自己 2 个微批次均值的均值（self.log 的 sync_dist 默认关闭）",
    "no thread found in transformers (unexplained upstream). Measured: the cross-entropy part "
    "of the update matches (num_items_in_batch), but each micro-batch's load-balancing term is "
    "added unscaled, so the auxiliary part weighs about 4 times the large batch's (k = 4) and the "
    "logged loss carries it 4 times; NeMo AutoModel fixed the same mechanism in its own loop "
    "(NVIDIA-NeMo/Automodel PR #3359); transformers #48690 (open) is its 2-rank relative, the "
    "term multiplied by the world size":
        "在 transformers 中没有找到上游讨论（原因不明）。实测：更新的交叉熵部分一致"
        "（num_items_in_batch），但每个微批次的负载均衡项都未经缩放地加进来，所以辅助部分的权重"
        "约是大批次的 4 倍（k = 4），记录的损失也把它计了 4 次；NeMo AutoModel 在它自己的循环"
        "里修复过同样的问题（NVIDIA-NeMo/Automodel PR #3359）；transformers #48690（未解决）是它在 "
        "2 个进程上的同类问题：这一项被乘以进程数",
    # threads read that are not a cell
    "open: under nn.DataParallel (n_gpu > 1 in one process) each replica divides its summed "
    "loss by the whole batch's count and training_step then averages the replicas, so the loss "
    "is 1/n_gpu of the mean; the pinned 5.23.0 source still does both (read), and the fix PRs "
    "#40610, #40747, #41530 and #42150 were closed unmerged. Not a cell: DataParallel needs "
    "several GPUs in one process; the table's ranks are CPU processes":
        "未解决：在 nn.DataParallel 下（一个进程里 n_gpu > 1），每个副本把自己的求和损失除以整个"
        "批次的 token 数，training_step 再对各副本取平均，所以损失只有均值的 1/n_gpu；固定版本 5."
        "23.0 "
        "的源码仍然两步都做（读过源码），修复 PR #40610、#40747、#41530 和 #42150 都未合并即关闭"
        "。未列为单元格：DataParallel 需要一个进程里有多块 GPU；本表的进程都是 CPU 进程",
    "merged, fixes #43899 (the Trainer ignored sync_each_batch in AcceleratorConfig's "
    "gradient_accumulation_kwargs): first released in transformers 5.2.0 (5.1.0's trainer.py "
    "does not read it), and the pinned 5.23.0 reads it. Not a cell: it changes when DDP "
    "all-reduces the gradients, not what is summed (not measured here)":
        "已合并，修复 #43899（`Trainer` 忽略了 AcceleratorConfig 的 gradient_accumulation_kwargs "
        "里的 sync_each_batch）：首次发布于 transformers 5.2.0（5.1.0 的 trainer.py 不读取这个参"
        "数），"
        "固定版本 5.23.0 会读取它。未列为单元格：它改变的是 DDP 何时对梯度做全规约，而不是求和的"
        "内容"
        "（本表未测量）",
    "open: with DeepSpeed, accelerator.backward runs the engine's backward and step, and the "
    "engine keeps its own accumulation boundary, which may disagree with Accelerate's "
    "sync_gradients; accelerate PR #3630 (merged; first in 1.8.0, whose deepspeed.py has it and "
    "1.7.0's does not) sets the engine's boundary from sync_gradients, and the pinned 1.15.0 "
    "does. Not a cell: DeepSpeed is not a column (below)":
        "未解决：使用 DeepSpeed 时，`accelerator.backward` 会调用引擎的 `backward()` 和 "
        "`step()`，而引擎有"
        "自己的累积边界，可能与 Accelerate 的 sync_gradients 不一致；accelerate PR #3630（已合并"
        "；首次出现在 1.8.0，它的 deepspeed.py 有这段，1.7.0 的没有）按 sync_gradients 设置引擎"
        "的边界，固定版本 1.15.0 也是如此。未列为单元格：DeepSpeed 不是本表的一列（见下）",
    "closed: GRPOTrainer appends its loss-path metrics (policy_loss, entropy) once per "
    "micro-batch and log() averages the entries, so windows of different sizes (an epoch's "
    "short last one) weigh by their micro-batch count; its PR #7053 was closed unmerged, and "
    "the pinned 1.16.0 still appends policy_loss once per micro-batch (read). Not a cell: it is "
    "about GRPO's logged metrics, and the GRPO table measures the update only":
        "已关闭：GRPOTrainer 的损失相关指标（policy_loss、entropy）每个微批次追加一次，log() 再对"
        "这些条目取平均，所以大小不同的窗口（一个 epoch 最后一个不满的窗口）按微批次数加权；它的 "
        "PR #7053 未合并即关闭，固定版本 1.16.0 仍每个微批次追加一次 policy_loss（读过源码）。"
        "未列为单元格：它讲的是 GRPO 记录的指标，而 GRPO 表只测量更新",
    "open: skip the gradient scaling when accumulation is 1; a reviewer shows that the "
    "distributed recipe scales the loss by the rank's own token count and the gradients by the "
    "world size over the global count, which cancel only when every rank holds the same "
    "tokens. Not a cell: torchtune is not a column (below: it does not import with the newest "
    "torchao)":
        "尚未合并：累积步数为 1 时跳过梯度缩放；一位审阅者指出，分布式配方把损失按本进程的 "
        "token 数缩放、把梯度乘以“进程数 / 全局 token 数”，两者只有在每个进程的 token 数相同时"
        "才相互抵消。未列为单元格：torchtune 不是本表的一列（见下：用最新的 torchao 时它无法导入）",
    "open: with average_tokens_across_devices the Trainer multiplies Qwen3-MoE's whole loss, "
    "its router load-balancing term included, by the world size, so that term grows with the "
    "ranks; its fix PRs #48691 and #48706 are open. Not a cell: the MoE column runs one process ("
    "its "
    "accumulation counterpart is the Trainer × moe_aux cell)":
        "未解决：开启 average_tokens_across_devices 时，`Trainer` 把 Qwen3-MoE 的整个损失（包括"
        "路由器的负载均衡项）乘以进程数，于是这一项随进程数增长；修复 PR #48691 和 #48706 尚未合"
        "并。未列为单元"
        "格：MoE 这一列只跑一个进程（与之对应的累积情形是 `Trainer` × moe_aux 单元格）",
}

_MOE_MEAN_ZH = (
    "这是设计上的选择，不是缺陷：框架取每个微批次各自的负载均衡损失，"
    "MoE 训练框架通常都这样做（Qiu 等，2025；他们改为在全局批次上同步路由计数）。"
    "实测：交叉熵部分一致，辅助部分的权重也与大批次相同（1.00），"
    "但它是 4 个微批次负载均衡梯度的均值，与整个窗口的负载均衡梯度相差 30%：这个损失是两个"
    "批均值的乘积，无论怎样按微批次缩放，都得不到窗口的值（笔记本 08 第 2 节：用窗口的路由计数才"
    "行）")
TRANSLATED["paper (ACL 2025): MoE training frameworks compute the load-balancing loss within "
           "each micro-batch; the authors sync the experts' selection frequencies across "
           "micro-batches to compute it over the global batch, and report lower perplexity and "
           "more specialised experts"] = (
    "论文（ACL 2025）：MoE 训练框架通常在每个微批次内计算负载均衡损失；"
    "作者在各微批次之间同步专家被选中的频率，在全局批次上计算它，并报告困惑度更低、专家分工更明确")
_LOGGED_SMALL_ZH = "；记录的损失与窗口真实均值之差在容差（1e-6）以内"
# keyed by the English as every entry here is: an English edit without its Chinese raises
_MOE_MEAN = (
    "a design choice, not a bug: the framework takes each micro-batch's load-balancing loss, "
    "as MoE training frameworks usually do (Qiu et al. 2025, who sync the routed counts over the "
    "global batch instead). Measured: the cross-entropy part matches and the auxiliary part has "
    "the large batch's weight (1.00), but it is the mean of the 4 micro-batches' load-balancing "
    "gradients, 30% off the window's: the loss is a product of two batch means, so no "
    "per-micro-batch scale gives the window's (notebook 08 §2: the window's routed counts do)")
_LOGGED_SMALL = "; the logged loss is within the tolerance (1e-6) of the window's true mean"
TRANSLATED |= {  # the notes of the MoE cells
    _MOE_MEAN: _MOE_MEAN_ZH,
    _MOE_MEAN + _LOGGED_SMALL: _MOE_MEAN_ZH + _LOGGED_SMALL_ZH,
    _MOE_MEAN + "; SFTTrainer divides the term by the accumulation steps, and Qwen3-MoE's "
    "loss_type is ForCausalLM, so its count is right" + _LOGGED_SMALL:
        _MOE_MEAN_ZH + "；SFTTrainer 把这一项除以累积步数，且 Qwen3-MoE 的 loss_type 是 "
        "ForCausalLM，所以它的 token 计数正确" + _LOGGED_SMALL_ZH,
}

# the GRPO table (December 2026)
TRANSLATED |= {
    "open: asks why GRPO trains worse with gradient accumulation; a comment reads the bnpo "
    "branch (each micro-batch's summed token loss over its own token count) as still differing "
    "from the large batch under accumulation":
        "未解决：提问者问为什么开启梯度累积后 GRPO 训练变差；一条评论读了 bnpo 分支（每个微批次"
        "的求和 token 损失除以它自己的 token 数），认为它在累积下仍与大批次不同",
    "documented: GRPOConfig's loss_type docstring says bnpo normalises over the local batch "
    "only, so results may vary with the local batch size at a constant effective batch size. "
    "Measured: each micro-batch's token mean divided by k weighs the tokens of micro-batch i by "
    "1/(4 n_i), n_i its completion tokens, instead of 1/N, N the window's, so the tokens of the "
    "micro-batches with fewer tokens weigh more":
        "有文档说明：GRPOConfig 中 loss_type 的文档字符串说 bnpo 只在本地批次上归一化，所以在"
        "有效批大小不变时结果可能随本地批大小变化。实测：每个微批次的 token 均值再除以 k，使微"
        "批次 i 的 token 权重为 1/(4 n_i)（n_i 是它的补全 token 数），而不是 1/N（N 是窗口的），"
        "于是 token 较少的微批次里的 token 权重更大",
    "Measured: a match. Why (read in the source): each micro-batch's mean over its sequences, "
    "divided by k, is the large batch's mean over sequences because every micro-batch holds 2 "
    "sequences":
        "实测：一致。原因（读源码）：每个微批次对其序列取平均再除以 k，等于大批次对序列的平均，"
        "因为每个微批次都有 2 条序列",
    "Measured: a match. Why (read in the source): each micro-batch's sum over (its 2 sequences "
    "× max_completion_length), divided by k, is the large batch's sum over (8 × "
    "max_completion_length)":
        "实测：一致。原因（读源码）：每个微批次的和除以（它的 2 条序列 × "
        "max_completion_length）再除以 k，等于大批次的和除以（8 × max_completion_length）",
}

# the GRPO row's reason: its loss types and sizes are grpo.py's, in both languages
TRANSLATED[GRPO_NOT_RUN] = (
    "GRPOTrainer 不在这些场景的 token 窗口上训练：它自己生成补全并打奖励，所以它的各种损失"
    f"类型（{'、'.join(LOSS_TYPES)}）在它自己的一个生成窗口上测量，见 GRPO 表："
    f"GRPOTrainer(...).train() 用 k = {ACCUMULATION_STEPS} 个每个 {MICRO_BATCH_SIZE} 条的微批次，"
    f"与同一批补全组成的一个 {ACCUMULATION_STEPS * MICRO_BATCH_SIZE} 条的批次对比（只比较更新；"
    "不比较它记录的损失，也不测多个进程、多于一次迭代或不满的窗口）")
