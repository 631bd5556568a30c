"""What a training run did: one record per optimizer step (window), in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["TrainingHistory", "WindowRecord"]


@dataclass(frozen=True)
class WindowRecord:
    """What one optimizer step saw: its window, items, item-weighted loss, gradient norm
    (of the accumulated gradient, before clipping) and the learning rate it used.
    """

    epoch: int
    window: int
    micro_steps: int
    items: float
    loss: float
    grad_norm: float
    learning_rate: float


@dataclass
class TrainingHistory:
    """Per-window records of a training run, in order."""

    records: list[WindowRecord] = field(default_factory=list)

    def column(self, name: str) -> list[float]:
        """Return one field of every record, e.g. ``column("loss")``."""
        if name not in WindowRecord.__dataclass_fields__:
            raise ValueError(f"name must be one of {list(WindowRecord.__dataclass_fields__)}; "
                             f"got {name!r}")
        return [getattr(record, name) for record in self.records]

    def as_dict(self) -> dict[str, list[float]]:
        """Return the history as columns (a dict of lists, safe for ``weights_only`` loads)."""
        return {name: self.column(name) for name in WindowRecord.__dataclass_fields__}

    @classmethod
    def from_dict(cls, columns: Mapping[str, Sequence[float]]) -> TrainingHistory:
        """Rebuild a history from :meth:`as_dict`'s columns."""
        names = list(WindowRecord.__dataclass_fields__)
        missing = [name for name in names if name not in columns]
        if missing:
            raise ValueError(f"history columns are missing {missing}; expected {names}")
        rows = zip(*(columns[name] for name in names), strict=True)
        return cls([WindowRecord(**dict(zip(names, row, strict=True))) for row in rows])

    def __len__(self) -> int:
        return len(self.records)
