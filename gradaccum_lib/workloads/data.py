"""Data for the series: the shipped EMR corpus (its labels, loading, statistics; written by
``scripts/make_emr_corpus.py``), the tokenizer over ``data/vocab.txt``, encoding and
masking, small synthetic sets for the math notebooks, and padding the Chinese labels to a
display width for a table.

Everything random is generated from an explicit seed through a private ``torch.Generator``,
so the global random state is never touched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gradaccum_lib.runtime import (
    check_bool,
    check_int,
    check_number,
    check_positive_int,
    check_seed,
    is_int,
)

if TYPE_CHECKING:  # transformers is imported only where a tokenizer is built
    from transformers import PreTrainedTokenizerBase


__all__ = [
    "corpus_statistics",
    "encode_records",
    "IGNORE_INDEX",
    "LABELS",
    "load_emr_split",
    "load_tokenizer",
    "make_toy_classification",
    "make_toy_token_batch",
    "mask_tokens",
]


#: the corpus's diagnoses: a record's ``label`` indexes them (scripts/make_emr_corpus.py
#: generates its notes from the same table, in this order)
LABELS: tuple[str, ...] = (
    "高血压", "2型糖尿病", "社区获得性肺炎", "冠心病", "慢性胃炎", "脑梗死", "慢性阻塞性肺疾病",
    "急性阑尾炎", "慢性心力衰竭", "泌尿系感染",
)
_SPLITS = ("train", "validation", "test")
_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
_REGENERATE = "regenerate it with `python scripts/make_emr_corpus.py`"

_PAD_ID = 0  # input id of padding tokens

IGNORE_INDEX = -100  # label of padding tokens: they count as no item


def make_toy_classification(
    num_samples: int,
    input_dim: int,
    num_classes: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """Return ``(inputs, labels)``: Gaussian inputs, labels from a random linear teacher plus
    noise (learnable, not separable).
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("input_dim", input_dim)
    check_positive_int("num_classes", num_classes)
    check_seed(seed)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype; got {dtype!r}")
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, input_dim, generator=generator, dtype=torch.float64)
    teacher = torch.randn(input_dim, num_classes, generator=generator, dtype=torch.float64)
    noise = torch.randn(num_samples, num_classes, generator=generator, dtype=torch.float64)
    labels = (inputs @ teacher + noise).argmax(dim=1)
    return inputs.to(dtype), labels


def make_toy_token_batch(
    num_sequences: int,
    max_length: int,
    vocab_size: int,
    num_tags: int,
    *,
    min_length: int = 1,
    sort_by_length: bool = False,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Return ``{"input_ids", "labels", "attention_mask"}`` for padded sequences of random
    length in [min_length, max_length]; padding has id ``_PAD_ID`` and label ``IGNORE_INDEX``.

    ``sort_by_length`` orders sequences longest first, as length-grouped samplers do, which
    makes consecutive micro-batches hold very different numbers of real tokens.
    """
    check_positive_int("num_sequences", num_sequences)
    check_positive_int("max_length", max_length)
    check_positive_int("num_tags", num_tags)
    if not is_int(vocab_size) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (id 0 is padding); got {vocab_size!r}")
    if not is_int(min_length) or not 1 <= min_length <= max_length:
        raise ValueError(f"min_length must be an int in [1, max_length={max_length}]; "
                         f"got {min_length!r}")
    check_bool("sort_by_length", sort_by_length)
    check_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (num_sequences,), generator=generator)
    if sort_by_length:
        lengths = lengths.sort(descending=True).values
    input_ids = torch.randint(1, vocab_size, (num_sequences, max_length), generator=generator)
    # the tag of a token depends on its id and its left neighbour: learnable, not trivial
    previous = torch.roll(input_ids, shifts=1, dims=1)
    labels = (input_ids * 7 + previous * 3) % num_tags
    attention_mask = torch.arange(max_length)[None, :] < lengths[:, None]
    input_ids = input_ids.masked_fill(~attention_mask, _PAD_ID)
    labels = labels.masked_fill(~attention_mask, IGNORE_INDEX)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": attention_mask.long(),
    }


def _check_record(record: object, where: str) -> Mapping[str, object]:
    """A record with a str ``text`` and an int ``label`` in range; errors start with ``where``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a record must be a JSON object with 'text' and 'label'; "
                         f"got {type(record).__name__}")
    text, label = record.get("text"), record.get("label")
    if not isinstance(text, str):
        raise ValueError(f"{where}: 'text' must be a string; got "
                         f"{'nothing (no text key)' if 'text' not in record else repr(text)}")
    if not is_int(label) or not 0 <= label < len(LABELS):
        shown = "nothing (no label key)" if "label" not in record else repr(label)
        raise ValueError(f"{where}: 'label' must be an int in [0, {len(LABELS) - 1}] (an index "
                         f"into LABELS); got {shown}")
    diagnosis = record.get("diagnosis", LABELS[label])
    if diagnosis != LABELS[label]:
        raise ValueError(f"{where}: 'diagnosis' {diagnosis!r} does not match label {label} "
                         f"({LABELS[label]!r})")
    return record


def _directory(directory: object) -> Path:
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path (str or Path); got {type(directory).__name__}")
    path = Path(directory)
    if not path.exists():
        raise FileNotFoundError(f"directory {path} does not exist; give the folder holding the "
                                "emr_*.jsonl files (default: the shipped data/)")
    if not path.is_dir():
        raise NotADirectoryError(f"directory {path} is not a directory")
    return path


def load_emr_split(split: str, directory: str | Path = _DATA_DIR) -> list[dict[str, object]]:
    """Return the records of one shipped split: ``train``, ``validation`` or ``test``.

    Blank lines are skipped; anything else that is not a record (a JSON object with a str
    ``text`` and an int ``label`` in [0, len(LABELS))) is refused naming the file and its
    1-based line. ``directory`` is a corpus written by ``python scripts/make_emr_corpus.py
    DIRECTORY`` (the tests read damaged copies there).
    """
    if not isinstance(split, str) or split not in _SPLITS:
        raise ValueError(f"split must be one of {list(_SPLITS)}; got {split!r}")
    path = _directory(directory) / f"emr_{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; {_REGENERATE}")
    records = []
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}, line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{where}: not UTF-8 ({error.reason} at byte "
                                 f"{error.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg} at column "
                                 f"{error.colno})") from None
            records.append(dict(_check_record(record, where)))
    if not records:
        raise ValueError(f"{path} holds no records; {_REGENERATE}")
    return records


def corpus_statistics(records: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Return counts per diagnosis and character-length quantiles of ``records``."""
    if not records:
        raise ValueError("records is empty")
    lengths = sorted(len(str(r["text"])) for r in records)

    def quantile(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))]

    counts = {label: 0 for label in LABELS}
    for record in records:
        counts[str(record["diagnosis"])] += 1
    return {
        "records": len(records),
        "label_counts": counts,
        "length_min": lengths[0],
        "length_median": quantile(0.5),
        "length_p90": quantile(0.9),
        "length_max": lengths[-1],
    }


def _check_vocabulary(path: Path) -> None:
    """Refuse a vocabulary without the special tokens, with [PAD] not first, with blank or
    duplicate lines: naming the file (and line)."""
    try:
        tokens = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise ValueError(f"vocabulary {path} is not UTF-8 ({error.reason})") from None
    if tokens and tokens[-1] == "":
        tokens.pop()  # the newline that ends the last line
    missing = [token for token in _SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise ValueError(f"vocabulary {path} lacks the special tokens {missing}; it needs "
                         f"{list(_SPECIAL_TOKENS)}, one per line, [PAD] on the first line")
    if tokens[_PAD_ID] != "[PAD]":
        raise ValueError(f"vocabulary {path}: line 1 must be [PAD] (id {_PAD_ID} is padding "
                         f"everywhere); got {tokens[0]!r}")
    seen: dict[str, int] = {}
    for number, token in enumerate(tokens, start=1):
        if not token.strip():
            raise ValueError(f"vocabulary {path}, line {number}: blank token")
        if token in seen:
            raise ValueError(f"vocabulary {path}, line {number}: {token!r} repeats line "
                             f"{seen[token]}")
        seen[token] = number


def load_tokenizer(vocab_path: str | Path = _DATA_DIR / "vocab.txt") -> PreTrainedTokenizerBase:
    """Return a BERT tokenizer over the shipped character vocabulary (no download).

    transformers 5 pitfall: ``BertTokenizerFast(vocab_file=...)`` silently maps every character
    to [UNK]; ``BertTokenizer(vocab=path)`` loads the file. Case is kept (CT, BNP, mmHg).
    The file is checked first: one token per line, [PAD] first, every special token present
    (the tests check damaged copies through ``vocab_path``).
    """
    from transformers import BertTokenizer

    if not isinstance(vocab_path, (str, os.PathLike)):
        raise TypeError(f"vocab_path must be a path (str or Path); got "
                        f"{type(vocab_path).__name__}")
    path = Path(vocab_path)
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary {path} is missing")
    _check_vocabulary(path)
    return BertTokenizer(vocab=str(path), do_lower_case=False)


def encode_records(
    records: Sequence[Mapping[str, object]], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, Tensor]:
    """Return ``{"input_ids", "attention_mask", "labels"}`` for ``records``, each note
    truncated and padded to ``max_length`` tokens (fixed padding: micro-batches are views).
    ``max_length`` is at least 3: [CLS], one token of the note, [SEP].
    """
    if not is_int(max_length) or max_length < 3:
        raise ValueError(f"max_length must be a positive int >= 3 ([CLS], a token, [SEP]); "
                         f"got {max_length!r}")
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
        raise TypeError(f"records must be a list of records (dicts with 'text' and 'label'); "
                        f"got {type(records).__name__}")
    if not records:
        raise ValueError("records is empty; it needs at least one record")
    for index, record in enumerate(records):
        _check_record(record, f"records[{index}]")
    if not callable(tokenizer) or getattr(tokenizer, "pad_token_id", None) is None:
        raise TypeError(f"tokenizer must be a transformers tokenizer with a pad token (e.g. "
                        f"load_tokenizer()); got {type(tokenizer).__name__}")
    encoded = tokenizer([r["text"] for r in records], padding="max_length",
                        truncation=True, max_length=max_length, return_tensors="pt",
                        return_token_type_ids=False)
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": torch.tensor([r["label"] for r in records]),
    }


def mask_tokens(
    batch: Mapping[str, Tensor],
    *,
    mask_token_id: int,
    special_token_ids: Iterable[int],
    probability: float = 0.15,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Return a masked-LM copy of ``batch``: each real, non-special token is replaced by
    ``mask_token_id`` with ``probability`` (its label is the original id); every other
    position is labelled ``IGNORE_INDEX``. At least one token per note is masked.
    """
    check_number("probability", probability, low=0, high=1, low_open=True, high_open=True)
    check_int("mask_token_id", mask_token_id, low=0)
    check_seed(seed)
    if isinstance(special_token_ids, (str, bytes)) or not isinstance(special_token_ids, Iterable):
        raise TypeError(f"special_token_ids must be an iterable of ints (e.g. "
                        f"tokenizer.all_special_ids); got {type(special_token_ids).__name__}")
    special_token_ids = list(special_token_ids)
    for index, special in enumerate(special_token_ids):
        check_int(f"special_token_ids[{index}]", special, low=0)
    if not isinstance(batch, Mapping) or not all(
            isinstance(batch.get(key), Tensor) for key in ("input_ids", "attention_mask")):
        raise TypeError("batch must be a dict holding Tensors 'input_ids' and 'attention_mask' "
                        f"(from encode_records); got {type(batch).__name__}"
                        + (f" with keys {list(batch)}" if isinstance(batch, Mapping) else ""))
    input_ids = batch["input_ids"]
    if input_ids.dim() != 2 or batch["attention_mask"].shape != input_ids.shape:
        raise ValueError("batch['input_ids'] and batch['attention_mask'] must be 2-dim and of "
                         f"the same shape; got {tuple(input_ids.shape)} and "
                         f"{tuple(batch['attention_mask'].shape)}")
    candidates = batch["attention_mask"].to(torch.bool, copy=True)  # never the caller's mask
    for special in special_token_ids:
        candidates &= input_ids != special
    generator = torch.Generator().manual_seed(seed)
    draws = torch.rand(input_ids.shape, generator=generator)
    chosen = candidates & (draws < probability)
    # guarantee one masked token per note that has any candidate: its lowest draw
    lowest = torch.where(candidates, draws, torch.full_like(draws, 2.0)).argmin(dim=1)
    has_candidate = candidates.any(dim=1)
    chosen[has_candidate, lowest[has_candidate]] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return {**batch, "input_ids": input_ids.masked_fill(chosen, mask_token_id), "labels": labels}
