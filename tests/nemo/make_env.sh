#!/usr/bin/env bash
# Build the NeMo environment: a virtualenv with nemo-toolkit 2.7.3 (the last release with the LLM
# collection) and ghsweep, on a machine without a GPU. The path is $GHSWEEP_NEMO_VENV (default
# .venv-nemo in the repository). Safe to run again: it reinstalls the same pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${GHSWEEP_NEMO_VENV:-.venv-nemo}"
# --no-compile: Python compiles what NeMo imports on first use, not the whole 2.6 GB up front.
pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "$@"; }

# Debian's own python3 has venv only with the python3-venv package; virtualenv (PyPI) needs nothing.
python3 -m venv "$venv" || { python3 -m pip install --quiet virtualenv && python3 -m virtualenv --quiet "$venv"; }
# The CPU build of torch first, as in .ci/run: otherwise pip pulls the CUDA build.
pip_install torch==2.13.0
# Without their dependencies (see the `nemo` set in pyproject.toml for why and what they need).
pip_install --no-deps nemo_run==0.11.1 leptonai==0.27.3
pip_install -e ".[nemo,test]"
echo "NeMo environment ready: $venv"
