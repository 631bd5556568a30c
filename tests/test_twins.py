"""The Chinese edition (notebooks/zh/) cannot drift from the English one.

Each twin is built by scripts/build_twins.py from its English notebook and a translation file
keyed by cell id and a hash of the English source. Here: every markdown cell of a translated
notebook has a current translation (an English edit makes it stale, and the test names the
cell), the committed twin is what the builder writes, its code cells and outputs are the
English ones (so CI need not execute it: nbval runs the English notebook, and the root
conftest leaves notebooks/zh/ out), every number of a translated cell is one of its English
cell's, and the twins' links resolve.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prose_numbers import numbers
from script_loader import load_script

twins = load_script("scripts/build_twins.py")
ROOT = Path(__file__).resolve().parent.parent
TRANSLATED = twins.translated_notebooks()
NAMES = [str(twins.relative(path)) for path in TRANSLATED]
#: English notebooks without a translation yet (issue 32 is done when this is empty)
NOT_YET = {str(twins.relative(path)) for path in twins.english_notebooks()} - set(NAMES)


def test_the_notebooks_not_yet_translated_are_named() -> None:
    assert NOT_YET == set(NOT_YET_EXPECTED), (
        f"translated now, remove from NOT_YET_EXPECTED: {sorted(set(NOT_YET_EXPECTED) - NOT_YET)}"
        f"; new and untranslated: {sorted(NOT_YET - set(NOT_YET_EXPECTED))}")


NOT_YET_EXPECTED: list[str] = []


@pytest.mark.parametrize("notebook", TRANSLATED, ids=NAMES)
def test_every_markdown_cell_has_a_current_translation(notebook: Path) -> None:
    assert twins.problems(notebook) == []


@pytest.mark.parametrize("notebook", TRANSLATED, ids=NAMES)
def test_the_committed_twin_is_what_the_builder_writes(notebook: Path) -> None:
    path = twins.twin_path(notebook)
    assert path.exists(), f"{path} is missing: run python scripts/build_twins.py"
    assert path.read_text(encoding="utf-8") == twins.dumps(twins.build_twin(notebook)), (
        f"{path} is out of date: run python scripts/build_twins.py")


@pytest.mark.parametrize("notebook", TRANSLATED, ids=NAMES)
def test_the_twins_code_and_outputs_are_the_english_ones(notebook: Path) -> None:
    english = json.loads(notebook.read_text(encoding="utf-8"))
    twin = json.loads(twins.twin_path(notebook).read_text(encoding="utf-8"))
    assert [c["id"] for c in twin["cells"]] == [c["id"] for c in english["cells"]]
    linker = twins.Linker()
    for ours, theirs in zip(twin["cells"], english["cells"], strict=True):
        if theirs["cell_type"] == "code":  # the same, but for links and the checkers' words
            twins.rewrite_output_links(theirs, twins.relative(notebook), linker)
            twins.localize_feedback(theirs)
            twins.localize_output(theirs, twins.read_translation(twins.translation_path(notebook)))
            assert ours == theirs, f"code cell {theirs['id']} differs from the English one"
    assert twin["metadata"]["kernelspec"] == english["metadata"]["kernelspec"]
    twins.localize_widgets(english)  # the stored widgets: the English ones, said in Chinese
    assert twin["metadata"].get("widgets") == english["metadata"].get("widgets")


def _widget_texts(notebook: dict) -> dict[str, str]:
    """{model id/key: text} of the stored widgets' descriptions and Label texts."""
    state = notebook["metadata"].get("widgets", {}).get(twins.WIDGET_STATE, {}).get("state", {})
    return {f"{model_id}/{key}": model["state"][key] for model_id, model in state.items()
            for key in ("description", "value")
            if isinstance(model["state"].get(key), str) and model["state"][key]
            and (key != "value" or model["model_name"] == "LabelModel")}


@pytest.mark.parametrize("name", ["02_single_device.ipynb", "04_emr_case_study.ipynb",
                                  "06_beyond.ipynb"])
def test_a_twins_stored_sliders_speak_chinese_with_the_english_numbers(name: str) -> None:
    """Issue 49: a kernel started in notebooks/zh/ labels its sliders in Chinese; the twin, not
    executed, says its stored labels and summaries the same way (the widget module's own
    Chinese texts), each with the English text's numbers."""
    english = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    twin = json.loads((ROOT / "notebooks" / "zh" / name.replace(".ipynb", ".zh.ipynb")).read_text(
        encoding="utf-8"))
    english_texts, twin_texts = _widget_texts(english), _widget_texts(twin)
    assert english_texts and set(twin_texts) == set(english_texts)
    for key, text in twin_texts.items():
        assert re.search(r"[\u4e00-\u9fff]", text), f"{name} {key}: still English: {text!r}"
        assert numbers(text) == numbers(english_texts[key]), (key, text, english_texts[key])
    if name == "02_single_device.ipynb":  # the slider a reader meets first
        assert {"累积步数 k", "微批次大小"} <= set(twin_texts.values())


def test_a_stored_widget_is_said_in_chinese_as_a_chinese_kernel_draws_it(monkeypatch) -> None:
    """The twin's stored text is the one a kernel of the Chinese edition draws, word for word."""
    from gradaccum_course.widgets import accumulation_explorer
    from gradaccum_lib.measure.planning import StepTimeModel

    def drawn(language: str) -> list[str]:
        monkeypatch.setenv("GRADACCUM_LANGUAGE", language)
        steps, size, summary, _ = accumulation_explorer(
            num_parameters=10_756, activation_bytes_per_sample=2_136.0,
            step_time=StepTimeModel(2e-4, 6e-6), accumulation_steps=3,
            micro_batch_size=5).children
        return [steps.description, size.description, summary.value]

    english, chinese = drawn("en"), drawn("zh")
    notebook = {"metadata": {"widgets": {twins.WIDGET_STATE: {"state": {
        str(index): {"model_name": model, "state": {key: text}}
        for index, (model, key, text) in enumerate(zip(
            ["IntSliderModel", "IntSliderModel", "LabelModel"],
            ["description", "description", "value"], english, strict=True))}}}}}
    twins.localize_widgets(notebook)
    assert list(_widget_texts(notebook).values()) == chinese
    assert chinese[:2] == ["累积步数 k", "微批次大小"]
    assert chinese[2].startswith("有效批大小 15 = 5 x 3：")


@pytest.mark.parametrize("notebook", TRANSLATED, ids=NAMES)
def test_every_number_of_a_translation_is_its_english_cells(notebook: Path) -> None:
    english = {c["id"]: "".join(c["source"])
               for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]}
    twin = twins.build_twin(notebook)  # as published: the current run time copied in
    extra = {cell["id"]: sorted(numbers("".join(cell["source"])) - numbers(english[cell["id"]]))
             for cell in twin["cells"] if cell["cell_type"] == "markdown"}
    assert {cell_id: found for cell_id, found in extra.items() if found} == {}
    # a printed text said in Chinese states the English text's numbers, all of them
    printed = {c["id"]: twins.printed(c)
               for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]}
    for cell in twin["cells"]:
        if cell["cell_type"] == "code" and twins.printed(cell) != printed[cell["id"]]:
            assert numbers(twins.printed(cell)) == numbers(printed[cell["id"]]), cell["id"]


@pytest.mark.parametrize("notebook", TRANSLATED, ids=NAMES)
def test_the_twins_links_resolve(notebook: Path) -> None:
    path = twins.twin_path(notebook)
    twin = json.loads(path.read_text(encoding="utf-8"))
    broken = []
    for cell in twin["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", "".join(cell["source"])):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(target)
            elif fragment and resolved.suffix == ".ipynb" and fragment != "Exercises" and (
                    fragment not in _anchors(resolved)):
                broken.append(target)
    assert broken == []


def _anchors(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return {twins.anchor(heading) for cell in cells if cell["cell_type"] == "markdown"
            for heading in twins._headings("".join(cell["source"]))}


def test_an_edited_english_cell_makes_its_translation_stale(tmp_path, monkeypatch) -> None:
    english = tmp_path / "notebooks" / "01_x.ipynb"
    english.parent.mkdir()
    cell = {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["# Title\n", "5 GB"]}
    english.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5}))
    monkeypatch.setattr(twins, "NOTEBOOKS", english.parent)
    monkeypatch.setattr(twins, "TRANSLATIONS", english.parent / "zh" / "translations")
    translation = twins.translation_path(english)
    translation.parent.mkdir(parents=True)
    digest = twins.source_hash("# Title\n5 GB")
    translation.write_text(f"<!-- cell intro source {digest} -->\n# 标题\n5 GB\n")
    assert twins.problems(english) == []
    cell["source"] = ["# Title\n", "6 GB"]  # the English cell edited
    english.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5}))
    assert twins.problems(english) == [
        f"01_x.ipynb: cell intro changed since it was translated (translated {digest}, now "
        f"{twins.source_hash('# Title' + chr(10) + '6 GB')})"]
    with pytest.raises(ValueError, match="cell intro changed since it was translated"):
        twins.build_twin(english)
    twins.skeleton(english)  # the stale translation kept, marked for the translator
    assert "TODO-翻译 STALE" in translation.read_text() and twins.problems(english) == [
        "01_x.ipynb: cell intro is not translated yet"]


def test_a_new_run_time_is_copied_into_the_twin_and_stales_nothing(tmp_path, monkeypatch):
    english = tmp_path / "notebooks" / "03_x.ipynb"
    english.parent.mkdir()
    header = "# X\n\nRun time on 2 CPU cores (`ci` profile): about {} s."

    def write(seconds: int) -> None:
        cell = {"cell_type": "markdown", "id": "t", "metadata": {},
                "source": header.format(seconds)}
        english.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                       "nbformat_minor": 5}))

    write(30)
    monkeypatch.setattr(twins, "NOTEBOOKS", english.parent)
    monkeypatch.setattr(twins, "TRANSLATIONS", english.parent / "zh" / "translations")
    twins.translation_path(english).parent.mkdir(parents=True)
    twins.translation_path(english).write_text(
        f"<!-- cell t source {twins.source_hash(header.format(30))} -->\n# X\n\n运行约需 30 s。\n")
    write(45)  # make notebooks recorded a new run time
    assert twins.problems(english) == []
    assert "运行约需 45 s。" in "".join(twins.build_twin(english)["cells"][0]["source"])


def test_a_missing_cell_and_an_orphan_translation_are_named(tmp_path, monkeypatch) -> None:
    english = tmp_path / "notebooks" / "02_x.ipynb"
    english.parent.mkdir()
    cells = [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["A"]}]
    english.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5}))
    monkeypatch.setattr(twins, "NOTEBOOKS", english.parent)
    monkeypatch.setattr(twins, "TRANSLATIONS", english.parent / "zh" / "translations")
    twins.translation_path(english).parent.mkdir(parents=True)
    twins.translation_path(english).write_text("<!-- cell gone source 000000000000 -->\n旧\n")
    assert twins.problems(english) == ["02_x.ipynb: cell a has no translation",
                                       "02_x.ipynb: the translation of cell gone has no cell "
                                       "in the notebook"]


def test_exercise_feedback_follows_the_notebooks_language(monkeypatch, capsys) -> None:
    from gradaccum_course import exercises, language

    monkeypatch.delenv("GRADACCUM_LANGUAGE", raising=False)
    monkeypatch.chdir(ROOT / "notebooks")
    assert language() == "en"
    monkeypatch.chdir(ROOT / "notebooks" / "zh" / "solutions")  # a Chinese twin's kernel
    assert language() == "zh"
    exercises.check_exercise("00.2", None)
    assert capsys.readouterr().out.startswith(
        "练习 00.2（DDP 下一次优化器更新的样本数）：还没有答案")
    exercises.check_exercise("00.2", 384)
    assert capsys.readouterr().out.startswith("✓ 练习 00.2：正确。")
    with pytest.raises(exercises._WrongAnswer) as wrong:
        exercises.check_exercise("00.2", 96)
    assert str(wrong.value).splitlines()[:2] == [
        "✗ 练习 00.2（DDP 下一次优化器更新的样本数）：还不对。",
        "应当给出：一次优化器更新的样本数：微批次 16、k = 6、4 个 DDP 进程。"]
    monkeypatch.setenv("GRADACCUM_LANGUAGE", "en")
    assert language() == "en"
    # every exercise is framed in Chinese, and a twin's checker cells show the Chinese framing
    assert set(exercises._TITLES_ZH) == set(exercises._EXERCISES) == set(exercises._EXPECTS_ZH)
    twin = json.loads((ROOT / "notebooks" / "zh" / "00_the_article.zh.ipynb").read_text())
    checks = [cell for cell in twin["cells"] if cell["cell_type"] == "code"
              and "".join(cell["source"]).startswith("check_exercise(")]
    assert checks and all("".join(cell["outputs"][0]["text"]).startswith("练习 00.")
                          for cell in checks)


def test_a_twin_writes_to_the_repositorys_build_folder() -> None:
    """A twin is one folder deeper than its English notebook: its cells name the build folder
    through gradaccum_course.build_dir(), never by a relative path, so running either writes to
    the repository's build/."""
    def relative_builds(path: Path) -> list[str]:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [cell["id"] for cell in cells if cell["cell_type"] == "code"
                and "../build" in "".join(cell["source"])]

    for notebook in TRANSLATED:
        assert not relative_builds(notebook), twins.relative(notebook)
        assert not relative_builds(twins.twin_path(notebook)), twins.relative(notebook)


def test_a_printed_text_can_be_said_in_chinese_and_goes_stale_with_the_english(
        tmp_path, monkeypatch) -> None:
    english = tmp_path / "notebooks" / "01_x.ipynb"
    english.parent.mkdir()
    title = {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["# Title"]}
    code = {"cell_type": "code", "id": "count", "metadata": {}, "execution_count": 1,
            "source": ["print(...)"],
            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["used 0.250\n"]}]}

    def write() -> None:
        english.write_text(json.dumps({"cells": [title, code], "metadata": {}, "nbformat": 4,
                                       "nbformat_minor": 5}))

    write()
    monkeypatch.setattr(twins, "NOTEBOOKS", english.parent)
    monkeypatch.setattr(twins, "TRANSLATIONS", english.parent / "zh" / "translations")
    translation = twins.translation_path(english)
    translation.parent.mkdir(parents=True)
    digest = twins.source_hash("used 0.250\n")
    translation.write_text(f"<!-- cell intro source {twins.source_hash('# Title')} -->\n# 标题\n\n"
                           f"<!-- output count source {digest} -->\n用到 0.250\n")
    assert twins.problems(english) == []
    twin = twins.build_twin(english)
    assert twin["cells"][1]["outputs"][0]["text"] == "用到 0.250\n"
    assert twin["cells"][1]["source"] == ["print(...)"]  # the code stays the English code
    code["outputs"][0]["text"] = ["used 0.500\n"]  # the English output changed
    write()
    assert twins.problems(english) == [
        f"01_x.ipynb: what cell count prints changed since it was translated (translated "
        f"{digest}, now {twins.source_hash('used 0.500' + chr(10))})"]
