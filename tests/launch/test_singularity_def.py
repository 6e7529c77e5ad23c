"""Singularity.def: its structure, and its runscript and test sections run outside a container.

Building the image needs the NeMo base image and a container runtime; the sections are what
these tests can run, with this machine's python3 standing in for the image's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.paths import REPO

DEF = REPO / "Singularity.def"


def sections() -> tuple[dict[str, str], dict[str, str]]:
    """(header keywords, {section name: body}) of the definition file."""
    header: dict[str, str] = {}
    body: dict[str, list[str]] = {}
    current = None
    for line in DEF.read_text().splitlines():
        if line.startswith("%"):
            current = line[1:].strip()
            body[current] = []
        elif current is None:
            match = re.match(r"^(\w+):\s*(.+)$", line)
            if match:
                header[match[1]] = match[2]
        else:
            body[current].append(line)
    return header, {k: "\n".join(v) for k, v in body.items()}


def run_section(script: str, *args: str) -> subprocess.CompletedProcess:
    # python3 of this environment, as the image's python3 would be.
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    return subprocess.run(
        ["bash", "-euc", script, "runscript", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_builds_from_a_nemo_base_image_with_a_tag_argument():
    header, body = sections()
    assert header["Bootstrap"] == "docker"
    assert header["From"] == "nvcr.io/nvidia/nemo:{{ NEMO_TAG }}"
    assert re.search(r"^\s*NEMO_TAG=\d\d\.\d\d$", body["arguments"], re.M)


def test_copies_everything_the_package_and_its_config_need():
    _, body = sections()
    copied = {}
    for line in body["files"].splitlines():
        if line.strip():
            src, dest = line.split()
            copied[src] = dest
            assert (REPO / src).exists(), f"%files copies {src}, which is not in the repository"
            assert dest == f"/opt/ghsweep/{src}"
    # conf/experiment and conf/hydra/launcher are links to these two.
    assert {"pyproject.toml", "ghsweep", "hydra_plugins", "conf", "experiments", "launchers"} <= set(copied)


def test_post_keeps_the_images_torch_and_installs_ghsweep():
    _, body = sections()
    post = body["post"]
    assert "torch" in post and "> /opt/ghsweep/constraints.txt" in post
    # Not editable: the package brings its config (ghsweep/conf), so the install needs no source tree.
    assert "pip install --no-cache-dir -c /opt/ghsweep/constraints.txt /opt/ghsweep" in post and " -e " not in post


def test_runscript_runs_the_cli_outside_a_container():
    _, body = sections()
    assert body["runscript"].strip() == 'exec python3 -m ghsweep "$@"'
    proc = run_section(body["runscript"], "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ghsweep: sweeps of LLM fine-tuning runs" in proc.stdout
    assert "precision: bf16, fp16, fp32, fp8" in proc.stdout


def test_test_section_passes_outside_a_container():
    _, body = sections()
    proc = run_section(body["test"])
    assert proc.returncode == 0, proc.stderr[-2000:]
