"""The config ships inside the package: a wheel installed without the repository composes and runs.

Built the way a user or a container build installs ghsweep (a wheel, not editable), into a fresh
virtual environment that borrows this interpreter's dependencies, and run from a directory that
holds no conf/: Hydra must find conf/, experiments/ and launchers/ as package data.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

# What a wheel is built from (ghsweep/conf links to conf/, which links experiments/ and launchers/).
SOURCES = ["pyproject.toml", "README.md", "ghsweep", "hydra_plugins", "conf", "experiments", "launchers"]


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory) -> Path:
    """A venv's python with ghsweep installed from a freshly built wheel, and nothing else of the repo."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    wheels = root / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    see_these_packages(python)
    # --force-reinstall: this interpreter's site-packages already hold a ghsweep (editable) to shadow.
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            *map(str, wheels.glob("ghsweep-*.whl")),
        ],
        check=True,
        env=without_repo(),
    )
    return python


def see_these_packages(python: Path) -> None:
    """Give the venv of `python` this interpreter's packages (hydra, torch, ...), after its own.
    `venv --system-site-packages` would give it the base interpreter's instead, which lack them when
    this interpreter is itself a venv's (pip install -e ".[test]" in a venv)."""
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    # One line: site runs a .pth line that starts with `import`, in a scope of its own.
    adds = "; ".join(f"site.addsitedir({d!r})" for d in dirs)
    (Path(purelib) / "_outer_site_packages.pth").write_text(f"import site; {adds}\n")


def without_repo() -> dict[str, str]:
    """This environment without PYTHONPATH: the repository must not be importable."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_installed(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=without_repo(), capture_output=True, text=True, timeout=300
    )


def test_the_wheel_is_imported_not_the_repo(installed_python, tmp_path):
    proc = run_installed(installed_python, tmp_path, "-c", "import ghsweep; print(ghsweep.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(installed_python.parents[1])), proc.stdout


def test_installed_wheel_composes_a_preset(installed_python, tmp_path):
    proc = run_installed(
        installed_python, tmp_path, "-m", "ghsweep", "--cfg", "job", "experiment=smoke", "precision=fp32"
    )
    assert proc.returncode == 0, proc.stderr
    assert "max_steps: 20" in proc.stdout and "name: fp32" in proc.stdout


def test_installed_wheel_finds_the_launch_profiles(installed_python, tmp_path):
    proc = run_installed(installed_python, tmp_path, "-m", "ghsweep", "--cfg", "hydra", "hydra/launcher=gh200")
    assert proc.returncode == 0, proc.stderr
    assert "ghsweep_launcher.SlurmLauncher" in proc.stdout
    searchpath = run_installed(installed_python, tmp_path, "-m", "ghsweep", "--info", "searchpath")
    assert f"file://{installed_python.parents[1]}" in searchpath.stdout and "ghsweep/conf" in searchpath.stdout


def test_installed_wheel_trains_a_run(installed_python, tmp_path):
    # Every subpackage must be in the wheel, the worker's backends included, not only the config.
    proc = run_installed(
        installed_python,
        tmp_path,
        "-m",
        "ghsweep",
        "experiment=smoke",
        "train.max_steps=4",
        "train.log_every=2",
        "profile=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "FINISHED"
