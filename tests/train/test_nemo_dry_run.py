"""`dry_run=true` with backend=nemo prints each combination's composed recipe and keeps it in its run dir.

Runs the real CLI with the NeMo environment's interpreter (CI: `.venv-nemo/bin/python -m pytest -m nemo`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ghsweep.core.run_dir import RECIPE_JSON, RECIPE_TXT
from ghsweep.train.nemo.recipe import build_recipe, load_recipe
from tests.support.cli import run_cli
from tests.support.nemo_recipes import nemo_typed

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]


def test_dry_run_prints_the_recipe_and_the_worker_command_and_keeps_the_recipe(tmp_path):
    proc = run_cli(
        ["-m", "backend=nemo", "dry_run=true", "model=llama2_7b,tiny_llama", "offload=on", "offload.num_layers=4"],
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    # The tiny model's combination is not runnable (below): the dry run says so and exits 1.
    assert proc.returncode == 1, out[-3000:]
    assert "ghsweep: dry run: 1 combination(s) not runnable, marked above" in proc.stderr
    blocks = re.split(r"(?m)^#(?=\d+ )", proc.stdout)[1:]
    assert len(blocks) == 2
    by_model = {("llama2_7b" if "model=llama2_7b" in b.splitlines()[0] else "tiny_llama"): b for b in blocks}

    llama = by_model["llama2_7b"]
    run_dir = Path(re.search(r"run dir: (\S+)", llama).group(1))
    assert re.search(r"worker: .*python\S* -m ghsweep\.train\.worker " + re.escape(str(run_dir)), llama)
    assert "<Partial[finetune(" in llama and "cpu_offloading_num_layers=4" in llama
    # capture.start_step=auto: the last 3 of train.max_steps=10 steps.
    assert "<Config[NsysCallback(start_step=7, end_step=9" in llama
    # Nothing trained, nothing recorded: only the recipe is kept.
    assert (run_dir / RECIPE_TXT).exists() and not (run_dir / "metrics.jsonl").exists()
    config = nemo_typed("model=llama2_7b", "offload=on", "offload.num_layers=4")
    assert load_recipe(run_dir) == build_recipe(config, run_dir)

    # Four offloaded layers of a four-layer model: Megatron would refuse it, the dry run says so.
    tiny = by_model["tiny_llama"]
    assert "recipe:  (not runnable) offload.num_layers=4: with backend=nemo" in tiny
    tiny_dir = Path(re.search(r"run dir: (\S+)", tiny).group(1))
    assert not (tiny_dir / RECIPE_JSON).exists()
