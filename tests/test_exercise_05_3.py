"""Exercise 05.3, "write the DDP window": its checker runs the reader's window under torchrun
on 2 gloo ranks and, on a wrong one, names the kind of mistake from what it measured. One
launch measures every window below (a module fixture); each test then checks one window's
hint, in English and in Chinese."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from gradaccum_course.exercises import _WrongAnswer, check_exercise
from gradaccum_course.exercises.ex05 import _measure_ddp_windows

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))
import ddp_windows  # noqa: E402

#: each wrong window, and what its hint must say (English; the Chinese one names it too)
KINDS = {
    "mean_over_k": (r"^wrong divisor: your gradient's cosine with the large batch's is 0\.\d+",
                    "除数不对"),
    "local_count": (r"^wrong divisor: ", "除数不对"),
    "no_world_factor": (r"^no world factor: your gradient is 0\.500 x the large batch's",
                        "少了进程数这个因子"),
    "flag_after_forward": (r"^sync flag set after the forward: the forward of micro-step\(s\) 1 "
                           r"read the flag on, but at the backward it was on at 3; .* Measured: "
                           r"micro-step\(s\) 1 all-reduced, .* ranks' gradients differ",
                           "同步标志在前向之后才设置"),
    "no_sync_around_backward": (r"^sync flag set after the forward: the forward of "
                                r"micro-step\(s\) 1, 2, 3 read the flag on, but at the backward "
                                r"it was on at 3; .* Measured: all 3 micro-steps all-reduced: "
                                r"the gradient is right and nothing is saved",
                                "同步标志在前向之后才设置"),
    "sync_first_not_last": (r"^sync on the wrong micro-step: micro-step\(s\) 1 synchronised, "
                            r"where only the last \(3\) should; .* ranks' gradients differ",
                            "在错误的微步上同步"),
    "count_off_device": (r"^count tensor off the model's device: .* dist\.all_reduce got a "
                         r"tensor on meta; .* NCCL all-reduces CUDA tensors only",
                         "计数张量不在模型所在的设备上"),
}


@pytest.fixture(scope="module")
def measured() -> None:
    """Every window measured in one torchrun launch (the checker keeps what it measured)."""
    _measure_ddp_windows(ddp_windows.right, *(getattr(ddp_windows, name) for name in KINDS))


def test_the_right_window_passes(measured: None, capsys: pytest.CaptureFixture[str]) -> None:
    check_exercise("05.3", ddp_windows.right)
    assert capsys.readouterr().out.startswith(
        "✓ Exercise 05.3: correct. your ddp_window on 2 gloo ranks, 2 windows of 3 uneven "
        "micro-batches: one all-reduce per window, at the last micro-step")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_hint_names_the_kind_of_mistake(kind: str, measured: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    english, chinese = KINDS[kind]
    hints = {}
    for language in ("en", "zh"):
        monkeypatch.setenv("GRADACCUM_LANGUAGE", language)
        with pytest.raises(_WrongAnswer) as wrong:
            check_exercise("05.3", getattr(ddp_windows, kind))
        hints[language] = str(wrong.value).splitlines()[2]
    assert re.match(english, hints["en"].removeprefix("Hint: ")), hints["en"]
    assert hints["zh"].startswith(f"提示：{chinese}"), hints["zh"]


def test_a_window_must_be_a_file(tmp_path: Path) -> None:
    with pytest.raises(_WrongAnswer, match="must be the path of the .py file"):
        check_exercise("05.3", tmp_path / "missing.py")
    with pytest.raises(_WrongAnswer, match="must be the path of the .py file"):
        check_exercise("05.3", 3)


def test_a_window_that_raises_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "window.py"
    path.write_text("def ddp_window(model, window):\n    raise ValueError('not yet')\n")
    with pytest.raises(_WrongAnswer, match=r"your ddp_window raised ValueError: not yet"):
        check_exercise("05.3", str(path))
