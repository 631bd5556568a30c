"""gradaccum benchmarks: ratios measured side by side, written to results.json and README.md.

    python benchmarks/run.py            # the full run (make bench), a few minutes on 2 cores
    python benchmarks/run.py --quick    # tiny sizes: checks the harness, not the numbers

Every comparison runs in one process, the contenders interleaved round by round (order
rotated), after a warm-up; medians with min-max are reported. These machines are noisy: the
ratios are the result, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.bench import Timing, time_interleaved
from gradaccum_lib.data import (
    encode_records,
    load_emr_split,
    load_tokenizer,
    make_toy_classification,
)
from gradaccum_lib.frameworks import accelerate_loop, bare_loop
from gradaccum_lib.launcher import launch
from gradaccum_lib.losses import bert_classification_loss, sample_classification_loss
from gradaccum_lib.memory import activation_bytes
from gradaccum_lib.models import make_mlp, make_tiny_bert

HERE = Path(__file__).resolve().parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


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
    return {"median": timing.median, "min": timing.min, "max": timing.max}


# ----------------------------------------------------------------------------- the three loops

def mean_loss(model, batch):  # noqa: ANN001, ANN201 - the model's mean loss, as the bare loops use
    summed, count = (bert_classification_loss if isinstance(batch, dict)
                     else sample_classification_loss)(model, batch)
    return summed / count


def library_loop(model, optimizer, loss_fn, accumulation_steps):  # noqa: ANN001, ANN201
    trainer = AccumulationTrainer(model, loss_fn, optimizer, accumulation_steps=accumulation_steps,
                                  progress=False)
    return trainer.step_window


def loop_overhead(name, make_model, batch, loss_fn, ks, repeats):  # noqa: ANN001, ANN201
    """Time one optimizer step of each loop on the same model, data and k."""
    rows = []
    for k in ks:
        window = split_into_micro_batches(batch, accumulation_steps=k)
        steps = {}
        for label in ("library", "bare", "accelerate"):
            model = make_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            if label == "library":
                steps[label] = library_loop(model, optimizer, loss_fn, k)
            elif label == "bare":
                steps[label] = bare_loop(model, optimizer, k, mean_loss)
            else:
                steps[label] = accelerate_loop(model, optimizer, k, mean_loss)[0]
        loops = {label: (lambda step=step, w=window: step(w)) for label, step in steps.items()}
        timings = time_interleaved(loops, repeats=repeats, warmup=2)
        row = {"model": name, "k": k, **{label: summary(t) for label, t in timings.items()}}
        row["library_vs_bare"] = timings["library"].median / timings["bare"].median
        row["library_vs_accelerate"] = timings["library"].median / timings["accelerate"].median
        rows.append(row)
        print(f"{name:9s} k={k:2d}: library/bare {row['library_vs_bare']:.3f}, "
              f"library/accelerate {row['library_vs_accelerate']:.3f}", flush=True)
    return rows


def micro_batch_time(batch, effective, sizes, repeats):  # noqa: ANN001, ANN201
    """Time per sample against micro-batch size at a fixed effective batch (library loop)."""
    loops = {}
    for size in sizes:
        model = make_mlp(batch[0].shape[1], 1024, 4, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = library_loop(model, optimizer, sample_classification_loss, effective // size)
        window = split_into_micro_batches(batch, micro_batch_size=size)
        loops[size] = lambda s=step, w=window: s(w)
    timings = time_interleaved(loops, repeats=repeats, warmup=1)
    base = timings[sizes[0]].median
    return [{"micro_batch_size": s, "k": effective // s, "seconds_per_sample": timings[s].median
             / effective, "ratio_to_largest": timings[s].median / base, **summary(timings[s])}
            for s in sizes]


def activation_scaling(batch, ks):  # noqa: ANN001, ANN201
    model = make_mlp(batch[0].shape[1], 1024, 4, dtype=torch.float32)
    full = activation_bytes(model, sample_classification_loss, batch)
    rows = []
    for k in ks:
        part = split_into_micro_batches(batch, accumulation_steps=k)[0]
        measured = activation_bytes(model, sample_classification_loss, part)
        rows.append({"k": k, "bytes": measured, "ratio_to_k1": measured / full,
                     "ratio_to_1_over_k": measured / full * k})
    return rows


PEAK_SCRIPT = """
import sys, torch
from pathlib import Path
from gradaccum_lib import split_into_micro_batches
from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.data import make_toy_classification
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.models import make_mlp

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])  # KiB

k, n, d = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
x, y = make_toy_classification(n, d, 4, dtype=torch.float32)
model = make_mlp(d, 4096, 4, dtype=torch.float32)
trainer = AccumulationTrainer(model, sample_classification_loss,
                              torch.optim.SGD(model.parameters(), lr=0.1),
                              accumulation_steps=k, progress=False)
window = split_into_micro_batches((x, y), accumulation_steps=k)
trainer.step_window(window)  # gradients and allocator pools exist from here on
Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS")
trainer.step_window(window)
print(status("VmHWM") - before)
"""


def peak_process_memory(ks, samples, dim):  # noqa: ANN001, ANN201
    """Peak resident-memory growth (KiB) during one accumulated step (after a first one), in
    a fresh process per k; Linux only (/proc/self/clear_refs resets the peak)."""
    if not Path("/proc/self/clear_refs").exists():
        return []
    rows = []
    for k in ks:
        out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(k), str(samples), str(dim)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        rows.append({"k": k, "peak_rss_growth_kib": int(out.stdout.strip().splitlines()[-1])})
    return rows


def ddp_communication(ks, quick):  # noqa: ANN001, ANN201
    result = launch("gradaccum_lib.ddp", [
        "--accumulation-steps", "1", "--sweep", ",".join(map(str, ks)),
        "--micro-batch-size", "8", "--steps", "3" if quick else "8", "--dtype", "float32",
        "--hidden-dim", "64" if quick else "512"], nproc_per_node=2, timeout_seconds=600)
    return [{key: run[key] for key in ("accumulation_steps", "sync", "bytes_per_step",
                                       "syncs_per_step", "seconds_per_step")}
            for run in result["runs"]]


def ddp_engine_overhead(quick):  # noqa: ANN001, ANN201
    """The engine under DDP against the plain nanoGPT no_sync loop, 2 gloo processes."""
    return launch(str(HERE / "ddp_overhead.py"),
                  ["--repeats", "3" if quick else "31", "--hidden-dim", "64" if quick else "1024"],
                  nproc_per_node=2, timeout_seconds=600)["rows"]


# ----------------------------------------------------------------------------- reporting

def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Measured {results['date']} on {m['cpu']} ({m['cores']} cores, "
             f"{m['torch_threads']} torch threads), torch {m['torch']}, Python {m['python']}"
             f"{', ' + m['cuda'] if m['cuda'] else ', no GPU'}"
             f"{' (QUICK RUN: tiny sizes, numbers meaningless)' if results['quick'] else ''}.", "",
             "### 1. Time per optimizer step: library loop vs bare loop vs Accelerate", "",
             "| model | k | library / bare (median) | library / Accelerate (median) | "
             "library ms (min–max) |", "|---|---|---|---|---|"]
    for row in results["loop_overhead"]:
        lib = row["library"]
        lines.append(f"| {row['model']} | {row['k']} | {row['library_vs_bare']:.3f} | "
                     f"{row['library_vs_accelerate']:.3f} | {1e3 * lib['median']:.2f} "
                     f"({1e3 * lib['min']:.2f}–{1e3 * lib['max']:.2f}) |")
    lines += ["", "### 2. Time per sample against micro-batch size (effective batch "
              f"{results['micro_batch_time'][0]['micro_batch_size']})", "",
              "| micro-batch | k | µs per sample | step time / largest micro-batch |",
              "|---|---|---|---|"]
    for row in results["micro_batch_time"]:
        lines.append(f"| {row['micro_batch_size']} | {row['k']} | "
                     f"{1e6 * row['seconds_per_sample']:.1f} | {row['ratio_to_largest']:.2f} |")
    lines += ["", "### 3. Activation bytes against k (and peak process memory)", "",
              "| k | activation bytes | ratio to k = 1 | ratio × k (1.00 = exactly 1/k) | "
              "peak RSS growth (KiB) |", "|---|---|---|---|---|"]
    peaks = {row["k"]: row["peak_rss_growth_kib"] for row in results["peak_memory"]}
    for row in results["activation_memory"]:
        lines.append(f"| {row['k']} | {row['bytes']:,} | {row['ratio_to_k1']:.4f} | "
                     f"{row['ratio_to_1_over_k']:.4f} | {peaks.get(row['k'], '')} |")
    lines += ["", "### 4. DDP, 2 gloo processes: per optimizer step", "",
              "| k | bytes (window) | bytes (every) | syncs window / every | "
              "ms window | ms every |", "|---|---|---|---|---|---|"]
    ddp = {(r["accumulation_steps"], r["sync"]): r for r in results["ddp"]}
    for k in sorted({k for k, _ in ddp}):
        w, e = ddp[k, "window"], ddp[k, "every"]
        lines.append(f"| {k} | {w['bytes_per_step']:,.0f} | {e['bytes_per_step']:,.0f} | "
                     f"{w['syncs_per_step']:.0f} / {e['syncs_per_step']:.0f} | "
                     f"{1e3 * w['seconds_per_step']:.2f} | {1e3 * e['seconds_per_step']:.2f} |")
    lines += ["", "### 5. DDP, 2 gloo processes: the engine against the plain nanoGPT loop", "",
              "| k | engine / plain no_sync loop (median) | engine ms (min–max) |", "|---|---|---|"]
    for row in results.get("ddp_engine", []):
        engine = row["engine"]
        lines.append(f"| {row['k']} | {row['engine_vs_plain']:.3f} | {1e3 * engine['median']:.2f}"
                     f" ({1e3 * engine['min']:.2f}–{1e3 * engine['max']:.2f}) |")
    if results.get("cuda"):
        lines += ["", "### 6. CUDA", "", "```", json.dumps(results["cuda"], indent=1), "```"]
    else:
        lines += ["", "### 6. CUDA", "", "No GPU on the machine that ran this; rerun "
                  "`make bench` on one to fill this section."]
    return "\n".join(lines)


def figure(results: dict) -> Figure:
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for model in sorted({r["model"] for r in results["loop_overhead"]}):
        rows = [r for r in results["loop_overhead"] if r["model"] == model]
        ks = [r["k"] for r in rows]
        left.plot(ks, [r["library_vs_bare"] for r in rows], marker="o", label=f"{model}: / bare")
        left.plot(ks, [r["library_vs_accelerate"] for r in rows], marker="s", linestyle="--",
                  label=f"{model}: / Accelerate")
    left.axhline(1.0, color="grey", linewidth=1)
    left.set_xscale("log", base=2)
    left.set_xlabel("accumulation steps k")
    left.set_ylabel("library step time ratio (median)")
    left.legend(fontsize="small")
    rows = results["micro_batch_time"]
    right.plot([r["micro_batch_size"] for r in rows], [1e6 * r["seconds_per_sample"] for r in rows],
               marker="o")
    right.set_xscale("log", base=2)
    right.set_xlabel("micro-batch size (fixed effective batch)")
    right.set_ylabel("µs per sample")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write the results")
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    torch.manual_seed(0)
    ks = [1, 2, 4] if quick else [1, 2, 4, 8, 16]
    repeats = 3 if quick else 21
    started = time.perf_counter()

    mlp_batch = make_toy_classification(32 if quick else 256, 64 if quick else 256, 4,
                                        dtype=torch.float32)
    tokenizer = load_tokenizer()
    notes = encode_records(load_emr_split("train")[: 16 if quick else 64], tokenizer,
                           max_length=32 if quick else 128)
    results = {"date": time.strftime("%Y-%m-%d"), "quick": quick, "machine": machine()}
    results["loop_overhead"] = (
        loop_overhead("MLP", lambda: make_mlp(mlp_batch[0].shape[1], 64 if quick else 1024, 4,
                                               dtype=torch.float32),
                      mlp_batch, sample_classification_loss, ks, repeats)
        + loop_overhead("tiny BERT", lambda: make_tiny_bert(len(tokenizer), 10, hidden_size=64,
                                                             max_length=128),
                        notes, bert_classification_loss, ks, repeats))
    sizes = [32, 8, 2] if quick else [256, 128, 64, 32, 16, 8, 4, 2, 1]
    results["micro_batch_time"] = micro_batch_time(mlp_batch, sizes[0], sizes, repeats)
    results["activation_memory"] = activation_scaling(mlp_batch, ks)
    results["peak_memory"] = peak_process_memory(ks, 64 if quick else 2048,
                                                 64 if quick else 512)
    results["ddp"] = ddp_communication(ks, quick)
    results["ddp_engine"] = ddp_engine_overhead(quick)
    results["cuda"] = None  # filled by a GPU run: see benchmarks/README.md
    results["seconds"] = time.perf_counter() - started

    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    figure(results).savefig(out / "results.png", dpi=100)
    readme = out / "README.md"
    table = markdown(results)
    if readme.is_file() and START in readme.read_text():
        text = readme.read_text()
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1] if END in rest else ""
        readme.write_text(f"{head}{START}\n{table}\n{END}{tail}")
    else:
        readme.write_text(f"# Benchmarks\n\n{START}\n{table}\n{END}\n")
    print(f"wrote {out / 'results.json'}, {readme} and {out / 'results.png'} "
          f"in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
