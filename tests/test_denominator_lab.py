"""The denominator lab (notebook 03): its gradients against the library's ground truth."""

from __future__ import annotations

import math

import pytest

from gradaccum_course.denominator_lab import (
    NORMALISATIONS,
    PRESETS,
    format_layout,
    measure_window,
    parse_layout,
    preset_layout,
)

RIGHT = NORMALISATIONS[-1]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("ranks", "k"), [(1, 1), (2, 4), (4, 3)])
def test_the_global_token_count_is_the_large_batch(preset, ranks, k) -> None:
    layout = preset_layout(preset, ranks, k)
    if not any(n for rank in layout for micro in rank for n in micro):
        pytest.skip("no real token")
    measured = measure_window(layout, k)
    assert measured.errors[RIGHT] < 1e-12, preset
    # the logged token-weighted mean is the window's true mean, whatever the split
    assert math.isfinite(measured.logged["token-weighted window mean"])


def test_equal_tokens_make_every_mean_right_but_sum_over_k() -> None:
    measured = measure_window(preset_layout("equal tokens", 2, 4), 4)
    for name in ("mean of micro-batch means", "rank-local token count", "per sample"):
        assert measured.errors[name] < 1e-12, name
    # 16 tokens per micro-batch: sum / k weighs each token 16 times the mean's weight
    assert measured.weights["sum / k"][0] == pytest.approx(16.0)
    assert measured.errors["sum / k"] == pytest.approx(15.0, rel=1e-9)


def test_uneven_tokens_break_the_mean_of_means() -> None:
    measured = measure_window(preset_layout("uneven tokens", 2, 4), 4)
    assert measured.errors["mean of micro-batch means"] > 0.05
    assert measured.errors["per sample"] > 0.05
    logged = measured.logged
    assert logged["mean of micro-batch means"] != pytest.approx(
        logged["token-weighted window mean"], rel=1e-6)


def test_a_rank_with_zero_tokens_logs_nan_but_its_gradient_is_zero() -> None:
    measured = measure_window(preset_layout("a rank with zero tokens", 2, 4), 4)
    # the empty rank's mean is 0 / 0: the logged mean of means is NaN ...
    assert math.isnan(measured.logged["mean of micro-batch means"])
    # ... but cross-entropy sends no gradient from ignored tokens: the update is finite, and
    # DDP's average over 2 ranks halves every real token's weight under the rank-local count
    assert measured.errors["rank-local token count"] == pytest.approx(0.5, abs=1e-9)
    assert math.isfinite(measured.errors["mean of micro-batch means"])
    assert measured.errors[RIGHT] < 1e-12


def test_a_short_last_window_divided_by_k_is_under_weighted() -> None:
    layout = preset_layout("short last window", 1, 4)
    assert len(layout[0]) == 2
    measured = measure_window(layout, 4)
    # each rank's two micro-batches divided by k = 4: every token weighs half or less
    assert max(measured.weights["mean of micro-batch means"]) < 1.0
    assert measured.errors["mean of micro-batch means"] > 0.3


def test_the_text_round_trips_and_bad_text_is_named() -> None:
    layout = preset_layout("uneven tokens", 3, 2)
    assert parse_layout(format_layout(layout), 2) == layout
    with pytest.raises(ValueError, match="rank 1, micro-batch 0"):
        parse_layout("3+4\nx 2", 2)
    with pytest.raises(ValueError, match="at most k = 2"):
        parse_layout("1 2 3", 2)
    with pytest.raises(ValueError, match="1 to 4 lines"):
        parse_layout("1\n1\n1\n1\n1", 2)
    with pytest.raises(ValueError, match="0..64"):
        parse_layout("65", 1)
    with pytest.raises(ValueError, match="no real token"):
        measure_window([[[0, 0]]], 1)
    with pytest.raises(ValueError, match="ranks must be 1 to 4"):
        preset_layout("equal tokens", 5, 1)


def test_the_widget_measures_what_its_controls_say_now(monkeypatch) -> None:
    from gradaccum_course.widgets import denominator_lab

    lab = denominator_lab(ranks=2, accumulation_steps=4)
    ranks, k, preset, tokens, report, _figure = lab.children
    assert "2 rank(s), k = 4" in report.value
    k.value = 2
    assert "k = 2" in report.value and len(tokens.value.splitlines()[0].split()) == 2
    tokens.value = "8+8\n0+0"
    assert "mean of micro-batch means NaN" in report.value  # the empty rank's 0 / 0
    tokens.value = "1 2 3"
    assert "at most k = 2" in report.value
    monkeypatch.setenv("GRADACCUM_LANGUAGE", "zh")
    zh = denominator_lab()
    assert zh.children[1].description == "累积步数 k"
    assert "个真实 token" in zh.children[4].value


def test_the_stored_english_report_is_said_in_chinese() -> None:
    """scripts/build_twins.py says each text between the report's tags in Chinese."""
    import re

    from gradaccum_course.widgets import denominator_lab, localize_text

    for preset in PRESETS:
        report = denominator_lab(preset=preset).children[4].value
        texts = [text for text in re.findall(r">([^<]+)<", report) if re.search("[a-z]{3}", text)]
        assert len(texts) >= 8, report
        untranslated = [text for text in texts
                        if not re.search(r"[\u4e00-\u9fff]", localize_text(text))]
        assert not untranslated, untranslated
