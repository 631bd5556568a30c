"""The notebooks' exercises, and the checkers that grade a reader's answer
(``check_exercise("02.1", answer)``, run by nbval on ``notebooks/solutions/`` in ``make test``).

This module is the registry and the messages. Each notebook's exercises are a module
(``ex00`` ... ``ex09``, ``ex04b``) of rows (:func:`register`): title, answer expected, what a
right answer checked, and a checker that computes the truth by running the library, never from
a stored value. Texts and hints are data: pairs of format strings (English, Chinese) filled
with the same values (:func:`wrong`); an answer that is one number is a :class:`Numeric` row.
"""

from __future__ import annotations

import gc
import importlib
import re
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch.distributed as dist

from gradaccum_course import language

__all__ = ["BERT_BASE_CHINESE", "GIB", "check_exercise", "correct_message", "no_answer_message"]

GIB = 1024**3
# bert-base-chinese's published configuration (its config.json on the Hugging Face Hub)
BERT_BASE_CHINESE: dict[str, int] = {
    "vocab_size": 21128, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
Hint = tuple[str, str]  # a text's format strings: English, Chinese (the same fields)


class _WrongAnswer(AssertionError):
    """A wrong answer: the message says how (``zh``: in Chinese). IPython calls
    ``_render_traceback_`` instead of printing a traceback: a reader sees the message alone."""

    def __init__(self, message: str = "", *, zh: str | None = None) -> None:
        super().__init__(message)
        self.zh = zh

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


@dataclass(frozen=True)
class _Exercise:
    """One exercise: its title, the answer it expects in words (never its value), its checker
    (``checker(answer, **context) -> values``, raises if wrong), what it checked (``said``)."""

    title: str
    expects: str
    checker: Callable[..., dict]
    said: str = ""


_EXERCISES: dict[str, _Exercise] = {}  # filled by the notebooks' modules, imported at the end
#: in the Chinese edition (notebooks/zh/): each title, answer expected, and what was checked
#: (a pattern that reads the English sentence's values, and the Chinese sentence they fill)
_TITLES_ZH: dict[str, str] = {}
_EXPECTS_ZH: dict[str, str] = {}
_CHECKED_ZH: dict[str, tuple[str, str]] = {}


def register(exercise_id: str, title: Hint, expects: Hint, said: Hint,
             checker: Callable[..., dict]) -> None:
    """Add an exercise, a row of data: its title, answer expected, what a right answer checked
    (filled with the values ``checker`` returns), each in English and Chinese; its checker."""
    _EXERCISES[exercise_id] = _Exercise(title[0], expects[0], checker, said[0])
    _TITLES_ZH[exercise_id], _EXPECTS_ZH[exercise_id] = title[1], expects[1]
    pattern, seen = "", set()
    for literal, field, _, _ in string.Formatter().parse(said[0]):
        pattern += re.escape(literal)
        if field is not None:
            pattern += f"(?P={field})" if field in seen else f"(?P<{field}>.+?)"
            seen.add(field)
    _CHECKED_ZH[exercise_id] = (pattern, said[1])


def check_exercise(exercise_id: str, answer: object, **context: object) -> None:
    """Grade ``answer`` to exercise ``exercise_id`` (``"02.1"``): say there is no answer yet
    (``None``), or print ``✓``, what was checked and the true value (returning None: no ``Out:``
    line), or raise :class:`_WrongAnswer` (so a solution fails under nbval): ``✗``, the answer
    expected, a hint. ``context``: what an exercise needs from its cell (01.1: ``loops=...``);
    in the Chinese edition (:func:`gradaccum_course.language`) all of it is in Chinese."""
    if exercise_id not in _EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; known: {sorted(_EXERCISES)}")
    lang = language()
    if answer is None:
        print(no_answer_message(exercise_id, lang))
        return
    exercise = _EXERCISES[exercise_id]
    try:
        values = exercise.checker(answer, **context)
    except _WrongAnswer as wrong_answer:  # one short message, not a chain of two tracebacks
        hint = wrong_answer.zh if lang == "zh" and wrong_answer.zh else str(wrong_answer)
        raise _WrongAnswer(_wrong_message(exercise_id, hint, lang)) from None
    print(correct_message(exercise_id, exercise.said.format(**values), lang))


def no_answer_message(exercise_id: str, lang: str = "en") -> str:
    """Return what the checker says when ``answer`` is None."""
    if lang == "zh":
        return (f"练习 {exercise_id}（{_TITLES_ZH.get(exercise_id, _EXERCISES[exercise_id].title)}"
                "）：还没有答案。在上面的单元格里设置 `answer`，再运行这个单元格；参考答案在 "
                "notebooks/zh/solutions/。")
    return (f"Exercise {exercise_id} ({_EXERCISES[exercise_id].title}): no answer yet. Set "
            "`answer` in the cell above and run this cell again; the solution is in "
            "notebooks/solutions/.")


def correct_message(exercise_id: str, checked: str, lang: str = "en") -> str:
    """Return what the checker prints for a right answer (in Chinese via :data:`_CHECKED_ZH`)."""
    if lang == "zh":
        return f"✓ 练习 {exercise_id}：正确。{_checked_in_chinese(exercise_id, checked)}"
    return f"✓ Exercise {exercise_id}: correct. {checked}"


def _checked_in_chinese(exercise_id: str, checked: str) -> str:
    """``checked`` said in Chinese, with its numbers; as it is where no pattern reads it."""
    pattern, chinese = _CHECKED_ZH.get(exercise_id, (None, None))
    found = re.fullmatch(pattern, checked) if pattern else None
    return chinese.format(**found.groupdict()) if found else checked


def _wrong_message(exercise_id: str, hint: str, lang: str = "en") -> str:
    """Return the three lines of a wrong answer: ✗, the answer expected, the hint."""
    exercise = _EXERCISES[exercise_id]
    if lang == "zh":
        return (f"✗ 练习 {exercise_id}（{_TITLES_ZH.get(exercise_id, exercise.title)}）：还不对。\n"
                f"应当给出：{_EXPECTS_ZH.get(exercise_id, exercise.expects)}。\n提示：{hint}")
    return (f"✗ Exercise {exercise_id} ({exercise.title}): not right yet.\n"
            f"Expected: {exercise.expects}.\nHint: {hint}")


def say(text: Hint, **values: object) -> Hint:
    """``text`` (English, Chinese) filled with ``values``."""
    return text[0].format(**values), text[1].format(**values)


def wrong(hint: Hint, **values: object) -> _WrongAnswer:
    """The wrong answer that ``hint``, filled with ``values``, explains (to raise)."""
    english, chinese = say(hint, **values)
    return _WrongAnswer(english, zh=chinese)


def require(condition: bool, hint: Hint, **values: object) -> None:
    """Raise :func:`wrong` ``(hint, **values)`` unless ``condition``."""
    if not condition:
        raise wrong(hint, **values)


def number(answer: object, unit: Hint) -> float:
    """``answer`` as a float, or a wrong answer saying what number (``unit``) was wanted."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise wrong(("answer ({unit[0]}) must be a number; got {got}",
                     "answer（{unit[1]}）必须是一个数；实际得到的是 {got}"),
                    unit=unit, got=f"{type(answer).__name__} {answer!r}")
    return float(answer)


@dataclass(frozen=True)
class Numeric:
    """A number's checker, as data: ``values(**context)`` computes the truth (``"truth"``) and
    what the texts name (a callable value is called with the answer); the answer passes each of
    ``guards`` (``(test(given, values), hint)``), then lies within ``tolerance`` of the truth
    (times it, where ``relative``), else ``hint``; ``given``: the answer as a float."""

    values: Callable[..., dict]
    unit: Hint
    tolerance: float
    hint: Hint
    relative: bool = False
    guards: tuple[tuple[Callable[[float, dict], bool], Hint], ...] = ()

    def __call__(self, answer: object, **context: object) -> dict:
        values = self.values(**context)
        given = number(answer, self.unit)
        named = {name: value(answer) if callable(value) else value
                 for name, value in values.items()} | {"answer": answer, "given": given}
        for test, hint in self.guards:
            require(test(given, values), hint, **named)
        bound = self.tolerance * (values["truth"] if self.relative else 1)
        require(abs(given - values["truth"]) <= bound, self.hint, **named)
        return named


@contextmanager
def one_process_group() -> Iterator[None]:
    """A gloo process group of one process (05.1's DDP, 08.1's pipeline), destroyed after. Its
    store lives in memory: no file or folder to remove while gloo's threads wind down (a CI
    worker twice aborted inside the removal of a FileStore's folder)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()  # a DDP reducer left in a cycle goes before the group it runs on
        dist.destroy_process_group()


for _notebook in ("ex00", "ex01", "ex02", "ex03", "ex04", "ex04b", "ex05", "ex06", "ex07",
                  "ex08", "ex09"):  # each registers its exercises
    importlib.import_module(f"{__name__}.{_notebook}")
