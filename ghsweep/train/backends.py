"""The training backends by name: backend=NAME -> the module-level BACKEND of its light module.

The plan asks the chosen backend to check a config and the dry run to describe it, without loading
NeMo or transformers: a registered module stays light to import (no torch, transformers or NeMo at
its top) and imports what training needs inside `train`. A new backend is one folder with such a
module, one line here, its name among BackendSchema.name's choices, and its config file in
conf/backend/.
"""

from __future__ import annotations

from ghsweep.core.errors import ConfigError
from ghsweep.train import torch_backend
from ghsweep.train.automodel import automodel_backend
from ghsweep.train.backend_protocol import Backend
from ghsweep.train.nemo import nemo_backend

BACKENDS: dict[str, Backend] = {
    backend.name: backend for backend in (torch_backend.BACKEND, nemo_backend.BACKEND, automodel_backend.BACKEND)
}


def backend_named(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"backend={name}: not a known backend; accepted: {', '.join(BACKENDS)}")
    return BACKENDS[name]
