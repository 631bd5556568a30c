"""The EMR corpus (deterministic, shipped byte for byte), the tokenizer and the tiny BERT."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

from gradaccum_lib.losses import bert_classification_loss, bert_masked_lm_loss
from gradaccum_lib.workloads.data import _DATA_DIR as DATA_DIR
from gradaccum_lib.workloads.data import (
    LABELS,
    corpus_statistics,
    encode_records,
    load_emr_split,
    load_tokenizer,
    mask_tokens,
)
from gradaccum_lib.workloads.models import make_tiny_bert, make_tiny_causal_lm

corpus = load_script("scripts/make_emr_corpus.py")  # how data/ was written
_DIAGNOSES, _build_vocabulary = corpus._DIAGNOSES, corpus._build_vocabulary
_generate_emr_corpus, _write_emr_corpus = corpus._generate_emr_corpus, corpus._write_emr_corpus


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_generator_is_deterministic_and_seed_dependent():
    assert _generate_emr_corpus(50, seed=3) == _generate_emr_corpus(50, seed=3)
    assert _generate_emr_corpus(50, seed=3) != _generate_emr_corpus(50, seed=4)


def test_corpus_distributions_imbalance_lengths_sections_negations():
    records = _generate_emr_corpus(2000, seed=7)
    stats = corpus_statistics(records)
    counts = stats["label_counts"]
    assert set(counts) == set(LABELS) and all(c > 0 for c in counts.values())
    assert counts["高血压"] > 2 * counts["泌尿系感染"]  # imbalanced as the priors say
    assert stats["length_min"] < 30 and stats["length_max"] > 250  # tens to hundreds
    texts = [r["text"] for r in records]
    for section in ("主诉", "现病史", "既往史", "体格检查", "辅助检查"):
        assert sum(section in t for t in texts) > 100
    assert sum("否认" in t for t in texts) > 500 and sum("无" in t for t in texts) > 1000
    assert all(r["diagnosis"] == LABELS[r["label"]] for r in records)
    assert len(_DIAGNOSES) == 10
    assert tuple(entry[0] for entry in _DIAGNOSES) == LABELS  # the package reads labels by index


def test_shipped_data_is_exactly_what_the_generator_writes(tmp_path):
    written = _write_emr_corpus(tmp_path)
    for path in written.values():
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), path.name


def test_load_emr_split_and_its_errors(tmp_path):
    train = load_emr_split("train")
    assert len(train) == 2000 and {"id", "text", "label", "diagnosis"} <= set(train[0])
    with pytest.raises(ValueError, match="split must be one of"):
        load_emr_split("dev")
    with pytest.raises(FileNotFoundError, match="regenerate it with"):
        load_emr_split("test", directory=tmp_path)
    with pytest.raises(ValueError, match="records is empty"):
        corpus_statistics([])


def test_vocabulary_has_specials_characters_and_continuations():
    vocabulary = _build_vocabulary(["头痛 36.5℃", "BP"])
    assert vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "头" in vocabulary and "##5" in vocabulary and "##℃" in vocabulary
    assert "##头" not in vocabulary  # CJK characters are split, never continued


def test_tokenizer_round_trips_real_text_without_unk(tokenizer):
    for split in ("train", "validation", "test"):
        for record in load_emr_split(split):
            tokens = tokenizer.tokenize(record["text"])
            assert "[UNK]" not in tokens
            rebuilt = "".join(t[2:] if t.startswith("##") else t for t in tokens)
            assert rebuilt == record["text"].replace(" ", "")


def test_load_tokenizer_reports_a_missing_vocabulary(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocabulary .* is missing"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_encode_records_pads_and_truncates_to_a_fixed_width(tokenizer):
    records = load_emr_split("validation")[:8]
    batch = encode_records(records, tokenizer, max_length=32)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (8, 32)
    assert batch["labels"].tolist() == [r["label"] for r in records]
    assert bool((batch["input_ids"][:, 0] == tokenizer.cls_token_id).all())
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        encode_records(records, tokenizer, max_length=0)


def test_tiny_bert_builds_offline_and_is_seeded(monkeypatch, tokenizer):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a = make_tiny_bert(len(tokenizer), len(LABELS), hidden_size=16, num_heads=2, seed=1)
    b = make_tiny_bert(len(tokenizer), len(LABELS), hidden_size=16, num_heads=2, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.config.num_labels == 10 and a.config.hidden_dropout_prob == 0.0
    mlm = make_tiny_bert(len(tokenizer), 2, hidden_size=16, masked_lm=True)
    assert type(mlm).__name__ == "BertForMaskedLM"
    with pytest.raises(ValueError, match=r"hidden_size \(10\) must be divisible by num_heads"):
        make_tiny_bert(100, 2, hidden_size=10, num_heads=3)


def test_bert_losses_are_sums_with_their_item_counts(tokenizer):
    batch = encode_records(load_emr_split("validation")[:6], tokenizer, max_length=24)
    model = make_tiny_bert(len(tokenizer), len(LABELS), hidden_size=16, dtype=torch.float64)
    summed, count = bert_classification_loss(model, batch)
    assert int(count) == 6
    torch.testing.assert_close(summed / count, model(**batch).loss)
    mlm = make_tiny_bert(len(tokenizer), 2, hidden_size=16, masked_lm=True, dtype=torch.float64)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1:4] = batch["input_ids"][:, 1:4]
    masked = {**batch, "labels": labels}
    summed, count = bert_masked_lm_loss(mlm, masked)
    assert int(count) == 18
    torch.testing.assert_close(summed / count, mlm(**masked).loss)


def test_mask_tokens_masks_only_real_non_special_tokens(tokenizer):
    batch = encode_records(load_emr_split("validation")[:16], tokenizer, max_length=48)
    masked = mask_tokens(batch, mask_token_id=tokenizer.mask_token_id,
                         special_token_ids=tokenizer.all_special_ids, probability=0.15, seed=1)
    chosen = masked["labels"] != -100
    assert bool((masked["input_ids"][chosen] == tokenizer.mask_token_id).all())
    assert torch.equal(masked["labels"][chosen], batch["input_ids"][chosen])
    assert bool((batch["attention_mask"][chosen] == 1).all())
    specials = torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids))
    assert not bool((chosen & specials).any())
    assert bool((chosen.sum(dim=1) >= 1).all())  # at least one per note
    share = chosen.sum() / (batch["attention_mask"].bool() & ~specials).sum()
    assert 0.1 < share.item() < 0.3
    again = mask_tokens(batch, mask_token_id=tokenizer.mask_token_id,
                        special_token_ids=tokenizer.all_special_ids, probability=0.15, seed=1)
    assert torch.equal(again["input_ids"], masked["input_ids"])
    with pytest.raises(ValueError, match=r"probability must be in \(0, 1\); got 1.0"):
        mask_tokens(batch, mask_token_id=4, special_token_ids=[], probability=1.0)


def test_tiny_causal_lm_honours_num_items_in_batch(tokenizer):
    model = make_tiny_causal_lm(len(tokenizer), hidden_size=16, max_length=32,
                                dtype=torch.float64)
    batch = encode_records(load_emr_split("validation")[:4], tokenizer, max_length=32)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    mean = model(**{**batch, "labels": labels}).loss
    summed_over_ten = model(**{**batch, "labels": labels}, num_items_in_batch=10).loss
    predicted = int((labels[:, 1:] != -100).sum())
    torch.testing.assert_close(summed_over_ten * 10, mean * predicted, rtol=1e-6, atol=0)


def test_load_emr_split_skips_blank_lines_including_a_trailing_one(tmp_path):
    lines = (DATA_DIR / "emr_test.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "emr_test.jsonl").write_text(
        "\n" + lines[0] + "\n  \n" + "\n".join(lines[1:]) + "\n\n", encoding="utf-8")
    records = load_emr_split("test", directory=tmp_path)
    assert records == load_emr_split("test")[:3]


def test_load_emr_split_names_the_file_and_the_line_of_a_bad_record(tmp_path):
    lines = (DATA_DIR / "emr_test.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    bad = lines[1].replace('"label": ', '"label": 9') if '"label": ' in lines[1] else lines[1]
    (tmp_path / "emr_test.jsonl").write_text(f"{lines[0]}\n\n{bad}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'emr_test.jsonl'}, line 3: 'label'"):
        load_emr_split("test", directory=tmp_path)


def test_shipped_vocabulary_passes_the_checks_and_a_broken_one_fails_at_load(tmp_path):
    tokens = (DATA_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "vocab.txt").write_text("\n".join(t for t in tokens if t != "[MASK]") + "\n",
                                        encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt lacks the special tokens \['\[MASK\]'\]"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_mask_tokens_leaves_a_boolean_attention_mask_untouched(tokenizer):
    batch = encode_records(load_emr_split("validation")[:4], tokenizer, max_length=24)
    batch = {**batch, "attention_mask": batch["attention_mask"].bool()}
    before = batch["attention_mask"].clone()
    mask_tokens(batch, mask_token_id=tokenizer.mask_token_id,
                special_token_ids=tokenizer.all_special_ids, seed=0)
    assert torch.equal(batch["attention_mask"], before)
