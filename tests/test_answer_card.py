"""Notebook 00 opens with the article's three verdicts and the two-minute spoken answer, notebook 09
with the answer card, each in English and in Chinese: the same numbers, the same code, every
number printed by a cell of 00 or 09, the spoken answers short enough to say in two minutes, and
the card's loop the library's function, run by 09's cells and the program 09 launches (00 points
to where its source is shown, and prints none)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prose_numbers import NUMBER, numbers

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "00_the_article.ipynb"  # the verdicts, the spoken answer
CARD = ROOT / "notebooks" / "09_the_article_checked.ipynb"  # the card and its cells


def _cells(notebook: Path = NOTEBOOK) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _spoken() -> tuple[str, str]:
    """The English and the Chinese spoken answer: the first two cells after the title."""
    cells = _cells()
    english, chinese = _source(cells[1]), _source(cells[2])
    assert english.startswith("## The answer in two minutes"), english[:80]
    assert chinese.startswith("## 两分钟口述答案（中文）"), chinese[:80]
    return english, chinese


def _cards() -> tuple[str, str]:
    """The English and the Chinese card: 09's two cells after its title."""
    cells = _cells(CARD)
    english, chinese = _source(cells[1]), _source(cells[2])
    assert english.startswith("## The answer card"), english[:80]
    assert chinese.startswith("## 答案要点（中文）"), chinese[:80]
    return english, chinese


def _body(text: str) -> str:
    """What is said aloud: the text without its heading and its italic stage direction."""
    return "\n".join(line for line in text.splitlines()[1:] if not line.startswith("*What")
                     and not line.startswith("*一个"))


def _code_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


def _without_comments(code: str) -> list[str]:
    return [line.split("  #")[0].rstrip() for line in code.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _outputs(*notebooks: Path) -> str:
    texts = []
    for cell in [cell for notebook in notebooks for cell in _cells(notebook)]:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            texts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def test_09_opens_with_the_two_cards_and_they_state_the_same_numbers() -> None:
    english, chinese = _cards()
    assert numbers(english) == numbers(chinese), (
        f"only in English: {sorted(numbers(english) - numbers(chinese))}; "
        f"only in Chinese: {sorted(numbers(chinese) - numbers(english))}")
    assert {"325.5", "5.2", "1.97", "2048", "1.30", "0.14", "0.015"} <= numbers(english)


def test_every_number_on_the_card_is_printed_by_a_cell_of_09() -> None:
    english, _ = _cards()
    printed = {token.replace(",", "") for token in NUMBER.findall(_outputs(CARD))}
    missing = sorted(numbers(english) - printed)
    assert not missing, f"numbers on the card that no output of 09 prints: {missing}"


def test_the_spoken_answers_fit_two_minutes_and_state_the_same_printed_numbers() -> None:
    english, chinese = _spoken()
    words = len(re.findall(r"[\w'’.-]+", _body(english)))
    # a Chinese character or punctuation mark is one, a Latin word or a number is one, as read
    characters = len(re.findall(r"[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]|[A-Za-z0-9_.+×/-]+",
                                _body(chinese)))
    assert words <= 300, f"the English spoken answer is {words} words (at most 300)"
    assert characters <= 500, f"the Chinese spoken answer is {characters} characters (at most 500)"
    assert numbers(english) == numbers(chinese), (
        f"only in English: {sorted(numbers(english) - numbers(chinese))}; "
        f"only in Chinese: {sorted(numbers(chinese) - numbers(english))}")
    printed = {token.replace(",", "") for token in NUMBER.findall(_outputs(NOTEBOOK, CARD))}
    assert not sorted(numbers(english) - printed), sorted(numbers(english) - printed)
    assert numbers(english) <= numbers(_cards()[0]) | {"1"}  # the card's numbers, said aloud
    # the five parts in order, the window defined, 显存 said, why x world size
    heads = [line.split("**")[1] for line in _body(english).splitlines() if line.startswith("**")]
    assert heads == ["What it computes.", "The loop.", "What it saves and costs.",
                     "Two pitfalls.", "The article's case."]
    assert "*window*" in english and "显存" in english and "averages" in english
    assert "累积窗口" in chinese and "显存" in chinese and "取平均" in chinese


def _call(block: str) -> list[str]:
    """The lines of a card's block from its ``accumulate_window(`` call on, stripped."""
    lines = [line.strip() for line in _without_comments(block)]
    start = next(i for i, line in enumerate(lines) if "accumulate_window(" in line)
    return lines[start:]


def test_both_cards_show_the_same_code_and_it_is_the_code_that_runs() -> None:
    english, chinese = _cards()
    blocks = _code_blocks(english)
    assert len(blocks) == 3, "the library's loop, its fp16 call and the article's loop"
    assert [_without_comments(b) for b in blocks] == [
        _without_comments(b) for b in _code_blocks(chinese)]
    code = [_source(c) for c in _cells(CARD) if c["cell_type"] == "code"]
    run = "\n".join(line.strip() for cell in code for line in _without_comments(cell))
    for block in blocks[:2]:  # each call, as the card writes it, is a call a cell of 09 makes
        assert "\n".join(_call(block)) in run, f"no cell of 09 calls {_call(block)}"
    assert "autocast_dtype=torch.float16" in blocks[1] and "scaler=scaler" in blocks[1]
    # the program 09 writes and launches imports the loop; no copy of it is defined anywhere
    written = next(c for c in code if c.startswith("%%writefile"))
    assert "from gradaccum_lib.accumulation import accumulate_window" in written
    everywhere = code + [_source(c) for c in _cells() if c["cell_type"] == "code"]
    assert not [c for c in everywhere if "def train_window" in c]


def test_00_states_the_three_verdicts_first_and_prints_no_library_source() -> None:
    """Issue 49: 00's first cell states the article's three verdicts (the figures 00 computes)
    before anything else, and 00 points to 02 for the loop's source instead of printing it."""
    cells = _cells()
    title = _source(cells[0])
    verdicts = [line for line in title.splitlines() if line.startswith("- **")]
    assert len(verdicts) == 3 and title.index(verdicts[0]) < title.index("interview question")
    for verdict, number in zip(verdicts, ("1/k", "325.5M", "2048"), strict=True):
        assert number in verdict, verdict
    assert all("09_the_article_checked.ipynb#" in title.split(v)[1].split("\n- ")[0]
               for v in verdicts)  # each says where it is proven
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    assert not [c for c in code if "getsource" in c], "00 prints a source: 02 shows the loop"
    loop = next(_source(c) for c in cells if _source(c).startswith("## The loop"))
    assert "02_single_device.ipynb" in loop


def test_the_number_scanner() -> None:
    card = ("325.5M, 8 × V100 16 GB, 1e-12, 1,000 notes, 0.015 s, [02 §5d](02_x.ipynb#5d.-A),"
            " `k = 9`\n```python\nx = 7\n```")
    assert numbers(card) == {"325.5", "8", "16", "1e-12", "1000", "0.015"}
