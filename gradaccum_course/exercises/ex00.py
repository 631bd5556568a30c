"""Notebook 00's exercises (the article)."""

from torch.utils.data import DataLoader, DistributedSampler

from gradaccum_course.exercises import BERT_BASE_CHINESE, Numeric, register
from gradaccum_lib.batches import windows_of
from gradaccum_lib.workloads.models import count_bert_parameters


def _ddp_effective_batch() -> dict:
    micro, k, world = 32, 8, 8
    seen = 0
    for rank in range(world):  # what each rank's loader feeds into its first window
        sampler = DistributedSampler(range(100_000), num_replicas=world, rank=rank,
                                     shuffle=False)
        loader = DataLoader(range(100_000), batch_size=micro, sampler=sampler)
        seen += sum(len(batch) for batch in next(windows_of(loader, k)))
    return {"truth": seen, "micro": micro, "k": k, "world": world}


register("00.1", ("parameters of bert-base-chinese, in millions",
                  "bert-base-chinese 的参数量，以百万计"),
         ("the parameters of bert-base-chinese with a 2-class head, in millions (±1M)",
          "带 2 分类任务头的 bert-base-chinese 的参数量，以百万计（误差在一百万以内）"),
         ("bert-base-chinese with a 2-class head has {truth:.2f}M parameters",
          "带 2 类分类头的 bert-base-chinese 有 {truth}M 个参数"),
         Numeric(lambda: {"truth": count_bert_parameters(BERT_BASE_CHINESE, num_labels=2) / 1e6},
                 ("millions of parameters", "参数量，以百万计"), 1.0, (
             "{given:g}M is not within 1M of the count; count the embeddings (vocabulary x "
             "hidden), then 12 layers of attention (4 h x h) and feed-forward (2 h x 4h)",
             "{given:g}M 与实际参数量相差超过 1M；先数嵌入层（词表大小 x 隐藏维度），再数 12 "
             "层的注意力（4 h x h）和前馈层（2 h x 4h）")))
register("00.2", ("samples per optimizer step under DDP", "DDP 下一次优化器更新的样本数"),
         ("the samples in one optimizer step: micro-batches of 32, k = 8, 8 DDP ranks",
          "一次优化器更新的样本数：微批次 32、k = 8、8 个 DDP 进程"),
         ("one optimizer step sees {truth} samples: {micro} per micro-batch x k={k} x {world} "
          "ranks",
          "一次优化器更新看到 {truth} 个样本：每个微批次 {micro} 个 x k={k} x {world} 个进程"),
         Numeric(_ddp_effective_batch, ("samples", "样本数"), 0, (
             "{answer} is not it: under DDP every one of the {world} ranks runs the whole loop on "
             "its own share of the data",
             "{answer} 不对：在 DDP 下，{world} 个进程每个都在自己分到的那份数据上跑完整的循环")))
