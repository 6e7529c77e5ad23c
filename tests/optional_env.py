"""The one way a test says a part it needs is missing here: a skip with the reason and how to get the
part, except with CI=true (.ci/run sets it and installs every optional part but a GPU), where a
missing part is a failure. The GPU tests (marker `gpu`) skip without CUDA everywhere (tests/conftest.py)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str, module_level: bool = False) -> NoReturn:
    """Skip with `reason`; with CI=true fail with it instead."""
    if in_ci():
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def require(module: str, env_script: str, venv: str, marker: str) -> ModuleType:
    """`module` imported, or unavailable() naming how to build its environment."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        unavailable(
            f"{module} does not import here ({exc}); build its environment with `bash {env_script}` "
            f"and run `{venv}/bin/python -m pytest -m {marker}`"
        )
