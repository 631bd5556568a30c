"""The exercises' checkers: None passes with a note, the right answer passes, a wrong one fails;
every notebook ends with exercises whose solutions are in notebooks/solutions/."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from gradaccum_lib.losses import token_classification_loss
from gradaccum_lib.notebook.exercises import EXERCISES, WrongAnswer, check_exercise

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHECK = re.compile(r"check_exercise\(\s*\"(\d\d\.\d)\"")


def _loop_right(model, optimizer, micro_batches, k):  # noqa: ANN001, ANN202
    optimizer.zero_grad()
    for inputs, labels in micro_batches:
        (nn.functional.cross_entropy(model(inputs), labels) / k).backward()
    optimizer.step()


def _loop_zero_grad_inside(model, optimizer, micro_batches, k):  # noqa: ANN001, ANN202
    for inputs, labels in micro_batches:
        optimizer.zero_grad()
        (nn.functional.cross_entropy(model(inputs), labels) / k).backward()
    optimizer.step()


def _loop_never_divides(model, optimizer, micro_batches, k):  # noqa: ANN001, ANN202, ARG001
    optimizer.zero_grad()
    for inputs, labels in micro_batches:
        nn.functional.cross_entropy(model(inputs), labels).backward()
    optimizer.step()


def _token_mean_per_micro_batch(model, batch):  # noqa: ANN001, ANN202
    summed, count = token_classification_loss(model, batch)
    return summed / count, 1


LOOPS = {"A": _loop_right, "B": _loop_zero_grad_inside}
# (right answer, wrong answer, context) per exercise; the right answers are the worked
# solutions' results, the checkers compute them independently
CASES = {
    "00.1": (102, 110, {}),
    "00.2": (2048, 256, {}),
    "01.1": ("B", "A", {"loops": LOOPS}),
    "01.2": (token_classification_loss, _token_mean_per_micro_batch, {}),
    "02.1": ((12, 22), (12, 21), {}),
    "02.2": (4.0, 1.0, {"loop": _loop_never_divides}),
    "03.1": (2.0, 1.0, {}),
    "03.2": (125, 250, {}),  # DDP averages the ranks: N / world size
    "04.1": (8, 32, {}),
    "04.2": (4.0, 1.0, {}),
    "05.1": (3 * 8 * (10 * 32 + 32 + 32 * 4 + 4), 12 * 8 * (10 * 32 + 32 + 32 * 4 + 4), {}),
    "05.2": (4, 7, {}),
    "06.1": (2e-5 * math.sqrt(8), 2e-5 * 8, {}),
    "06.2": (3, 2, {}),
}


def test_every_exercise_has_a_case() -> None:
    assert set(CASES) == set(EXERCISES)


@pytest.mark.parametrize("exercise_id", sorted(CASES))
def test_checker(exercise_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    right, wrong, context = CASES[exercise_id]
    assert check_exercise(exercise_id, None, **context) is None
    assert "no answer yet" in capsys.readouterr().out
    assert check_exercise(exercise_id, right, **context) is True
    assert f"Exercise {exercise_id}: correct." in capsys.readouterr().out
    with pytest.raises(WrongAnswer):
        check_exercise(exercise_id, wrong, **context)


def test_bad_answers_are_refused_with_a_message() -> None:
    with pytest.raises(KeyError, match="no exercise '9.9'"):
        check_exercise("9.9", 1)
    with pytest.raises(WrongAnswer, match="must be a number"):
        check_exercise("04.1", "eight")
    with pytest.raises(WrongAnswer, match="must be a pair"):
        check_exercise("02.1", 12)
    with pytest.raises(WrongAnswer, match="must be one of"):
        check_exercise("01.1", "Z", loops=LOOPS)
    with pytest.raises(WrongAnswer, match="must be a loss function"):
        check_exercise("01.2", 3)


def test_the_ddp_checker_leaves_no_process_group() -> None:
    check_exercise("05.1", CASES["05.1"][0])
    assert not torch.distributed.is_initialized()


def _exercise_ids(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [match for cell in cells if cell["cell_type"] == "code"
            for match in CHECK.findall("".join(cell["source"]))]


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS.glob("0*.ipynb")), ids=lambda p: p.name)
def test_every_notebook_ends_with_exercises_and_their_solutions(notebook: Path) -> None:
    ids = _exercise_ids(notebook)
    number = notebook.name[:2]
    assert 2 <= len(ids) <= 4, f"{notebook.name} has {len(ids)} exercises; 2-4 wanted"
    assert all(i.startswith(number + ".") for i in ids)
    solutions = NOTEBOOKS / "solutions" / notebook.name.replace(".ipynb", "_solutions.ipynb")
    assert solutions.is_file(), f"no solutions notebook {solutions.name}"
    assert _exercise_ids(solutions) == ids
    # the notebook's cells hold no answers: every `answer =` line there is `answer = None`
    source = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
    assert re.findall(r"^answer = (.*)$", source, re.M) == ["None  # your answer"] * len(ids)
