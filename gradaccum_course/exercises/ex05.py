"""Notebook 05's exercises (DDP): 05.3 runs the reader's window under torchrun, 2 ranks."""

import inspect
import math
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from gradaccum_course.exercises import Numeric, one_process_group, register, require, say, wrong
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import split_into_micro_batches, windows_of
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.measure.comm import CommCounter
from gradaccum_lib.workloads.models import make_mlp


def _allreduce_bytes() -> dict:
    model = make_mlp(10, 32, 4, seed=0)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with one_process_group():
        ddp = DistributedDataParallel(model)
        counter = CommCounter()
        counter.register(ddp)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        inputs = torch.randn(48, 10, generator=torch.Generator().manual_seed(4),
                             dtype=torch.float64)
        micro_batches = split_into_micro_batches((inputs, torch.arange(48) % 4), micro_batch_size=4)
        for window in windows_of(micro_batches, 4):
            accumulate_window(ddp, optimizer, window, sample_classification_loss)
        sent = counter.take()["bytes"]
        del ddp, optimizer, counter  # the reducer goes before its process group does
    return {"truth": sent, "parameter_bytes": parameter_bytes}


def _steps_per_epoch() -> dict:
    sampler = DistributedSampler(range(50), num_replicas=2, rank=0, shuffle=False)
    steps = sum(1 for _ in windows_of(DataLoader(range(50), batch_size=4, sampler=sampler), 2))
    return {"truth": steps, "samples": len(sampler), "micro": math.ceil(len(sampler) / 4)}


#: 05.3's hints, English and Chinese
_HINTS = {
    "not a file": ("answer must be the path of the .py file that defines ddp_window(model, "
                   "window) (what %%writefile wrote), or a function defined in such a file; got "
                   "{answer!r}",
                   "answer 必须是定义了 ddp_window(model, window) 的 .py 文件的路径（%%writefile "
                   "写出的那个），或者是在这样的文件里定义的函数；实际得到的是 {answer!r}"),
    "timeout": ("the run did not finish within 180 s on 2 ranks: does every rank call the same "
                "collectives (all_reduce, a synchronised backward) the same number of times?",
                "在 2 个进程上运行 180 秒仍未结束：每个进程调用的集合通信（all_reduce、"
                "同步的反向传播）次数都一样吗？"),
    "failed": ("the run on 2 ranks failed: {last}", "在 2 个进程上运行失败：{last}"),
    "raised": ("your ddp_window raised {error}", "你的 ddp_window 抛出了异常：{error}"),
    "all synced": ("all {k} micro-steps all-reduced: the gradient is right and nothing is saved",
                   "{k} 个微步全都做了全规约：梯度是对的，却什么也没省下"),
    "some synced": ("micro-step(s) {synced} all-reduced, a partial gradient, and the ranks' "
                    "gradients differ by up to {across:.2g}",
                    "第 {synced} 个微步做了全规约，同步的只是部分梯度，各进程的梯度最多相差 "
                    "{across:.2g}"),
    "flag after forward": (
        "sync flag set after the forward: the forward of micro-step(s) {forward} read the flag "
        "on, but at the backward it was on at {backward}; DDP's forward reads the flag and tells "
        "the reducer whether the coming backward all-reduces, so enter model.no_sync() before the "
        "forward. Measured: {symptom[0]}",
        "同步标志在前向之后才设置：第 {forward} 个微步的前向读到的标志是开的，而到反向时开着的是"
        "第 {backward} 个；DDP 的前向读取这个标志，并告诉 reducer 接下来的反向要不要全规约，"
        "所以要在前向之前进入 model.no_sync()。测得：{symptom[1]}"),
    "wrong micro-step": ("sync on the wrong micro-step: micro-step(s) {synced} synchronised, "
                         "where only the last ({k}) should; under no_sync a backward only "
                         "accumulates locally. Keep no_sync around forward and backward of every "
                         "micro-step but the last. Measured: {symptom[0]}",
                         "在错误的微步上同步：同步的是第 {synced} 个微步，而应当只同步最后一个（"
                         "第 {k} 个）；在 no_sync 下反向传播只在本地累积。除最后一个微步外，"
                         "每个微步的前向和反向都要放在 no_sync 里。测得：{symptom[1]}"),
    "ranks differ": ("the ranks' gradients differ by up to {across:.2g}",
                     "各进程的梯度最多相差 {across:.2g}"),
    "no world factor": (
        "no world factor: your gradient is {ratio:.3f} x the large batch's, 1/2 of it. DDP "
        "averages the gradients of the 2 ranks, so multiply each rank's summed loss by the world "
        "size as well as dividing it by the window's global count",
        "少了进程数这个因子：你的梯度是大批次梯度的 {ratio:.3f} 倍，即 1/2。DDP 会对 2 "
        "个进程的梯度取平均，所以每个进程的求和损失除以窗口的全局计数之外，还要乘以进程数"),
    "wrong divisor": ("wrong divisor: your gradient's cosine with the large batch's is "
                      "{cosine:.4f} and its norm ratio {ratio:.4f}. On micro-batches of uneven "
                      "sizes, a micro-batch mean divided by k (or a count of one rank's samples) "
                      "weighs samples unequally: divide each micro-batch's summed loss by the "
                      "window's sample count, all-reduced over the ranks, times the world size",
                      "除数不对：你的梯度与大批次梯度的余弦相似度是 {cosine:.4f}，范数之比是 "
                      "{ratio:.4f}。微批次大小不一时，把微批次均值除以 k（或除以单个进程的样本数"
                      "）会让样本的权重不等：应当把每个微批次的求和损失除以窗口的样本数（在各"
                      "进程间全规约后），再乘以进程数"),
    "nccl": ("Gloo on the CPU takes any CPU tensor; NCCL all-reduces CUDA tensors only, and a "
             "count left on the CPU fails there ('No backend type associated with device type "
             "cpu')",
             "CPU 上的 gloo 什么 CPU 张量都接受；NCCL 只对 CUDA 张量做全规约，留在 CPU "
             "上的计数在那里会出错（报错说 cpu 这种设备类型没有对应的后端）"),
    "device error": ("with the default device set apart from the model's, your window raised "
                     "{error}: a tensor made without device= lands on the default device, not the "
                     "model's. {nccl[0]}",
                     "把默认设备设成与模型所在设备不同之后，你的窗口抛出了异常 {error}：不带 "
                     "device= 创建的张量落在默认设备上，而不是模型所在的设备上。{nccl[1]}"),
    "count off device": ("count tensor off the model's device: with the default device set apart "
                         "from the model's (cpu), dist.all_reduce got a tensor on {devices}; "
                         "create the count on next(model.parameters()).device. {nccl[0]}",
                         "计数张量不在模型所在的设备上：把默认设备设成与模型的（cpu）不同之后，"
                         "dist.all_reduce 收到的张量在 {devices} 上；应当在 "
                         "next(model.parameters()).device 上创建计数。{nccl[1]}"),
}

#: what 05.3's runs measured, by the file's text and the function's name (a test or a reader
#: checking the same window twice launches once)
_DDP_WINDOW_RUNS: dict[str, dict] = {}


def _ddp_window_target(answer: object) -> str:
    """``PATH::NAME`` of the reader's window: a file defining ``ddp_window``, or a function."""
    path, name = None, "ddp_window"
    if isinstance(answer, (str, Path)):  # PATH, or PATH::NAME for a function of another name
        path, _, named = str(answer).partition("::")
        path, name = Path(path), named or name
    elif callable(answer):
        source = inspect.getsourcefile(answer)
        path, name = (Path(source) if source else None), answer.__name__
    require(path is not None and path.suffix == ".py" and path.is_file(), _HINTS["not a file"],
            answer=answer)
    return f"{path.resolve()}::{name}"


def _measure_ddp_windows(*answers: object) -> list[dict]:
    """What each window did under torchrun on 2 gloo ranks (one launch for those not yet run)."""
    from gradaccum_course.launch import LaunchError, LaunchTimeout, launch

    targets = [_ddp_window_target(answer) for answer in answers]
    keys = {target: Path(target.split("::")[0]).read_text(encoding="utf-8") + target
            for target in targets}
    missing = [target for target in targets if keys[target] not in _DDP_WINDOW_RUNS]
    if missing:
        try:
            runs = launch("gradaccum_course.programs.ddp_window_check", missing,
                          nproc_per_node=2, timeout_seconds=180)
        except LaunchTimeout:
            raise wrong(_HINTS["timeout"]) from None
        except LaunchError as error:
            stderr = error.rank_stderr.get(error.root_cause_rank or 0, "").strip()
            last = stderr.splitlines()[-1] if stderr else str(error).splitlines()[0]
            raise wrong(_HINTS["failed"], last=last) from None
        _DDP_WINDOW_RUNS.update({keys[target]: runs[target] for target in missing})
    return [_DDP_WINDOW_RUNS[keys[target]] for target in targets]


def _sync_flag_hint(window: dict) -> None:
    """Name the sync-flag mistake a window's flags and syncs show, if any."""

    def _steps(flags: list) -> str:  # the 1-based micro-steps where flags is true: "1, 3"
        return ", ".join(str(i + 1) for i, flag in enumerate(flags) if flag) or "none"

    forward, backward, synced = (window[key] for key in ("forward_flags", "backward_flags",
                                                         "synced"))
    last_only = [False] * (len(forward) - 1) + [True]
    if forward == last_only and synced == last_only:
        return
    k, steps = len(forward), _steps(synced)
    symptom = say(_HINTS["all synced" if all(synced) else "some synced"], k=k, synced=steps,
                  across=window["across_ranks"])
    raise wrong(_HINTS["flag after forward" if backward != forward else "wrong micro-step"],
                forward=_steps(forward), backward=_steps(backward), synced=steps, k=k,
                symptom=symptom)


def _divisor_hint(window: dict) -> None:
    """Name the divisor mistake a window's gradient shows against the large batch's, if any."""
    cosine, ratio = window["cosine"], window["ratio"]
    if abs(cosine - 1) > 1e-9 or abs(ratio - 1) > 1e-9:
        factor = abs(cosine - 1) <= 1e-9 and abs(ratio - 0.5) <= 1e-9
        raise wrong(_HINTS["no world factor" if factor else "wrong divisor"], cosine=cosine,
                    ratio=ratio)


def _write_the_ddp_window(answer: object) -> dict:
    (run,) = _measure_ddp_windows(answer)
    require("error" not in run, _HINTS["raised"], error=run.get("error"))
    for window in run["windows"]:
        _sync_flag_hint(window)
    for window in run["windows"]:
        require(window["across_ranks"] <= 1e-12, _HINTS["ranks differ"],
                across=window["across_ranks"])
        _divisor_hint(window)
    off = sorted({device for device in run.get("all_reduce_devices", []) if device != "cpu"})
    require("device_error" not in run, _HINTS["device error"], error=run.get("device_error"),
            nccl=_HINTS["nccl"])
    require(not off, _HINTS["count off device"], devices=", ".join(off), nccl=_HINTS["nccl"])
    return {}


register("05.1", ("bytes DDP all-reduces in an epoch", "一个 epoch 里 DDP 全规约的字节数"),
         ("the bytes of gradients DDP hands to all-reduce on one rank over the epoch",
          "一个进程在整个 epoch 里交给全规约的梯度字节数"),
         ("{truth} bytes = 3 windows x {parameter_bytes} bytes of gradients: one all-reduce per "
          "window, whatever k",
          "{truth} 字节 = 3 个窗口 x 每个窗口 {parameter_bytes} 字节的梯度：不论 k 是多少，每个"
          "窗口全规约一次"),
         Numeric(_allreduce_bytes, ("bytes", "字节数"), 0, (
             "{answer} bytes is not what DDP handed to all-reduce; count the all-reduces of an "
             "epoch (the library's loop syncs under no_sync) and the float64 gradient of each",
             "{answer} 字节不是 DDP 交给全规约的字节数；数一数一个 epoch 里有几次全规约（本库的"
             "循环用 no_sync 控制梯度同步），以及每次全规约的 float64 梯度")))
register("05.2", ("optimizer steps per epoch under DistributedSampler",
                  "DistributedSampler 下每个 epoch 的优化器更新次数"),
         ("the optimizer steps of one epoch: 50 samples, 2 ranks, micro-batches of 4, k = 2",
          "一个 epoch 的优化器更新次数：50 个样本、2 个进程、微批次 4、k = 2"),
         ("rank 0 gets {samples} samples, {micro} micro-batches, {truth} windows: {truth} "
          "optimizer steps (the last window is partial)",
          "0 号进程分到 {samples} 个样本、{micro} 个微批次、{truth} 个窗口：{truth} 次优化器更新"
          "（最后一个窗口不满）"),
         Numeric(_steps_per_epoch, ("optimizer steps", "优化器更新次数"), 0, (
             "{answer} is not the number of windows rank 0 sees; count its samples, then its "
             "micro-batches, then windows of k (a partial last window steps too)",
             "{answer} 不是 0 号进程看到的窗口数；先数它的样本，再数它的微批次，最后数 k "
             "个微批次一组的窗口（最后一个不满的窗口也会更新）")))
register("05.3", ("write the DDP window", "写出 DDP 的累积窗口"),
         ("the path of a .py file defining ddp_window(model, window), which leaves in .grad of "
          "the DDP model the gradient of the mean loss over all ranks' samples of the window, "
          "all-reducing once, at the last micro-step",
          "一个定义了 ddp_window(model, window) 的 .py 文件的路径：它在 DDP 模型的 .grad 里留下"
          "窗口内所有进程全部样本的平均损失的梯度，只在最后一个微步全规约一次"),
         ("your ddp_window on 2 gloo ranks, 2 windows of 3 uneven micro-batches: one all-reduce "
          "per window, at the last micro-step; the gradient is the large batch's within 1e-09; "
          "the count all-reduced on the model's device",
          "你的窗口函数在 2 个进程上跑了 2 个窗口，每个窗口 3 个大小不一的微批次：每个窗口只全规约"
          "一次，就在最后一个微步；梯度与大批次的梯度相差在 1e-09 以内；计数在模型所在的设备上"
          "全规约"),
         _write_the_ddp_window)
