"""Where the repository and its Hydra config live."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
