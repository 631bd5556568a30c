"""The conformance table: each framework's accumulation path × each scenario, measured
against the library's ground truth, written as JSON, a heat-map and a Markdown page in English
and in Chinese (both from the JSON, so their numbers cannot drift).

``python -m gradaccum_course.audits.conformance`` (``make conformance``) runs every cell with a
progress bar, writes ``docs/conformance/`` (JSON, figure), ``docs/conformance.md`` and
``docs/zh/conformance.md``, then checks every cell against
:data:`~.verdicts.EXPECTED` and exits 1 naming each cell that changed, with its thread.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import accelerate, lightning, trainer, trl, two_ranks
from .scenarios import SCENARIOS, Scenario
from .verdicts import (
    CHECKED,
    EXPECTED,
    GRADIENT_ONLY,
    GRPO_EXPECTED,
    LOGGED_PROGRAMS,
    NOTES,
    PROGRAMS,
    THREADS,
    TOLERANCE,
)

__all__ = ["FIGURE", "FRAMEWORKS", "check", "committed_table", "deviation_lines", "main",
           "measure_cell", "page_text", "run_table", "write_figure", "write_json", "write_page"]

#: the framework columns' runners, by key
FRAMEWORKS = {"trainer": trainer, "accelerate": accelerate, "lightning": lightning,
              "trl": trl, "trl_grpo": trl.GRPO}
_ROOT = Path(__file__).resolve().parents[3]
_DEFAULT_OUT = _ROOT / "docs" / "conformance"
#: the committed heat-map (``make conformance`` writes it)
FIGURE = _DEFAULT_OUT / "conformance.png"


def _verdict(error: float | None) -> str:
    if error is None:
        return "not run"
    return "match" if error <= TOLERANCE else "deviate"


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def measure_cell(framework: str, scenario: Scenario) -> dict:
    """Return one cell of the table: run ``framework`` on ``scenario`` (or say why not)."""
    runner, key = FRAMEWORKS[framework], (framework, scenario.key)
    threads = [dict(zip(("label", "url", "says"), t, strict=True)) for t in THREADS.get(key, ())]
    cell = {"framework": framework, "framework_name": runner.NAME, "scenario": scenario.key,
            "threads": threads, "logged_threads": [] if key in GRADIENT_ONLY else threads,
            "note": NOTES.get(key, "")}
    if key in PROGRAMS:
        program = f"gradaccum_course/audits/conformance/repro/{PROGRAMS[key]}.py"
        cell |= {"program": program,
                 "logged_program": program if PROGRAMS[key] in LOGGED_PROGRAMS else ""}
    reason = scenario.not_run or getattr(runner, "NOT_RUN", {}).get(scenario.key, "")
    if reason:
        return {**cell, "status": "not run", "reason": reason,
                "gradient_verdict": "not run", "logged_verdict": "not run"}
    measured = two_ranks.run(framework, scenario) if scenario.ranks > 1 else runner.run(scenario)
    logged, true = measured["logged_loss"], measured["true_loss"]
    logged_error = None if logged is None else abs(logged - true) / true
    if scenario.router_aux_coefficient:  # the update's two parts (moe.decompose)
        from .moe import decompose

        parts = decompose(framework, scenario)  # the cross-entropy part's error: a bound's digit
        cell |= {key: _rounded(value, 1 if key == "ce_relative_error" else 4)
                 for key, value in parts.items()}
    return {**cell, "status": "ran", "version": measured["version"],
            "gradient_relative_error": _rounded(measured["gradient_relative_error"]),
            "norm_ratio": _rounded(measured["norm_ratio"], 6),
            "gradient_verdict": _verdict(measured["gradient_relative_error"]),
            "logged_loss": _rounded(logged, 6), "true_loss": _rounded(true, 6),
            "logged_relative_error": _rounded(logged_error),
            "logged_verdict": _verdict(logged_error),
            "logged_reason": measured.get("logged_not_run", "")}


def run_table(frameworks: Sequence[str] = tuple(FRAMEWORKS),
              scenarios: Sequence[Scenario] = SCENARIOS, *, progress: bool = True) -> dict:
    """Return the table (``versions``, ``scenarios``, ``cells``), one cell per framework and
    scenario, with a tqdm progress bar over the cells."""
    from importlib.metadata import version

    from tqdm.auto import tqdm

    pairs = [(f, s) for f in frameworks for s in scenarios]
    cells = []
    for framework, scenario in tqdm(pairs, desc="conformance", unit="cell",
                                    disable=not progress):
        cells.append(measure_cell(framework, scenario))
    extra = {}
    if "trl_grpo" in frameworks:  # the GRPO table: its loss types on a generated window
        from .grpo import grpo_table

        extra["grpo"] = grpo_table(progress=progress)
    return {"tolerance": TOLERANCE,
            "versions": {FRAMEWORKS[f].PACKAGE: version(FRAMEWORKS[f].PACKAGE)
                         for f in frameworks} | {"torch": version("torch")},
            "scenarios": [{"key": s.key, "title": s.title,
                           "accumulation_steps": s.accumulation_steps,
                           "predicted_tokens": s.predicted_tokens(),
                           "max_grad_norm": s.max_grad_norm, "model_forward": s.model_forward,
                           "ranks": s.ranks, "router_aux_coefficient": s.router_aux_coefficient}
                          for s in scenarios],
            "cells": cells,
            "threads_checked": [dict(zip(("label", "url", "says"), t, strict=True))
                                for t in CHECKED]} | extra


def check(table: dict) -> list[str]:
    """Return one line per cell whose verdicts differ from :data:`EXPECTED` (empty: all as
    expected), naming the cell and its threads."""
    wrong = []
    for cell in table["cells"]:
        key = (cell["framework"], cell["scenario"])
        measured = (cell["gradient_verdict"], cell["logged_verdict"])
        expected = EXPECTED.get(key, ("not run", "not run"))
        if measured != expected:
            threads = ", ".join(t["label"] for t in cell["threads"]) or "no thread"
            wrong.append(f"{key[0]} × {key[1]}: (gradient, logged) {measured}, expected "
                         f"{expected} ({threads})")
    for line in table.get("grpo", {}).get("lines", []):
        expected = GRPO_EXPECTED.get(line["loss_type"], "not run")
        if line["verdict"] != expected:
            threads = ", ".join(t["label"] for t in line["threads"]) or "no thread"
            wrong.append(f"trl_grpo × loss_type {line['loss_type']}: update {line['verdict']}, "
                         f"expected {expected} ({threads})")
    return wrong


def committed_table() -> dict:
    """Return the committed table, ``docs/conformance/conformance.json``."""
    return json.loads((_DEFAULT_OUT / "conformance.json").read_text(encoding="utf-8"))


def deviation_lines(table: dict) -> list[str]:
    """One line per program that reproduces deviating updates: its cells (then the GRPO loss
    types'), their relative error, their thread (or "no thread") and the program's module
    name."""
    grouped: dict[str, list[dict]] = {}
    for cell in table["cells"]:
        if cell["gradient_verdict"] == "deviate":
            grouped.setdefault(Path(cell["program"]).stem, []).append(cell)
    lines = []
    for program, cells in grouped.items():
        names = dict.fromkeys(FRAMEWORKS[c["framework"]].NAME.replace("🤗 ", "").split()[0]
                              for c in cells)
        errors = sorted({f"{c['gradient_relative_error']:.2g}" for c in cells})
        threads = {t["label"] for c in cells for t in c["threads"]} or {"no thread"}
        scenarios = ", ".join(dict.fromkeys(c["scenario"] for c in cells))
        lines.append(f"{' / '.join(names)} × {scenarios}: "
                     f"error {', '.join(errors)}; {', '.join(sorted(threads))}; "
                     f"repro.{program}")
    for line in table.get("grpo", {}).get("lines", []):
        if line["verdict"] == "deviate":
            threads = sorted(t["label"] for t in line["threads"]) or ["no thread"]
            lines.append(f"TRL GRPO × loss_type {line['loss_type']}: error "
                         f"{line['relative_error']:.2g}; {', '.join(threads)}; "
                         f"repro.{Path(line['program']).stem}")
    return lines


def write_json(table: dict, path: Path) -> None:
    """Write the table as indented JSON."""
    path.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _grid(table: dict, field: str) -> tuple[list[str], list[str], list[list[dict]]]:
    frameworks = list(dict.fromkeys(c["framework"] for c in table["cells"]))
    scenarios = [s["key"] for s in table["scenarios"]]
    cells = {(c["framework"], c["scenario"]): c for c in table["cells"]}
    return frameworks, scenarios, [[cells[(f, s)] for s in scenarios] for f in frameworks]


def _colour(error: float | None, verdict: str):  # noqa: ANN202
    """Green shades for a match, red for a deviation (darker: larger log error), grey when
    not run."""
    from matplotlib import colormaps

    if verdict == "not run" or error is None:
        return (0.88, 0.88, 0.88, 1.0)
    level = min(max((math.log10(max(error, 1e-12)) + 12) / 13, 0.0), 1.0)
    if verdict == "match":
        return colormaps["Greens"](0.15 + 0.35 * level)
    return colormaps["Reds"](0.45 + 0.5 * min(max((math.log10(error) + 6) / 7, 0), 1))


def write_figure(table: dict, path: Path) -> None:
    """Write the heat-map: the update's and the logged loss's relative error per cell (log
    scale in the shading; red: a deviation, grey: not run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("gradient", "update vs the large batch's"), ("logged", "logged loss vs true mean"))
    height = 1.6 + 0.45 * len({cell["framework"] for cell in table["cells"]})
    figure, axes = plt.subplots(1, 2, figsize=(13, height), constrained_layout=True)
    for axis, (field, title) in zip(axes, panels, strict=True):
        frameworks, scenarios, rows = _grid(table, field)
        error_key = "gradient_relative_error" if field == "gradient" else "logged_relative_error"
        for i, row in enumerate(rows):
            for j, cell in enumerate(row):
                error, verdict = cell.get(error_key), cell[f"{field}_verdict"]
                axis.add_patch(plt.Rectangle((j, i), 1, 1, color=_colour(error, verdict)))
                text = "not run" if verdict == "not run" else f"{error:.0e}"
                axis.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8,
                          color="white" if verdict == "deviate" else "black")
        axis.set_xlim(0, len(scenarios))
        axis.set_ylim(len(rows), 0)
        axis.set_xticks([j + 0.5 for j in range(len(scenarios))], scenarios, rotation=30,
                        ha="right", fontsize=8)
        names = [FRAMEWORKS[f].NAME.replace("🤗 ", "HF ") for f in frameworks]
        axis.set_yticks([i + 0.5 for i in range(len(rows))], names, fontsize=8)
        axis.set_title(f"relative error: {title}", fontsize=9)
    figure.suptitle(f"shade: log10 of the relative error; green: at most {TOLERANCE:g}, red: "
                    "a deviation, grey: not run", fontsize=8)
    figure.savefig(path, dpi=90)
    plt.close(figure)


_ENGLISH = {
    "title": "# The conformance table",
    "intro": (
        "Each framework's gradient-accumulation path, run as its documentation shows on a tiny "
        "GPT-2 (float64, SGD, one optimizer step; a tiny Qwen3-MoE in the `moe_aux` column), is "
        "held against the large batch's update "
        "computed by the library's ground truth (`full_batch_gradients`): a cell is the "
        "update's relative error, and beside it the loss the framework logs against the "
        "window's true mean token loss (in `moe_aux`, plus its load-balancing term). "
        "✅ is a match (relative error ≤ {tolerance}), ❌ a deviation, linked to its upstream "
        "thread (or a paper) and to the program that reproduces it, or "
        "\"unexplained\" where no thread was found."),
    "pinned": (
        "Pinned versions: {versions}. Written by `make conformance` "
        "(`gradaccum_course/audits/conformance/`), with [the Chinese page](zh/conformance.md) "
        "from the same JSON. The Trainer's logged loss comes from a run with its default "
        "(random) sampler (on 2 ranks, its sequential one), next to the true mean of the "
        "samples it put in the window; "
        "Lightning's is `self.log(..., on_epoch=True)`'s value (on 2 ranks, rank 0's); "
        "TRL's is SFTTrainer's step `loss` (sequential sampler; on 2 ranks, rank 0's)."),
    "figure": (
        "The heat-map of both tables (`docs/conformance/conformance.png`; notebook 04b shows it "
        "in [its last section](../notebooks/04b_framework_audit.ipynb#6.-The-conformance-table)):"),
    "scenarios": "## Scenarios",
    "scenario_line": "- `{key}`: {title}; k = {k}, predicted tokens per micro-batch: {tokens}",
    "gradient": "## The update against the large batch's",
    "logged": "## The logged loss against the window's true mean",
    "framework": "framework",
    "deviations": "## Each deviation, and what is not run",
    "not run": "not run",
    "unexplained": "unexplained",
    "program": "program",
    "logged not run": "logged loss not run: {reason}",
    "cell not run": "not run: {reason}",
    "program line": "reproduced by {links} (`python -m "
                    "gradaccum_course.audits.conformance.repro.NAME`, which exits non-zero once "
                    "the deviation is gone or has changed)",
    "grpo": "## TRL GRPOTrainer's loss types: k micro-batches against one batch",
    "grpo intro": (
        "The GRPO-family row above is not run on the scenarios (GRPOTrainer trains on "
        "completions it generates); its loss types are run here through "
        "`GRPOTrainer(...).train()` (TRL {version}): one SGD step of the same tiny float64 "
        "GPT-2, beta = 0, one iteration, no clipping, on {prompts} prompts × {generations} "
        "completions of at most {max_length} tokens, rewarded by their length (completion "
        "lengths: {lengths}). Run A takes them in k = {k} micro-batches of {b}, run B as one "
        "batch of {large}; both generate the same completions (asserted). A cell is A's "
        "update's relative error against B's, the large batch under the loss type's own "
        "definition. Not run: the logged loss, several processes, more than one iteration, a "
        "partial window."),
    "loss type": "loss type",
    "grpo update": "update vs one batch",
    "grpo tokens": "completion tokens per micro-batch (run A)",
    "threads checked": "## Threads read that are not a cell",
    "threads intro": "Each was read; its state is at the pinned versions, and the reason it is "
                     "not a cell is the path it needs, which the table does not run.",
    "not yet": (
        "Not in the table yet: TRL's other trainers (DPO, KTO, RLOO, reward); of GRPOTrainer, "
        "anything but the update of each loss type on one generated window (above). Other "
        "frameworks, tried on this machine without a GPU and outside the project's "
        "environment: **DeepSpeed 0.19.8 ran** (its CPU "
        "accelerator, gloo, built without its compiled ops; `scripts/try_deepspeed_cpu.py`, "
        "`benchmarks/deepspeed_cpu.txt`): a full float32 window matches (2.5e-07), a partial "
        "last window makes no optimizer step (its gradient is carried into the next window), "
        "and it refuses float64 gradients, so it is not a column of this float64 table. "
        "**torchtune 0.6.1 did not import** with torchao 0.18.0, the newest: it asks for "
        "`torchao.dtypes.nf4tensor`, which torchao 0.17.0 has and 0.18.0 no longer has; with "
        "torchao 0.17.0 it imports, and no torchtune recipe was run "
        "(`benchmarks/torchtune_torchtitan_cpu.txt`). **torchtitan 0.3.0 did not run** (same "
        "file): importing its trainer needs triton, and with triton installed and no "
        "accelerator it picks the CUDA device and stops at `torch.cuda.set_device`; its "
        "source (read, not run) divides each micro-batch's summed loss by the number of "
        "tokens the loss does not ignore in the whole window, summed over the data-parallel "
        "ranks."),
}


def _words(lang: str) -> tuple[dict, object]:
    """The page's words and the translation of the JSON's sentences for ``lang``."""
    if lang == "en":
        return _ENGLISH, lambda text: text
    from .zh import TRANSLATED, WORDS

    return WORDS, TRANSLATED.__getitem__  # a sentence without its Chinese: KeyError


def _link(repo_path: str, page: Path) -> str:
    """A relative link from ``page`` to the repository file ``repo_path``."""
    return Path(os.path.relpath(_ROOT / repo_path, page.resolve().parent)).as_posix()


def _grpo_lines(table: dict, words: dict, path: Path) -> list[str]:
    """The GRPO table's section: the window, then one line per loss type."""
    grpo = table.get("grpo")
    if not grpo:
        return []
    lines = ["", words["grpo"], "", words["grpo intro"].format(
        version=grpo["version"], prompts=len(grpo["prompts"]), generations=grpo["generations"],
        max_length=grpo["max_completion_length"],
        lengths=", ".join(map(str, grpo["completion_lengths"])), k=grpo["accumulation_steps"],
        b=grpo["micro_batch_size"], large=grpo["micro_batch_size"] * grpo["accumulation_steps"]),
        "", f"| {words['loss type']} | {words['grpo update']} | {words['grpo tokens']} |",
        "|---|---|---|"]
    for line in grpo["lines"]:
        cell = {"gradient_verdict": line["verdict"], "threads": line["threads"],
                "gradient_relative_error": line["relative_error"],
                "program": line.get("program", "")}
        lines.append(f"| `{line['loss_type']}` | {_cell_text(cell, 'gradient', words, path)} | "
                     + ", ".join(map(str, line["tokens_per_micro_batch"])) + " |")
    return lines


def _cell_text(cell: dict, field: str, words: dict | None = None,
               page: Path | None = None) -> str:
    words = words or _ENGLISH
    verdict = cell[f"{field}_verdict"]
    if verdict == "not run":
        return words["not run"]
    error = cell["gradient_relative_error" if field == "gradient" else "logged_relative_error"]
    if verdict == "match":
        return f"✅ {error:.0e}"
    listed = cell["threads"] if field == "gradient" else cell["logged_threads"]
    threads = " ".join(f"[{t['label'].split()[-1]}]({t['url']})" for t in listed)
    text = f"❌ {error:.2g} " + (threads or words["unexplained"])
    program = cell.get("program" if field == "gradient" else "logged_program")
    if program and page is not None:
        text += f" [{words['program']}]({_link(program, page)})"
    return text


def write_page(table: dict, path: Path, figure_name: str | None = None, lang: str = "en") -> None:
    """Write :func:`page_text` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_text(table, path, figure_name, lang), encoding="utf-8")


def page_text(table: dict, path: Path, figure_name: str | None = None, lang: str = "en") -> str:
    """The Markdown page in ``lang`` ("en" or "zh") that lives at ``path`` (its links are
    relative to it): the point, the pinned versions, both tables (each red cell linked to its
    thread and its program), each deviation's thread or note, what was not run and why.
    ``figure_name``: the image embedded ("": none); by default the heat-map, :data:`FIGURE`, by
    its path from the page (the site copies it beside the pages)."""
    words, tr = _words(lang)
    frameworks, scenarios, rows = _grid(table, "gradient")
    versions = ", ".join(f"{name} {v}" for name, v in table["versions"].items())
    lines = [words["title"], "", words["intro"].format(tolerance=f"{TOLERANCE:g}"), "",
             words["pinned"].format(versions=versions), "", words["figure"], ""]
    if figure_name is None:
        figure_name = Path(os.path.relpath(FIGURE, path.resolve().parent)).as_posix()
    lines += [f"![conformance]({figure_name})", ""] if figure_name else []
    lines += [words["scenarios"], ""]
    lines += [words["scenario_line"].format(
        key=s["key"], title=tr(s["title"]), k=s["accumulation_steps"],
        tokens=", ".join(map(str, s["predicted_tokens"]))) for s in table["scenarios"]]
    for field in ("gradient", "logged"):
        lines += ["", words[field], "", f"| {words['framework']} | " + " | ".join(scenarios)
                  + " |", "|---" * (len(scenarios) + 1) + "|"]
        for framework, row in zip(frameworks, rows, strict=True):
            runner = FRAMEWORKS[framework]
            lines.append(f"| {runner.NAME} ({runner.PACKAGE} "
                         f"{table['versions'][runner.PACKAGE]}) | "
                         + " | ".join(_cell_text(c, field, words, path) for c in row) + " |")
    lines += _grpo_lines(table, words, path)
    lines += ["", words["deviations"], ""]
    grouped: dict[str, list[str]] = {}  # a line's text -> the cells it is said of
    colon, stop = ("：", "。") if lang == "zh" else (": ", ".")
    for row in rows:
        for cell in row:
            name = FRAMEWORKS[cell["framework"]].NAME
            said = [f"[{t['label']}]({t['url']}){colon}{tr(t['says'])}" for t in cell["threads"]]
            said += [tr(cell["note"])] if cell["note"] else []
            if cell.get("program"):
                program = cell["program"]
                said.append(words["program line"].format(
                    links=f"[`{Path(program).stem}`]({_link(program, path)})"))
            if cell.get("logged_reason"):
                said.append(words["logged not run"].format(reason=tr(cell["logged_reason"])))
            if cell["status"] == "not run":
                said.append(words["cell not run"].format(reason=tr(cell["reason"])))
            for text in said:
                grouped.setdefault(f"{name}|{text}", []).append(f"`{cell['scenario']}`")
    for line in table.get("grpo", {}).get("lines", []):  # the GRPO table's loss types
        said = [f"[{t['label']}]({t['url']}){colon}{tr(t['says'])}" for t in line["threads"]]
        said += [tr(line["note"])] if line["note"] else []
        if line.get("program"):
            said.append(words["program line"].format(
                links=f"[`{Path(line['program']).stem}`]({_link(line['program'], path)})"))
        for text in said:
            grouped.setdefault(f"{FRAMEWORKS['trl_grpo'].NAME}|{text}", []).append(
                f"`{line['loss_type']}`")
    lines += [f"- {key.split('|', 1)[0]} × {', '.join(where)}{colon}{key.split('|', 1)[1]}{stop}"
              for key, where in grouped.items()]
    lines += ["", words["threads checked"], "", words["threads intro"], ""]
    lines += [f"- [{t['label']}]({t['url']}){colon}{tr(t['says'])}{stop}"
              for t in table.get("threads_checked", [])]
    lines += ["", words["not yet"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the table, write ``conformance.json`` and ``conformance.png`` under ``--out`` and
    the English and Chinese pages (``--page``, ``--page-zh``), and return 1 if a cell's
    verdict is not the expected one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=_DEFAULT_OUT)
    parser.add_argument("--page", type=Path, default=_ROOT / "docs" / "conformance.md")
    parser.add_argument("--page-zh", type=Path, default=_ROOT / "docs" / "zh" / "conformance.md")
    parser.add_argument("--no-progress", action="store_true")
    arguments = parser.parse_args(argv)
    started = time.perf_counter()
    table = run_table(progress=not arguments.no_progress)
    arguments.out.mkdir(parents=True, exist_ok=True)
    write_json(table, arguments.out / "conformance.json")
    write_figure(table, arguments.out / "conformance.png")
    write_page(table, arguments.page)
    write_page(table, arguments.page_zh, lang="zh")
    wrong = check(table)
    print(f"conformance: {len(table['cells'])} cells in {time.perf_counter() - started:.0f} s, "
          f"written to {arguments.out}")
    for line in wrong:
        print(f"conformance: CHANGED {line}", file=sys.stderr)
    return 1 if wrong else 0
