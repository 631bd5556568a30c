"""The Chinese edition says one thing one way: the glossary's term for each concept
(docs/zh/glossary.md), in every translation and in README.zh.md.

Each rule names a wording the glossary rejects and the term to use instead; the test lists
every place that still uses it, with its file and the words around it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXTS = sorted((ROOT / "notebooks" / "zh" / "translations").rglob("*.md")) + [
    ROOT / "README.zh.md"]

#: (what is wrong, a pattern that finds it, what to write instead)
RULES: list[tuple[str, str, str]] = [
    ("内存 for GPU memory", r"(?<!CPU )(?<!主机)(?<!不占)内存(?!高效)",
     "显存 (内存高效内核 is a kernel's name; 内存 is memory in general: 不占内存, CPU 内存)"),
    ("an English plural after a number", r"\d+ tokens", "N 个 token"),
    ("快/慢/小/大 N 倍 (read as (1 + N) times by many)",
     r"(?<!放)(?:快|慢|小|大|少|多)了?\s*\$?\s*(?:[\d.]+|k|k/m|m)\s*\$?\s*(?:×|倍)(?!\s*\d)",
     "是……的 N 倍, or 只有……的 1/N"),
    ("梯度检查点", r"梯度检查点", "激活检查点"),
    ("答题卡 (a machine-read exam sheet)", r"答题卡", "答案要点"),
    ("走一步 for a step", r"走一步", "优化器更新一次 / 调度器步进一次"),
]


def _unquoted(text: str) -> str:
    """The text without quotations of the article (“…”, 《…》), where its words stay its own."""
    return re.sub(r"“[^”]*”|《[^》]*》", " ", text)


def _findings(pattern: str) -> list[str]:
    found = []
    for path in TEXTS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(pattern, text):
            line = text[text.rfind("\n", 0, match.start()) + 1:text.find("\n", match.end())]
            if not re.search(r"[\u4e00-\u9fff]", line):  # a paragraph kept in English
                continue
            where = text[max(0, match.start() - 15):match.end() + 10].replace("\n", " ")
            found.append(f"{path.relative_to(ROOT)}: …{where}…")
    return found


@pytest.mark.parametrize("rule", RULES, ids=[rule[0] for rule in RULES])
def test_the_glossary_term_is_used(rule: tuple[str, str, str]) -> None:
    what, pattern, instead = rule
    found = _findings(pattern)
    assert not found, f"{what}: write {instead}:\n" + "\n".join(found)


def test_the_articles_sub_batch_only_in_its_own_words() -> None:
    """子批次 is the article's word: in a quotation of it, or glossed as its word."""
    found = []
    for path in TEXTS:
        text = _unquoted(path.read_text(encoding="utf-8"))
        for match in re.finditer(r"子批次", text):
            after = text[match.end():match.end() + 12]
            if "叫法" not in after and "说法" not in after:
                where = text[max(0, match.start() - 15):match.end() + 10].replace("\n", " ")
                found.append(f"{path.relative_to(ROOT)}: …{where}…")
    assert not found, ("子批次 outside a quotation of the article: write 微批次:\n"
                       + "\n".join(found))


def test_the_rules_find_what_they_name() -> None:
    samples = {"内存 for GPU memory": "显存不够，内存也不够",
               "an English plural after a number": "512 tokens", "梯度检查点": "梯度检查点",
               "走一步 for a step": "调度器走一步", "答题卡 (a machine-read exam sheet)": "答题卡"}
    for what, pattern, _ in RULES:
        if what in samples:
            assert re.search(pattern, samples[what]), what
    factor = next(pattern for what, pattern, _ in RULES if what.startswith("快"))
    assert all(re.search(factor, s) for s in ("快 2.11×", "小 k×", "小 k/m 倍", "快 3 倍"))
    assert not re.search(factor, "是大批次的 2 倍") and not re.search(RULES[0][1], "内存高效内核")
    assert not re.search(factor, "批大小 32 × 8 = 256") and not re.search(factor, "放大 k 倍")
    assert _unquoted("文章说“子批次”") == "文章说 "
