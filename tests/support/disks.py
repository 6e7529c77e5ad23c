"""Small and read-only file systems for the full-disk tests, and run directories a job cannot start in."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path`, for as long as the block runs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as a full disk needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"this machine does not let a test mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """`path` (a directory) remounted read-only, as a file system turned read-only, for as long as the block runs."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@contextlib.contextmanager
def unstartable_run_dirs(sweep_dir: Path, victim: Path) -> Iterator[dict[int, str]]:
    """Run directories 1 to 3 of `sweep_dir` made ahead (empty folders a new sweep directory may hold):
    1 a link to `victim`, 2 on a full disk, 3 on a read-only one; yields how each job's run must fail
    (the start of its reason)."""
    victim.mkdir()
    (sweep_dir / "3").mkdir(parents=True)
    (sweep_dir / "1").symlink_to(victim, target_is_directory=True)
    # 4 KiB: room for no file of Hydra's.
    with small_tmpfs(sweep_dir / "2", "4k"), read_only(sweep_dir / "3"):
        yield {
            1: f"the run directory {sweep_dir / '1'} is a symbolic link (to {victim}); a sweep writes only into "
            "directories it makes: remove the link",
            2: f"no space left on device under {sweep_dir / '2'} (",
            3: f"the file system of {sweep_dir / '3'} is read-only",
        }
