"""The exercises' checkers: None passes with a note, the right answer passes with ✓, a wrong one
fails with ✗, the answer expected and a hint, shown in a real kernel without a traceback;
every notebook ends with exercises whose solutions are in notebooks/solutions/."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from test_portability import rounding_level_numbers
from torch import nn

from gradaccum_course.exercises import _EXERCISES, _WrongAnswer, check_exercise
from gradaccum_lib.losses import token_classification_loss

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHECK = re.compile(r"check_exercise\(\s*\"(\d\d[a-z]?\.\d)\"")  # 04.1, 04b.1


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


# 01.3: window_gradient(model, micro_batches), right and as each usual mistake writes it
def _window_gradient(model, micro_batches, *, divide="window", zero="once",  # noqa: ANN001, ANN202
                     backward="every"):
    if zero == "once":
        model.zero_grad()
    items, k = sum(len(labels) for _, labels in micro_batches), len(micro_batches)
    for step, (inputs, labels) in enumerate(micro_batches):
        if zero == "every micro-batch":
            model.zero_grad()
        if divide == "window":
            loss = nn.functional.cross_entropy(model(inputs), labels, reduction="sum") / items
        elif divide == "never, summed":
            loss = nn.functional.cross_entropy(model(inputs), labels, reduction="sum")
        else:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss = loss / k if divide == "k" else loss
        if backward == "every" or (backward == "last" and step == k - 1):
            loss.backward()


def _variant(function, **options):  # noqa: ANN001, ANN202
    return lambda *args: function(*args, **options)


WINDOW_GRADIENT_HINTS = {
    "backward only on the last micro-batch": (
        {"divide": "k", "backward": "last"}, r"^only the last micro-batch's gradient reached"),
    "zero_grad inside the loop": ({"zero": "every micro-batch"},
                                  r"^only the last micro-batch's gradient reached"),
    "each mean divided by k": ({"divide": "k"}, r"^you divided each micro-batch's mean loss by k: "
                               r"exact only on equal micro-batches, and these hold 7, 3, 5 and 1"),
    "means never divided": ({"divide": "never, means"}, r"^you added the micro-batches' mean "
                            r"losses without dividing"),
    "sums never divided": ({"divide": "never, summed"}, r"^your gradient points the right way but "
                           r"is 16 x the large batch's: divide the summed losses by the window's "
                           r"16 samples"),
    "no zero_grad": ({"zero": "never"}, r"^your gradient was added to the one \.grad already held"),
    "no backward": ({"backward": "none"}, r"^\.grad is empty after your function"),
}


# 02.3: train_window(model, optimizer, scheduler, micro_batches, max_grad_norm), likewise
def _train_window(model, optimizer, scheduler, micro_batches,  # noqa: ANN001, ANN202, PLR0913
                  max_grad_norm, *, clip="once", per_micro_batch=(), divide="window",
                  scheduler_first=False):
    optimizer.zero_grad()
    items, k = sum(len(labels) for _, labels in micro_batches), len(micro_batches)
    for inputs, labels in micro_batches:
        if divide == "window":
            loss = nn.functional.cross_entropy(model(inputs), labels, reduction="sum") / items
        else:
            loss = nn.functional.cross_entropy(model(inputs), labels) / k
        loss.backward()
        if clip == "every":
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if "optimizer" in per_micro_batch:
            optimizer.step()
            optimizer.zero_grad()
        if "scheduler" in per_micro_batch:
            scheduler.step()
    if clip == "once":
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scheduler_first:
        scheduler.step()
    if "optimizer" not in per_micro_batch:
        optimizer.step()
    if "scheduler" not in per_micro_batch and not scheduler_first:
        scheduler.step()


WINDOW_STEP_HINTS = {
    "clips every micro-batch": ({"clip": "every"}, r"^you clipped after every micro-batch"),
    "never clips": ({"clip": "never"}, r"^your step did not clip"),
    "scheduler per micro-batch": ({"per_micro_batch": ("scheduler",)},
                                  r"^scheduler\.step\(\) ran 4 times for one window of 4 "
                                  r"micro-batches \(once per micro-batch\)"),
    "optimizer per micro-batch": ({"per_micro_batch": ("optimizer",)},
                                  r"^optimizer\.step\(\) ran 4 times for one window of 4 "
                                  r"micro-batches \(once per micro-batch\)"),
    "each mean divided by k": ({"divide": "k"}, r"^you divided each micro-batch's mean loss by k"),
    "scheduler before optimizer": ({"scheduler_first": True},
                                   r"^scheduler\.step\(\) ran before optimizer\.step\(\)"),
}
# (right answer, wrong answer, context) per exercise; the right answers are the worked
# solutions' results, the checkers compute them independently
CASES = {
    "00.1": (20.8, 2.6, {}),  # GB per GPU for 1.3B parameters; 2.6: split over the 8 ranks
    "00.2": (384, 96, {}),  # 16 x 6 x 4 ranks; 96 is one rank's window
    "01.1": ("B", "A", {"loops": LOOPS}),
    "01.2": (token_classification_loss, _token_mean_per_micro_batch, {}),
    "01.3": (_window_gradient, _variant(_window_gradient, divide="k"), {}),
    "02.1": ((12, 22), (12, 21), {}),
    "02.2": (4.0, 1.0, {"loop": _loop_never_divides}),
    "02.3": (_train_window, _variant(_train_window, clip="every"), {}),
    "03.1": (2.0, 1.0, {}),
    "03.2": (125, 250, {}),  # DDP averages the ranks: N / world size
    "04.1": (8, 32, {}),
    "04.2": (5.2, 2.6, {}),  # the state per GPU, in GB: k does not halve it
    "04b.1": (4.0, 1.0, {}),
    "04b.2": (0.5, 1.0, {}),  # Accelerate divides by k = 4 though 2 micro-batches came
    "05.1": (3 * 8 * (10 * 32 + 32 + 32 * 4 + 4), 12 * 8 * (10 * 32 + 32 + 32 * 4 + 4), {}),
    "05.2": (4, 7, {}),
    "05.3": tuple(f"{Path(__file__).resolve().parent}/workers/ddp_windows.py::{name}"
                  for name in ("right", "no_world_factor")) + ({},),  # run under torchrun
    "06.1": (2e-5 * math.sqrt(8), 2e-5 * 8, {}),
    "06.2": (3, 2, {}),
    "07.1": (7, 4, {}),  # 11 % 4 left over + 4
    "07.2": (96, 375, {}),  # ceil(125 / 4) x 3 epochs, not the micro-batches
    "08.1": (0.25, 1.0, {}),  # scale_grads divides the first window's gradient again
    "08.2": (1.0, 1.5, {}),  # the window's shares and probabilities, not a micro-batch's loss
    "09.1": (3 / 11, 0.6, {}),  # 1.5 / (4 + 1.5); 0.6 is the share without no_sync
    "09.2": (489, 3907, {}),  # ceil(ceil(125000 / 32) / 8); 3907 is one process's count
}


def test_every_exercise_has_a_case() -> None:
    assert set(CASES) == set(_EXERCISES)


@pytest.mark.parametrize("exercise_id", sorted(CASES))
def test_checker(exercise_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    right, wrong, context = CASES[exercise_id]
    assert check_exercise(exercise_id, None, **context) is None
    assert "no answer yet" in capsys.readouterr().out
    assert check_exercise(exercise_id, right, **context) is None  # no `Out:` in a notebook
    checked = capsys.readouterr().out
    assert checked.startswith(f"✓ Exercise {exercise_id}: correct. ")
    # a solution notebook's compared output: a bound, never a rounding error's own digits
    assert rounding_level_numbers(checked) == [], checked
    with pytest.raises(_WrongAnswer) as wrong_answer:
        check_exercise(exercise_id, wrong, **context)
    lines = str(wrong_answer.value).splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"✗ Exercise {exercise_id} (")
    assert lines[1] == f"Expected: {_EXERCISES[exercise_id].expects}."
    assert lines[2].startswith("Hint: ") and len(lines[2]) > len("Hint: ") + 10
    assert wrong_answer.value._render_traceback_() == lines  # what IPython shows instead
    assert wrong_answer.value.__cause__ is None and wrong_answer.value.__suppress_context__


def test_bad_answers_are_refused_with_a_message() -> None:
    with pytest.raises(KeyError, match="no exercise '9.9'"):
        check_exercise("9.9", 1)
    with pytest.raises(_WrongAnswer, match="must be a number"):
        check_exercise("04.1", "eight")
    with pytest.raises(_WrongAnswer, match="must be a pair"):
        check_exercise("02.1", 12)
    with pytest.raises(_WrongAnswer, match="must be one of"):
        check_exercise("01.1", "Z", loops=LOOPS)
    with pytest.raises(_WrongAnswer, match="must be a loss function"):
        check_exercise("01.2", 3)


# 02.1: a hint per kind of wrong answer (the truth: 12 fits, 13 does not; 12 x 22 >= 256)
FIT_A_GPU_HINTS = {
    "does not fit": ((16, 16), r"^micro-batch 16 does not fit: .* need 20\.1 GiB, more than 16; "
                                r"k=16 would be right for micro-batches of 16"),
    "fits, not the largest": ((11, 24), r"^micro-batch 11 fits \(14\.6 GiB of 16\) but is not "
                                        r"the largest: .*; k=24 would be right for micro-batches "
                                        r"of 11"),
    "k too small": ((12, 21), r"^k=21 is too small for micro-batches of 12: 12 x 21 = 252 < 256; "
                              r"the effective batch must be at least 256 samples$"),
    "k more than needed": ((12, 23), r"^k=23 is more than micro-batches of 12 need: 12 x 23 = "
                                     r"276, and a smaller k also gives at least 256 samples$"),
    "both wrong": ((13, 10), r"^micro-batch 13 does not fit: .* need 16\.8 GiB, more than 16; "
                             r"k=10 is too small for micro-batches of 13: 13 x 10 = 130 < 256; "
                             r"the effective batch must be at least 256 samples$"),
    "malformed: one number": (12, r"^answer must be a pair of positive integers"),
    "malformed: three numbers": ((12, 22, 1), r"^answer must be a pair of positive integers"),
    "malformed: a float": ((12.0, 22), r"^answer must be a pair of positive integers"),
    "malformed: zero": ((0, 22), r"^answer must be a pair of positive integers"),
    "malformed: a string": (("12", "22"), r"^answer must be a pair of positive integers"),
}


@pytest.mark.parametrize("kind", sorted(FIT_A_GPU_HINTS))
def test_02_1_gives_the_hint_for_its_kind_of_wrong_answer(kind: str) -> None:
    answer, hint = FIT_A_GPU_HINTS[kind]
    with pytest.raises(_WrongAnswer) as wrong_answer:
        check_exercise("02.1", answer)
    assert re.match(hint, str(wrong_answer.value).splitlines()[2].removeprefix("Hint: "))


@pytest.mark.parametrize("kind", sorted(WINDOW_GRADIENT_HINTS))
def test_01_3_names_the_mistake_by_its_symptom(kind: str) -> None:
    options, hint = WINDOW_GRADIENT_HINTS[kind]
    with pytest.raises(_WrongAnswer) as wrong_answer:
        check_exercise("01.3", _variant(_window_gradient, **options))
    assert re.match(hint, str(wrong_answer.value).splitlines()[2].removeprefix("Hint: "))


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
@pytest.mark.parametrize("kind", sorted(WINDOW_STEP_HINTS))
def test_02_3_names_the_mistake_by_its_symptom(kind: str) -> None:
    options, hint = WINDOW_STEP_HINTS[kind]
    with pytest.raises(_WrongAnswer) as wrong_answer:
        check_exercise("02.3", _variant(_train_window, **options))
    assert re.match(hint, str(wrong_answer.value).splitlines()[2].removeprefix("Hint: "))


def test_02_1_takes_a_list_as_a_pair(capsys: pytest.CaptureFixture[str]) -> None:
    check_exercise("02.1", [12, 22])
    assert capsys.readouterr().out.startswith("✓ Exercise 02.1: correct. micro-batch 12 fits")


def test_02_1_asks_for_at_least_256_samples_not_exactly(capsys, monkeypatch) -> None:
    """Issue 49: "reaches 256" read as "exactly 256" by some; 12 x 22 = 264 is the answer, and
    every text says "at least", in both languages."""
    check_exercise("02.1", (12, 22))
    assert capsys.readouterr().out.strip() == (
        "✓ Exercise 02.1: correct. micro-batch 12 fits, and k = 22 gives 264 samples per step "
        "(at least 256)")
    with pytest.raises(_WrongAnswer, match=r"micro_batch x k >= 256 \(at least 256 samples per "
                                           r"step, not exactly 256\)"):
        check_exercise("02.1", (8, 32))  # exactly 256, but 8 is not the largest that fits
    monkeypatch.setenv("GRADACCUM_LANGUAGE", "zh")
    check_exercise("02.1", (12, 22))
    assert capsys.readouterr().out.strip() == (
        "✓ 练习 02.1：正确。微批次 12 放得下，k = 22 时每次更新 264 个样本（至少 256 个）")
    with pytest.raises(_WrongAnswer, match="不必恰好是 256"):
        check_exercise("02.1", (12, 21))


def test_the_ddp_checker_leaves_no_process_group() -> None:
    check_exercise("05.1", CASES["05.1"][0])
    assert not torch.distributed.is_initialized()


def _exercise_ids(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [match for cell in cells if cell["cell_type"] == "code"
            for match in CHECK.findall("".join(cell["source"]))]


def test_every_name_a_notebook_imports_from_the_exercises_is_there() -> None:
    from gradaccum_course import exercises

    imported = {name.strip() for path in NOTEBOOKS.glob("**/*.ipynb")
                for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
                for names in re.findall(r"from gradaccum_course\.exercises import "
                                        r"([\w, ]+)", "".join(cell["source"]))
                for name in names.split(",")}
    assert {"check_exercise", "BERT_BASE_CHINESE", "GIB"} <= imported
    assert imported <= set(exercises.__all__)
    assert all(hasattr(exercises, name) for name in imported)


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS.glob("0*.ipynb")), ids=lambda p: p.name)
def test_every_notebook_ends_with_exercises_and_their_solutions(notebook: Path) -> None:
    ids = _exercise_ids(notebook)
    number = notebook.name.split("_")[0]  # "04", or "04b" for 04b_framework_audit.ipynb
    assert 2 <= len(ids) <= 4, f"{notebook.name} has {len(ids)} exercises; 2-4 wanted"
    assert all(i.startswith(number + ".") for i in ids)
    solutions = NOTEBOOKS / "solutions" / notebook.name.replace(".ipynb", "_solutions.ipynb")
    assert solutions.is_file(), f"no solutions notebook {solutions.name}"
    assert _exercise_ids(solutions) == ids
    # the notebook's cells hold no answers: every `answer =` line there is `answer = None`
    source = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
    assert re.findall(r"^answer = (.*)$", source, re.M) == ["None  # your answer"] * len(ids)


# ---- in a real kernel: what a reader sees under the checker cell ----------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(NOTEBOOKS),
                                       startup_timeout=120)
    try:
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _execute(client, code: str) -> tuple[str, list[dict]]:  # noqa: ANN001
    """Run ``code`` in the kernel; return the reply's status and the cell's iopub outputs."""
    outputs: list[dict] = []

    def keep(message: dict) -> None:
        if message["msg_type"] in {"stream", "error", "execute_result", "display_data"}:
            outputs.append({"type": message["msg_type"], **message["content"]})

    reply = client.execute_interactive(code, output_hook=keep, timeout=180)
    return reply["content"]["status"], outputs


def test_in_a_kernel_a_wrong_answer_is_one_short_message_without_a_traceback(kernel) -> None:
    status, outputs = _execute(kernel, "from gradaccum_course.exercises import "
                                       "check_exercise")
    assert status == "ok", outputs
    status, outputs = _execute(kernel, 'answer = 32\ncheck_exercise("04.1", answer)')
    assert status == "error"  # it still raises: a solution notebook fails under nbval
    assert [output["type"] for output in outputs] == ["error"], outputs
    error = outputs[0]
    assert error["ename"] == "_WrongAnswer"
    lines = [ANSI.sub("", line) for entry in error["traceback"] for line in entry.splitlines()]
    assert not [line for line in lines if "exercises.py" in line or "checkers.py" in line
                or "Traceback" in line or "File " in line], lines
    assert lines == [
        "✗ Exercise 04.1 (k for 256 samples on 8 GPUs): not right yet.",
        f"Expected: {_EXERCISES['04.1'].expects}.",
        "Hint: k=32 gives 1024 samples",
    ]


def test_in_a_kernel_a_right_answer_prints_a_tick_and_no_out_line(kernel) -> None:
    status, outputs = _execute(kernel, "from gradaccum_course.exercises import "
                                       "check_exercise")
    assert status == "ok", outputs
    status, outputs = _execute(kernel, 'answer = 8\ncheck_exercise("04.1", answer)')
    assert status == "ok", outputs
    assert [output["type"] for output in outputs] == ["stream"], outputs
    assert outputs[0]["name"] == "stdout"
    assert outputs[0]["text"] == ("✓ Exercise 04.1: correct. k = 8: 4 per GPU x 8 GPUs x 8 = "
                                  "256 samples per optimizer step\n")


# ---- the Chinese edition: the hint in Chinese too ----------------------------------------------

CJK = re.compile(r"[\u4e00-\u9fff]")
# three English words in a row: a sentence left untranslated (code names such as
# `accelerator.backward`, micro_batch or `answer` stand alone in a Chinese hint)
UNTRANSLATED = re.compile(r"\b[A-Za-z]{2,}(?:[ ,;:']+[A-Za-z]{2,}\b){2}")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
# every wrong answer the tests above give, English side: CASES, 02.1's kinds, the refusals
WRONG_ANSWERS = (
    [pytest.param(exercise_id, wrong, context, id=exercise_id)
     for exercise_id, (_, wrong, context) in sorted(CASES.items())]
    + [pytest.param("02.1", answer, {}, id=f"02.1-{kind}")
       for kind, (answer, _) in sorted(FIT_A_GPU_HINTS.items())]
    + [pytest.param("04.1", "eight", {}, id="04.1-not a number"),
       pytest.param("01.1", "Z", {"loops": LOOPS}, id="01.1-not a loop"),
       pytest.param("01.2", 3, {}, id="01.2-not a function"),
       pytest.param("01.3", 3, {}, id="01.3-not a function"),
       pytest.param("02.3", 3, {}, id="02.3-not a function")]
    + [pytest.param("01.3", _variant(_window_gradient, **options), {}, id=f"01.3-{kind}")
       for kind, (options, _) in sorted(WINDOW_GRADIENT_HINTS.items())]
    + [pytest.param("02.3", _variant(_train_window, **options), {}, id=f"02.3-{kind}")
       for kind, (options, _) in sorted(WINDOW_STEP_HINTS.items())]
    + [pytest.param("03.2", -1, {}, id="03.2-not positive")])


def _wrong_lines(exercise_id: str, answer: object, context: dict) -> list[str]:
    with pytest.raises(_WrongAnswer) as wrong_answer:
        check_exercise(exercise_id, answer, **context)
    assert wrong_answer.value.__cause__ is None and wrong_answer.value.__suppress_context__
    lines = str(wrong_answer.value).splitlines()
    assert wrong_answer.value._render_traceback_() == lines
    return lines


@pytest.mark.parametrize(("exercise_id", "answer", "context"), WRONG_ANSWERS)
def test_in_the_chinese_edition_the_hint_is_chinese(exercise_id: str, answer: object,
                                                    context: dict,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from gradaccum_course.exercises import _EXPECTS_ZH

    monkeypatch.setenv("GRADACCUM_LANGUAGE", "en")
    english = _wrong_lines(exercise_id, answer, context)[2].removeprefix("Hint: ")
    monkeypatch.setenv("GRADACCUM_LANGUAGE", "zh")
    lines = _wrong_lines(exercise_id, answer, context)
    assert len(lines) == 3 and lines[0].startswith(f"✗ 练习 {exercise_id}（")
    assert lines[1] == f"应当给出：{_EXPECTS_ZH[exercise_id]}。"
    assert lines[2].startswith("提示：")
    hint = lines[2].removeprefix("提示：")
    assert CJK.search(hint) and not UNTRANSLATED.search(hint), hint
    # computed from the same values, formatted the same way: the English hint's numbers
    assert sorted(NUMBER.findall(hint)) == sorted(NUMBER.findall(english)), (hint, english)


def test_a_wrong_answer_keeps_its_english_text_and_carries_the_chinese() -> None:
    import pickle

    error = _WrongAnswer("x", zh="y")
    assert str(error) == "x" and error.zh == "y"
    assert error._render_traceback_() == ["x"]
    assert _WrongAnswer("x").zh is None
    assert pickle.loads(pickle.dumps(error)).zh == "y"


def test_without_a_chinese_hint_the_chinese_edition_shows_the_english_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gradaccum_course.exercises import _Exercise

    def english_only(answer: object) -> str:
        raise _WrongAnswer(f"{answer} is not it")

    monkeypatch.setitem(_EXERCISES, "04.1", _Exercise(_EXERCISES["04.1"].title,
                                                    _EXERCISES["04.1"].expects, english_only))
    monkeypatch.setenv("GRADACCUM_LANGUAGE", "zh")
    assert _wrong_lines("04.1", 7, {})[2] == "提示：7 is not it"


def test_in_a_kernel_of_the_chinese_edition_the_hint_is_chinese_without_a_traceback(
        kernel) -> None:
    from gradaccum_course.exercises import _EXPECTS_ZH, _TITLES_ZH

    status, outputs = _execute(kernel, "import os\nfrom gradaccum_course.exercises import "
                                       "check_exercise\n"
                                       "_language = os.environ.get('GRADACCUM_LANGUAGE')\n"
                                       "os.environ['GRADACCUM_LANGUAGE'] = 'zh'")
    assert status == "ok", outputs
    try:
        status, outputs = _execute(kernel, 'answer = 32\ncheck_exercise("04.1", answer)')
    finally:
        _execute(kernel, "os.environ.pop('GRADACCUM_LANGUAGE')\nif _language is not None:\n"
                         "    os.environ['GRADACCUM_LANGUAGE'] = _language")
    assert status == "error"
    assert [output["type"] for output in outputs] == ["error"], outputs
    lines = [ANSI.sub("", line) for entry in outputs[0]["traceback"]
             for line in entry.splitlines()]
    assert lines == [
        f"✗ 练习 04.1（{_TITLES_ZH['04.1']}）：还不对。",
        f"应当给出：{_EXPECTS_ZH['04.1']}。",
        "提示：k=32 给出的是 1024 个样本",
    ]


def test_every_solutions_check_line_is_said_in_chinese_in_the_twin_with_its_numbers():
    """Issue 38: what a checker prints is whole in the reader's language. Every ✓ line of the
    English solutions has a Chinese reading (_CHECKED_ZH) with the same numbers, and the
    Chinese twins of the solutions print it, with no English sentence left."""
    from prose_numbers import numbers

    from gradaccum_course.exercises import _checked_in_chinese

    root = Path(__file__).resolve().parent.parent

    def check_lines(path: Path) -> list[str]:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [line for cell in cells for output in cell.get("outputs", [])
                for line in "".join(output.get("text", "")).split("\n")
                if line.startswith("✓")]

    english = sorted((root / "notebooks" / "solutions").glob("*_solutions.ipynb"))
    assert len(english) == len(list((root / "notebooks").glob("[0-9]*.ipynb")))  # one each
    for path in english:
        lines = check_lines(path)
        assert lines, path.name
        twin = check_lines(root / "notebooks" / "zh" / "solutions" / path.name.replace(
            ".ipynb", ".zh.ipynb"))
        assert len(twin) == len(lines), path.name
        for line, chinese in zip(lines, twin, strict=True):
            exercise_id, checked = re.match(r"✓ Exercise (\S+): correct\. (.*)", line).groups()
            said = _checked_in_chinese(exercise_id, checked)
            assert said != checked and numbers(said) == numbers(checked), (exercise_id, said)
            assert chinese == f"✓ 练习 {exercise_id}：正确。{said}", chinese
            words = re.findall(r"[A-Za-z]{3,}", said)  # names and units may stay: no sentence
            assert set(words) <= {"bert", "base", "chinese", "token", "Trainer", "SGD",
                                  "Accelerate", "DDP", "GPU", "epoch"}, (exercise_id, words)


def test_the_mistaken_window_refuses_a_name_that_would_make_it_the_right_loop():
    """02.3's deliberately wrong loops run only as a named mistake: an unknown name would run
    a correct copy of the loop, which the library writes once (accumulate_window)."""
    from gradaccum_course.exercises import ex02

    with pytest.raises(ValueError, match="mistake must be one of 02.3's usual mistakes"):
        ex02._run_window_step(ex02._mistaken_window, 1.0, mistake="typo")
