"""Fixtures of the training tests: the optional backends' environments and a saved Hugging Face model."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.automodel import require_automodel
from tests.nemo import require_nemo
from tests.support.models import saved_hf_llama


@pytest.fixture(scope="session")
def nemo_llm() -> ModuleType:
    return require_nemo()


@pytest.fixture(scope="session")
def automodel() -> ModuleType:
    return require_automodel()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A 2-layer Llama folder (safetensors and tokenizer), made once per module that asks for it."""
    return saved_hf_llama(tmp_path_factory.mktemp("tiny_hf_llama"))
