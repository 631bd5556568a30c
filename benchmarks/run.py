"""gradaccum benchmarks: ratios measured side by side, written to results.json and README.md.

    python benchmarks/run.py            # the full run (make bench), a few minutes on 2 cores
    python benchmarks/run.py --quick    # tiny sizes: checks the harness, not the numbers

Every comparison runs in one process, the contenders interleaved round by round (order
rotated), after a warm-up, with glibc told to keep freed memory (``bench.steady_allocator``);
contenders of the same kind trade their model copies every turn (:func:`trading_copies`), so
that no copy's memory layout lands on one of them; ratios are medians of per-round ratios
(``bench.paired_ratio``), times medians with min-max.
These machines are noisy: the ratios are the result, not the absolute times. Memory is
counted, not sampled: activation bytes (saved-tensor hooks) and the peak bytes of the tensors
a step allocates (``tensor_peak_bytes``), the same to the byte on every run. The functions
here take the model factory, loss and batch they measure, on any device:
``scripts/gpu_check.py`` (``make gpu-check``) imports them for the CUDA numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradaccum_course.audits.frameworks import accelerate_loop, bare_loop
from gradaccum_course.launch import launch
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import Batch, LossFn, batch_size
from gradaccum_lib.losses import bert_classification_loss, sample_classification_loss
from gradaccum_lib.measure.bench import Timing, paired_ratio, steady_allocator, time_interleaved
from gradaccum_lib.measure.memory import activation_bytes, tensor_peak_bytes
from gradaccum_lib.measure.planning import fit_transformer_activations
from gradaccum_lib.workloads.data import (
    encode_records,
    load_emr_split,
    load_tokenizer,
    make_toy_classification,
)
from gradaccum_lib.workloads.models import make_mlp, make_tiny_bert

HERE = Path(__file__).resolve().parent
START, END = "<!-- results:start -->", "<!-- results:end -->"
#: scripts/gpu_check.py writes its CUDA section between these in README-gpu.md
GPU_START, GPU_END = "<!-- gpu-cuda-section:start -->", "<!-- gpu-cuda-section:end -->"
#: consecutive windows per turn: the MLP's (a tiny BERT window, about 0.1 s, takes its turn
#: alone) and the DDP loop's (turns of 4 measured the same ratios with twice the A/A spread)
MLP_WINDOWS_PER_TURN, DDP_WINDOWS_PER_TURN = 4, 1
#: rounds of the DDP comparison (4 contenders, each window about 13-27 ms): 121 rounds left
#: its A/A control spanning 0.958-1.038; the median's error falls as 1 / sqrt(rounds)
DDP_ROUNDS = 400
#: the tiny BERT of the benchmarks (and of the notebooks' ci profile)
TINY_BERT = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}
#: optimizers of the peak-memory columns: SGD (no state) and AdamW (foreach temporaries)
PEAK_OPTIMIZERS: dict[str, Callable[[object], torch.optim.Optimizer]] = {
    "sgd": lambda parameters: torch.optim.SGD(parameters, lr=1e-3),
    "adamw": lambda parameters: torch.optim.AdamW(parameters, lr=1e-4),
}


def machine() -> dict:
    """Describe what the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def summary(timing: Timing) -> dict:
    """Return the median, min and max seconds of ``timing``."""
    return {"median": timing.median, "min": timing.min, "max": timing.max}


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Return ``batch`` (a dict or tuple of tensors) with every tensor on ``device``."""
    if isinstance(batch, dict):
        return {key: value.to(device) for key, value in batch.items()}
    return tuple(tensor.to(device) for tensor in batch)


# ----------------------------------------------------------------------------- the three loops

def mean_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Return the model's mean loss on ``batch``, as the bare loops use it."""
    summed, count = (bert_classification_loss if isinstance(batch, dict)
                     else sample_classification_loss)(model, batch)
    return summed / count


def library_loop(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 ) -> Callable[[Sequence[Batch]], object]:
    """Return ``run(window)``: the library's loop, :func:`accumulate_window`, on ``model``."""
    return lambda window: accumulate_window(model, optimizer, window, loss_fn)


Loop = Callable[[Sequence[Batch]], object]


def exact_plain_loop(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                     ) -> Loop:
    """Return ``run(window)``: the plain loop made exact torchtune-style, and nothing more.
    Backward on each micro-batch's summed loss (under DDP syncing on the last only, set before
    its forward); the window's item count, all-reduced during the last backward when there
    are several ranks; every gradient times world size / items (DDP averaged over ranks); one
    step. No checks, no norm: over the bare loop, what exactness costs; under the library's
    loop, what its checks, bookkeeping and norm cost."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    parameters = list(model.parameters())

    def run(window: Sequence[Batch]) -> None:
        items, pending, last = 0.0, None, len(window) - 1
        for index, micro_batch in enumerate(window):
            syncs = index == last or not isinstance(model, DistributedDataParallel)
            with contextlib.nullcontext() if syncs else model.no_sync():
                summed, count = loss_fn(model, micro_batch)
                items = items + count  # a tensor count stays on the model's device
                if index == last and world_size > 1:
                    items = torch.as_tensor(items, dtype=torch.float64,
                                            device=parameters[0].device)
                    pending = dist.all_reduce(items, async_op=True)
                summed.backward()
        if pending is not None:
            pending.wait()
        scale = world_size / float(items)
        with torch.no_grad():
            for parameter in parameters:
                if parameter.grad is not None:
                    parameter.grad.mul_(scale)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return run


def without_gradient_norm(run: Loop) -> Loop:
    """Return ``run`` with ``torch.nn.utils.get_total_norm`` answering 0 while it runs: the
    library's loop less its one pass for the gradient's norm (its non-finite-gradient check and
    ``WindowResult.grad_norm``). A probe of what that pass costs, never a way to train: it would
    step a NaN gradient."""
    def call(window: Sequence[Batch]) -> object:
        real = torch.nn.utils.get_total_norm
        torch.nn.utils.get_total_norm = lambda tensors, *args, **kwargs: torch.zeros(())
        try:
            return run(window)
        finally:
            torch.nn.utils.get_total_norm = real
    return call


def trading_copies(makers: Mapping[str, Callable[[nn.Module, torch.optim.Optimizer], Loop]],
                   copies: Sequence[tuple[nn.Module, torch.optim.Optimizer]], window: list,
                   calls_per_turn: int = 1) -> dict[str, Callable[[], object]]:
    """Return a call per contender (``makers[name](model, optimizer) -> run(window)``) in
    which the contenders trade ``copies`` (one per contender, the same model) every turn: the
    i-th contender's t-th turn runs on copy (i + t) mod n. Every copy's memory layout then
    lands on every contender alike (an A/A pair on fixed copies measured up to 4% apart). A
    turn is ``calls_per_turn`` calls; the calls count turns from the first, so warm them up
    with :func:`warm_up`, whole turns, and time them with ``warmup=0``."""
    if len(copies) != len(makers):
        raise ValueError(f"one copy per contender: {len(makers)} contenders, {len(copies)} "
                         "copies")
    runs = {name: [make(model, optimizer) for model, optimizer in copies]
            for name, make in makers.items()}
    calls = {}
    for index, name in enumerate(makers):
        turns = itertools.count()

        def call(name: str = name, index: int = index, turns: itertools.count = turns) -> object:
            return runs[name][(index + next(turns) // calls_per_turn) % len(copies)](window)
        calls[name] = call
    return calls


def warm_up(calls: Mapping[str, Callable[[], object]], rounds: int, calls_per_turn: int = 1,
            ) -> None:
    """Call every contender ``rounds`` whole turns of ``calls_per_turn`` calls, untimed."""
    for _ in range(rounds):
        for call in calls.values():
            for _ in range(calls_per_turn):
                call()


def loop_overhead(name: str, make_model: Callable[[], nn.Module], batch: Batch, loss_fn: LossFn,
                  ks: Sequence[int], repeats: int, windows_per_turn: int = 1) -> list[dict]:
    """Return, per k, the time of one optimizer step of each loop (the library's, the
    library's without its gradient norm (:func:`without_gradient_norm`), the exact plain loop
    (:func:`exact_plain_loop`), bare nanoGPT, the bare loop again (an A/A control: what a tie
    measures in this run), Accelerate) on the same model, data and k; the paired ratios: the
    library's to the bare loop, the exact plain loop and Accelerate, and the library's without
    the norm, the exact plain loop's and the bare copy's to the bare loop; and the library's
    paired excess over the bare loop, µs per window. A loop's turn is ``windows_per_turn``
    consecutive windows, as in training (``time_interleaved``'s ``calls_per_turn``). All but
    Accelerate trade five model copies every turn (:func:`trading_copies`); Accelerate keeps
    the one it prepared. ``make_model`` builds the model on the batch's device."""
    rows = []
    for k in ks:
        window = split_into_micro_batches(batch, accumulation_steps=k)
        copies = [(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
                  for model in (make_model() for _ in range(5))]

        def bare(model: nn.Module, optimizer: torch.optim.Optimizer, k: int = k) -> Loop:
            return bare_loop(model, optimizer, k, mean_loss)

        def library(model: nn.Module, optimizer: torch.optim.Optimizer) -> Loop:
            return library_loop(model, optimizer, loss_fn)

        def library_no_norm(model: nn.Module, optimizer: torch.optim.Optimizer) -> Loop:
            return without_gradient_norm(library_loop(model, optimizer, loss_fn))

        def exact_plain(model: nn.Module, optimizer: torch.optim.Optimizer) -> Loop:
            return exact_plain_loop(model, optimizer, loss_fn)

        loops = trading_copies({"library": library, "library_no_norm": library_no_norm,
                                "exact_plain": exact_plain, "bare": bare, "bare_copy": bare},
                               copies, window, windows_per_turn)
        model = make_model()
        run = accelerate_loop(model, torch.optim.AdamW(model.parameters(), lr=1e-4), k,
                              mean_loss)[0]
        loops["accelerate"] = lambda run=run, w=window: run(w)
        warm_up(loops, 3, windows_per_turn)
        timings = time_interleaved(loops, repeats=repeats, warmup=0,
                                   calls_per_turn=windows_per_turn)
        row = {"model": name, "k": k, "windows_per_turn": windows_per_turn,
               **{label: summary(t) for label, t in timings.items()}}
        for a, b in (("library", "bare"), ("library", "accelerate"), ("bare_copy", "bare"),
                     ("library_no_norm", "bare"), ("exact_plain", "bare"),
                     ("library", "exact_plain")):
            row[f"{a}_vs_{b}"] = paired_ratio(timings[a], timings[b])
        pairs = zip(timings["library"].samples, timings["bare"].samples, strict=True)
        row["library_minus_bare_us"] = 1e6 * Timing(tuple(a - b for a, b in pairs)).median
        rows.append(row)
        print(f"{name:9s} k={k:2d}: " + ", ".join(f"{key} {row[key]:.3f}" for key in row
              if "_vs_" in key) + f"; library - bare {row['library_minus_bare_us']:+.0f} µs",
              flush=True)
    return rows


def micro_batch_time(make_model: Callable[[], nn.Module], loss_fn: LossFn, batch: Batch,
                     sizes: Sequence[int], repeats: int) -> list[dict]:
    """Return, per micro-batch size, the library loop's time per sample and per step at a
    fixed effective batch (all of ``batch``; every size must divide it), interleaved."""
    effective = batch_size(batch)
    for size in sizes:
        if effective % size:
            raise ValueError(f"sizes must divide the batch of {effective} samples; got {size}")
    loops = {}
    for size in sizes:
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = library_loop(model, optimizer, loss_fn)
        window = split_into_micro_batches(batch, micro_batch_size=size)
        loops[size] = lambda s=step, w=window: s(w)
    timings = time_interleaved(loops, repeats=repeats, warmup=1)
    base = timings[sizes[0]].median
    return [{"micro_batch_size": s, "k": effective // s, "effective_batch": effective,
             "seconds_per_sample": timings[s].median / effective,
             "ratio_to_largest": timings[s].median / base, **summary(timings[s])}
            for s in sizes]


PeakMeasure = Callable[[Callable[[], object]], int | None]


def step_peak_bytes(make_model: Callable[[], nn.Module], loss_fn: LossFn, batch: Batch, k: int,
                    optimizer: str, measures: Mapping[str, PeakMeasure] | None = None,
                    ) -> dict[str, int | None]:
    """Return, per named measure (default: ``tensor_peak_bytes``), its peak bytes of one
    accumulated step of the library's loop over ``batch`` in ``k`` micro-batches; each measure
    gets a step of its own, after a first one (gradients and optimizer state then exist)."""
    measures = {"tensor": tensor_peak_bytes} if measures is None else measures
    model = make_model()
    step = library_loop(model, PEAK_OPTIMIZERS[optimizer](model.parameters()), loss_fn)
    window = split_into_micro_batches(batch, accumulation_steps=k)
    step(window)
    return {name: measure(lambda: step(window)) for name, measure in measures.items()}


def memory_against_k(make_model: Callable[[], nn.Module], loss_fn: LossFn, batch: Batch,
                     ks: Sequence[int]) -> list[dict]:
    """Return, per k at the fixed effective batch ``batch``: the activation bytes of one
    micro-batch (saved-tensor hooks) and their ratios to k = 1, and the peak bytes of the
    tensors one step allocates (``tensor_peak_bytes``) with SGD and with AdamW."""
    model = make_model()
    full = activation_bytes(model, loss_fn, batch)
    rows = []
    for k in ks:
        part = split_into_micro_batches(batch, accumulation_steps=k)[0]
        measured = activation_bytes(model, loss_fn, part)
        rows.append({"k": k, "micro_batch_size": batch_size(part), "bytes": measured,
                     "ratio_to_k1": measured / full, "ratio_to_1_over_k": measured / full * k,
                     **{f"peak_bytes_{name}": step_peak_bytes(make_model, loss_fn, batch, k,
                                                              name)["tensor"]
                        for name in PEAK_OPTIMIZERS}})
    return rows


def attention_share(vocab_size: int, config: dict[str, int], notes: dict,
                    lengths: tuple[int, int, int]) -> dict:
    """Return the activation model of a padded EMR note for a BERT of ``config``, fitted
    exactly through ``lengths`` (:func:`fit_transformer_activations`): its bytes per note at
    the longest length and the share of them that is the s² (attention) term."""
    def measure(num_layers: int, length: int) -> int:
        model = make_tiny_bert(vocab_size, 10, max_length=lengths[-1],
                               **{**config, "num_layers": num_layers})
        # the first note, cut to fewer tokens than the shortest length: padded at every length,
        # so the attention mask takes the same path (the bytes depend on shapes, not tokens)
        kept = torch.arange(length) < min(int(notes["attention_mask"][0].sum()), lengths[0] - 1)
        sample = {"input_ids": torch.where(kept, notes["input_ids"][0, :length], 0)[None],
                  "attention_mask": kept.long()[None], "labels": notes["labels"][:1]}
        return activation_bytes(model, bert_classification_loss, sample)

    fit = fit_transformer_activations(measure, lengths)
    length, layers = lengths[-1], config["num_layers"]
    per_sample = fit.bytes_per_sample(length, layers)
    squared = layers * length * length * fit.per_layer_per_token_squared
    return {"sequence_length": length, "bytes_per_note": fit.bytes_for(1, length, layers),
            "bytes_per_sample": per_sample, "s_squared_bytes_per_sample": squared,
            "s_squared_share": squared / per_sample}


def bert_at_length(vocab_size: int, notes: dict, ks: Sequence[int], sizes: Sequence[int],
                   repeats: int, device: torch.device) -> dict:
    """Return the tiny BERT's memory against k and time per sample against micro-batch size
    on ``notes`` (one effective batch, padded to the length to measure), on ``device``."""
    length = notes["input_ids"].shape[1]

    def make_model() -> nn.Module:
        return make_tiny_bert(vocab_size, 10, max_length=length, **TINY_BERT).to(device)

    batch = to_device(notes, device)
    parameters = sum(p.numel() for p in make_model().parameters())
    lengths = (length // 4, length // 2, length)
    return {"sequence_length": length, "effective_batch": batch_size(notes),
            "tokens_per_note": notes["attention_mask"].sum(dim=1).tolist(),
            "model": {**TINY_BERT, "parameters": parameters},
            "attention": attention_share(vocab_size, TINY_BERT, notes, lengths),
            "memory": memory_against_k(make_model, bert_classification_loss, batch, ks),
            "micro_batch_time": micro_batch_time(make_model, bert_classification_loss, batch,
                                                 sizes, repeats)}


def ddp_communication(ks: Sequence[int], quick: bool) -> list[dict]:
    """Return bytes, syncs and seconds per optimizer step under DDP (2 gloo processes), per k,
    syncing once per window and every micro-step."""
    result = launch("gradaccum_course.programs.ddp", [
        "--accumulation-steps", "1", "--sweep", ",".join(map(str, ks)),
        "--micro-batch-size", "8", "--steps", "3" if quick else "8", "--dtype", "float32",
        "--hidden-dim", "64" if quick else "512"], nproc_per_node=2, timeout_seconds=600)
    return [{key: run[key] for key in ("accumulation_steps", "sync", "bytes_per_step",
                                       "syncs_per_step", "seconds_per_step")}
            for run in result["runs"]]


def ddp_loop_overhead(quick: bool) -> list[dict]:
    """Return, per k, the library loop's step time under DDP against the exact plain no_sync
    loop's, and the exact plain loop's against nanoGPT's (2 gloo processes;
    ``ddp_overhead.py``)."""
    return launch(str(HERE / "ddp_overhead.py"),
                  ["--repeats", "4" if quick else str(DDP_ROUNDS),
                   "--windows-per-turn", str(DDP_WINDOWS_PER_TURN),
                   "--hidden-dim", "64" if quick else "1024"],
                  nproc_per_node=2, timeout_seconds=1200)["rows"]


# ----------------------------------------------------------------------------- reporting

def mib(value: float) -> str:
    """Return ``value`` bytes as MiB with two decimals."""
    return f"{value / 2**20:,.2f}"


def memory_table(rows: list[dict]) -> list[str]:
    """Return the markdown lines of a memory-against-k table."""
    lines = ["| k | micro-batch | activation bytes | ratio to k = 1 | ratio × k (1.00 = exactly "
             "1/k) | peak tensor bytes, SGD | peak tensor bytes, AdamW |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['k']} | {row['micro_batch_size']} | {row['bytes']:,} | "
                     f"{row['ratio_to_k1']:.4f} | {row['ratio_to_1_over_k']:.4f} | "
                     f"{row['peak_bytes_sgd']:,} | {row['peak_bytes_adamw']:,} |")
    return lines


def time_table(rows: list[dict], unit: str = "µs") -> list[str]:
    """Return the markdown lines of a time-per-sample-against-micro-batch table."""
    scale = {"µs": 1e6, "ms": 1e3}[unit]
    lines = [f"| micro-batch | k | {unit} per sample | step time / largest micro-batch |",
             "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['micro_batch_size']} | {row['k']} | "
                     f"{scale * row['seconds_per_sample']:.1f} | {row['ratio_to_largest']:.2f} |")
    return lines


def cuda_section(out: Path) -> list[str]:
    """Return the CUDA section: the one ``make gpu-check`` wrote in README-gpu.md, if any."""
    gpu_readme = out / "README-gpu.md"
    if gpu_readme.is_file() and GPU_START in gpu_readme.read_text():
        return [gpu_readme.read_text().split(GPU_START, 1)[1].split(GPU_END, 1)[0].strip()]
    return ["No GPU on the machine that ran this. On one, `make gpu-check` measures the CUDA "
            "numbers (peak memory per k, fp32/bf16/fp16 against the fp32 truth, time per "
            "sample, the three loops) and writes them to `results-gpu.json` and "
            "`README-gpu.md`; the next `make bench` includes them here."]


def markdown(results: dict, out: Path = HERE) -> str:
    """Return the results as the markdown that goes between the README's markers."""
    m = results["machine"]
    mlp_turn = next(row.get("windows_per_turn", 1) for row in results["loop_overhead"]
                    if row["model"] == "MLP")
    ddp_turn = next((row.get("windows_per_turn", 1) for row in results.get("ddp_loop", [])), 1)
    lines = [f"Measured {results['date']} on {m['cpu']} ({m['cores']} cores, "
             f"{m['torch_threads']} torch threads), torch {m['torch']}, Python {m['python']}"
             f"{', ' + m['cuda'] if m['cuda'] else ', no GPU'}"
             f"{' (QUICK RUN: tiny sizes, numbers meaningless)' if results['quick'] else ''}.", "",
             "### 1. Time per optimizer step: library loop vs bare loop vs Accelerate", "",
             "Ratios (and *library − bare*): the median over rounds of the two loops' times' "
             f"ratio (difference) in the same round; for the MLP each loop's turn is {mlp_turn} "
             "consecutive windows. *Bare copy*: the bare loop again, another contender, what "
             "a tie measures in this run. *Without its norm*: the library's loop with "
             "`get_total_norm` answering 0 (`without_gradient_norm`), what its one pass for "
             "the non-finite-gradient check costs. *Exact plain*: the plain loop made exact "
             "(summed losses, one rescale by the window's items; `exact_plain_loop`), no "
             "checks, no norm: over the bare loop, what exactness costs. These five trade five "
             "copies of the model every turn; Accelerate keeps the one it prepared.", "",
             "| model | k | library / bare | library without its norm / bare | exact plain / "
             "bare | library / exact plain | bare copy / bare | library / Accelerate | "
             "library − bare, µs per window | library ms (min–max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["loop_overhead"]:
        lib = row["library"]
        lines.append(f"| {row['model']} | {row['k']} | {row['library_vs_bare']:.3f} | "
                     f"{row['library_no_norm_vs_bare']:.3f} | "
                     f"{row['exact_plain_vs_bare']:.3f} | "
                     f"{row['library_vs_exact_plain']:.3f} | {row['bare_copy_vs_bare']:.3f} | "
                     f"{row['library_vs_accelerate']:.3f} | "
                     f"{row['library_minus_bare_us']:+.0f} | {1e3 * lib['median']:.2f} "
                     f"({1e3 * lib['min']:.2f}–{1e3 * lib['max']:.2f}) |")
    lines += ["", "### 2. Time per sample against micro-batch size (MLP, effective batch "
              f"{results['micro_batch_time'][0]['effective_batch']})", ""]
    lines += time_table(results["micro_batch_time"])
    lines += ["", "### 3. Memory against k (MLP, effective batch "
              f"{results['micro_batch_time'][0]['effective_batch']})", "",
              "Activation bytes of one micro-batch (saved-tensor hooks), and the peak bytes of "
              "the tensors one accumulated step allocates and holds at once "
              "(`tensor_peak_bytes`: gradients, activations, backward and optimizer "
              "temporaries; parameters and optimizer state existed before). Both are counted, "
              "not sampled: the same to the byte on every run.", ""]
    lines += memory_table(results["activation_memory"])
    bert = results["bert_long"]
    model, attention = bert["model"], bert["attention"]
    lines += ["", f"### 4. Tiny BERT at the article's record length (s = "
              f"{bert['sequence_length']}, effective batch {bert['effective_batch']})", "",
              f"Hidden {model['hidden_size']}, {model['num_layers']} layers, "
              f"{model['num_heads']} heads ({model['parameters']:,} parameters), EMR notes "
              f"padded to {bert['sequence_length']} tokens. One note's activations: "
              f"{mib(attention['bytes_per_note'])} MiB; the s² (attention) term is "
              f"{100 * attention['s_squared_share']:.0f}% of the part that grows with the "
              f"note (fitted exactly through s = {bert['sequence_length'] // 4}, "
              f"{bert['sequence_length'] // 2}, {bert['sequence_length']}).", ""]
    lines += memory_table(bert["memory"])
    lines += [""] + time_table(bert["micro_batch_time"], unit="ms")
    lines += ["", "### 5. DDP, 2 gloo processes: per optimizer step", "",
              "| k | bytes (window) | bytes (every) | syncs window / every | "
              "ms window | ms every |", "|---|---|---|---|---|---|"]
    ddp = {(r["accumulation_steps"], r["sync"]): r for r in results["ddp"]}
    for k in sorted({k for k, _ in ddp}):
        w, e = ddp[k, "window"], ddp[k, "every"]
        lines.append(f"| {k} | {w['bytes_per_step']:,.0f} | {e['bytes_per_step']:,.0f} | "
                     f"{w['syncs_per_step']:.0f} / {e['syncs_per_step']:.0f} | "
                     f"{1e3 * w['seconds_per_step']:.2f} | {1e3 * e['seconds_per_step']:.2f} |")
    lines += ["", "### 6. DDP, 2 gloo processes: the library's loop against the exact plain "
              "loop", "",
              "Each window is timed after a barrier, "
              f"{'one window' if ddp_turn == 1 else f'{ddp_turn} consecutive windows'} a turn; "
              "the five loops trade five DDP copies of the model every turn. *Exact plain*: "
              "the no_sync loop made exact torchtune-style (`exact_plain_loop`: all-reduced "
              "item count, one rescale); over nanoGPT's (÷ k): the price of exactness. *A/A*: "
              "it again, as another contender. *Without its norm*: the library's loop with "
              "`get_total_norm` answering 0. *Fixed cost*: the median over rounds of library − "
              "exact plain.", "",
              "| k | library / exact plain | library without its norm / exact plain | exact "
              "plain / nanoGPT plain | A/A: exact plain copy / exact plain | library's fixed "
              "cost, µs per window | library ms (min–max) |", "|---|---|---|---|---|---|---|"]
    ratios = ("library_vs_exact_plain", "library_no_norm_vs_exact_plain",
              "exact_plain_vs_plain", "exact_plain_copy_vs_exact_plain")
    for row in results.get("ddp_loop", []):
        library = row["library"]
        lines.append(f"| {row['k']} | {' | '.join(f'{row[key]:.3f}' for key in ratios)} | "
                     f"{row['library_minus_exact_plain_us']:+.0f} | "
                     f"{1e3 * library['median']:.2f} ({1e3 * library['min']:.2f}–"
                     f"{1e3 * library['max']:.2f}) |")
    lines += ["", "### 7. CUDA", ""] + cuda_section(out)
    return "\n".join(lines)


def figure(results: dict) -> Figure:
    """Return the figure: loop ratios, step time against micro-batch, memory against k."""
    fig = Figure(figsize=(15, 3.8), layout="constrained")
    left, middle, right = fig.subplots(1, 3)
    for model in sorted({r["model"] for r in results["loop_overhead"]}):
        rows = [r for r in results["loop_overhead"] if r["model"] == model]
        ks = [r["k"] for r in rows]
        left.plot(ks, [r["library_vs_bare"] for r in rows], marker="o",
                  label=f"{model}: library / bare")
        left.plot(ks, [r["exact_plain_vs_bare"] for r in rows], marker="^", linestyle=":",
                  label=f"{model}: exact plain / bare")
        left.plot(ks, [r["library_vs_accelerate"] for r in rows], marker="s", linestyle="--",
                  label=f"{model}: library / Accelerate")
    left.axhline(1.0, color="grey", linewidth=1)
    left.set_xscale("log", base=2)
    left.set_xlabel("accumulation steps k")
    left.set_ylabel("step time ratio (median)")
    left.legend(fontsize="small")
    bert = results["bert_long"]
    for label, rows in (("MLP", results["micro_batch_time"]),
                        (f"tiny BERT, s = {bert['sequence_length']}", bert["micro_batch_time"])):
        middle.plot([r["micro_batch_size"] for r in rows], [r["ratio_to_largest"] for r in rows],
                    marker="o", label=label)
    middle.set_xscale("log", base=2)
    middle.set_yscale("log")
    middle.set_xlabel("micro-batch size (fixed effective batch)")
    middle.set_ylabel("step time / largest micro-batch")
    middle.legend(fontsize="small")
    for label, rows in (("MLP", results["activation_memory"]),
                        (f"BERT s={bert['sequence_length']}", bert["memory"])):
        ks = [r["k"] for r in rows]
        right.plot(ks, [r["bytes"] / 2**20 for r in rows], marker="o",
                   label=f"{label}: activations")
        right.plot(ks, [r["peak_bytes_sgd"] / 2**20 for r in rows], marker="s", linestyle="--",
                   label=f"{label}: peak (SGD)")
        right.plot(ks, [r["peak_bytes_adamw"] / 2**20 for r in rows], marker="^", linestyle=":",
                   label=f"{label}: peak (AdamW)")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("accumulation steps k (fixed effective batch)")
    right.set_ylabel("MiB")
    right.legend(fontsize="x-small")
    return fig


def readme_around_section(readme: Path, start: str, end: str) -> tuple[str, str] | None:
    """Return the text of ``readme`` before ``start`` and after ``end`` (None if there is no
    file); raise ValueError unless each marker occurs once, ``start`` first: the hand-written
    rest of the page must survive the rewrite."""
    if not readme.is_file():
        return None
    text = readme.read_text()
    counts = {marker: text.count(marker) for marker in (start, end)}
    if counts != {start: 1, end: 1} or text.index(start) > text.index(end):
        raise ValueError(f"{readme} must hold {start} once, then {end} once, around the section "
                         f"the benchmark rewrites; got counts {counts}: restore the markers")
    head, rest = text.split(start, 1)
    return head, rest.split(end, 1)[1]


def write_readme_section(readme: Path, start: str, end: str, table: str, title: str) -> None:
    """Replace what lies between ``start`` and ``end`` in ``readme`` (created if missing)."""
    around = readme_around_section(readme, start, end)
    if around is not None:
        head, tail = around
        readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")
    else:
        readme.write_text(f"# {title}\n\n{start}\n{table}\n{end}\n")


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark, write results.json, results.png and the README tables; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write the results")
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    readme_around_section(arguments.out / "README.md", START, END)  # before minutes of work
    steady = steady_allocator()
    torch.manual_seed(0)
    # where accelerate_loop's Accelerator puts the model: every contender runs there
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ks = [1, 2, 4] if quick else [1, 2, 4, 8, 16]
    repeats = 3 if quick else 21
    started = time.perf_counter()

    features = 64 if quick else 256
    mlp_batch = to_device(make_toy_classification(32 if quick else 256, features, 4,
                                                  dtype=torch.float32), device)
    tokenizer = load_tokenizer()
    records = load_emr_split("train")
    notes = to_device(encode_records(records[: 16 if quick else 64], tokenizer,
                                     max_length=32 if quick else 128), device)

    def make_wide_mlp() -> nn.Module:
        return make_mlp(features, 1024, 4, dtype=torch.float32).to(device)

    results = {"date": time.strftime("%Y-%m-%d"), "quick": quick, "machine": machine(),
               "steady_allocator": steady}
    results["loop_overhead"] = (
        loop_overhead("MLP", lambda: make_mlp(features, 64 if quick else 1024, 4,
                                              dtype=torch.float32).to(device),
                      mlp_batch, sample_classification_loss, ks, 3 if quick else 41,
                      windows_per_turn=2 if quick else MLP_WINDOWS_PER_TURN)
        + loop_overhead("tiny BERT", lambda: make_tiny_bert(len(tokenizer), 10, hidden_size=64,
                                                            max_length=128).to(device),
                        notes, bert_classification_loss, ks, repeats))
    sizes = [32, 8, 2] if quick else [256, 128, 64, 32, 16, 8, 4, 2, 1]
    results["micro_batch_time"] = micro_batch_time(make_wide_mlp, sample_classification_loss,
                                                   mlp_batch, sizes, repeats)
    results["activation_memory"] = memory_against_k(make_wide_mlp, sample_classification_loss,
                                                    mlp_batch, ks)
    print("MLP memory against k done", flush=True)
    long_notes = encode_records(records[: 4 if quick else 16], tokenizer,
                                max_length=256 if quick else 512)
    results["bert_long"] = bert_at_length(len(tokenizer), long_notes, ks,
                                          [4, 2, 1] if quick else [16, 8, 4, 2, 1],
                                          3 if quick else 7, device)
    print(f"tiny BERT at s = {long_notes['input_ids'].shape[1]} done", flush=True)
    results["ddp"] = ddp_communication(ks, quick)
    results["ddp_loop"] = ddp_loop_overhead(quick)
    results["seconds"] = time.perf_counter() - started

    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    figure(results).savefig(out / "results.png", dpi=100)
    readme = out / "README.md"
    write_readme_section(readme, START, END, markdown(results, out), "Benchmarks")
    print(f"wrote {out / 'results.json'}, {readme} and {out / 'results.png'} "
          f"in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
