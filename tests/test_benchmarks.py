"""Smoke test of the benchmark harness at tiny sizes: it runs and writes well-formed results.
(No timing assertions: these machines are noisy.)"""

from __future__ import annotations

import json
import re

import pytest
from script_loader import ROOT, load_script


def test_quick_benchmark_writes_json_table_and_figure(tmp_path):
    module = load_script("benchmarks/run.py")
    (tmp_path / "README.md").write_text(
        f"# kept header\n\n{module.START}\nold table\n{module.END}\nkept footer\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and results["machine"]["torch"]
    overhead = results["loop_overhead"]
    assert {row["model"] for row in overhead} == {"MLP", "tiny BERT"}
    for row in overhead:
        for loop in ("library", "library_no_norm", "exact_plain", "bare", "bare_copy",
                     "accelerate"):
            assert 0 < row[loop]["min"] <= row[loop]["median"] <= row[loop]["max"]
        assert row["library_vs_bare"] > 0 and row["library_vs_accelerate"] > 0
        assert row["bare_copy_vs_bare"] > 0 and row["library_no_norm_vs_bare"] > 0
        assert row["exact_plain_vs_bare"] > 0 and row["library_vs_exact_plain"] > 0
        assert isinstance(row["library_minus_bare_us"], float)  # a difference: either sign
        assert row["windows_per_turn"] == (2 if row["model"] == "MLP" else 1)
    memory = results["activation_memory"]
    assert [row["k"] for row in memory] == [1, 2, 4]
    assert abs(memory[-1]["ratio_to_1_over_k"] - 1) < 0.05
    for optimizer in ("sgd", "adamw"):  # counted bytes: a step holds at least its activations
        assert all(row[f"peak_bytes_{optimizer}"] > row["bytes"] for row in memory)
    bert = results["bert_long"]
    assert bert["sequence_length"] == 256 and bert["effective_batch"] == 4
    assert [row["k"] for row in bert["memory"]] == [1, 2, 4]
    assert bert["memory"][0]["bytes"] > bert["memory"][-1]["bytes"]
    assert bert["memory"][0]["peak_bytes_sgd"] > bert["memory"][-1]["peak_bytes_sgd"]
    # the fitted model of a padded note gives the measured bytes of the micro-batch of one
    assert max(bert["tokens_per_note"]) < 256
    assert bert["attention"]["bytes_per_note"] == bert["memory"][-1]["bytes"]
    assert 0 < bert["attention"]["s_squared_share"] < 1
    assert [row["micro_batch_size"] for row in bert["micro_batch_time"]] == [4, 2, 1]
    assert all(row["seconds_per_sample"] > 0 for row in bert["micro_batch_time"])
    ddp = {(r["accumulation_steps"], r["sync"]): r for r in results["ddp"]}
    assert ddp[4, "every"]["bytes_per_step"] == 4 * ddp[4, "window"]["bytes_per_step"]
    loop_rows = results["ddp_loop"]
    assert [row["k"] for row in loop_rows] == [1, 2, 4, 8, 16]
    for row in loop_rows:
        assert row["windows_per_turn"] == 1
        for name in ("library", "library_no_norm", "plain", "exact_plain", "exact_plain_copy"):
            assert 0 < row[name]["min"] <= row[name]["median"] <= row[name]["max"]
        assert all(row[key] > 0 for key in (
            "library_vs_exact_plain", "library_no_norm_vs_exact_plain", "exact_plain_vs_plain",
            "exact_plain_copy_vs_exact_plain"))
        # the fixed cost per window, µs: either sign
        assert isinstance(row["library_minus_exact_plain_us"], float)
        assert "engine" not in row and "engine_vs_exact_plain" not in row  # gone
    assert results["steady_allocator"] is True  # glibc here
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# kept header") and readme.endswith("kept footer\n")
    assert "old table" not in readme and "| MLP | 1 |" in readme
    assert "for the MLP each loop's turn is 2 consecutive windows" in readme
    assert "Each window is timed after a barrier, one window a turn;" in readme
    assert "### 6. DDP, 2 gloo processes: the library's loop against the exact plain loop" in readme
    assert "the five loops trade five DDP copies of the model every turn" in readme
    assert "| library without its norm / bare |" in readme
    assert "| library / exact plain |" in readme and "| exact plain / nanoGPT plain |" in readme
    assert "library − bare, µs per window" in readme and "carrying" not in readme
    assert "### 4. Tiny BERT at the article's record length (s = 256" in readme
    assert "make gpu-check" in readme  # no GPU, no README-gpu.md: the CUDA section says how
    assert (tmp_path / "results.png").read_bytes().startswith(b"\x89PNG")


def test_a_readme_without_its_markers_is_refused_not_overwritten(tmp_path):
    module = load_script("benchmarks/run.py")
    readme = tmp_path / "README.md"
    readme.write_text(f"# hand-written\n\nprose\n{module.END}\n")  # the start marker lost
    with pytest.raises(ValueError, match="restore the markers"):
        module.write_readme_section(readme, module.START, module.END, "table", "Benchmarks")
    assert readme.read_text() == f"# hand-written\n\nprose\n{module.END}\n"
    with pytest.raises(ValueError, match="restore the markers"):  # before any measurement
        module.main(["--quick", "--out", str(tmp_path)])


COMMITTED = ROOT / "benchmarks"


def _committed_results() -> dict:
    """benchmarks/results.json; the tests of the committed run wait for a run of this loop."""
    results = json.loads((COMMITTED / "results.json").read_text())
    if "ddp_loop" not in results:  # TODO(lead): gone after issue 36's make bench
        pytest.skip("results.json is from before issue 36's loop (no 'ddp_loop'): run make bench")
    return results


def test_the_committed_tables_are_the_committed_results():
    """Between its markers benchmarks/README.md holds what run.py writes from results.json."""
    module = load_script("benchmarks/run.py")
    results = _committed_results()
    text = (COMMITTED / "README.md").read_text()
    assert module.readme_around_section(COMMITTED / "README.md", module.START, module.END)
    section = text.split(module.START, 1)[1].split(module.END, 1)[0]
    assert section.strip() == module.markdown(results, COMMITTED).strip()


@pytest.mark.parametrize("loss", ["sample", "token"])
def test_the_exact_plain_loop_updates_as_the_library_loop(loss):
    """run.exact_plain_loop, the reference the library's loop is timed against, is exact: one
    window of uneven micro-batches (number counts; token counts, which are tensors) updates
    the model as accumulate_window does."""
    import torch

    from gradaccum_lib import split_into_micro_batches
    from gradaccum_lib.accumulation import accumulate_window
    from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
    from gradaccum_lib.workloads.data import make_toy_classification
    from gradaccum_lib.workloads.models import make_mlp

    def token_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 3)).double()

    if loss == "sample":
        loss_fn, make_model = sample_classification_loss, lambda: make_mlp(6, 8, 3)
        window = split_into_micro_batches(make_toy_classification(11, 6, 3, seed=1),
                                          accumulation_steps=3)
    else:  # 3 real tokens, then 4, then 1
        loss_fn, make_model = token_classification_loss, token_model
        window = [{"input_ids": torch.tensor([[3, 4, 5, 0]]),
                   "labels": torch.tensor([[1, 2, 0, -100]])},
                  {"input_ids": torch.tensor([[5, 6, 7, 8]]),
                   "labels": torch.tensor([[0, 1, 2, 0]])},
                  {"input_ids": torch.tensor([[9, 0, 0, 0]]),
                   "labels": torch.tensor([[2, -100, -100, -100]])}]
    module = load_script("benchmarks/run.py")
    library, exact = make_model(), make_model()
    accumulate_window(library, torch.optim.SGD(library.parameters(), lr=1.0), window, loss_fn)
    module.exact_plain_loop(exact, torch.optim.SGD(exact.parameters(), lr=1.0), loss_fn)(window)
    moved = False
    for a, b, start in zip(library.parameters(), exact.parameters(), make_model().parameters(),
                           strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        moved = moved or not torch.equal(a, start)
    assert moved  # a step was taken


def _verdict_row(verdict: str, label: str) -> str:
    return next(line for line in verdict.splitlines() if line.startswith(f"| {label} |"))


def _range(cell: str) -> tuple[float, float]:
    low, high = re.search(r"(\d\.\d{3})–(\d\.\d{3})", cell).groups()
    return float(low), float(high)


def test_the_verdict_cites_the_committed_run():
    """The verdict table (hand-written, outside the markers) names results.json's date and
    machine, and its three-run ranges hold the third run's ratios, which results.json keeps."""
    results = _committed_results()
    text = (COMMITTED / "README.md").read_text()
    verdict = text.split("## Verdict", 1)[1].split("## Harness", 1)[0]
    assert results["date"] in verdict and results["machine"]["torch"] in verdict
    assert results["machine"]["cpu"] in verdict and f"{results['machine']['cores']}-core" in verdict
    rows = {(row["model"], row["k"]): row for row in results["loop_overhead"]}
    checks = {  # verdict row -> [(ratio column, model), ...] in the order the row quotes them
        "MLP: library / bare loop": [("library_vs_bare", "MLP")],
        "MLP: exact plain loop / bare loop": [("exact_plain_vs_bare", "MLP")],
        "MLP: library / exact plain loop": [("library_vs_exact_plain", "MLP")],
        "MLP: library without its norm / bare loop": [("library_no_norm_vs_bare", "MLP")],
        "tiny BERT: library / bare loop": [("library_vs_bare", "tiny BERT")],
        "library / 🤗 Accelerate": [("library_vs_accelerate", "MLP"),
                                   ("library_vs_accelerate", "tiny BERT")],
    }
    for label, columns in checks.items():
        cells = _verdict_row(verdict, label).split(" | ")
        quoted = re.findall(r"\d\.\d{3}–\d\.\d{3}", cells[2])
        assert len(quoted) == len(columns), label
        for text_range, (column, model) in zip(quoted, columns, strict=True):
            low, high = _range(text_range)
            third = [round(row[column], 3) for (name, _), row in rows.items() if name == model]
            assert low <= min(third) and max(third) <= high, (label, column, model)
    for label, model in (("MLP: library / bare loop", "MLP"),
                         ("tiny BERT: library / bare loop", "tiny BERT")):  # the A/A controls
        low, high = _range(_verdict_row(verdict, label).split(" | ")[3])
        assert all(low <= round(rows[model, k]["bare_copy_vs_bare"], 3) <= high
                   for k in (1, 2, 4, 8, 16)), model
    ddp = {row["k"]: row for row in results["ddp_loop"]}
    for label, columns in {
        "DDP, 2 gloo ranks (MLP): library / exact plain loop": ["library_vs_exact_plain"],
        "DDP: library without its norm / exact plain loop": ["library_no_norm_vs_exact_plain"],
        "DDP: exact plain / nanoGPT's inexact loop": ["exact_plain_vs_plain"],
    }.items():
        cells = _verdict_row(verdict, label).split(" | ")
        quoted = re.findall(r"\d\.\d{3}–\d\.\d{3}", cells[2])
        for text_range, column in zip(quoted, columns, strict=True):
            low, high = _range(text_range)
            assert all(low <= round(row[column], 3) <= high for row in ddp.values()), column
        low, high = _range(cells[3])
        assert all(low <= round(row["exact_plain_copy_vs_exact_plain"], 3) <= high
                   for row in ddp.values())
    steps = results["micro_batch_time"]
    slowdown = steps[-1]["seconds_per_sample"] / steps[0]["seconds_per_sample"]
    assert f"{slowdown:.1f}× (third run)" in _verdict_row(
        verdict, "MLP time per sample, micro-batch 256 down to 1 (effective batch 256)")
    bytes_per_step = {(r["accumulation_steps"], r["sync"]): r["bytes_per_step"]
                      for r in results["ddp"]}
    assert {bytes_per_step[k, "window"] for k in (1, 2, 4, 8, 16)} == {43024}
    assert all(bytes_per_step[k, "every"] == k * 43024 for k in (1, 2, 4, 8, 16))
    assert "43,024 bytes at every k, against k × 43,024" in verdict


def test_contenders_trade_their_copies_every_turn():
    """run.trading_copies: contender i's t-th turn runs on copy (i + t) mod n, so over n turns
    every contender runs on every copy once, and in every turn each copy serves one
    contender; a turn of several calls stays on one copy."""
    module = load_script("benchmarks/run.py")
    seen = []

    def maker(name):
        return lambda model, optimizer: (lambda window: seen.append((name, model)))

    copies = [(f"copy {i}", None) for i in range(3)]
    calls = module.trading_copies({name: maker(name) for name in "abc"}, copies, [], 2)
    module.warm_up(calls, 1, 2)  # one whole turn each: the next turn is the second
    seen.clear()
    for _ in range(3):  # three turns of two calls, contender by contender
        for call in calls.values():
            call()
            call()
    turns = [seen[i:i + 2] for i in range(0, len(seen), 2)]
    assert all(first == second for first, second in turns)  # one copy a turn
    used = {name: [model for (who, model), _ in turns if who == name] for name in "abc"}
    assert used == {"a": ["copy 1", "copy 2", "copy 0"], "b": ["copy 2", "copy 0", "copy 1"],
                    "c": ["copy 0", "copy 1", "copy 2"]}
    with pytest.raises(ValueError, match="one copy per contender: 3 contenders, 2 copies"):
        module.trading_copies({name: maker(name) for name in "abc"}, copies[:2], [])


def test_the_probe_without_the_norm_drops_only_the_norm_and_gives_torch_back():
    """``without_gradient_norm`` (the bench's "without its norm" contender): the library's
    loop steps as it does, reports a norm of 0, and torch's get_total_norm is back after the
    call, also when the call raises."""
    import torch

    from gradaccum_lib.losses import sample_classification_loss
    from gradaccum_lib.workloads.data import make_toy_classification
    from gradaccum_lib.workloads.models import make_mlp

    module = load_script("benchmarks/run.py")
    real = torch.nn.utils.get_total_norm
    window = [make_toy_classification(6, 8, 3, seed=seed) for seed in (1, 2)]
    probed, plain = make_mlp(8, 16, 3), make_mlp(8, 16, 3)
    result = module.without_gradient_norm(module.library_loop(
        probed, torch.optim.SGD(probed.parameters(), lr=0.5), sample_classification_loss))(window)
    truth = module.library_loop(plain, torch.optim.SGD(plain.parameters(), lr=0.5),
                                sample_classification_loss)(window)
    assert result.grad_norm == 0 and truth.grad_norm > 0
    assert torch.nn.utils.get_total_norm is real
    assert all(torch.equal(a, b) for a, b in zip(probed.parameters(), plain.parameters(),
                                                 strict=True))

    def fails(_window):  # noqa: ANN001, ANN202
        assert torch.nn.utils.get_total_norm is not real
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        module.without_gradient_norm(fails)(window)
    assert torch.nn.utils.get_total_norm is real
