"""The optional backends' environments (NeMo, NeMo AutoModel): their tests run where the package
imports, skip with the way to build it elsewhere, and fail in CI (CI=true), which builds them."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str, env_script: str, venv: str, marker: str) -> ModuleType:
    """`module` imported, or a skip naming how to build its environment; with CI=true a failure."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = (f"{module} does not import here ({exc}); build its environment with `bash {env_script}` "
                  f"and run `{venv}/bin/python -m pytest -m {marker}`")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
