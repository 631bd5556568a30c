"""make gpu-check: the CUDA numbers of benchmarks/README.md, on one GPU in under 8 minutes.

    python scripts/gpu_check.py                   # everything (sized for 8 min; notebooks last)
    python scripts/gpu_check.py --skip-notebooks  # the measurements only

On the GPU it measures, and writes to benchmarks/results-gpu.json, results-gpu.png and
README-gpu.md (the README's CUDA section and a `gpu` column for README.md's notebook table):

1. peak memory of one accumulated AdamW step per k at a fixed effective batch, for the tiny
   BERT and a BERT-base-sized model (hidden 768, 12 layers, 12 heads) at s = 512: the CUDA
   allocator's peak (``torch.cuda.max_memory_allocated`` via ``memory.cuda_peak_bytes``), its
   growth over what was allocated before the step, and the step's tensors counted as on the CPU
   (``memory.tensor_peak_bytes``);
2. the loop's (``accumulate_window``) fp32, bf16 and fp16 + GradScaler paths against the fp32
   ground truth
   (``equivalence.audit_update``: one SGD step from the full-batch fp32 gradient), at k = 1
   and k > 1, each asserted within a stated tolerance (``TOLERANCES``);
3. time per sample against micro-batch size (benchmarks/run.py's ``micro_batch_time``);
4. the library's loop against the bare nanoGPT loop and Accelerate (run.py's
   ``loop_overhead``);
5. the code readers copy, under nccl (one process per GPU, at most 4): 09's card program
   (``accumulate_window``: the large batch's step to 1e-12 in float64; in fp16 with a
   GradScaler: within 1% of the fp32 update) and 05's plain DDP loop against
   ``accumulate_window``'s run (``gradaccum_course.programs.ddp``, the same samples and split:
   1e-12), each
   launched as the notebooks launch them;
6. DDP's own gradient memory per k (``gradaccum_course.programs.memory_probe``): bytes held after a
   window's last backward with DDP's default and with ``gradient_as_bucket_view=True``,
   counted and by the CUDA allocator, against the budget model's bucket copy
   (``memory_budget(..., ddp_bucket_copy=True)``);
7. ``torch.compile`` with gradient accumulation (pytorch #169545, notebook 08 §3): 4
   micro-steps into one ``.grad`` as the issue's repro runs them, in the default mode and with
   ``mode="reduce-overhead"`` (CUDA graphs); whether each ran and, if it did, its gradient
   against eager's (``compiled_accumulation_checks``; CUDA only);
8. each notebook's wall time under ``GRADACCUM_PROFILE=gpu``, within what is left of the
   budget (``--budget-seconds``, 480 by default).

Without a CUDA device it exits at once with status 2 and says what to do.
``--cpu-rehearsal`` runs steps 1-6 on the CPU at tiny sizes, 5 and 6 under gloo, and skips 7
(for the tests; not GPU numbers). Any check outside its bound makes the exit status 1.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
NOTEBOOKS = ROOT / "notebooks"
NO_CUDA_EXIT = 2  # the exit status without a CUDA device
FAILED_EXIT = 1  # the exit status when a precision check is outside its tolerance
GPU_START, GPU_END = "<!-- gpu-cuda-section:start -->", "<!-- gpu-cuda-section:end -->"
COLUMN_START, COLUMN_END = "<!-- gpu-notebook-column:start -->", "<!-- gpu-notebook-column:end -->"

#: the models measured: BERT configs (vocabulary: data/vocab.txt; 10 diagnosis classes)
MODELS: dict[str, dict[str, int]] = {
    "tiny BERT": {"hidden_size": 64, "num_layers": 2, "num_heads": 2},
    "BERT-base-sized": {"hidden_size": 768, "num_layers": 12, "num_heads": 12},
}
REHEARSAL_MODELS: dict[str, dict[str, int]] = {
    "tiny BERT": {"hidden_size": 16, "num_layers": 1, "num_heads": 2},
    "small BERT (rehearsal)": {"hidden_size": 32, "num_layers": 2, "num_heads": 2},
}

#: the loop's precisions: autocast dtype (fp16 gets a GradScaler on CUDA)
AMP_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

#: largest relative parameter-update difference |update - truth| / |truth| allowed for one
#: SGD step (update = -lr x gradient, so this is the gradient's relative error; AdamW's first
#: step is about lr x sign(g), which turns rounding noise in tiny gradients into full-size
#: update differences and would measure nothing about accumulation):
TOLERANCES: dict[str, float] = {
    # fp32: only the summation order differs from the truth (micro-batch GEMM shapes, the
    # accumulation into .grad); measured 0 at k = 1 and 2e-6 at k = 4 for the BERT-base-sized
    # model on a CPU. 1e-4 leaves room for GPU kernels' order and atomics, not for a bug
    # (a wrong normaliser is off by 1/k or more).
    "fp32": 1e-4,
    # bf16 keeps 8 significant bits (unit roundoff 2^-9 = 2e-3) in every autocast matmul and
    # attention; measured 5e-3 (tiny) and 8e-3 (BERT-base-sized, 12 layers) on a CPU; GPU
    # kernels round attention probabilities too. A wrong loop is off by 1/k or more.
    "bf16": 5e-2,
    # fp16 keeps 11 bits (unit roundoff 2^-12), 8x finer than bf16, and the GradScaler keeps
    # small gradients above fp16's underflow; measured 2e-3 to 5e-3 on a CPU.
    "fp16": 2e-2,
}
#: accumulating k micro-batches in the loop's fp32 .grad buffers must not add error to
#: autocast's own: the error at k may be at most this many times the error at k = 1 (each is
#: a different draw of rounding, on different GEMM shapes), plus the fp32 tolerance
ACCUMULATION_SLACK = 2.0
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")  # colours in a kernel's traceback
MAX_SKIPPED_STEPS = 24  # GradScaler halves its scale on each overflow: 2^16 -> 2^-8 at most


# ----------------------------------------------------------------------------- no CUDA

def cuda_peak_bytes(step: Callable[[], object], device: torch.device | str = "cuda") -> int | None:
    """Return the CUDA allocator's peak bytes while ``step()`` runs (None without CUDA)."""
    if not callable(step):
        raise TypeError(f"step must be a callable taking no argument; got {type(step).__name__}")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a device name or a torch.device; got {device!r}")
    try:
        device_type = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device must be a device name such as 'cuda' or 'cuda:1'; got "
                         f"{device!r}") from None
    if not torch.cuda.is_available() or device_type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def no_cuda_message() -> str | None:
    """Return why this machine cannot run the check (no CUDA device), or None if it can."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU-only build"
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device with "
               f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}")
    else:
        why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU "
               "(no NVIDIA driver, or no device)")
    return (f"gpu-check: no CUDA device: {why}.\n"
            "Run `make gpu-check` on a machine with an NVIDIA GPU and a CUDA build of torch "
            "(install the pinned torch==2.13.0 from PyTorch's CUDA wheel index for your CUDA "
            "version into .venv). On this machine, `make bench` measures the CPU numbers.")


# ----------------------------------------------------------------------------- the reader's code

def written_program(notebook: str, name: str) -> str:
    """Return the program that ``notebooks/<notebook>`` writes with ``%%writefile
    ../build/<name>`` (the code the series gives readers to copy), read from the committed
    notebook: a fresh clone has no build/."""
    # plain JSON, not nbformat: a GPU machine's image may have torch but no Jupyter
    cells = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))["cells"]
    header = f"%%writefile {{BUILD}}/{name}"
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(header):
            return source.split("\n", 1)[1] + "\n"
    raise ValueError(f"notebooks/{notebook} has no cell starting with {header!r}")


def reader_world_size() -> int:
    """Return the processes for the reader's programs: one per GPU, 1, 2 or 4 of them (the
    card's window has 4 micro-batches to share); 2 gloo processes on a CPU."""
    gpus = torch.cuda.device_count()
    return 2 if not gpus else max(w for w in (1, 2, 4) if w <= gpus)


def reader_code_checks(world_size: int, device: torch.device) -> tuple[dict, list[str]]:
    """Run 09's card program and 05's plain DDP loop as the notebooks write them, under
    torchrun with ``world_size`` processes (nccl on GPUs, gloo on a CPU), against the truth;
    return the measured differences and a message per failure."""
    from gradaccum_course.launch import launch
    from gradaccum_lib.accumulation import accumulate_window
    from gradaccum_lib.losses import sample_classification_loss
    from gradaccum_lib.workloads.data import make_toy_classification
    from gradaccum_lib.workloads.models import make_mlp

    results: dict[str, object] = {"world_size": world_size, "device": device.type}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-reader-") as folder:
        card = Path(folder) / "answer_loop.py"
        card.write_text(written_program("09_the_article_checked.ipynb", "answer_loop.py"))
        plain = Path(folder) / "plain_ddp_loop.py"
        plain.write_text(written_program("05_ddp_torchrun.ipynb", "plain_ddp_loop.py"))
        ranks = launch(str(card), [], nproc_per_node=world_size, timeout_seconds=300)
        k = 4 // world_size  # 05's splits: 4 x 1, 2 x 2, 1 x 4 (micro-batch 2, 28 samples)
        plain_run = launch(str(plain), ["ddp", str(k)], nproc_per_node=world_size,
                           timeout_seconds=300)
    loop_run = launch("gradaccum_course.programs.ddp", [
        "--task", "tokens", "--micro-batch-size", "2", "--samples", "28", "--steps", "8",
        "--steps-per-epoch", "4", "--optimizer", "adamw", "--lr", "0.01", "--dump-parameters",
        "--accumulation-steps", str(k), "--wrap", "ddp"], nproc_per_node=world_size,
        timeout_seconds=300)
    inputs, labels = make_toy_classification(32, 16, 4, seed=0)
    truth = {}
    for dtype in (torch.float64, torch.float32):  # the large batch's step, on this device
        model = make_mlp(16, 32, 4, seed=1, dtype=dtype).to(device)
        start = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        accumulate_window(model, optimizer, [(inputs.to(device, dtype), labels.to(device))],
                          sample_classification_loss, max_grad_norm=1.0)  # as the card
        truth[dtype] = start, torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    checks = {  # name: (measured, bound, must be below the bound)
        "accumulate_window: largest difference to the large batch's step (float64)": (
            (torch.tensor(ranks["accumulate_window"], dtype=torch.float64)
             - truth[torch.float64][1]).abs().max().item(),
            1e-12, True),
        "fp16 with a GradScaler: update off the fp32 large batch's, relative": (
            _relative_off(ranks["fp16"], *truth[torch.float32]), 0.01, True),
        "mean / k shortcut: update off the large batch's, relative (must be large)": (
            _relative_off(ranks["mean / k"], *truth[torch.float64]), 0.01, False),
        "05's plain DDP loop: largest difference to accumulate_window's run": (
            max(abs(a - b) for a, b in zip(plain_run["final_parameters"],
                                           loop_run["final_parameters"], strict=True)),
            1e-12, True),
    }
    results["checks"] = []
    for name, (value, bound, below) in checks.items():
        ok = value <= bound if below else value > bound
        results["checks"].append({"check": name, "value": value, "bound": bound,
                                  "below": below, "ok": ok})
        if not ok:
            failures.append(f"{name}: {value:.3g} is {'above' if below else 'not above'} "
                            f"{bound:g} ({world_size} process(es) on {device.type})")
    return results, failures


def _relative_off(parameters: Sequence[float], start: torch.Tensor,
                  truth: torch.Tensor) -> float:
    """Return |parameters - truth| / |truth - start|: how far an update is off the true one."""
    return ((torch.tensor(parameters, dtype=truth.dtype) - truth).norm()
            / (truth - start).norm()).item()


def ddp_memory_checks(rehearsal: bool) -> tuple[list[dict], list[str]]:
    """Measure DDP's gradient bytes both ways per k on one process (nccl on a GPU) and hold
    the difference against the budget model's bucket copy: counted bytes within 1%, the CUDA
    allocator's within 5% (it rounds blocks). Return the rows and a message per failure."""
    from gradaccum_course.launch import launch
    from gradaccum_lib.measure.memory import memory_budget

    sizes = ["--ks", "1", "2", "4"] if rehearsal else [
        "--input-dim", "1024", "--hidden-dim", "4096", "--ks", "1", "2", "4", "8"]
    probe = launch("gradaccum_course.programs.memory_probe", sizes, nproc_per_node=1,
                   timeout_seconds=300)
    rows, failures = [], []
    for pair in probe["ddp_per_k"]:
        default, views = pair["default"], pair["gradient_as_bucket_view"]
        parameters = default["gradient_bytes"] // 4  # fp32
        modelled = memory_budget(parameters, ddp_bucket_copy=True).ddp_buckets
        row = {"k": default["k"], "gradient_bytes": default["gradient_bytes"],
               "modelled_copy_bytes": modelled,
               "counted_copy_bytes": default["held_bytes"] - views["held_bytes"],
               "cuda_copy_bytes": None if default["cuda_held_bytes"] is None else
               default["cuda_held_bytes"] - views["cuda_held_bytes"],
               "cuda_buckets_bytes": default["cuda_wrap_bytes"],
               "cuda_peak_default_bytes": default["cuda_peak_bytes"],
               "cuda_peak_views_bytes": views["cuda_peak_bytes"]}
        for key, tolerance in (("counted_copy_bytes", 0.01), ("cuda_copy_bytes", 0.05)):
            if row[key] is not None and not abs(row[key] - modelled) <= tolerance * modelled:
                failures.append(f"DDP bucket copy at k = {row['k']}: {key} {row[key]:,} is not "
                                f"within {tolerance:.0%} of the budget model's {modelled:,}")
        rows.append(row)
    return rows, failures


# ----------------------------------------------------------------------------- torch.compile

#: the torch.compile options run with accumulation on CUDA (pytorch #169545): inductor, and
#: inductor with CUDA graphs
COMPILE_MODES: dict[str, dict[str, str]] = {
    "default": {}, "reduce-overhead": {"mode": "reduce-overhead"}}
#: largest relative difference of a compiled fp32 accumulation to eager's: kernels summing in
#: another order, not a micro-step lost or counted twice (off by 1/4 or more here)
COMPILE_TOLERANCE = 1e-5


def accumulate_compiled(device: torch.device, compile_options: Mapping[str, object],
                        accumulation_steps: int = 4) -> dict:
    """Run pytorch #169545's repro: ``torch.compile(nn.Linear(10, 1), fullgraph=True,
    **compile_options)``, ``accumulation_steps`` micro-steps into one ``.grad``, each with
    ``torch.compiler.cudagraph_mark_step_begin()`` before its forward and the outputs cloned.
    Return ``outcome`` ("ok" or "failed"), ``error`` (the exception's type and first line) and,
    when it ran, ``relative_difference``: the accumulated gradient's largest difference to
    eager's over eager's largest entry."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(10, 1).to(device)
    compiled_model = copy.deepcopy(eager)
    inputs = torch.randn(accumulation_steps, 10, generator=torch.Generator().manual_seed(1))
    for x in inputs.to(device):  # the truth: eager, the same micro-steps into one .grad
        eager(x).sum().backward()
    try:
        compiled = torch.compile(compiled_model, fullgraph=True, **compile_options)
        for x in inputs.to(device):
            torch.compiler.cudagraph_mark_step_begin()
            x = x.clone().requires_grad_(True)  # as in the issue
            compiled(x).clone().sum().clone().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as error:  # noqa: BLE001 - how it fails is the measurement
        lines = str(error).strip().splitlines()
        return {"outcome": "failed", "relative_difference": None,
                "error": f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]}
    truth = torch.cat([p.grad.flatten() for p in eager.parameters()])
    measured = torch.cat([p.grad.flatten() for p in compiled_model.parameters()])
    return {"outcome": "ok", "error": "",
            "relative_difference": ((measured - truth).abs().max() / truth.abs().max()).item()}


def compiled_accumulation_checks(device: torch.device) -> tuple[dict, list[str]]:
    """On CUDA, :func:`accumulate_compiled` in each of ``COMPILE_MODES``; return the rows and a
    message per failure: the default mode not running, or a mode that ran with a gradient off
    eager's by more than ``COMPILE_TOLERANCE``. A ``reduce-overhead`` run that raises is
    recorded (it is what #169545 reports), not failed. Without CUDA it compiles nothing and
    returns ``{"skipped": why}``."""
    if device.type != "cuda":
        return {"skipped": 'needs CUDA: mode="reduce-overhead" records CUDA graphs'}, []
    rows, failures = [], []
    for mode, options in COMPILE_MODES.items():
        torch.compiler.reset()  # each mode compiles from nothing
        row = {"mode": mode, **accumulate_compiled(device, options)}
        rows.append(row)
        if row["outcome"] == "failed" and mode == "default":
            failures.append(f"torch.compile (default mode) with accumulation failed: "
                            f"{row['error']}")
        elif row["outcome"] == "ok" and not row["relative_difference"] <= COMPILE_TOLERANCE:
            failures.append(f"torch.compile ({mode}) with accumulation: gradient off eager's "
                            f"by {row['relative_difference']:.3g} (relative; bound "
                            f"{COMPILE_TOLERANCE:g})")
    torch.compiler.reset()
    return {"rows": rows}, failures


# ----------------------------------------------------------------------------- measuring

def benchmarks_run() -> ModuleType:
    """Return benchmarks/run.py as a module (its measuring functions are reused here)."""
    if "gradaccum_benchmarks_run" in sys.modules:
        return sys.modules["gradaccum_benchmarks_run"]
    spec = importlib.util.spec_from_file_location("gradaccum_benchmarks_run",
                                                  BENCHMARKS / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gradaccum_benchmarks_run"] = module
    spec.loader.exec_module(module)
    return module


def encoded_notes(count: int, length: int, device: torch.device | str) -> dict:
    """Return the first ``count`` EMR training notes, padded to ``length`` tokens, on
    ``device``."""
    from gradaccum_lib.workloads.data import encode_records, load_emr_split, load_tokenizer

    notes = encode_records(load_emr_split("train")[:count], load_tokenizer(), max_length=length)
    return {key: value.to(device) for key, value in notes.items()}


def model_factory(config: Mapping[str, int], length: int,
                  device: torch.device | str) -> Callable[[], torch.nn.Module]:
    """Return ``make_model()``: a copy of one BERT of ``config`` (built once), on ``device``."""
    from gradaccum_lib.workloads.data import load_tokenizer
    from gradaccum_lib.workloads.models import make_tiny_bert

    template = make_tiny_bert(len(load_tokenizer()), 10, max_length=length, **config)
    return lambda: copy.deepcopy(template).to(device)


def cuda_growth_bytes(step: Callable[[], object]) -> int | None:
    """Return the CUDA allocator's peak during ``step()`` minus what was allocated before it
    (None without CUDA)."""

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    peak = cuda_peak_bytes(step)
    return None if peak is None else peak - before


def peak_memory_rows(name: str, make_model: Callable[[], torch.nn.Module], batch: dict,
                     ks: Sequence[int]) -> list[dict]:
    """Return, per k at the fixed effective batch ``batch``, the peak memory of one
    accumulated AdamW step (CUDA allocator peak and growth when on CUDA, counted tensor
    peak anywhere) and the activation bytes of one micro-batch."""
    from gradaccum_lib import split_into_micro_batches
    from gradaccum_lib.batches import batch_size
    from gradaccum_lib.losses import bert_classification_loss
    from gradaccum_lib.measure.memory import activation_bytes, tensor_peak_bytes

    run = benchmarks_run()
    measures = {"cuda_peak_bytes": cuda_peak_bytes, "cuda_growth_bytes": cuda_growth_bytes,
                "tensor_peak_bytes": tensor_peak_bytes}
    rows = []
    for k in ks:  # nothing else of ours on the device meanwhile: the allocator's peak is the step's
        _release_memory()
        rows.append({"model": name, "k": k, **run.step_peak_bytes(
            make_model, bert_classification_loss, batch, k, "adamw", measures)})
    model = make_model()
    for row in rows:
        micro_batch = split_into_micro_batches(batch, accumulation_steps=row["k"])[0]
        row["micro_batch_size"] = batch_size(micro_batch)
        row["activation_bytes"] = activation_bytes(model, bert_classification_loss, micro_batch)
    return rows


def _release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def loop_step(autocast_dtype: torch.dtype | None, skipped_steps: list[int]) -> Callable:
    """Return a step function for ``audit_update``: ``accumulate_window`` over the window until
    it takes its step. fp16 on CUDA runs with a GradScaler, which may find the gradients
    overflow while it settles on its scale: such a step is skipped (parameters untouched, scale
    halved) and the same window is run again; the number skipped is appended to
    ``skipped_steps``."""
    from gradaccum_lib.accumulation import accumulate_window
    from gradaccum_lib.losses import bert_classification_loss

    def step(model: torch.nn.Module, micro_batches: list, make_optimizer: Callable) -> None:
        optimizer = make_optimizer(model.parameters())
        cuda = next(model.parameters()).device.type == "cuda"
        scaler = torch.amp.GradScaler("cuda") if autocast_dtype == torch.float16 and cuda else None
        skipped = 0
        while not accumulate_window(model, optimizer, micro_batches, bert_classification_loss,
                                    scaler=scaler, autocast_dtype=autocast_dtype).stepped:
            skipped += 1
            if skipped > MAX_SKIPPED_STEPS:
                raise RuntimeError(f"GradScaler skipped {skipped} steps in a row: the fp16 "
                                   "gradients overflow at every scale")
        skipped_steps.append(skipped)

    return step


def precision_rows(name: str, model: torch.nn.Module, batch: dict, k: int,
                   precisions: Sequence[str] = tuple(AMP_DTYPES)) -> list[dict]:
    """Return, per precision and for k = 1 and ``k``, how one loop step's parameter update
    compares with the fp32 truth's (one SGD step from the full-batch fp32 gradient)."""
    from gradaccum_lib import split_into_micro_batches
    from gradaccum_lib.equivalence import audit_update
    from gradaccum_lib.losses import bert_classification_loss

    rows = []
    for precision in precisions:
        if precision not in AMP_DTYPES:
            raise ValueError(f"precisions must be among {sorted(AMP_DTYPES)}; got {precision!r}")
        for steps in sorted({1, k}):
            skipped: list[int] = []
            result = audit_update(loop_step(AMP_DTYPES[precision], skipped), model,
                                  bert_classification_loss,
                                  split_into_micro_batches(batch, accumulation_steps=steps),
                                  lambda parameters: torch.optim.SGD(parameters, lr=0.1))
            rows.append({"model": name, "precision": precision, "k": steps,
                         "relative_difference": result.relative_difference,
                         "cosine": result.cosine, "norm_ratio": result.norm_ratio,
                         "tolerance": TOLERANCES[precision], "skipped_steps": sum(skipped)})
    return rows


def check_tolerances(rows: list[dict]) -> list[str]:
    """Mark each precision row ``ok`` and return a message per failure: a relative update
    difference above its precision's tolerance, or one at k > 1 above ACCUMULATION_SLACK times
    the same model and precision's at k = 1 plus the fp32 tolerance."""
    at_k1 = {(r["model"], r["precision"]): r["relative_difference"] for r in rows if r["k"] == 1}
    failures = []
    for row in rows:
        label = f"{row['model']}, {row['precision']}, k = {row['k']}"
        difference = row["relative_difference"]
        problems = []
        if not difference <= row["tolerance"]:  # NaN fails too
            problems.append(f"relative update difference {difference:.3g} is above the "
                            f"{row['precision']} tolerance {row['tolerance']:g}")
        baseline = at_k1.get((row["model"], row["precision"]))
        if row["k"] > 1 and baseline is not None:
            limit = ACCUMULATION_SLACK * baseline + TOLERANCES["fp32"]
            if not difference <= limit:
                problems.append(f"accumulating adds error: {difference:.3g} against "
                                f"{baseline:.3g} at k = 1 (limit {limit:.3g})")
        row["ok"] = not problems
        failures += [f"{label}: {problem}" for problem in problems]
    return failures


def measure_model(name: str, config: Mapping[str, int], sizes: Mapping[str, object],
                  device: torch.device) -> dict:
    """Return every measurement of one model: memory per k, precision, time per sample
    against micro-batch size, and the three loops."""
    from gradaccum_lib.losses import bert_classification_loss

    run = benchmarks_run()
    length = sizes["sequence_length"]
    make_model = model_factory(config, length, device)
    batch = encoded_notes(sizes["effective_batch"], length, device)
    precision_batch = encoded_notes(sizes["precision_batch"], length, device)
    started = time.perf_counter()
    result = {"config": dict(config),
              "parameters": sum(p.numel() for p in make_model().parameters())}
    result["memory"] = peak_memory_rows(name, make_model, batch, sizes["ks"])
    _release_memory()
    print(f"{name}: memory per k in {time.perf_counter() - started:.0f} s", flush=True)
    result["precision"] = precision_rows(name, make_model(), precision_batch,
                                         sizes["precision_k"])
    _release_memory()
    print(f"{name}: precision in {time.perf_counter() - started:.0f} s", flush=True)
    result["micro_batch_time"] = run.micro_batch_time(make_model, bert_classification_loss,
                                                      batch, sizes["micro_batch_sizes"],
                                                      sizes["repeats"])
    _release_memory()
    print(f"{name}: time per sample in {time.perf_counter() - started:.0f} s", flush=True)
    result["loop_overhead"] = run.loop_overhead(name, make_model, batch,
                                                bert_classification_loss, sizes["loop_ks"],
                                                sizes["repeats"])
    _release_memory()
    result["seconds"] = time.perf_counter() - started
    return result


# ----------------------------------------------------------------------------- notebooks

def notebook_times(paths: Sequence[Path], deadline: float, profile: str = "gpu") -> list[dict]:
    """Return each notebook's wall time, run top to bottom on a copy (the committed notebook
    is untouched) under ``GRADACCUM_PROFILE=profile``, until ``deadline`` (time.monotonic());
    a notebook still running then is stopped, and those after it are not run."""
    rows = []
    environment = {**os.environ, "GRADACCUM_PROFILE": profile}
    for path in paths:
        left = deadline - time.monotonic()
        if left <= 0:
            rows.append({"notebook": path.name, "status": "not run", "seconds": None,
                         "error": "the budget was spent"})
            continue
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
            copy_path = Path(folder) / path.name
            copy_path.write_bytes(path.read_bytes())
            started = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), str(copy_path)],
                cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
            try:
                _, error = process.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the runner; its kernel follows it
                process.communicate()
                rows.append({"notebook": path.name, "status": "stopped",
                             "seconds": time.monotonic() - started,
                             "error": "still running when the budget was spent"})
                continue
            seconds = time.monotonic() - started
            lines = [line for line in ANSI_CODES.sub("", error).splitlines() if line.strip()]
            rows.append({"notebook": path.name, "seconds": seconds,
                         "status": "ok" if process.returncode == 0 else "failed",
                         "error": "" if process.returncode == 0 else
                         (lines[-1] if lines else f"exit status {process.returncode}")})
        print(f"{path.name}: {rows[-1]['status']} in {rows[-1]['seconds'] or 0:.0f} s",
              flush=True)
    return rows


# ----------------------------------------------------------------------------- reporting

def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.1f}"


def _relative(row: Mapping) -> str:
    return "–" if row["relative_difference"] is None else f"{row['relative_difference']:.2e}"


def _model_table(results: Mapping, key: str, header: str,
                 cells: Callable[[Mapping, Mapping], str]) -> list[str]:
    """A markdown table with a row per entry of ``results["models"][name][key]``, each starting
    with the model's name; ``header`` is the header line, ``cells(model, row)`` the rest of a
    row (its ``|`` separators included)."""
    columns = header.count("|") - 1
    lines = [header, "|" + "---|" * columns]
    for name, model in results["models"].items():
        lines += [f"| {name} | {cells(model, row)} |" for row in model[key]]
    return lines


def cuda_markdown(results: Mapping) -> str:
    """Return the markdown of the README's CUDA section for ``results``."""
    device = results["device"]
    lines = [f"Measured {results['date']} by `make gpu-check` on {device['name']} "
             f"({device['memory_gib']:.0f} GiB), torch {device['torch']}, CUDA "
             f"{device['cuda'] or '–'}, fp32 matmul precision "
             f"`{device['float32_matmul_precision']}`; "
             f"EMR notes padded to s = {results['sizes']['sequence_length']}"
             f"{' (CPU REHEARSAL: tiny sizes, not GPU numbers)' if results['rehearsal'] else ''}"
             ".", "",
             f"**Peak memory of one AdamW step** (effective batch "
             f"{results['sizes']['effective_batch']}): the CUDA allocator's peak (parameters, "
             "AdamW state and all), its growth during the step, the step's own tensors counted "
             "as on the CPU, and one micro-batch's activations (MiB).", ""]
    lines += _model_table(
        results, "memory", "| model | parameters | k | micro-batch | CUDA peak | growth in the "
        "step | step's tensors | activations |",
        lambda model, row: f"{model['parameters']:,} | {row['k']} | {row['micro_batch_size']} | "
        f"{_mib(row['cuda_peak_bytes'])} | {_mib(row['cuda_growth_bytes'])} | "
        f"{_mib(row['tensor_peak_bytes'])} | {_mib(row['activation_bytes'])}")
    lines += ["", "**Precision against the fp32 truth**: one SGD step of `accumulate_window` "
              "against one from the full-batch fp32 gradient (`audit_update`), relative "
              "update difference; tolerances fp32 "
              f"{TOLERANCES['fp32']:g}, bf16 {TOLERANCES['bf16']:g}, fp16 "
              f"{TOLERANCES['fp16']:g}, and at k > 1 at most {ACCUMULATION_SLACK:g}× the k = 1 "
              "error (+ the fp32 tolerance).", ""]
    lines += _model_table(
        results, "precision", "| model | precision | k | relative update difference | cosine | "
        "fp16 steps skipped | within tolerance |",
        lambda _, row: f"{row['precision']} | {row['k']} | {row['relative_difference']:.2e} | "
        f"{row['cosine']:.6f} | {row['skipped_steps']} | {'yes' if row.get('ok') else 'NO'}")
    lines += ["", "**Time per sample against micro-batch size** (fp32, AdamW, the library's "
              "loop):", ""]
    lines += _model_table(
        results, "micro_batch_time", "| model | micro-batch | k | ms per sample | step time / "
        "largest micro-batch |",
        lambda _, row: f"{row['micro_batch_size']} | {row['k']} | "
        f"{1e3 * row['seconds_per_sample']:.2f} | {row['ratio_to_largest']:.2f}")
    reader = results.get("reader_code")
    if reader:
        lines += ["", f"**The code readers copy**, launched with {reader['world_size']} "
                  f"process(es) on {reader['device']} as the notebooks launch it:", "",
                  "| check | measured | bound | ok |", "|---|---|---|---|"]
        lines += [f"| {row['check']} | {row['value']:.3g} | {'≤' if row['below'] else '>'} "
                  f"{row['bound']:g} | {'yes' if row['ok'] else 'NO'} |"
                  for row in reader["checks"]]
    if results.get("ddp_memory"):
        lines += ["", "**DDP's bucket copy of the gradients** (one process; held after a "
                  "window's last backward, DDP's default minus `gradient_as_bucket_view=True`, "
                  "against `memory_budget(..., ddp_bucket_copy=True)`; MiB):", "",
                  "| k | gradients | modelled copy | counted copy | CUDA allocator's copy | "
                  "CUDA allocator at the wrap (buckets) | CUDA peak, default | CUDA peak, views |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {row['k']} | {_mib(row['gradient_bytes'])} | "
                  f"{_mib(row['modelled_copy_bytes'])} | {_mib(row['counted_copy_bytes'])} | "
                  f"{_mib(row['cuda_copy_bytes'])} | {_mib(row['cuda_buckets_bytes'])} | "
                  f"{_mib(row['cuda_peak_default_bytes'])} | "
                  f"{_mib(row['cuda_peak_views_bytes'])} |" for row in results["ddp_memory"]]
    compiled = results.get("compiled_accumulation")
    if compiled:
        lines += ["", "**`torch.compile` with gradient accumulation** (pytorch #169545, notebook "
                  "08 §3): 4 micro-steps into one `.grad` as the issue's repro runs them "
                  "(`torch.compiler.cudagraph_mark_step_begin()` before each forward, outputs "
                  "cloned), against eager:", ""]
        if "skipped" in compiled:
            lines.append(f"Skipped: {compiled['skipped']}.")
        else:
            lines += ["| mode | outcome | gradient off eager's (relative) | error |",
                      "|---|---|---|---|"]
            lines += [f"| `{row['mode']}` | {row['outcome']} | {_relative(row)} | "
                      f"{row['error'].replace('|', '/') or '–'} |" for row in compiled["rows"]]
    lines += ["", "**Library loop against the bare nanoGPT loop and Accelerate** (fp32, AdamW, "
              "one optimizer step):", ""]
    lines += _model_table(
        results, "loop_overhead", "| model | k | library / bare (median) | bare copy / bare "
        "(a tie) | library / Accelerate (median) | library ms (min–max) |",
        lambda _, row: f"{row['k']} | {row['library_vs_bare']:.3f} | "
        f"{row['bare_copy_vs_bare']:.3f} | "
        f"{row['library_vs_accelerate']:.3f} | {1e3 * row['library']['median']:.1f} "
        f"({1e3 * row['library']['min']:.1f}–{1e3 * row['library']['max']:.1f})")
    return "\n".join(lines)


def notebook_column_markdown(results: Mapping) -> str:
    """Return the markdown of the ``gpu`` column for README.md's notebook table."""
    rows = results.get("notebooks") or []
    header = f"GPU time (`gpu` profile, {results['device']['name']})"
    lines = [f"| notebook | {header} |", "|---|---|"]
    for row in rows:
        if row["status"] == "ok":
            cell = f"~{max(1, round(row['seconds'])):d} s"
        elif row["status"] == "stopped":
            cell = f"> {row['seconds']:.0f} s (stopped at the budget)"
        elif row["status"] == "failed":
            cell = f"fails after {row['seconds']:.0f} s: {row['error'][:80]}"
        else:
            cell = f"not run ({row['error']})"
        lines.append(f"| `{row['notebook']}` | {cell} |")
    if not rows:
        lines.append("| (notebooks not run: --skip-notebooks or a rehearsal) | |")
    return "\n".join(lines)


def readme_gpu(results: Mapping) -> str:
    """Return README-gpu.md: both markdown blocks between their markers, to merge."""
    return (f"# GPU check results (merge into README.md)\n\nWritten by `make gpu-check` "
            f"(`scripts/gpu_check.py`); `make bench` copies the CUDA section into "
            f"benchmarks/README.md.\n\n## CUDA section\n\n{GPU_START}\n{cuda_markdown(results)}"
            f"\n{GPU_END}\n\n## `gpu` column of README.md's notebook table\n\n{COLUMN_START}\n"
            f"{notebook_column_markdown(results)}\n{COLUMN_END}\n")


def figure(results: Mapping):  # noqa: ANN201 - a matplotlib Figure
    """Return the figure: CUDA peak against k, time per sample, precision errors."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 3.8), layout="constrained")
    memory, timing, precision = fig.subplots(1, 3)
    for name, model in results["models"].items():
        rows = model["memory"]
        ks = [row["k"] for row in rows]
        key = "cuda_peak_bytes" if rows[0]["cuda_peak_bytes"] is not None else "tensor_peak_bytes"
        memory.plot(ks, [row[key] / 2**20 for row in rows], marker="o", label=f"{name}: peak")
        memory.plot(ks, [row["activation_bytes"] / 2**20 for row in rows], marker="s",
                    linestyle="--", label=f"{name}: activations")
        rows = model["micro_batch_time"]
        timing.plot([row["micro_batch_size"] for row in rows],
                    [1e3 * row["seconds_per_sample"] for row in rows], marker="o", label=name)
    for axes in (memory, timing):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.legend(fontsize="small")
    memory.set_xlabel("accumulation steps k (fixed effective batch)")
    memory.set_ylabel("MiB")
    timing.set_xlabel("micro-batch size (fixed effective batch)")
    timing.set_ylabel("ms per sample")
    labels, values, limits = [], [], []
    for name, model in results["models"].items():
        for row in model["precision"]:
            labels.append(f"{name}\n{row['precision']} k={row['k']}")
            values.append(max(row["relative_difference"], 1e-12))
            limits.append(row["tolerance"])
    positions = range(len(values))
    precision.bar(positions, values, color="tab:blue", label="relative update difference")
    precision.scatter(positions, limits, color="tab:red", marker="_", s=300, label="tolerance")
    precision.set_xticks(list(positions), labels, rotation=90, fontsize="x-small")
    precision.set_yscale("log")
    precision.legend(fontsize="small")
    return fig


# ----------------------------------------------------------------------------- main

def sizes_for(rehearsal: bool) -> dict:
    """Return the problem sizes: the GPU's, or tiny ones for a CPU rehearsal."""
    if rehearsal:
        return {"sequence_length": 32, "effective_batch": 4, "ks": [1, 2, 4],
                "precision_batch": 4, "precision_k": 2, "micro_batch_sizes": [4, 2, 1],
                "loop_ks": [1, 2], "repeats": 2}
    return {"sequence_length": 512, "effective_batch": 32, "ks": [1, 2, 4, 8, 16, 32],
            "precision_batch": 16, "precision_k": 4, "micro_batch_sizes": [32, 16, 8, 4, 2, 1],
            "loop_ks": [1, 4, 16], "repeats": 7}


def device_description(device: torch.device) -> dict:
    """Return what the numbers were measured on."""
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, memory_gib = properties.name, properties.total_memory / 2**30
    else:
        name, memory_gib = "CPU", 0.0
    return {"name": name, "memory_gib": memory_gib, "torch": torch.__version__,
            "cuda": torch.version.cuda, "float32_matmul_precision":
            torch.get_float32_matmul_precision()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write (default: benchmarks/)")
    parser.add_argument("--skip-notebooks", action="store_true",
                        help="do not time the notebooks")
    parser.add_argument("--budget-seconds", type=float, default=480.0,
                        help="stop timing notebooks when this much time has passed")
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="steps 1-6 on the CPU at tiny sizes (tests only; no GPU numbers)")
    arguments = parser.parse_args(argv)
    if arguments.budget_seconds <= 0:
        parser.error(f"--budget-seconds must be > 0; got {arguments.budget_seconds}")
    if arguments.cpu_rehearsal and arguments.out is None:
        parser.error("--cpu-rehearsal needs --out: its CPU numbers must not replace the GPU "
                     "results in benchmarks/")
    deadline = time.monotonic() + arguments.budget_seconds
    rehearsal = arguments.cpu_rehearsal
    if not rehearsal:
        message = no_cuda_message()
        if message is not None:
            print(message, file=sys.stderr)
            return NO_CUDA_EXIT
    device = torch.device("cpu" if rehearsal else "cuda")
    # fp32 means fp32: no TF32 matmuls for the ground truth and the fp32 loop (the default;
    # set here so that nothing imported before can have changed it)
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    sizes = sizes_for(rehearsal)
    results = {"date": time.strftime("%Y-%m-%d"), "rehearsal": rehearsal,
               "device": device_description(device), "sizes": sizes,
               "tolerances": TOLERANCES, "accumulation_slack": ACCUMULATION_SLACK, "models": {}}
    started = time.perf_counter()
    for name, config in (REHEARSAL_MODELS if rehearsal else MODELS).items():
        results["models"][name] = measure_model(name, config, sizes, device)
    failures = check_tolerances([row for model in results["models"].values()
                                 for row in model["precision"]])
    results["reader_code"], reader_failures = reader_code_checks(reader_world_size(), device)
    results["ddp_memory"], memory_failures = ddp_memory_checks(rehearsal)
    results["compiled_accumulation"], compile_failures = compiled_accumulation_checks(device)
    failures += reader_failures + memory_failures + compile_failures
    print(f"reader's code, DDP memory and torch.compile in {time.perf_counter() - started:.0f} s",
          flush=True)
    results["measure_seconds"] = time.perf_counter() - started
    skip = arguments.skip_notebooks or rehearsal
    results["notebooks"] = [] if skip else notebook_times(
        sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")), deadline - 20)  # 20 s left for writing
    results["seconds"] = time.perf_counter() - started
    results["failures"] = failures

    out = arguments.out or BENCHMARKS
    out.mkdir(parents=True, exist_ok=True)
    (out / "results-gpu.json").write_text(json.dumps(results, indent=1) + "\n")
    figure(results).savefig(out / "results-gpu.png", dpi=100)
    (out / "README-gpu.md").write_text(readme_gpu(results))
    print(readme_gpu(results))
    print(f"wrote {out / 'results-gpu.json'}, {out / 'results-gpu.png'} and "
          f"{out / 'README-gpu.md'} in {results['seconds']:.0f} s")
    for failure in failures:
        print(f"CHECK FAILED: {failure}", file=sys.stderr)
    return FAILED_EXIT if failures else 0


if __name__ == "__main__":
    sys.exit(main())
