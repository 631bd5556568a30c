"""scripts/gpu_check.py (make gpu-check): everything short of a GPU.

(a) without CUDA it stops at once with status 2 and says what to do (the script and the make
target); (b) its pure parts on synthetic results: tolerance checks, markdown, README-gpu.md;
(c) its measuring functions on the CPU at tiny sizes (a rehearsal of the whole run: the
precision paths, the reader's programs under gloo, DDP's bucket copy per k; torch.compile with
accumulation, CUDA only, skipped there and run on the CPU with the eager backend), and the
notebook timer's ok / failed / stopped / not-run paths on tiny notebooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
gpu_check = load_script("scripts/gpu_check.py")

NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA, even on a GPU machine


# ----------------------------------------------------------------------------- (a) no CUDA

def test_cuda_peak_bytes_is_none_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.cuda_peak_bytes(lambda: None) is None


def test_without_cuda_the_script_exits_2_at_once_and_says_what_to_do():
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(SCRIPT)], env=NO_GPU, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == gpu_check.NO_CUDA_EXIT == 2
    assert "no CUDA device" in result.stderr and "make gpu-check" in result.stderr
    assert "NVIDIA GPU" in result.stderr and "make bench" in result.stderr
    assert result.stdout == ""
    assert time.monotonic() - started < 60  # it imports torch and stops: nothing is measured


def _written(folder: Path) -> dict[str, float]:
    return {name: (folder / name).stat().st_mtime for name in
            ("results-gpu.json", "results-gpu.png", "README-gpu.md") if (folder / name).exists()}


def test_make_gpu_check_runs_the_script_and_fails_with_its_message():
    before = _written(ROOT / "benchmarks")
    # -o: treat the install stamp as up to date (the test must not reinstall the venv)
    result = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed-stamp",
                             "gpu-check"], env=NO_GPU, cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "scripts/gpu_check.py" in result.stdout  # the recipe make echoed
    assert "no CUDA device" in result.stderr and "Error 2" in result.stderr  # the script's 2
    assert _written(ROOT / "benchmarks") == before  # nothing written


def test_the_message_names_the_cause(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_check.no_cuda_message() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in gpu_check.no_cuda_message()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES=''" in gpu_check.no_cuda_message()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "no NVIDIA driver" in gpu_check.no_cuda_message()


def test_bad_options_are_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--budget-seconds", "0"])
    assert stopped.value.code == 2 and "--budget-seconds must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # CPU numbers must not land in benchmarks/
        gpu_check.main(["--cpu-rehearsal"])
    assert stopped.value.code == 2 and "--cpu-rehearsal needs --out" in capsys.readouterr().err


# ----------------------------------------------------------------------------- (b) pure parts

def _precision_row(model: str, precision: str, k: int, difference: float) -> dict:
    return {"model": model, "precision": precision, "k": k, "relative_difference": difference,
            "cosine": 1.0, "norm_ratio": 1.0, "tolerance": gpu_check.TOLERANCES[precision],
            "skipped_steps": 0}


def test_tolerances_are_ordered_by_significand_bits():
    tolerances = gpu_check.TOLERANCES
    assert tolerances["fp32"] < tolerances["fp16"] < tolerances["bf16"] < 0.25  # 1/k for k=4
    assert set(tolerances) == set(gpu_check.AMP_DTYPES)


def test_check_tolerances_passes_rounding_and_names_each_failure():
    rows = [_precision_row("m", "fp32", 1, 0.0), _precision_row("m", "fp32", 4, 2e-6),
            _precision_row("m", "bf16", 1, 8e-3), _precision_row("m", "bf16", 4, 9e-3),
            _precision_row("m", "fp16", 1, 2e-3), _precision_row("m", "fp16", 4, 2.5e-3)]
    assert gpu_check.check_tolerances(rows) == []
    assert all(row["ok"] for row in rows)

    rows = [_precision_row("m", "fp32", 1, 0.0),
            _precision_row("m", "fp32", 4, 0.75),  # a loop that divides by k twice
            _precision_row("m", "bf16", 1, 1e-2),
            _precision_row("m", "bf16", 4, 3e-2),  # within bf16's tolerance, 3x k = 1's error
            _precision_row("m", "fp16", 1, float("nan")),
            _precision_row("other", "fp16", 1, 1e-3)]
    failures = gpu_check.check_tolerances(rows)
    assert [row["ok"] for row in rows] == [True, False, True, False, False, True]
    assert any(f.startswith("m, fp32, k = 4: relative update difference 0.75 is above")
               for f in failures)
    assert any("m, fp32, k = 4: accumulating adds error" in f for f in failures)
    assert any("m, bf16, k = 4: accumulating adds error: 0.03 against 0.01" in f
               for f in failures)
    assert any(f.startswith("m, fp16, k = 1: relative update difference nan") for f in failures)
    assert len(failures) == 4


def _synthetic_results(notebooks: list[dict] | None = None) -> dict:
    def model(parameters: int, scale: float) -> dict:
        memory = [{"model": "x", "k": k, "micro_batch_size": 32 // k,
                   "cuda_peak_bytes": int(scale * (600 + 1000 / k) * 2**20),
                   "cuda_growth_bytes": int(scale * 1000 / k * 2**20),
                   "tensor_peak_bytes": int(scale * 990 / k * 2**20),
                   "activation_bytes": int(scale * 900 / k * 2**20)} for k in (1, 2, 4)]
        timing = [{"micro_batch_size": s, "k": 32 // s, "effective_batch": 32,
                   "seconds_per_sample": 1e-3 * (1 + 8 / s), "ratio_to_largest": (1 + 8 / s)
                   / 1.25, "median": 0.1, "min": 0.09, "max": 0.2} for s in (32, 8, 1)]
        timing_stats = {"median": 0.1, "min": 0.09, "max": 0.12}
        loops = [{"model": "x", "k": k, "library": timing_stats, "bare": timing_stats,
                  "bare_copy": timing_stats, "accelerate": timing_stats,
                  "library_vs_bare": 1.004, "bare_copy_vs_bare": 0.997,
                  "library_vs_accelerate": 0.981} for k in (1, 4)]
        precision = [_precision_row("x", p, k, d) for p, k, d in
                     (("fp32", 1, 0.0), ("fp32", 4, 3e-6), ("bf16", 1, 9e-3),
                      ("bf16", 4, 1e-2), ("fp16", 1, 2e-3), ("fp16", 4, 2e-3))]
        gpu_check.check_tolerances(precision)
        return {"config": {}, "parameters": parameters, "memory": memory,
                "precision": precision, "micro_batch_time": timing, "loop_overhead": loops}

    return {"date": "2026-12-01", "rehearsal": False,
            "device": {"name": "NVIDIA H200", "memory_gib": 139.8, "torch": "2.13.0+cu128",
                       "cuda": "12.8", "float32_matmul_precision": "highest"},
            "sizes": gpu_check.sizes_for(False),
            "models": {"tiny BERT": model(679_464, 0.01),
                       "BERT-base-sized": model(86_054_410, 1.0)},
            "notebooks": notebooks or []}


def test_cuda_markdown_renders_every_table_from_a_results_dict():
    text = gpu_check.cuda_markdown(_synthetic_results())
    assert text.startswith("Measured 2026-12-01 by `make gpu-check` on NVIDIA H200 (140 GiB), "
                           "torch 2.13.0+cu128, CUDA 12.8")
    assert "s = 512" in text and "effective batch 32" in text and "REHEARSAL" not in text
    assert "| BERT-base-sized | 86,054,410 | 1 | 32 | 1,600.0 | 1,000.0 | 990.0 | 900.0 |" in text
    assert "| BERT-base-sized | bf16 | 4 | 1.00e-02 | 1.000000 | 0 | yes |" in text
    assert "| tiny BERT | 8 | 4 | 2.00 | 1.60 |" in text
    assert "| BERT-base-sized | 4 | 1.004 | 0.997 | 0.981 | 100.0 (90.0–120.0) |" in text
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.endswith("|")


def test_notebook_column_and_readme_gpu_put_each_block_between_its_markers():
    notebooks = [{"notebook": "01_the_math.ipynb", "status": "ok", "seconds": 7.4, "error": ""},
                 {"notebook": "04_emr_case_study.ipynb", "status": "failed", "seconds": 30.2,
                  "error": "AssertionError: accuracy 0.41"},
                 {"notebook": "05_ddp_torchrun.ipynb", "status": "stopped", "seconds": 200.0,
                  "error": "still running when the budget was spent"},
                 {"notebook": "06_beyond.ipynb", "status": "not run", "seconds": None,
                  "error": "the budget was spent"}]
    results = _synthetic_results(notebooks)
    column = gpu_check.notebook_column_markdown(results)
    assert column.splitlines()[:3] == ["| notebook | GPU time (`gpu` profile, NVIDIA H200) |",
                                       "|---|---|", "| `01_the_math.ipynb` | ~7 s |"]
    assert "| `04_emr_case_study.ipynb` | fails after 30 s: AssertionError: accuracy 0.41 |" in (
        column)
    assert "| `05_ddp_torchrun.ipynb` | > 200 s (stopped at the budget) |" in column
    assert "| `06_beyond.ipynb` | not run (the budget was spent) |" in column
    readme = gpu_check.readme_gpu(results)
    cuda = readme.split(gpu_check.GPU_START)[1].split(gpu_check.GPU_END)[0].strip()
    assert cuda == gpu_check.cuda_markdown(results)
    assert readme.split(gpu_check.COLUMN_START)[1].split(gpu_check.COLUMN_END)[0].strip() == (
        column)


def test_cuda_markdown_renders_the_compiled_accumulation_rows_or_their_skip():
    results = _synthetic_results()
    assert "torch.compile` with gradient accumulation" not in gpu_check.cuda_markdown(results)
    results["compiled_accumulation"] = {"rows": [
        {"mode": "default", "outcome": "ok", "relative_difference": 3e-8, "error": ""},
        {"mode": "reduce-overhead", "outcome": "failed", "relative_difference": None,
         "error": "RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
                  "overwritten by a subsequent run. | more"}]}
    text = gpu_check.cuda_markdown(results)
    assert "pytorch #169545" in text
    assert "| `default` | ok | 3.00e-08 | – |" in text
    assert ("| `reduce-overhead` | failed | – | RuntimeError: Error: accessing tensor output of "
            "CUDAGraphs that has been overwritten by a subsequent run. / more |") in text
    results["compiled_accumulation"] = gpu_check.compiled_accumulation_checks(
        torch.device("cpu"))[0]
    assert 'Skipped: needs CUDA: mode="reduce-overhead" records CUDA graphs.' in (
        gpu_check.cuda_markdown(results))


def test_make_bench_copies_the_cuda_section_of_readme_gpu(tmp_path):
    bench = gpu_check.benchmarks_run()
    assert (bench.GPU_START, bench.GPU_END) == (gpu_check.GPU_START, gpu_check.GPU_END)
    assert "make gpu-check" in bench.cuda_section(tmp_path)[0]
    results = _synthetic_results()
    (tmp_path / "README-gpu.md").write_text(gpu_check.readme_gpu(results))
    assert bench.cuda_section(tmp_path) == [gpu_check.cuda_markdown(results)]


def test_the_figure_draws_synthetic_results(tmp_path):
    gpu_check.figure(_synthetic_results()).savefig(tmp_path / "f.png", dpi=40)
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")


# ----------------------------------------------------------------------------- (c) on the CPU

def test_cpu_rehearsal_measures_every_part_and_writes_the_files(tmp_path, capsys):
    assert gpu_check.main(["--cpu-rehearsal", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results-gpu.json").read_text())
    assert results["rehearsal"] is True and results["notebooks"] == []
    assert results["failures"] == []
    sizes = gpu_check.sizes_for(True)
    for name, model in results["models"].items():
        memory = model["memory"]
        assert [row["k"] for row in memory] == sizes["ks"]
        assert all(row["cuda_peak_bytes"] is None for row in memory)  # no CUDA here
        assert all(row["tensor_peak_bytes"] > row["activation_bytes"] > 0 for row in memory)
        assert memory[0]["activation_bytes"] > memory[-1]["activation_bytes"]
        precision = {(row["precision"], row["k"]): row for row in model["precision"]}
        assert set(precision) == {(p, k) for p in ("fp32", "bf16", "fp16") for k in (1, 2)}
        assert precision["fp32", 1]["relative_difference"] < 1e-6, name
        assert all(row["ok"] for row in precision.values())
        assert [row["micro_batch_size"] for row in model["micro_batch_time"]] == [4, 2, 1]
        assert [row["k"] for row in model["loop_overhead"]] == sizes["loop_ks"]
    reader = results["reader_code"]  # the card's program and 05's plain loop, 2 gloo ranks
    assert reader["world_size"] == 2 and reader["device"] == "cpu"
    assert [row["check"].split(":")[0] for row in reader["checks"]] == [
        "accumulate_window", "fp16 with a GradScaler", "mean / k shortcut",
        "05's plain DDP loop"]
    assert all(row["ok"] for row in reader["checks"])
    assert results["compiled_accumulation"] == {  # CUDA graphs: not rehearsed on the CPU
        "skipped": 'needs CUDA: mode="reduce-overhead" records CUDA graphs'}
    assert [row["k"] for row in results["ddp_memory"]] == [1, 2, 4]
    for row in results["ddp_memory"]:  # exactly one more copy of the gradients, every k
        assert row["counted_copy_bytes"] == row["modelled_copy_bytes"] == row["gradient_bytes"]
        assert row["cuda_copy_bytes"] is None
    readme = (tmp_path / "README-gpu.md").read_text()
    assert "CPU REHEARSAL" in readme and readme in capsys.readouterr().out
    assert ("| accumulate_window: largest difference to the large batch's step (float64) |"
            in readme)
    assert "**DDP's bucket copy of the gradients**" in readme
    assert 'Skipped: needs CUDA: mode="reduce-overhead" records CUDA graphs.' in readme
    assert (tmp_path / "results-gpu.png").read_bytes().startswith(b"\x89PNG")


def test_the_loop_step_of_the_audit_reaches_the_fp32_truth_and_counts_no_skips():
    notes = gpu_check.encoded_notes(4, 16, "cpu")
    make_model = gpu_check.model_factory({"hidden_size": 16, "num_layers": 1, "num_heads": 2},
                                         16, "cpu")
    rows = gpu_check.precision_rows("m", make_model(), notes, 4, precisions=("fp32",))
    assert [(row["k"], row["skipped_steps"]) for row in rows] == [(1, 0), (4, 0)]
    assert rows[1]["relative_difference"] < 1e-5 and rows[1]["cosine"] > 0.999999
    with pytest.raises(ValueError, match="precisions must be among"):
        gpu_check.precision_rows("m", make_model(), notes, 2, precisions=("fp8",))


def test_compiled_accumulation_compiles_nothing_without_cuda_and_runs_on_the_cpu_eagerly():
    started = time.monotonic()
    assert gpu_check.compiled_accumulation_checks(torch.device("cpu")) == (
        {"skipped": 'needs CUDA: mode="reduce-overhead" records CUDA graphs'}, [])
    assert time.monotonic() - started < 1  # nothing compiled
    # the repro itself on the CPU, with Dynamo's eager backend instead of inductor's CUDA graphs
    torch.compiler.reset()
    ran = gpu_check.accumulate_compiled(torch.device("cpu"), {"backend": "eager"})
    assert ran["outcome"] == "ok" and ran["error"] == "" and ran["relative_difference"] <= 1e-6

    def broken_backend(graph_module, example_inputs):  # noqa: ANN001, ANN202, ARG001
        raise RuntimeError("no compiler here")

    torch.compiler.reset()
    failed = gpu_check.accumulate_compiled(torch.device("cpu"), {"backend": broken_backend})
    torch.compiler.reset()
    assert failed["outcome"] == "failed" and failed["relative_difference"] is None
    assert failed["error"].startswith("BackendCompilerFailed: ") and "\n" not in failed["error"]


def _notebook(folder: Path, name: str, source: str) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(notebook, folder / name)
    return folder / name


def test_notebook_times_reports_ok_failed_stopped_and_not_run(tmp_path):
    paths = [_notebook(tmp_path, "01_ok.ipynb",
                       "import os\nassert os.environ['GRADACCUM_PROFILE'] == 'gpu'"),
             _notebook(tmp_path, "02_bad.ipynb", "raise ValueError('broken on purpose')"),
             _notebook(tmp_path, "03_slow.ipynb", "import time\ntime.sleep(120)"),
             _notebook(tmp_path, "04_late.ipynb", "1")]
    before = {path: path.read_bytes() for path in paths}
    rows = gpu_check.notebook_times(paths[:2], time.monotonic() + 300)
    started = time.monotonic()
    rows += gpu_check.notebook_times(paths[2:], time.monotonic() + 4)
    assert time.monotonic() - started < 20  # the slow one was stopped at the deadline
    assert [row["status"] for row in rows] == ["ok", "failed", "stopped", "not run"]
    assert rows[1]["error"] == "ValueError: broken on purpose"  # colours stripped
    assert rows[0]["seconds"] > 0 and rows[3]["seconds"] is None
    assert all(path.read_bytes() == before[path] for path in paths)  # run on copies
