"""Notebook 09's exercises (the article, checked)."""

import math

from torch.utils.data import DistributedSampler

from gradaccum_course.exercises import Numeric, register
from gradaccum_lib.measure.planning import DdpStepModel

#: the hints of known wrong answers, English and Chinese
_HINTS = {
    "percentage": ("{given:g} is a percentage; give the share as a fraction of 1",
                   "{given:g} 是百分数；请给出 0 到 1 之间的比例"),
    "without no_sync": ("{given:g} is the share without no_sync: then every micro-step "
                        "all-reduces",
                        "{given:g} 是不用 no_sync 时的占比：那样每个微步都要全规约"),
    "one process": ("{given:g} is one process's count of steps (and each rank's count of "
                    "micro-steps under DDP); under DDP each of the {gpus} ranks takes 1/{gpus} of "
                    "the records, and a step takes k micro-steps",
                    "{given:g} 是单进程的更新次数（也是 DDP 下每个进程的微步数）；在 DDP 下 {gpus} "
                    "个进程每个只分到 1/{gpus} 的数据，而一次更新要 k 个微步"),
}


def _communication_share() -> dict:
    step = DdpStepModel.from_comm_share(compute_per_micro_step=1.0, comm_share=0.6)
    return {"truth": step.comm_fraction(4, "window"), "every": step.comm_fraction(4, "every")}


def _article_epoch_steps() -> dict:
    records, micro, k, gpus = 1_000_000, 32, 8, 8
    sampler = DistributedSampler(range(records), num_replicas=gpus, rank=0, shuffle=False)
    micro_batches = math.ceil(len(sampler) / micro)
    return {"truth": math.ceil(micro_batches / k), "records": len(sampler), "gpus": gpus,
            "micro_batches": micro_batches, "one_process": math.ceil(records / (micro * k))}


register("09.1", ("the communication share at k = 4", "k = 4 时通信所占的比例"),
         ("a fraction: the share of a step spent in all-reduce at k = 4 with no_sync, if it is "
          "0.6 at k = 1",
          "一个比例：若 k = 1 时全规约占一步的 0.6，用 no_sync、k = 4 时它占一步的多少"),
         ("at k = 4 with no_sync, communication is {truth:.3f} of the step (0.6 at k = 1)",
          "每个窗口只同步一次、k = 4 时，通信占一步的 {truth}（k = 1 时是 0.6）"),
         Numeric(_communication_share, ("a fraction", "一个比例"), 0.005,
                 guards=((lambda given, _: given <= 1, _HINTS["percentage"]),
                         (lambda given, values: abs(given - values["every"]) > 0.005,
                          _HINTS["without no_sync"])), hint=(
             "{given:g} is not it; at k = 1 one all-reduce costs 0.6 / 0.4 = 1.5 micro-steps of "
             "compute, and a window has k micro-steps of compute and one all-reduce",
             "{given:g} 不对；k = 1 时一次全规约的时间是 0.6 / 0.4 = 1.5 个微步的计算，"
             "而一个窗口有 k 个微步的计算和一次全规约")))
register("09.2", ("optimizer steps in an epoch of the article's records",
                  "文章的一百万条病历，一个 epoch 的优化器更新次数"),
         ("a number: the optimizer steps of one epoch of 1,000,000 records, micro-batches of 32, "
          "k = 8, 8 GPUs",
          "一个数：1,000,000 条病历、微批次 32、k = 8、8 张 GPU，一个 epoch 的优化器更新次数"),
         ("each rank gets {records} records, {micro_batches} micro-batches: {truth} optimizer "
          "steps", "每个进程分到 {records} 条病历、{micro_batches} 个微批次：{truth} 次优化器更新"),
         Numeric(_article_epoch_steps, ("optimizer steps", "优化器更新次数"), 0,
                 guards=((lambda given, values: given not in (values["micro_batches"],
                                                              values["one_process"]),
                          _HINTS["one process"]),), hint=(
             "{given:g} is not it; count rank 0's samples, its micro-batches, then windows of k "
             "(a partial last window steps too)",
             "{given:g} 不对；先数 0 号进程的样本，再数它的微批次，最后数 k 个一组的窗口"
             "（最后一个不满的窗口也会更新）")))
