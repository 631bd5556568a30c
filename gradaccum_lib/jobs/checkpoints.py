"""Checkpoint files: written atomically, verified on load, every failure naming its path.

A checkpoint file is one header line, ``gradaccum-checkpoint v1 sha256=<hex>``, followed by
the bytes of ``torch.save(state)``. :func:`write_checkpoint` writes it to a temporary file in
the same directory, ``fsync``s it, ``os.replace``s it over the target and ``fsync``s the
directory, so a crash at any moment leaves either the old checkpoint or the new one, never a
torn file; temporaries left by an earlier crash are removed. :func:`read_checkpoint` checks
the header and the content hash (a single flipped bit is refused) before unpickling with
``weights_only=True``; :func:`remove_stale_temporaries` clears what a killed writer left.
Two checks of what a checkpoint holds: :func:`optimizer_state_problems` (the optimizer state
against the parameters) and :func:`window_fingerprint` (the last window trained, for replay).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..batches import Batch, _tensors_of

__all__ = [
    "CheckpointError",
    "optimizer_state_problems",
    "read_checkpoint",
    "remove_stale_temporaries",
    "window_fingerprint",
    "write_checkpoint",
]

MAGIC = b"gradaccum-checkpoint v1 sha256="
_HEX_DIGITS = 64


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: missing, unreadable, torn, corrupted, or not one
    of ours. The message names the path."""


def _temporaries(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.tmp-*"))


def _writer_is_gone(temporary: Path) -> bool:
    """True when the pid in a ``.NAME.tmp-PID`` file's name is no running process."""
    try:
        os.kill(int(temporary.name.rsplit("-", 1)[1]), 0)
    except ValueError:
        return False  # not one of ours: leave it
    except ProcessLookupError:
        return True
    except PermissionError:  # a live process of another user
        return False
    return False


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of ``path`` left by writers that are gone (a crash during a
    save, e.g. a SIGKILL); return what was removed. A live writer's file is kept."""
    stale = [t for t in _temporaries(Path(path)) if _writer_is_gone(t)]
    for temporary in stale:
        temporary.unlink(missing_ok=True)
    return stale


def write_checkpoint(state: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename, fsync of the
    directory) with a content hash; return the path written."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict; got {type(state).__name__}")
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"checkpoint path {target} is a directory; give a file path")
    if not target.parent.is_dir():
        raise CheckpointError(f"checkpoint directory {target.parent} does not exist")
    for stale in _temporaries(target):  # left by a crash during an earlier save
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    payload = buffer.getvalue()
    header = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as handle:
            handle.write(header)
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as error:  # disk full, no permission...: the old checkpoint is intact
        raise CheckpointError(f"checkpoint {target} could not be written: {error}") from None
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return target


def read_checkpoint(path: str | os.PathLike,
                    map_location: str | torch.device | None = None) -> dict[str, Any]:
    """Return the state stored at ``path`` after checking its header and content hash.

    Raises :class:`CheckpointError`, naming the path, for a missing, empty, truncated,
    corrupted or foreign file.
    """
    source = Path(path)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {source} does not exist") from None
    except OSError as error:
        raise CheckpointError(f"checkpoint {source} cannot be read: {error}") from None
    if not data:
        raise CheckpointError(f"checkpoint {source} is empty (0 bytes)")
    header_end = len(MAGIC) + _HEX_DIGITS
    if not data.startswith(MAGIC) or data[header_end:header_end + 1] != b"\n":
        raise CheckpointError(
            f"checkpoint {source} is not a gradaccum checkpoint (no "
            f"'{MAGIC.decode()}...' header); write it with jobs.resume.Resumable.save_checkpoint"
        )
    expected = data[len(MAGIC):header_end].decode("ascii", errors="replace")
    payload = data[header_end + 1:]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise CheckpointError(
            f"checkpoint {source} is corrupted or truncated: its content hash is {actual[:16]}..."
            f" but its header says {expected[:16]}...; refusing to load it"
        )
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure names the file
        raise CheckpointError(f"checkpoint {source} cannot be unpickled (expected a dict of "
                              f"tensors and plain data written by torch.save): {error}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {source} holds a {type(state).__name__}, not a dict")
    return state


def optimizer_state_problems(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                             ) -> list[str]:
    """Return what keeps an optimizer ``state_dict`` from fitting ``optimizer``: other group
    sizes, or a per-parameter state tensor (``exp_avg``...) of another shape than its
    parameter (first three); empty when it fits."""
    groups = saved.get("param_groups", [])
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        return ["optimizer: its parameter groups hold other parameters"]
    shapes = {index: tuple(parameter.shape) for saved_group, group in zip(
        groups, optimizer.param_groups, strict=True) for index, parameter in zip(
        saved_group["params"], group["params"], strict=True)}
    problems = [f"optimizer: {key} of parameter {index} has shape {tuple(value.shape)}, the "
                f"parameter {shapes.get(index)}"
                for index, entry in saved.get("state", {}).items()
                for key, value in entry.items()
                if isinstance(value, torch.Tensor) and value.dim() > 0
                and tuple(value.shape) != shapes.get(index)]
    return problems[:3]


def window_fingerprint(window: Sequence[Batch]) -> str:
    """Return the SHA-256 of every tensor (dtype, shape, bytes) of a window's micro-batches."""
    digest = hashlib.sha256()
    for micro_batch in window:
        for label, tensor in _tensors_of(micro_batch):
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{label}:{flat.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
