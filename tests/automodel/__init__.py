"""The NeMo AutoModel environment the backend=automodel tests run in (built by tests/automodel/make_env.sh)."""

from __future__ import annotations

from types import ModuleType

from tests.optional_env import require


def require_automodel() -> ModuleType:
    return require("nemo_automodel", "tests/automodel/make_env.sh", ".venv-automodel", "automodel")
