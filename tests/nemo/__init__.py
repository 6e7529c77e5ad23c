"""The NeMo environment the backend=nemo tests run in (built by tests/nemo/make_env.sh)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.optional_env import require


def require_nemo() -> ModuleType:
    """`nemo.collections.llm` with its recipes (see tests/optional_env.py for the skip)."""
    llm = require("nemo.collections.llm", "tests/nemo/make_env.sh", ".venv-nemo", "nemo")
    # Without nvidia-modelopt the collection imports but has no recipes.
    if not hasattr(llm, "llama2_7b"):
        pytest.fail("nemo.collections.llm has no llama2_7b recipe: is nvidia-modelopt installed?", pytrace=False)
    return llm
