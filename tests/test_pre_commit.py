"""The pre-commit hooks run the lint, format and type checks CI runs (.ci/run), command for command, and
then the quick tier of the tests, which CI's pytest run includes."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import REPO

CI = (REPO / ".ci/run").read_text()
REPOS = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
HOOKS = [hook for repo in REPOS for hook in repo["hooks"]]


def test_the_pre_commit_hooks_are_cis_lint_format_and_type_checks_then_the_quick_tier():
    checks = re.findall(r"^python3 -m (?:ruff|mypy)\b.*$", CI, flags=re.MULTILINE)
    assert len(checks) == 3
    assert [hook["entry"] for hook in HOOKS] == [*checks, "python3 -m pytest -m quick -q"]
    # The installed tools (nothing downloaded at commit time), each over the whole tree as in CI.
    assert all(repo["repo"] == "local" for repo in REPOS)
    assert {hook["language"] for hook in HOOKS} == {"system"}
    assert all(hook["pass_filenames"] is False for hook in HOOKS)


def test_ci_runs_every_tier_the_quick_one_included():
    [main] = re.findall(r"^python3 -m pytest (.*)$", CI, flags=re.MULTILINE)
    assert main.startswith('-m "not nemo and not automodel"')  # quick, cli, systems and gpu (skipped without one)
    # Each in its own environment, beside the main call (one worker each, no cache of their own).
    assert re.search(r"^ +\.venv-nemo/bin/python -m pytest -m nemo -n 1 -p no:cacheprovider$", CI, flags=re.MULTILINE)
    assert re.search(
        r"^ +\.venv-automodel/bin/python -m pytest -m automodel -n 1 -p no:cacheprovider$", CI, flags=re.MULTILINE
    )
