"""The pre-commit hooks run the lint, format and type checks CI runs (.ci/run), command for command."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import REPO


def test_the_pre_commit_hooks_are_cis_lint_format_and_type_checks():
    ci = re.findall(r"^python3 -m (?:ruff|mypy)\b.*$", (REPO / ".ci/run").read_text(), flags=re.MULTILINE)
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert len(ci) == 3
    assert [hook["entry"] for hook in hooks] == ci
    # The installed tools (nothing downloaded at commit time), each over the whole tree as in CI.
    assert all(repo["repo"] == "local" for repo in config["repos"])
    assert {hook["language"] for hook in hooks} == {"system"}
    assert all(hook["pass_filenames"] is False for hook in hooks)
