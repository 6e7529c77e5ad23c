"""The NeMo environment the backend=nemo tests run in (built by tests/nemo/make_env.sh)."""

from __future__ import annotations

import os

import pytest


def require_nemo():
    """`nemo.collections.llm`, or a skip with the reason; in CI (CI=true) a failure, never a skip."""
    try:
        from nemo.collections import llm
    except ImportError as exc:
        reason = (f"NeMo does not import here ({exc}); build its environment with `bash tests/nemo/make_env.sh` "
                  "and run `.venv-nemo/bin/python -m pytest -m nemo`")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    # Without nvidia-modelopt the collection imports but has no recipes.
    if not hasattr(llm, "llama2_7b"):
        pytest.fail("nemo.collections.llm has no llama2_7b recipe: is nvidia-modelopt installed?", pytrace=False)
    return llm


@pytest.fixture(scope="session")
def nemo_llm():
    return require_nemo()
