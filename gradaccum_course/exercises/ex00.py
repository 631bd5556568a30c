"""Notebook 00's exercises (the article)."""

from collections.abc import Callable

from torch.utils.data import DataLoader, DistributedSampler

from gradaccum_course.exercises import GIB, Numeric, register
from gradaccum_lib.batches import windows_of
from gradaccum_lib.measure.memory import memory_budget

#: the hints of known wrong answers to 00.1, English and Chinese
_STATE_HINTS = {
    "split over the ranks": (
        "{given:g} GB is the state split over the {world} GPUs; DDP splits the data, not the "
        "model: each rank holds all of it",
        "{given:g} GB 是把状态平分到 {world} 张 GPU 上的结果；DDP 切分的是数据，不是模型："
        "每个进程都存着全部状态"),
    "divided by k": (
        "{given:g} GB is the state divided by k = {k}; accumulation shrinks the activations "
        "only",
        "{given:g} GB 是状态除以 k = {k} 的结果；梯度累积缩小的只是激活值"),
    "weights only": (
        "{given:g} GB is the fp32 weights alone; add their gradients and AdamW's two moments",
        "{given:g} GB 只是 fp32 权重；还要加上梯度和 AdamW 的两个矩"),
}


def _state_per_gpu() -> dict:
    parameters, world, k = 1_300_000_000, 8, 16
    budget = memory_budget(parameters, optimizer="adamw", precision="fp32")  # k: not an input
    if budget.total < 16 * GIB:  # the sentence a right answer prints says it does not fit
        raise RuntimeError("00.1's model was meant not to fit a 16 GB V100")
    return {"truth": budget.total / 1e9, "billions": parameters / 1e9, "world": world, "k": k,
            "bytes": budget.total / parameters, "weights": budget.parameters / 1e9}


def _not_near(name: str) -> Callable[[float, dict], bool]:
    """A guard: the answer is not ``values[name]`` (or the truth over it, for an int name)."""
    def test(given: float, values: dict) -> bool:
        wrong = values["truth"] / values[name] if name in ("world", "k") else values[name]
        return abs(given - wrong) > 0.05
    return test


def _ddp_effective_batch() -> dict:
    micro, k, world = 16, 6, 4
    seen = 0
    for rank in range(world):  # what each rank's loader feeds into its first window
        sampler = DistributedSampler(range(100_000), num_replicas=world, rank=rank,
                                     shuffle=False)
        loader = DataLoader(range(100_000), batch_size=micro, sampler=sampler)
        seen += sum(len(batch) for batch in next(windows_of(loader, k)))
    return {"truth": seen, "micro": micro, "k": k, "world": world,
            "one_rank": micro * k, "one_micro_step": micro * world}


register("00.1", ("the state per GPU of 1.3B parameters under DDP",
                  "DDP 下 1.3B 参数的模型每张 GPU 上的状态"),
         ("a number: GB (1e9 bytes) of fp32 weights, gradients and AdamW moments on each GPU, "
          "for 1.3B parameters on 8 DDP ranks at k = 16",
          "一个数：1.3B 参数的模型在 8 个 DDP 进程上、k = 16 时，每张 GPU 上 fp32 的权重、梯度和 "
          "AdamW 的两个矩共多少 GB（1e9 字节）"),
         ("{billions:g}B parameters x {bytes:g} bytes = {truth:.1f} GB on each of the {world} "
          "GPUs, at k = {k} as at k = 64: more than a 16 GB V100 holds, whatever k",
          "{billions}B 个参数 x {bytes} 字节 = {world} 张 GPU 每张 {truth} GB，k = {k} 和 "
          "k = 64 时一样：超过 16 GB 的 V100，k 取多少都放不下"),
         Numeric(_state_per_gpu, ("GB", "GB"), 0.1,
                 guards=((_not_near("world"), _STATE_HINTS["split over the ranks"]),
                         (_not_near("k"), _STATE_HINTS["divided by k"]),
                         (_not_near("weights"), _STATE_HINTS["weights only"])), hint=(
             "{given:g} GB is not within 0.1 GB of the state; 00 prints it for 175B parameters: "
             "divide by 175B for the bytes per parameter, then multiply by {billions:g}B",
             "{given:g} GB 与状态相差超过 0.1 GB；00 打印了 175B 参数的状态：除以 175B 得到每个"
             "参数的字节数，再乘以 {billions:g}B")))
register("00.2", ("samples per optimizer step under DDP", "DDP 下一次优化器更新的样本数"),
         ("the samples in one optimizer step: micro-batches of 16, k = 6, 4 DDP ranks",
          "一次优化器更新的样本数：微批次 16、k = 6、4 个 DDP 进程"),
         ("one optimizer step sees {truth} samples: {micro} per micro-batch x k={k} x {world} "
          "ranks",
          "一次优化器更新看到 {truth} 个样本：每个微批次 {micro} 个 x k={k} x {world} 个进程"),
         Numeric(_ddp_effective_batch, ("samples", "样本数"), 0,
                 guards=((lambda given, values: given != values["one_rank"], (
                     "{answer} is one rank's window; under DDP each of the {world} ranks runs "
                     "the whole loop on its own share of the data",
                     "{answer} 是一个进程的窗口；在 DDP 下，{world} 个进程每个都在自己分到的那份"
                     "数据上跑完整的循环")),
                         (lambda given, values: given != values["one_micro_step"], (
                     "{answer} is one micro-step on every rank; a step accumulates k of them",
                     "{answer} 是所有进程上的一个微步；一次更新要累积 k 个微步"))), hint=(
             "{answer} is not it: under DDP every one of the {world} ranks runs the whole loop "
             "on its own share of the data",
             "{answer} 不对：在 DDP 下，{world} 个进程每个都在自己分到的那份数据上跑完整的循环")))
