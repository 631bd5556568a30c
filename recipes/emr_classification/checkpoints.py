"""Checkpoint files: written atomically, verified on load, every failure naming its path.

A checkpoint file is one header line, ``gradaccum-checkpoint v1 sha256=<hex>``, followed by
the bytes of ``torch.save(state)``. :func:`write_atomically` writes a file's bytes to a
temporary ``.NAME.tmp-PID`` in the same directory, ``fsync``s it, ``os.replace``s it over the
target and ``fsync``s the directory, so a crash at any moment leaves either the old file or
the new one, never a torn file; :func:`remove_stale_temporaries` clears the temporaries a
killed writer left (exactly that name pattern, a pid that is no running process).
:func:`read_checkpoint` checks the header and the content hash (a single flipped bit is
refused) before unpickling with ``weights_only=True``. What a checkpoint holds is the job's
to check (``jobs.train``): this module knows files, not states.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "read_checkpoint", "remove_stale_temporaries", "write_atomically",
           "write_checkpoint"]

_MAGIC = b"gradaccum-checkpoint v1 sha256="
_HEX_DIGITS = 64


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: missing, unreadable, torn, corrupted, or not one
    of ours. The message names the path."""


def _temporaries(target: Path) -> list[Path]:
    """The files named ``.NAME.tmp-PID`` beside ``target`` (PID in digits): its writers'."""
    prefix = f".{target.name}.tmp-"
    return sorted(path for path in target.parent.glob(f"{glob.escape(prefix)}*")
                  if path.name[len(prefix):].isdigit())


def _writer_is_gone(temporary: Path) -> bool:
    """True when the pid in a ``.NAME.tmp-PID`` file's name is no running process."""
    try:
        os.kill(int(temporary.name.rsplit("-", 1)[1]), 0)
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


def write_atomically(path: str | os.PathLike, *chunks: bytes) -> Path:
    """Write ``chunks`` one after the other to ``path`` atomically (temporary file, fsync,
    rename, fsync of the directory), first removing the temporaries of ``path`` that a killed
    writer left; return the path written. Raises :class:`CheckpointError` naming the path
    when it cannot."""
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"{target} is a folder, not a file")
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: its folder {target.parent} does not exist")
    remove_stale_temporaries(target)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as error:  # disk full, no permission...: the old file is intact
        raise CheckpointError(f"{target} could not be written: {error}") from None
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return target


def write_checkpoint(state: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` atomically (:func:`write_atomically`) with a content hash;
    return the path written."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict; got {type(state).__name__}")
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    payload = buffer.getvalue()
    header = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    return write_atomically(path, header, payload)


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
    header_end = len(_MAGIC) + _HEX_DIGITS
    if not data.startswith(_MAGIC) or data[header_end:header_end + 1] != b"\n":
        raise CheckpointError(
            f"checkpoint {source} is not a gradaccum checkpoint (no "
            f"'{_MAGIC.decode()}...' header); write it with write_checkpoint"
        )
    expected = data[len(_MAGIC):header_end].decode("ascii", errors="replace")
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
