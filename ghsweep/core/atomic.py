"""Writing a file whole or not at all, and waiting for one that another process writes so."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TextIO


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` to `path` through a temporary file in the same folder, renamed over `path`.

    A reader never sees a cut file: the SLURM tasks of one run write the same files while a rank's
    worker may read them, and a full disk leaves the last complete file. `mode` sets the file's
    permissions; None leaves the temporary file's own, readable by the user only.
    """
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        try:
            tmp.write(text)
            tmp.flush()
        except BaseException:  # a full disk, or text the file cannot hold: no half-written file is left
            tmp.close()
            os.unlink(tmp.name)
            raise
    if mode is not None:
        os.chmod(tmp.name, mode)
    os.replace(tmp.name, path)


def open_new(path: Path) -> TextIO:
    """`path` made anew for writing, line-buffered: whatever was there (a file, or a link planted in its
    place) is replaced, never written through."""
    path.unlink(missing_ok=True)
    return open(path, "x", encoding="utf-8", buffering=1)  # noqa: SIM115 (the caller closes it)


def wait_for_file(path: Path, timeout_s: float, interval_s: float = 0.01) -> str | None:
    """What `path` holds once it exists (written with write_atomic: whole); None if it does not within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)
    return path.read_text()
