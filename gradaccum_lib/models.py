"""Small models built from code, never downloaded: toy MLPs and a per-token tagger."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["TokenTagger", "make_mlp"]

Normalization = Literal["none", "batch", "layer"]


def make_mlp(
    input_dim: int,
    hidden_dim: int,
    output_dim: int,
    *,
    normalization: Normalization = "none",
    dropout: float = 0.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> nn.Sequential:
    """Return Linear -> [BatchNorm|LayerNorm] -> Tanh -> [Dropout] -> Linear, initialised from
    ``seed`` (the same seed always gives the same weights).
    """
    for label, value in (("input_dim", input_dim), ("hidden_dim", hidden_dim),
                         ("output_dim", output_dim)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int; got {value!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout}")
    norms = {"none": None, "batch": nn.BatchNorm1d, "layer": nn.LayerNorm}
    if normalization not in norms:
        raise ValueError(f"normalization must be one of {sorted(norms)}; got {normalization!r}")
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
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
            self.head = nn.Linear(embedding_dim, num_tags)
        self.to(dtype)

    def forward(self, input_ids: Tensor) -> Tensor:
        """Return logits of shape (batch, sequence, num_tags)."""
        return self.head(torch.tanh(self.embedding(input_ids)))
