#!/usr/bin/env bash
# Build the NeMo AutoModel environment: a virtualenv with nemo-automodel (which pins its own
# transformers) and ghsweep, on a machine without a GPU. The path is $GHSWEEP_AUTOMODEL_VENV
# (default .venv-automodel in the repository). Safe to run again: it reinstalls the same pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${GHSWEEP_AUTOMODEL_VENV:-.venv-automodel}"
pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "$@"; }

python3 -m venv "$venv" || { python3 -m pip install --quiet virtualenv && python3 -m virtualenv --quiet "$venv"; }
# The CPU build of torch first, as in .ci/run: otherwise pip pulls the CUDA build.
pip_install torch==2.13.0
pip_install -e ".[automodel,test]"
echo "AutoModel environment ready: $venv"
