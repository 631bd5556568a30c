"""The numbers a piece of prose states, for the tests that hold two texts to the same numbers
(00's cards and spoken answers, the Chinese twins' translations)."""

from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:e-\d+)?(?![\d])")  # 325.5M: 325.5


def numbers(text: str) -> set[str]:
    """The numbers ``text`` states in its prose: code, link targets and heading anchors left
    out (code is compared on its own); '1,000' and '1000' are one number."""
    prose = re.sub(r"```.*?```", " ", text, flags=re.S)
    prose = re.sub(r"`[^`]*`", " ", prose)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)
    prose = re.sub(r"\[(\d\d|§)[^\]]*\]", " ", prose)  # the cross-references' labels: 02 §5d
    return {token.replace(",", "") for token in NUMBER.findall(prose)}
