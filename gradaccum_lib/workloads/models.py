"""Small models built from code, never downloaded: toy MLPs and a per-token tagger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn

from gradaccum_lib.runtime import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_positive_int,
    check_seed,
)

if TYPE_CHECKING:  # transformers is imported only where a model is built
    from transformers import BertForMaskedLM, BertForSequenceClassification, GPT2LMHeadModel

__all__ = [
    "ROBERTA_WWM_EXT_LARGE",
    "TokenTagger",
    "count_bert_parameters",
    "make_mlp",
    "make_tiny_bert",
    "make_tiny_causal_lm",
]

def _check_dtype(dtype: object, label: str = "dtype") -> torch.dtype:
    """A floating-point ``torch.dtype``, or a TypeError naming ``label``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{label} must be a floating-point torch.dtype (torch.float64, "
                        f"torch.float32, torch.bfloat16, torch.float16); got {dtype!r}")
    return dtype


def _check_sizes(**sizes: object) -> None:
    for label, value in sizes.items():
        check_positive_int(label, value)


def make_mlp(
    input_dim: int,
    hidden_dim: int,
    output_dim: int,
    *,
    normalization: Literal["none", "batch", "layer"] = "none",
    dropout: float = 0.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> nn.Sequential:
    """Return Linear -> [BatchNorm|LayerNorm] -> Tanh -> [Dropout] -> Linear, initialised from
    ``seed`` (the same seed always gives the same weights).
    """
    _check_sizes(input_dim=input_dim, hidden_dim=hidden_dim, output_dim=output_dim)
    check_number("dropout", dropout, low=0, high=1, high_open=True)
    norms = {"none": None, "batch": nn.BatchNorm1d, "layer": nn.LayerNorm}
    check_choice("normalization", normalization, norms)
    check_seed(seed)
    _check_dtype(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(input_dim, hidden_dim)]
        if norms[normalization] is not None:
            layers.append(norms[normalization](hidden_dim))
        layers.append(nn.Tanh())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(hidden_dim, output_dim))
        model = nn.Sequential(*layers)
    return model.to(dtype)


class TokenTagger(nn.Module):
    """Embedding -> Tanh -> Linear: one tag per token (a stand-in for a token-level head)."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        num_tags: int,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        _check_sizes(vocab_size=vocab_size, embedding_dim=embedding_dim, num_tags=num_tags)
        check_seed(seed)
        _check_dtype(dtype)
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
            self.head = nn.Linear(embedding_dim, num_tags)
        self.to(dtype)

    def forward(self, input_ids: Tensor) -> Tensor:
        """Return logits of shape (batch, sequence, num_tags)."""
        return self.head(torch.tanh(self.embedding(input_ids)))


def make_tiny_bert(
    vocab_size: int,
    num_labels: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    max_length: int = 512,
    dropout: float = 0.0,
    masked_lm: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> BertForSequenceClassification | BertForMaskedLM:
    """Return a randomly initialised BERT (from ``BertConfig``, nothing downloaded): a
    sequence classifier with ``num_labels`` classes, or a masked-LM head with ``masked_lm``.
    """
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    _check_sizes(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                 num_heads=num_heads, max_length=max_length)
    if masked_lm:
        check_positive_int("num_labels", num_labels)
    else:  # cross-entropy over a single class is identically zero
        check_int("num_labels", num_labels, low=2)
    if intermediate_size is not None:
        check_positive_int("intermediate_size", intermediate_size)
    check_number("dropout", dropout, low=0, high=1, high_open=True)
    check_bool("masked_lm", masked_lm)
    check_seed(seed)
    _check_dtype(dtype)
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})"
        )
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_length, num_labels=num_labels,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (BertForMaskedLM if masked_lm else BertForSequenceClassification)(config)
    return model.to(dtype)


def make_tiny_causal_lm(
    vocab_size: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int = 2,
    max_length: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> GPT2LMHeadModel:
    """Return a randomly initialised GPT-2-architecture causal LM from ``GPT2Config`` (no
    dropout). Its loss goes through transformers' shared ``ForCausalLMLoss``, which honours
    ``num_items_in_batch`` (the 2024 gradient-accumulation fix), unlike BERT's heads.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    _check_sizes(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                 num_heads=num_heads, max_length=max_length)
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})"
        )
    check_seed(seed)
    _check_dtype(dtype)
    config = GPT2Config(
        vocab_size=vocab_size, n_positions=max_length, n_embd=hidden_size, n_layer=num_layers,
        n_head=num_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0,
        bos_token_id=2, eos_token_id=3, loss_type="ForCausalLM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.to(dtype)


#: hfl/chinese-roberta-wwm-ext-large (Cui et al., arXiv:2004.13922): its published config.json.
#: A BERT architecture despite the name, with a 21,128-token Chinese vocabulary.
ROBERTA_WWM_EXT_LARGE: dict[str, int] = {
    "vocab_size": 21128, "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16, "intermediate_size": 4096, "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


_BERT_SIZES = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "max_position_embeddings", "type_vocab_size"}


def count_bert_parameters(config: dict[str, int], num_labels: int = 2) -> int:
    """Return the parameter count of a BERT sequence classifier with ``config``, built on the
    meta device (no memory is allocated, nothing is downloaded).
    """
    from transformers import BertConfig, BertForSequenceClassification

    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict of BertConfig fields (e.g. "
                        f"ROBERTA_WWM_EXT_LARGE); got {type(config).__name__}")
    known = BertConfig().to_dict()
    unknown = sorted(str(key) for key in config if key not in known)
    if unknown:
        raise ValueError(f"config holds keys that BertConfig does not know: {unknown} (a typo "
                         "would be silently ignored)")
    for key in _BERT_SIZES & set(config):
        check_positive_int(f"config[{key!r}]", config[key])
    check_positive_int("num_labels", num_labels)
    with torch.device("meta"):
        model = BertForSequenceClassification(BertConfig(**config, num_labels=num_labels))
    return sum(p.numel() for p in model.parameters())
