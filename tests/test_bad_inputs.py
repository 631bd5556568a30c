"""Every bad input gets a clear error: one table row per (call, exception type, message).

Each row's regex checks that the message names the argument AND the value or the accepted
range.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import torch
from script_loader import load_script
from torch import nn

from gradaccum_course import widgets
from gradaccum_course.programs.ddp import parse_arguments  # the DDP program's  # noqa: E402
from gradaccum_lib import (
    NonFiniteLossError,
    accumulated_gradients,
    equivalence,
    full_batch_gradients,
    gradients,
    losses,
    max_gradient_difference,
    runtime,
    split_into_micro_batches,
)
from gradaccum_lib import batches as batches_module
from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.distributed import agree_on_windows
from gradaccum_lib.losses import sample_classification_loss as LOSS
from gradaccum_lib.measure import memory, metrics, noise, planning
from gradaccum_lib.workloads import data, models
from recipes.emr_classification.checkpoints import (
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)

make_emr_corpus = load_script("scripts/make_emr_corpus.py")
gpu_check = load_script("scripts/gpu_check.py")

INPUTS, LABELS = data.make_toy_classification(8, 6, 3, seed=0)
BATCH = (INPUTS, LABELS)
PARTS = split_into_micro_batches(BATCH, accumulation_steps=2)
GRADS = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
STEP_TIME = planning.StepTimeModel(0.002, 0.0001)
ACTIVATIONS = planning._TransformerActivations(100.0, 8.0, 50.0, 30.0, 2.0)
SHAPE = planning.TransformerShape(1000, 100, ACTIVATIONS)
DDP_MODEL = planning.DdpStepModel(0.01, 0.005)
RECORD = {"id": "x", "text": "主诉：头痛1天。", "label": 0, "diagnosis": data.LABELS[0]}
MASK_BATCH = {"input_ids": torch.tensor([[2, 7, 8, 3]]), "attention_mask": torch.ones(1, 4)}
DDP_REQUIRED = ["--accumulation-steps", "2", "--micro-batch-size", "4", "--steps", "2",
                "--json", "out.json"]


def _model():
    return models.make_mlp(6, 8, 3, seed=0)


@functools.cache
def _tokenizer():
    return data.load_tokenizer()


def _counted(count_for_step):
    """A loss function whose num_items is ``count_for_step(micro_step, true_count)``."""
    calls = []

    def loss_fn(model, batch):
        summed, count = LOSS(model, batch)
        calls.append(None)
        return summed, count_for_step(len(calls) - 1, count)
    return loss_fn


def _nan_gradient_loss(model, batch):  # finite loss (0), NaN gradient: d sqrt(u)/du at 0
    return torch.sqrt((model(batch[0]) ** 2).sum() * 0.0), len(batch[0])


def _fp16_overflow():
    """An fp16 model whose MEAN gradient (about -8e4) does not fit in float16."""
    layer = nn.Linear(4, 1).half()
    x, y = torch.ones(16, 4).half(), torch.full((16, 1), 40000.0)

    def loss_fn(model, batch):
        return ((model(batch[0]).float() - batch[1]) ** 2).sum(), len(batch[0])
    return accumulated_gradients(layer, loss_fn, split_into_micro_batches((x, y),
                                                                         accumulation_steps=2))


def _jsonl(tmp: Path, *lines: str | bytes, split: str = "train") -> Path:
    """A corpus directory whose ``emr_{split}.jsonl`` holds ``lines`` (one per line)."""
    body = b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines)
    (tmp / f"emr_{split}.jsonl").write_bytes(body)
    return tmp


def _record(**changes) -> str:
    record = {**RECORD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...}, ensure_ascii=False)


def _folder_with(tmp: Path, name: str, text: str) -> Path:
    """A folder holding one file of the user's."""
    folder = tmp / "folder"
    folder.mkdir()
    (folder / name).write_text(text)
    return folder


def _vocab(tmp: Path, tokens: list[str]) -> Path:
    path = tmp / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


GOOD_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]


def _window(window=PARTS, loss_fn=LOSS, model=None, optimizer=None, **kwargs):
    """One accumulate_window of a fresh MLP (or ``model``) with AdamW; ``kwargs`` go to it."""
    model = _model() if model is None else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2) if optimizer is None else optimizer
    return accumulate_window(model, optimizer, window, loss_fn, **kwargs)


def _checkpoint(tmp: Path, damage=None) -> Path:
    """A checkpoint of a model and its optimizer after one window, optionally damaged."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    accumulate_window(model, optimizer, PARTS, LOSS)
    path = tmp / "c.pt"
    write_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    if damage is not None:
        path.write_bytes(damage(path.read_bytes()))
    return path


def _flip_inside_tensor_data(data_bytes: bytes) -> bytes:
    flipped = bytearray(data_bytes)
    flipped[len(flipped) // 2] ^= 0x01
    return bytes(flipped)


def _corpus_dir_with_other_files(tmp: Path) -> list[str]:
    (tmp / "notes.txt").write_text("mine")
    return [str(tmp)]


def row(case_id, call, error, pattern, *marks):
    return pytest.param(call, error, pattern, id=case_id, marks=marks)


V, T = ValueError, TypeError
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")

CASES = [
    # ---- public contract: split_into_micro_batches
    row("split-k-0", lambda tmp: split_into_micro_batches(INPUTS, accumulation_steps=0), V,
        r"accumulation_steps must be a positive int no larger than the batch \(8\); got 0"),
    row("split-k-too-large", lambda tmp: split_into_micro_batches(INPUTS, accumulation_steps=9),
        V, r"accumulation_steps .* no larger than the batch \(8\); got 9"),
    row("split-k-float", lambda tmp: split_into_micro_batches(INPUTS, accumulation_steps=2.0),
        T, r"accumulation_steps must be a positive int .* got 2\.0 of type float"),
    row("split-k-bool", lambda tmp: split_into_micro_batches(INPUTS, accumulation_steps=True),
        T, r"accumulation_steps must be a positive int .* got True of type bool"),
    row("split-size-0", lambda tmp: split_into_micro_batches(INPUTS, micro_batch_size=0), V,
        r"micro_batch_size must be a positive int; got 0"),
    row("split-size-str", lambda tmp: split_into_micro_batches(INPUTS, micro_batch_size="4"),
        T, r"micro_batch_size must be a positive int; got '4' of type str"),
    row("split-both", lambda tmp: split_into_micro_batches(
        INPUTS, accumulation_steps=2, micro_batch_size=4), V,
        r"exactly one of accumulation_steps or micro_batch_size; got accumulation_steps=2, "
        r"micro_batch_size=4"),
    row("split-neither", lambda tmp: split_into_micro_batches(INPUTS), V,
        r"exactly one of .* got accumulation_steps=None, micro_batch_size=None"),
    row("split-dim0-mismatch", lambda tmp: split_into_micro_batches(
        (torch.zeros(4), torch.zeros(5)), accumulation_steps=2), V,
        r"disagree on dim 0 \(batch\[0\]: 4, batch\[1\]: 5\)"),
    row("split-empty-batch", lambda tmp: split_into_micro_batches(
        torch.zeros(0, 3), accumulation_steps=1), V, r"batch is empty \(dim 0 has size 0\)"),
    row("split-str-batch", lambda tmp: split_into_micro_batches("abc", accumulation_steps=1), T,
        r"batch must be a Tensor, a tuple/list of Tensors or a dict of Tensors; got str"),
    row("split-0-dim", lambda tmp: split_into_micro_batches(
        torch.tensor(1.0), accumulation_steps=1), V, r"batch is a 0-dim tensor"),
    row("split-non-tensor-item", lambda tmp: split_into_micro_batches(
        [torch.zeros(2), [1, 2]], accumulation_steps=1), T,
        r"batch\[1\] must be a Tensor; got list"),
    row("split-empty-dict", lambda tmp: split_into_micro_batches({}, accumulation_steps=1), V,
        r"batch must hold at least one Tensor; got an empty container"),
    # ---- public contract: accumulated_gradients / full_batch_gradients
    row("accumulated-bare-tensor", lambda tmp: accumulated_gradients(
        _model(), lambda m, b: (m(b).sum(), len(b)), INPUTS), T,
        r"micro_batches must be a list .*split_into_micro_batches.* got Tensor"),
    row("accumulated-dict", lambda tmp: accumulated_gradients(
        _model(), LOSS, {"x": INPUTS}), T, r"micro_batches must be a list .* got dict"),
    row("accumulated-int", lambda tmp: accumulated_gradients(_model(), LOSS, 3), T,
        r"micro_batches must be a list .* got int"),
    row("accumulated-empty", lambda tmp: accumulated_gradients(_model(), LOSS, []), V,
        r"micro_batches is empty; it needs at least one micro-batch"),
    row("accumulated-loss-fn-int", lambda tmp: accumulated_gradients(_model(), 3, PARTS), T,
        r"loss_fn must be callable as loss_fn\(model, batch\) .* got int"),
    row("accumulated-model-function", lambda tmp: accumulated_gradients(
        lambda x: x, LOSS, PARTS), T, r"model must be a torch\.nn\.Module; got function"),
    row("accumulated-count-negative", lambda tmp: accumulated_gradients(
        _model(), _counted(lambda step, n: -1 if step == 1 else n), PARTS), V,
        r"num_items must be finite and >= 0; got -1\.0 at micro-batch 1"),
    row("accumulated-count-nan", lambda tmp: accumulated_gradients(
        _model(), _counted(lambda step, n: float("nan")), PARTS), V,
        r"num_items must be finite and >= 0; got nan at micro-batch 0"),
    row("accumulated-count-str", lambda tmp: accumulated_gradients(
        _model(), _counted(lambda step, n: "4"), PARTS), T,
        r"num_items must be a number .* got str at micro-batch 0"),
    row("accumulated-no-items", lambda tmp: accumulated_gradients(
        _model(), _counted(lambda step, n: 0), PARTS), V,
        r"window of 2 micro-batches covers no items"),
    row("accumulated-nan-loss", lambda tmp: accumulated_gradients(
        _model(), LOSS, [PARTS[0], (PARTS[1][0] * float("nan"), PARTS[1][1])]),
        NonFiniteLossError, r"micro-batch 1 produced a non-finite loss \(nan\)"),
    row("accumulated-loss-not-tuple", lambda tmp: accumulated_gradients(
        _model(), lambda m, b: m(b[0]).sum(), PARTS), T,
        r"loss_fn must return a tuple \(summed_loss, num_items\); got Tensor at micro-batch 0"),
    row("accumulated-loss-not-0-dim", lambda tmp: accumulated_gradients(
        _model(), lambda m, b: (m(b[0]), 4), PARTS), T,
        r"summed_loss must be a 0-dim Tensor .* shape \(4, 3\) at micro-batch 0"),
    row("accumulated-detached", lambda tmp: accumulated_gradients(
        _model(), lambda m, b: (m(b[0]).sum().detach(), 4), PARTS), V,
        r"loss of micro-batch 0 does not require grad"),
    row("accumulated-fp16-mean-overflow", lambda tmp: _fp16_overflow(), V,
        r"mean gradient of parameter 'weight' does not fit in torch\.float16 \(its largest "
        r"entry is 8e\+04\)"),
    row("accumulated-fp16-nan-gradient", lambda tmp: accumulated_gradients(
        models.make_mlp(6, 8, 3, dtype=torch.float16), _nan_gradient_loss,
        split_into_micro_batches((INPUTS.half(), LABELS), accumulation_steps=2)), V,
        r"gradient of parameter '0\.weight' is not finite \(NaN or inf\) after micro-batch 0"),
    row("accumulated-nan-gradient", lambda tmp: accumulated_gradients(
        _model(), _nan_gradient_loss, PARTS), V,
        r"gradient of parameter '0\.weight' is not finite .* after micro-batch 0"),
    row("full-batch-no-items", lambda tmp: full_batch_gradients(
        _model(), lambda m, b: (m(b[0]).sum(), 0), BATCH), V,
        r"batch covers no items \(loss_fn returned num_items == 0\)"),
    row("full-batch-loss-fn-none", lambda tmp: full_batch_gradients(_model(), None, BATCH), T,
        r"loss_fn must be callable .* got NoneType"),
    row("full-batch-nan-gradient", lambda tmp: full_batch_gradients(
        _model(), _nan_gradient_loss, BATCH), V,
        r"gradient of parameter '0\.weight' is not finite .* after micro-batch 0"),
    # ---- public contract: max_gradient_difference
    row("difference-list", lambda tmp: max_gradient_difference([1.0], GRADS), T,
        r"grads_a must be a dict of parameter name -> Tensor .* got list"),
    row("difference-empty", lambda tmp: max_gradient_difference(GRADS, {}), V,
        r"grads_b is empty"),
    row("difference-other-names", lambda tmp: max_gradient_difference(
        GRADS, {"w": GRADS["w"]}), V, r"only in grads_a: \['b'\], only in grads_b: \[\]"),
    row("difference-shapes", lambda tmp: max_gradient_difference(
        GRADS, {"w": torch.zeros(3), "b": torch.zeros(1)}), V,
        r"gradient 'w' has shape \(2,\) in grads_a but \(3,\) in grads_b"),
    row("difference-value-not-tensor", lambda tmp: max_gradient_difference(
        {"w": [1.0, 2.0], "b": GRADS["b"]}, GRADS), T,
        r"grads_a\['w'\] must be a Tensor; got list"),
    row("difference-relative-str", lambda tmp: max_gradient_difference(
        GRADS, GRADS, relative="yes"), T, r"relative must be True or False; got 'yes'"),
    # ---- batches
    row("windows-of-k-0", lambda tmp: batches_module.windows_of(PARTS, 0), V,
        r"accumulation_steps must be a positive int; got 0"),
    row("windows-of-tensor", lambda tmp: batches_module.windows_of(INPUTS, 2), T,
        r"micro_batches must be a list .* not one batch; got Tensor"),
    row("concatenate-empty", lambda tmp: batches_module.concatenate_micro_batches([]), V,
        r"micro_batches is empty"),
    row("concatenate-widths", lambda tmp: batches_module.concatenate_micro_batches(
        [torch.zeros(2, 3), torch.zeros(2, 4)]), V,
        r"micro-batches cannot be concatenated \(different keys, lengths or padded widths\): "
        r".*Expected size 3 but got size 4"),
    # ---- losses
    row("cross-entropy-float-targets", lambda tmp: losses.cross_entropy_sum(
        torch.zeros(4, 3), torch.zeros(4)), T,
        r"targets must be an integer tensor of class indices; got dtype torch\.float32"),
    row("cross-entropy-shape", lambda tmp: losses.cross_entropy_sum(
        torch.zeros(4, 3), torch.zeros(3, dtype=torch.long)), V,
        r"targets must have logits' shape without its last \(class\) dim, \(4,\); got \(3,\)"),
    row("cross-entropy-class-out-of-range", lambda tmp: losses.cross_entropy_sum(
        torch.zeros(2, 3), torch.tensor([0, 5])), V,
        r"targets must be class indices in \[0, 3\) or ignore_index \(-100\); got 5"),
    row("cross-entropy-weight-shape", lambda tmp: losses.cross_entropy_sum(
        torch.zeros(2, 3), torch.tensor([0, 1]), weight=torch.ones(2)), V,
        r"weight must be None or a 1-dim Tensor of one weight per class, shape \(3,\); got \(2,\)"),
    row("cross-entropy-logits-list", lambda tmp: losses.cross_entropy_sum(
        [[0.0, 1.0]], torch.tensor([0])), T, r"logits must be a Tensor; got list"),
    row("sample-loss-triple", lambda tmp: LOSS(_model(), (INPUTS, LABELS, LABELS)), T,
        r"sample_classification_loss's batch must be a pair of Tensors \(inputs, labels\); "
        r"got tuple of 3 items"),
    row("token-loss-missing-labels", lambda tmp: losses.token_classification_loss(
        models.TokenTagger(10, 4, 3), {"input_ids": torch.ones(2, 3, dtype=torch.long)}), V,
        r"token_classification_loss's batch must hold Tensors under \['input_ids', 'labels'\]; "
        r"missing or not a Tensor: \['labels'\]"),
    row("token-loss-tuple", lambda tmp: losses.token_classification_loss(
        models.TokenTagger(10, 4, 3), (INPUTS, LABELS)), T,
        r"token_classification_loss's batch must be a dict with keys \['input_ids', 'labels'\]; "
        r"got tuple"),
    row("bert-loss-missing-mask", lambda tmp: losses.bert_classification_loss(
        None, {"input_ids": torch.ones(1, 3), "labels": torch.zeros(1)}), V,
        r"missing or not a Tensor: \['attention_mask'\]"),
    row("info-nce-temperature-nan", lambda tmp: losses.info_nce_loss(
        _model(), (INPUTS[:, :6], INPUTS[:, :6]), temperature=float("nan")), V,
        r"temperature must be a finite number > 0; got nan"),
    row("info-nce-temperature-str", lambda tmp: losses.info_nce_loss(
        _model(), (INPUTS, INPUTS), temperature="0.5"), T,
        r"temperature must be a number > 0; got '0\.5' of type str"),
    row("info-nce-embedding-shapes", lambda tmp: losses.info_nce_from_embeddings(
        torch.zeros(4, 3), torch.zeros(5, 3)), V,
        r"anchor_embeddings and positive_embeddings must be 2-dim tensors of the same shape .* "
        r"got \(4, 3\) and \(5, 3\)"),
    # ---- data: the corpus files
    row("load-split-unknown", lambda tmp: data.load_emr_split("dev"), V,
        r"split must be one of \['train', 'validation', 'test'\]; got 'dev'"),
    row("load-split-list", lambda tmp: data.load_emr_split(["train"]), V,
        r"split must be one of .* got \['train'\]"),
    row("load-directory-missing", lambda tmp: data.load_emr_split("train", tmp / "nope"),
        FileNotFoundError, r"directory .*nope does not exist"),
    row("load-directory-is-file", lambda tmp: data.load_emr_split(
        "train", _vocab(tmp, GOOD_VOCAB)), NotADirectoryError,
        r"directory .*vocab\.txt is not a directory"),
    row("load-directory-int", lambda tmp: data.load_emr_split("train", 3), T,
        r"directory must be a path \(str or Path\); got int"),
    row("load-file-missing", lambda tmp: data.load_emr_split("test", tmp), FileNotFoundError,
        r"emr_test\.jsonl is missing; regenerate it"),
    row("load-bad-json", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(), _record(), '{"text": "x", "label": 1')), V,
        r"emr_train\.jsonl, line 3: not valid JSON"),
    row("load-bad-json-after-blank", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(), "", "not json")), V,
        r"emr_train\.jsonl, line 3: not valid JSON \(Expecting value at column 1\)"),
    row("load-label-missing", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(), _record(label=..., diagnosis=...))), V,
        r"emr_train\.jsonl, line 2: 'label' must be an int in \[0, 9\] .* got nothing "
        r"\(no label key\)"),
    row("load-label-99", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(label=99, diagnosis=...))), V,
        r"emr_train\.jsonl, line 1: 'label' must be an int in \[0, 9\] .* got 99"),
    row("load-label-str", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(label="3", diagnosis=...))), V,
        r"line 1: 'label' must be an int in \[0, 9\] .* got '3'"),
    row("load-label-bool", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(label=True))), V,
        r"line 1: 'label' must be an int .* got True"),
    row("load-text-missing", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(text=...))), V,
        r"emr_train\.jsonl, line 1: 'text' must be a string; got nothing \(no text key\)"),
    row("load-text-int", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(text=5))), V, r"line 1: 'text' must be a string; got 5"),
    row("load-record-list", lambda tmp: data.load_emr_split("train", _jsonl(tmp, "[1, 2]")), V,
        r"line 1: a record must be a JSON object with 'text' and 'label'; got list"),
    row("load-diagnosis-mismatch", lambda tmp: data.load_emr_split(
        "train", _jsonl(tmp, _record(diagnosis="x"))), V,
        r"line 1: 'diagnosis' 'x' does not match label 0"),
    row("load-not-utf8", lambda tmp: data.load_emr_split("train", _jsonl(tmp, b"\xff\xfe")), V,
        r"emr_train\.jsonl, line 1: not UTF-8"),
    row("load-no-records", lambda tmp: data.load_emr_split("train", _jsonl(tmp, "", " ")), V,
        r"emr_train\.jsonl holds no records"),
    # ---- data: tokenizer, encoding, masking, toy sets
    row("vocab-without-unk", lambda tmp: data.load_tokenizer(
        _vocab(tmp, [t for t in GOOD_VOCAB if t != "[UNK]"])), V,
        r"vocabulary .*vocab\.txt lacks the special tokens \['\[UNK\]'\]"),
    row("vocab-without-specials", lambda tmp: data.load_tokenizer(_vocab(tmp, ["a", "b"])), V,
        r"lacks the special tokens \['\[PAD\]', '\[UNK\]', '\[CLS\]', '\[SEP\]', '\[MASK\]'\]"),
    row("vocab-pad-not-first", lambda tmp: data.load_tokenizer(
        _vocab(tmp, GOOD_VOCAB[1:] + ["[PAD]"])), V,
        r"vocabulary .*vocab\.txt: line 1 must be \[PAD\] .* got '\[UNK\]'"),
    row("vocab-duplicate", lambda tmp: data.load_tokenizer(_vocab(tmp, GOOD_VOCAB + ["a"])), V,
        r"vocabulary .*vocab\.txt, line 8: 'a' repeats line 6"),
    row("vocab-blank-line", lambda tmp: data.load_tokenizer(
        _vocab(tmp, GOOD_VOCAB[:5] + ["", "a"])), V, r"vocab\.txt, line 6: blank token"),
    row("vocab-missing", lambda tmp: data.load_tokenizer(tmp / "none.txt"), FileNotFoundError,
        r"vocabulary .*none\.txt is missing"),
    row("vocab-path-int", lambda tmp: data.load_tokenizer(3), T,
        r"vocab_path must be a path \(str or Path\); got int"),
    row("encode-max-length-2", lambda tmp: data.encode_records([RECORD], _tokenizer(), 2), V,
        r"max_length must be a positive int >= 3 .* got 2"),
    row("encode-max-length-bool", lambda tmp: data.encode_records([RECORD], _tokenizer(), True),
        V, r"max_length must be a positive int >= 3 .* got True"),
    row("encode-records-dict", lambda tmp: data.encode_records(RECORD, _tokenizer(), 8), T,
        r"records must be a list of records .* got dict"),
    row("encode-records-empty", lambda tmp: data.encode_records([], _tokenizer(), 8), V,
        r"records is empty"),
    row("encode-label-99", lambda tmp: data.encode_records(
        [RECORD, {**RECORD, "label": 99, "diagnosis": "?"}], _tokenizer(), 8), V,
        r"records\[1\]: 'label' must be an int in \[0, 9\] .* got 99"),
    row("encode-text-none", lambda tmp: data.encode_records(
        [{**RECORD, "text": None}], _tokenizer(), 8), V,
        r"records\[0\]: 'text' must be a string; got None"),
    row("encode-tokenizer-none", lambda tmp: data.encode_records([RECORD], None, 8), T,
        r"tokenizer must be a transformers tokenizer .* got NoneType"),
    row("mask-probability-0", lambda tmp: data.mask_tokens(
        {"input_ids": torch.ones(1, 3), "attention_mask": torch.ones(1, 3)}, mask_token_id=4,
        special_token_ids=[], probability=0), V, r"probability must be in \(0, 1\); got 0"),
    row("mask-probability-nan", lambda tmp: data.mask_tokens(
        MASK_BATCH, mask_token_id=4, special_token_ids=[], probability=float("nan")), V,
        r"probability must be a finite number in \(0, 1\); got nan"),
    row("mask-probability-str", lambda tmp: data.mask_tokens(
        MASK_BATCH, mask_token_id=4, special_token_ids=[], probability="0.1"), T,
        r"probability must be a number in \(0, 1\); got '0\.1' of type str"),
    row("mask-special-ids-int", lambda tmp: data.mask_tokens(
        MASK_BATCH, mask_token_id=4, special_token_ids=0), T,
        r"special_token_ids must be an iterable of ints .* got int"),
    row("mask-token-id-negative", lambda tmp: data.mask_tokens(
        MASK_BATCH, mask_token_id=-1, special_token_ids=[]), V,
        r"mask_token_id must be an int >= 0; got -1"),
    row("mask-batch-without-mask", lambda tmp: data.mask_tokens(
        {"input_ids": torch.ones(1, 3)}, mask_token_id=4, special_token_ids=[]), T,
        r"batch must be a dict holding Tensors 'input_ids' and 'attention_mask' .* "
        r"with keys \['input_ids'\]"),
    row("toy-classification-samples-0", lambda tmp: data.make_toy_classification(0, 4, 3), V,
        r"num_samples must be a positive int; got 0"),
    row("toy-classification-seed-negative", lambda tmp: data.make_toy_classification(
        4, 4, 3, seed=-1), V, r"seed must be a non-negative int; got -1"),
    row("toy-classification-int-dtype", lambda tmp: data.make_toy_classification(
        4, 4, 3, dtype=torch.int64), T,
        r"dtype must be a floating-point torch\.dtype; got torch\.int64"),
    row("toy-tokens-min-length-bool", lambda tmp: data.make_toy_token_batch(
        4, 10, 30, 3, min_length=True), V, r"min_length must be an int in \[1, max_length=10\]; "
        r"got True"),
    row("toy-tokens-sort-str", lambda tmp: data.make_toy_token_batch(
        4, 10, 30, 3, sort_by_length="yes"), T, r"sort_by_length must be True or False; got 'yes'"),
    row("toy-tokens-vocab-1", lambda tmp: data.make_toy_token_batch(4, 10, 1, 3), V,
        r"vocab_size must be an int >= 2 \(id 0 is padding\); got 1"),
    # ---- equivalence: audit, optimizer steps, flattening
    row("audit-step-fn-int", lambda tmp: equivalence.audit_update(
        3, _model(), LOSS, PARTS, lambda p: torch.optim.SGD(p, lr=0.1)), T,
        r"step_fn must be callable as step_fn\(model, micro_batches, make_optimizer\); got int"),
    row("audit-micro-batches-tensor", lambda tmp: equivalence.audit_update(
        lambda *a: None, _model(), LOSS, INPUTS, lambda p: torch.optim.SGD(p, lr=0.1)), T,
        r"micro_batches must be a list .* got Tensor"),
    row("audit-empty", lambda tmp: equivalence.audit_update(
        lambda *a: None, _model(), LOSS, [], lambda p: torch.optim.SGD(p, lr=0.1)), V,
        r"micro_batches is empty"),
    row("audit-lr-0", lambda tmp: equivalence.audit_update(
        lambda *a: None, _model(), LOSS, PARTS, lambda p: torch.optim.SGD(p, lr=0.0)), V,
        r"the true update is zero \(learning rate 0\?\)"),
    row("audit-max-grad-norm-negative", lambda tmp: equivalence.audit_update(
        lambda *a: None, _model(), LOSS, PARTS, lambda p: torch.optim.SGD(p, lr=0.1),
        max_grad_norm=-1.0), V, r"max_grad_norm must be > 0; got -1\.0"),
    row("step-grads-missing", lambda tmp: equivalence.parameters_after_step(
        _model(), {"0.weight": torch.zeros(8, 6)}, lambda p: torch.optim.SGD(p, lr=0.1)), V,
        r"grads must name exactly the model's trainable parameters; missing: "
        r"\['0\.bias', '2\.bias', '2\.weight'\]"),
    row("step-grads-shape", lambda tmp: equivalence.parameters_after_step(
        _model(), {name: torch.zeros(3) for name, _ in _model().named_parameters()},
        lambda p: torch.optim.SGD(p, lr=0.1)), V,
        r"grads\['0\.weight'\] has shape \(3,\) but the parameter has shape \(8, 6\)"),
    row("step-grads-nan", lambda tmp: equivalence.parameters_after_step(
        _model(), {n: torch.full_like(p, float("nan")) for n, p in _model().named_parameters()},
        lambda p: torch.optim.SGD(p, lr=0.1)), V,
        r"grads\['0\.weight'\] holds a NaN or an inf; refusing to step on it"),
    row("step-optimizer-factory-returns-list", lambda tmp: equivalence.parameters_after_step(
        _model(), full_batch_gradients(_model(), LOSS, BATCH), list), T,
        r"make_optimizer must return a torch\.optim\.Optimizer; got list"),
    row("flatten-empty", lambda tmp: gradients.flatten_gradients({}), V,
        r"grads is empty; it must be a non-empty dict"),
    row("flatten-list", lambda tmp: gradients.flatten_gradients([torch.zeros(1)]), T,
        r"grads must be a dict of parameter name -> Tensor .* got list"),
    row("averaged-tensor", lambda tmp: equivalence.averaged_micro_batch_gradients(
        _model(), LOSS, INPUTS), T, r"micro_batches must be a list .* got Tensor"),
    row("info-nce-cached-temperature-0", lambda tmp: equivalence.info_nce_cached_gradients(
        _model(), [(INPUTS, INPUTS)], temperature=0), V, r"temperature must be > 0; got 0"),
    row("info-nce-cached-not-pairs", lambda tmp: equivalence.info_nce_cached_gradients(
        _model(), [INPUTS]), T,
        r"micro_batches\[0\] must be a pair of Tensors \(anchors, positives\); got Tensor"),
    # ---- memory
    row("budget-parameters-bool", lambda tmp: memory.memory_budget(True), V,
        r"num_parameters must be an int >= 0; got True"),
    row("budget-optimizer-unknown", lambda tmp: memory.memory_budget(10, optimizer="lion"), V,
        r"optimizer must be one of \['adam', 'adamw', 'sgd', 'sgd_momentum'\]; got 'lion'"),
    row("budget-optimizer-list", lambda tmp: memory.memory_budget(10, optimizer=["adamw"]), V,
        r"optimizer must be one of .* got \['adamw'\]"),
    row("budget-precision-unknown", lambda tmp: memory.memory_budget(10, precision="fp8"), V,
        r"precision must be one of \['autocast', 'fp32', 'mixed'\]; got 'fp8'"),
    row("budget-activations-nan", lambda tmp: memory.memory_budget(
        10, activation_bytes_per_sample=float("nan")), V,
        r"activation_bytes_per_sample must be a finite number >= 0; got nan"),
    row("budget-activations-str", lambda tmp: memory.memory_budget(
        10, activation_bytes_fixed="1"), T,
        r"activation_bytes_fixed must be a number >= 0; got '1' of type str"),
    row("activation-bytes-autocast-fp32", lambda tmp: memory.activation_bytes(
        _model(), LOSS, BATCH, autocast_dtype=torch.float32), V,
        r"autocast_dtype must be None, torch\.float16 or torch\.bfloat16; got torch\.float32"),
    row("activation-bytes-no-parameters", lambda tmp: memory.activation_bytes(
        nn.ReLU(), LOSS, BATCH), T, r"model must be a torch\.nn\.Module with parameters; got ReLU"),
    row("static-bytes-optimizer-str", lambda tmp: memory.static_bytes(_model(), "adam"), T,
        r"optimizer must be None or a torch\.optim\.Optimizer; got str"),
    row("tensor-bytes-tensor", lambda tmp: memory._tensor_bytes(torch.zeros(3)), T,
        r"tensors must be an iterable of Tensors .* got Tensor"),
    row("tensor-bytes-item", lambda tmp: memory._tensor_bytes([torch.zeros(3), 4]), T,
        r"tensors\[1\] must be a Tensor; got int"),
    row("cuda-peak-step-not-callable", lambda tmp: gpu_check.cuda_peak_bytes(3), T,
        r"step must be a callable taking no argument; got int"),
    # ---- planning (one device) and cluster
    row("step-time-negative", lambda tmp: planning.StepTimeModel(-1.0, 0.0), V,
        r"StepTimeModel\.overhead_per_micro_step must be >= 0; got -1\.0"),
    row("step-time-nan", lambda tmp: planning.StepTimeModel(0.0, float("nan")), V,
        r"StepTimeModel\.seconds_per_sample must be a finite number >= 0; got nan"),
    row("window-seconds-size-0", lambda tmp: STEP_TIME.window_seconds(0, 2), V,
        r"micro_batch_size must be a positive int; got 0"),
    row("fit-step-time-lengths", lambda tmp: planning.fit_step_time([1, 2, 4], [0.1, 0.2]), V,
        r"got 3 micro_batch_sizes and 2 seconds_per_micro_step"),
    row("fit-step-time-str", lambda tmp: planning.fit_step_time([1, 2], [0.1, "a"]), T,
        r"seconds_per_micro_step\[1\] must be a number >= 0; got 'a' of type str"),
    row("fit-step-time-nan", lambda tmp: planning.fit_step_time([1, 2], [float("nan"), 0.1]), V,
        r"seconds_per_micro_step\[0\] must be a finite number >= 0; got nan"),
    row("fit-step-time-size-0", lambda tmp: planning.fit_step_time([0, 2], [0.1, 0.2]), V,
        r"micro_batch_sizes\[0\] must be a positive int; got 0"),
    row("comm-share-1", lambda tmp: planning.DdpStepModel.from_comm_share(0.01, 1.0), V,
        r"comm_share must be in \[0, 1\); got 1\.0"),
    row("comm-compute-str", lambda tmp: planning.DdpStepModel.from_comm_share("1", 0.5), T,
        r"compute_per_micro_step must be a number > 0; got '1' of type str"),
    row("step-seconds-sync-unknown", lambda tmp: DDP_MODEL.step_seconds(2, "sometimes"), V,
        r"sync must be 'window' or 'every'; got 'sometimes'"),
    row("comm-fraction-k-0", lambda tmp: DDP_MODEL.comm_fraction(0), V,
        r"accumulation_steps must be a positive int; got 0"),
    row("fit-ddp-lengths", lambda tmp: planning.fit_ddp_step_model([1, 2], [1.0, 2.0], [1.0]),
        V, r"got 2 accumulation_steps, 2 window_seconds and 1 every_seconds"),
    row("plan-step-time-none", lambda tmp: planning.plan_accumulation(
        num_parameters=10, activation_bytes_per_sample=1.0, step_time=None, micro_batch_size=1,
        accumulation_steps=1), T, r"step_time must be a StepTimeModel .* got NoneType"),
    row("max-micro-device-nan", lambda tmp: planning.max_micro_batch_size(
        float("nan"), 100, 10.0), V, r"device_bytes must be a finite number > 0; got nan"),
    row("max-micro-activations-0", lambda tmp: planning.max_micro_batch_size(2000, 100, 0.0), V,
        r"activation_bytes_per_sample must be > 0; got 0\.0"),
    row("steps-for-world-0", lambda tmp: planning.accumulation_steps_for(256, 4, world_size=0),
        V, r"world_size must be a positive int; got 0"),
    row("fit-activations-lengths", lambda tmp: planning.fit_transformer_activations(
        lambda n, s: 1, lengths=(64, 32, 128)), V,
        r"lengths must be three increasing positive ints; got \(64, 32, 128\)"),
    row("fit-activations-measure-nan", lambda tmp: planning.fit_transformer_activations(
        lambda n, s: float("nan")), T,
        r"measure\(1, 32\) \(bytes\) must be an int >= 0; got nan of type float"),
    row("activations-nan", lambda tmp: planning._TransformerActivations(
        float("nan"), 0.0, 0.0, 0.0, 0.0), V,
        r"_TransformerActivations\.outside_fixed must be a finite number; got nan"),
    row("activations-length-0", lambda tmp: ACTIVATIONS.bytes_per_sample(0, 2), V,
        r"sequence_length must be a positive int; got 0"),
    row("shape-params-negative", lambda tmp: planning.TransformerShape(-1, 100, ACTIVATIONS), V,
        r"params_outside must be an int >= 0; got -1"),
    row("plan-cluster-shape-none", lambda tmp: planning.plan_cluster(
        None, num_layers=2, sequence_length=16, micro_batch_size=2, accumulation_steps=2,
        world_size=2, device_bytes=1e9), T, r"shape must be a TransformerShape .* got NoneType"),
    row("plan-cluster-device-negative", lambda tmp: planning.plan_cluster(
        SHAPE, num_layers=2, sequence_length=16, micro_batch_size=2, accumulation_steps=2,
        world_size=2, device_bytes=-1), V, r"device_bytes must be > 0; got -1"),
    row("measure-bert-lengths", lambda tmp: planning.measure_bert_shape(
        models.ROBERTA_WWM_EXT_LARGE, lengths=(32, 32, 64)), V,
        r"lengths must be three increasing positive ints; got \(32, 32, 64\)"),
    row("measure-bert-autocast-fp32", lambda tmp: planning.measure_bert_shape(
        models.ROBERTA_WWM_EXT_LARGE, autocast_dtype=torch.float32), V,
        r"autocast_dtype must be None, torch\.float16 or torch\.bfloat16; got torch\.float32"),
    # ---- metrics
    row("scores-label-out-of-range", lambda tmp: metrics.classification_scores(
        torch.tensor([0, 1]), torch.tensor([0, 5]), 3), V,
        r"labels must be class indices in \[0, 3\) \(num_classes=3\); got 5"),
    row("scores-float-predictions", lambda tmp: metrics.classification_scores(
        torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), 3), T,
        r"predictions must be an integer tensor of class indices; got dtype torch\.float32"),
    row("scores-classes-0", lambda tmp: metrics.classification_scores(
        torch.tensor([0]), torch.tensor([0]), 0), V, r"num_classes must be a positive int; got 0"),
    row("scores-list", lambda tmp: metrics.classification_scores([0], torch.tensor([0]), 2), T,
        r"predictions must be a Tensor of class indices; got list"),
    row("mean-loss-tensor", lambda tmp: metrics.evaluate_mean_loss(_model(), LOSS, INPUTS), T,
        r"batches must be a list .* got Tensor"),
    row("mean-loss-empty", lambda tmp: metrics.evaluate_mean_loss(_model(), LOSS, []), V,
        r"batches cover no items \(none given, or every num_items was 0\)"),
    row("predict-missing-mask", lambda tmp: metrics.predict_classes(
        _model(), {"input_ids": INPUTS}), T,
        r"batch must be a dict holding Tensors 'input_ids' and 'attention_mask' .* "
        r"with keys \['input_ids'\]"),
    row("predict-micro-batch-0", lambda tmp: metrics.predict_classes(
        _model(), {"input_ids": INPUTS, "attention_mask": INPUTS}, micro_batch_size=0), V,
        r"micro_batch_size must be a positive int; got 0"),
    # ---- noise
    row("noise-batches-equal", lambda tmp: noise._noise_scale_estimates(1.0, 1.0, 8, 8), V,
        r"need 0 < small_batch < big_batch; got small_batch=8, big_batch=8"),
    row("noise-norm-nan", lambda tmp: noise._noise_scale_estimates(float("nan"), 1.0, 8, 32), V,
        r"small_squared_norm must be a finite number >= 0; got nan"),
    row("noise-one-row", lambda tmp: noise.brute_force_noise_scale(torch.ones(1, 3)), V,
        r"per_sample_gradients must be a 2-dim tensor with at least 2 rows; got shape \(1, 3\)"),
    row("noise-list", lambda tmp: noise.brute_force_noise_scale([[1.0], [2.0]]), T,
        r"per_sample_gradients must be a 2-dim Tensor .* got list"),
    row("noise-zero-mean", lambda tmp: noise.brute_force_noise_scale(
        torch.tensor([[1.0], [-1.0]])), V, r"per_sample_gradients average to exactly zero"),
    row("tracker-smoothing-bool", lambda tmp: noise.NoiseScaleTracker(
        _model().parameters(), smoothing=False), T,
        r"smoothing must be a number in \[0, 1\); got False of type bool"),
    row("learning-rate-base-batch-0", lambda tmp: noise.scaled_learning_rate(
        1e-3, 0, 64, "linear"), V, r"base_batch must be a positive int; got 0"),
    row("learning-rate-nan", lambda tmp: noise.scaled_learning_rate(
        float("nan"), 32, 64, "linear"), V, r"base_lr must be a finite number > 0; got nan"),
    row("learning-rate-rule", lambda tmp: noise.scaled_learning_rate(1e-3, 32, 64, "cubic"), V,
        r"rule must be one of \['linear', 'none', 'sqrt'\]; got 'cubic'"),
    # ---- runtime
    row("profile-unknown", lambda tmp: runtime.get_profile("huge"), V,
        r"profile must be one of \['ci', 'cpu', 'gpu'\] .* got 'huge'"),
    row("profile-int", lambda tmp: runtime.get_profile(3), V,
        r"profile must be one of \['ci', 'cpu', 'gpu'\] .* got 3"),
    row("seed-negative", lambda tmp: runtime.set_seed(-1), V,
        r"seed must be a non-negative int; got -1"),
    row("seed-too-large", lambda tmp: runtime.set_seed(2**64), V,
        r"seed must be a non-negative int; got 18446744073709551616 .*< 2\*\*64"),
    row("seed-bool", lambda tmp: runtime.set_seed(True), V,
        r"seed must be a non-negative int; got True"),
    row("generator-seed-str", lambda tmp: runtime.make_generator("1"), V,
        r"seed must be a non-negative int; got '1'"),
    row("generator-device-unknown", lambda tmp: runtime.make_generator(0, device="gpu"), V,
        r"device must be a device name such as 'cpu', 'cuda', 'cuda:1' or 'mps'; got 'gpu'"),
    row("deterministic-threads-0", lambda tmp: runtime.make_deterministic(threads=0), V,
        r"threads must be a positive int or None; got 0"),
    row("deterministic-threads-bool", lambda tmp: runtime.make_deterministic(threads=True), V,
        r"threads must be a positive int or None; got True"),
    row("device-unknown", lambda tmp: runtime.choose_device("gpu"), V,
        r"preferred must be a device name such as .* got 'gpu'"),
    row("device-cuda-absent", lambda tmp: runtime.choose_device("cuda"), V,
        r"preferred device 'cuda' is not available on this machine", NO_CUDA),
    # ---- models
    row("mlp-dropout-1", lambda tmp: models.make_mlp(3, 4, 2, dropout=1.0), V,
        r"dropout must be in \[0, 1\); got 1\.0"),
    row("mlp-dropout-str", lambda tmp: models.make_mlp(3, 4, 2, dropout="0.1"), T,
        r"dropout must be a number in \[0, 1\); got '0\.1' of type str"),
    row("mlp-normalization-list", lambda tmp: models.make_mlp(3, 4, 2, normalization=["batch"]),
        V, r"normalization must be one of \['batch', 'layer', 'none'\]; got \['batch'\]"),
    row("mlp-int-dtype", lambda tmp: models.make_mlp(3, 4, 2, dtype=torch.int64), T,
        r"dtype must be a floating-point torch\.dtype .* got torch\.int64"),
    row("mlp-hidden-0", lambda tmp: models.make_mlp(3, 0, 2), V,
        r"hidden_dim must be a positive int; got 0"),
    row("tagger-vocab-0", lambda tmp: models.TokenTagger(0, 4, 3), V,
        r"vocab_size must be a positive int; got 0"),
    row("bert-heads-0", lambda tmp: models.make_tiny_bert(100, 2, num_heads=0), V,
        r"num_heads must be a positive int; got 0"),
    row("bert-one-label", lambda tmp: models.make_tiny_bert(100, 1), V,
        r"num_labels must be an int >= 2; got 1"),
    row("bert-indivisible-heads", lambda tmp: models.make_tiny_bert(
        100, 2, hidden_size=10, num_heads=3), V,
        r"hidden_size \(10\) must be divisible by num_heads \(3\)"),
    row("causal-lm-vocab-0", lambda tmp: models.make_tiny_causal_lm(0), V,
        r"vocab_size must be a positive int; got 0"),
    row("bert-count-typo", lambda tmp: models.count_bert_parameters(
        {**models.ROBERTA_WWM_EXT_LARGE, "hidden_sise": 10}), V,
        r"config holds keys that BertConfig does not know: \['hidden_sise'\]"),
    row("bert-count-list", lambda tmp: models.count_bert_parameters([1, 2]), T,
        r"config must be a dict of BertConfig fields .* got list"),
    row("bert-count-vocab-0", lambda tmp: models.count_bert_parameters(
        {**models.ROBERTA_WWM_EXT_LARGE, "vocab_size": 0}), V,
        r"config\['vocab_size'\] must be a positive int; got 0"),
    # ---- widgets: pure functions and the explorers' arguments
    row("describe-plan-none", lambda tmp: widgets._describe_plan(None, None), T,
        r"plan must be a AccumulationPlan .* got NoneType"),
    row("describe-cluster-str", lambda tmp: widgets._describe_cluster_plan("plan"), T,
        r"plan must be a ClusterPlan .* got str"),
    row("describe-ddp-k-0", lambda tmp: widgets._describe_ddp_step(DDP_MODEL, 0), V,
        r"accumulation_steps must be a positive int; got 0"),
    row("describe-ddp-model-none", lambda tmp: widgets._describe_ddp_step(None, 2), T,
        r"model must be a DdpStepModel .* got NoneType"),
    row("describe-rates-measured-list", lambda tmp: widgets._describe_learning_rates(
        1e-3, 32, 64, []), T, r"measured must be a dict .* got list"),
    row("describe-rates-batch-0", lambda tmp: widgets._describe_learning_rates(
        1e-3, 32, 0, {}), V, r"batch must be a positive int; got 0"),
    row("explorer-k-above-slider", lambda tmp: widgets.accumulation_explorer(
        num_parameters=10, activation_bytes_per_sample=1.0, step_time=STEP_TIME,
        accumulation_steps=40), V, r"accumulation_steps must be an int in \[1, 32\]; got 40"),
    row("explorer-step-time-none", lambda tmp: widgets.accumulation_explorer(
        num_parameters=10, activation_bytes_per_sample=1.0, step_time=None), T,
        r"step_time must be a StepTimeModel .* got NoneType"),
    row("ddp-explorer-share", lambda tmp: widgets.ddp_time_explorer(0.01, comm_share=0.97), V,
        r"comm_share must be in \[0, 0\.95\]; got 0\.97"),
    row("ddp-explorer-compute-0", lambda tmp: widgets.ddp_time_explorer(0), V,
        r"compute_per_micro_step must be > 0; got 0"),
    row("cluster-explorer-no-shapes", lambda tmp: widgets.cluster_explorer({}), V,
        r"shapes must be a non-empty dict of name -> \(TransformerShape, precision\); got \{\}"),
    row("cluster-explorer-layers", lambda tmp: widgets.cluster_explorer(
        {"fp32": (SHAPE, "fp32")}, num_layers=100), V,
        r"num_layers must be an int in \[1, 96\]; got 100"),
    row("rates-explorer-base-not-offered", lambda tmp: widgets.learning_rate_explorer(
        1e-3, 32, [16, 64], {}), V, r"base_batch must be one of batches \[16, 64\] .* got 32"),
    row("figure-png-none", lambda tmp: widgets._figure_png(None), T,
        r"figure must be a Figure .* got NoneType"),
    # ---- the EMR corpus command and the DDP program's command line (stderr is checked)
    row("corpus-command-foreign-files", lambda tmp: make_emr_corpus.main(
        _corpus_dir_with_other_files(tmp)), SystemExit,
        r"holds files that are not the corpus \(notes\.txt\).* pass --force"),
    row("corpus-command-users-readme", lambda tmp: make_emr_corpus.main(
        [str(_folder_with(tmp, "README.md", "# My project\n"))]), SystemExit,
        r"holds files that are not the corpus \(README\.md\).* pass --force"),
    row("corpus-command-file", lambda tmp: make_emr_corpus.main([str(_vocab(tmp, GOOD_VOCAB))]),
        SystemExit, r"vocab\.txt exists and is not a directory"),
    row("ddp-k-0", lambda tmp: parse_arguments(
        DDP_REQUIRED[:1] + ["0"] + DDP_REQUIRED[2:]), SystemExit,
        r"--accumulation-steps must be >= 1"),
    row("ddp-sweep-not-ints", lambda tmp: parse_arguments(DDP_REQUIRED + ["--sweep", "2,x"]),
        SystemExit, r"--sweep must be comma-separated ints; got '2,x'"),
    row("ddp-timeout-0", lambda tmp: parse_arguments(DDP_REQUIRED + ["--timeout", "0"]),
        SystemExit, r"--timeout must be > 0"),
    row("ddp-json-missing", lambda tmp: parse_arguments(DDP_REQUIRED[:-2]), SystemExit,
        r"the following arguments are required: --json"),
    row("ddp-task-unknown", lambda tmp: parse_arguments(DDP_REQUIRED + ["--task", "foo"]),
        SystemExit, r"--task: invalid choice: 'foo'"),
    row("ddp-samples-0", lambda tmp: parse_arguments(DDP_REQUIRED + ["--samples", "0"]),
        SystemExit, r"--samples must be >= 1"),
    row("ddp-lr-nan", lambda tmp: parse_arguments(DDP_REQUIRED + ["--lr", "nan"]), SystemExit,
        r"--lr must be"),
    row("ddp-input-dim-0", lambda tmp: parse_arguments(DDP_REQUIRED + ["--input-dim", "0"]),
        SystemExit, r"--input-dim must be >= 1"),
    # ---- the loop: accumulate_window's arguments
    row("agree-windows-generator", lambda tmp: agree_on_windows(
        torch.nn.Linear(2, 2), (window for window in [PARTS])), T,
        r"windows must be a list of windows .* got generator"),
    row("window-model-str", lambda tmp: accumulate_window("model", None, PARTS, LOSS), T,
        r"model must be a torch\.nn\.Module; got str"),
    row("window-optimizer-str", lambda tmp: _window(optimizer="adam"), T,
        r"optimizer must be a torch\.optim\.Optimizer; got str"),
    row("window-optimizer-of-another-model", lambda tmp: _window(
        optimizer=torch.optim.SGD(_model().parameters(), lr=0.1)), V,
        r"optimizer holds 4 parameter\(s\) that are not the model's"),
    row("window-scheduler-int", lambda tmp: _window(scheduler=5), V,
        r"scheduler must be None or an LR scheduler built on this optimizer; got int"),
    row("window-scheduler-of-another-optimizer", lambda tmp: _window(
        scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.SGD(_model().parameters()), 2)),
        V, r"scheduler must be None or an LR scheduler built on this optimizer; got StepLR"),
    row("window-scaler-str", lambda tmp: _window(scaler="fp16"), T,
        r"scaler must be None or a torch\.amp\.GradScaler; got str"),
    row("window-max-grad-norm-nan", lambda tmp: _window(max_grad_norm=float("nan")), V,
        r"max_grad_norm must be a finite number > 0 or None; got nan"),
    row("window-max-grad-norm-str", lambda tmp: _window(max_grad_norm="1"), V,
        r"max_grad_norm must be a finite number > 0 or None; got '1'"),
    row("window-max-grad-norm-bool", lambda tmp: _window(max_grad_norm=True), V,
        r"max_grad_norm must be a finite number > 0 or None; got True"),
    row("window-autocast-fp32", lambda tmp: _window(autocast_dtype=torch.float32), V,
        r"autocast_dtype must be None, torch\.bfloat16 or torch\.float16; got torch\.float32"),
    row("window-mixed-dtypes", lambda tmp: accumulate_window(
        nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()), None, PARTS, LOSS), V,
        r"mixed dtypes \('0\.weight' is torch\.float32, '1\.weight' is torch\.float64\)"),
    row("window-frozen-model", lambda tmp: _window(model=_model().requires_grad_(False),
                                                   optimizer=torch.optim.SGD([nn.Parameter(
                                                       torch.zeros(1))])), V,
        r"model \(Sequential\) has no trainable parameters"),
    row("window-loss-fn-none", lambda tmp: _window(loss_fn=None), T,
        r"loss_fn must be callable .* got NoneType"),
    row("window-tensor", lambda tmp: _window(INPUTS), T,
        r"window must be a list of micro-batches .* got Tensor"),
    row("window-one-batch-tuple", lambda tmp: _window(BATCH), T,
        r"window is a tuple of tensors: one batch such as \(inputs, labels\)"),
    row("window-str", lambda tmp: _window("abc"), T,
        r"window must be a list of micro-batches .* got str"),
    row("window-generator", lambda tmp: _window(p for p in PARTS), T,
        r"window must be a list of micro-batches .* got generator"),
    row("window-empty", lambda tmp: _window([]), V,
        r"window is empty; it needs at least one micro-batch"),
    # ---- the loop: what loss_fn returns
    row("window-count-negative", lambda tmp: _window(loss_fn=_counted(lambda step, n: -1)), V,
        r"num_items must be finite and >= 0; got -1\.0 at micro-batch 0"),
    row("window-count-nan-tensor", lambda tmp: _window(
        loss_fn=_counted(lambda step, n: torch.tensor(float("nan")) if step else n)), V,
        r"num_items must be finite and >= 0; got nan at micro-batch 1"),
    row("window-no-items", lambda tmp: _window(loss_fn=_counted(lambda step, n: 0)), V,
        r"window covers no items \(every num_items was 0"),
    row("window-nan-loss", lambda tmp: _window([(INPUTS * float("nan"), LABELS)]),
        NonFiniteLossError, r"micro-batch 0 produced a non-finite loss \(nan\)"),
    row("window-detached-loss", lambda tmp: _window(
        loss_fn=lambda m, b: (LOSS(m, b)[0].detach(), 4)), V,
        r"loss of micro-batch 0 does not require grad"),
    row("window-nan-gradient", lambda tmp: _window(loss_fn=_nan_gradient_loss),
        batches_module.NonFiniteGradientError,
        r"accumulated gradient is not finite \(first at parameter '0\.weight'\)"),
    # ---- checkpoint files
    row("checkpoint-truncated", lambda tmp: read_checkpoint(
        _checkpoint(tmp, lambda b: b[: len(b) // 3])), CheckpointError,
        r"checkpoint .*c\.pt is corrupted or truncated"),
    row("checkpoint-empty", lambda tmp: read_checkpoint(_checkpoint(tmp, lambda b: b"")),
        CheckpointError, r"checkpoint .*c\.pt is empty \(0 bytes\)"),
    row("checkpoint-garbage", lambda tmp: read_checkpoint(
        _checkpoint(tmp, lambda b: b"PK\x03\x04 garbage" * 20)), CheckpointError,
        r"checkpoint .*c\.pt is not a gradaccum checkpoint"),
    row("checkpoint-flipped-bit", lambda tmp: read_checkpoint(
        _checkpoint(tmp, _flip_inside_tensor_data)), CheckpointError,
        r"checkpoint .*c\.pt is corrupted or truncated: its content hash is"),
    row("checkpoint-directory", lambda tmp: read_checkpoint(tmp), CheckpointError,
        r"checkpoint .* cannot be read: .*Is a directory"),
    row("write-checkpoint-state-int", lambda tmp: write_checkpoint(5, tmp / "c.pt"), T,
        r"state must be a dict; got int"),
    row("read-checkpoint-missing", lambda tmp: read_checkpoint(tmp / "none.pt"),
        CheckpointError, r"checkpoint .*none\.pt does not exist"),
]


@pytest.mark.parametrize(("call", "error", "pattern"), CASES)
def test_bad_input_is_refused_with_a_clear_message(call, error, pattern, tmp_path, capsys):
    with pytest.raises(error) as info:
        call(tmp_path)
    message = capsys.readouterr().err if info.type is SystemExit else str(info.value)
    assert re.search(pattern, message, re.S), message


def test_the_table_has_at_least_100_rows():
    assert len(CASES) >= 100
