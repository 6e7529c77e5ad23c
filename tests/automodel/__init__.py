"""The NeMo AutoModel environment the backend=automodel tests run in (built by tests/automodel/make_env.sh)."""

from __future__ import annotations

import os

import pytest


def require_automodel():
    """`nemo_automodel`, or a skip with the reason; in CI (CI=true) a failure, never a skip."""
    try:
        import nemo_automodel
    except ImportError as exc:
        reason = (f"NeMo AutoModel does not import here ({exc}); build its environment with "
                  "`bash tests/automodel/make_env.sh` and run `.venv-automodel/bin/python -m pytest -m automodel`")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    return nemo_automodel


@pytest.fixture(scope="session")
def automodel():
    return require_automodel()
