"""Every command the README and docs/ give runs as written: each `python -m ghsweep ...` line's keys and
group options exist (the CLI's own check, launch/overrides.py) and its first combination composes (as the
CLI composes it); each `python -m ghsweep.X` names a module that exists. In-process, no subprocess."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType

from ghsweep.launch.overrides import refusals
from ghsweep.launch.resume import identity_overrides
from tests.support.compose import compose_config
from tests.support.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
# `python -m ghsweep...`, `python3 -m ...`, `.venv-nemo/bin/python -m ...`, after `$ ` or NAME=value.
COMMAND = re.compile(r"(?:^|&&\s*|\$ |`)(?:[A-Z_]+=\S+ )*(?:\S*/)?python3? -m ghsweep[\w.]*(?: [^`\n]*)?")
# The CLI's own flags and the ones Hydra adds, with how many values follow each.
FLAGS = {"-m": 0, "--multirun": 0, "--cfg": 1, "--resolve": 0, "--package": 1, "--help": 0, "--info": 0}
FIRST_VALUE_ONLY = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP)
# Hydra's notice on the submitit launcher's schema, which the CLI silences (ghsweep/__main__.py).
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*is validated against ConfigStore schema with the same name")


def code_lines(text: str) -> list[str]:
    """The text's lines of code: fenced or indented blocks, `\\` continuations joined, and inline code."""
    lines, fenced, joined = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            joined += line.strip().removesuffix("\\").rstrip() + " " if line.rstrip().endswith("\\") else line.strip()
            if not line.rstrip().endswith("\\"):
                lines.append(joined)
                joined = ""
        else:
            lines += re.findall(r"`([^`\n]+)`", line)
    return lines


def commands(text: str) -> list[str]:
    """Each ghsweep command of the text, from `python` on, one per `&&` part."""
    found = []
    for line in code_lines(text):
        for part in line.split("&&"):
            match = COMMAND.search(part.strip())
            if match:
                found.append(re.sub(r"^(?:&&\s*|\$ |`)?(?:[A-Z_]+=\S+ )*(?:\S*/)?", "", match.group(0)).strip())
    return found


def module_and_args(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command, comments=True)
    return words[2], words[3:]


def overrides_of(args: list[str]) -> list[str]:
    """The overrides of a `python -m ghsweep` command line: its flags and `...` placeholders left out."""
    overrides, skip = [], 0
    for word in args:
        if skip:
            skip -= 1
        elif word in FLAGS:
            skip = FLAGS[word]
        elif word != "...":
            overrides.append(word)
    return overrides


def first_combination(overrides: list[str]) -> list[str]:
    """The overrides of the sweep's first combination (a tuning study's intervals left to their defaults)."""
    first = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            if override.value_type not in FIRST_VALUE_ONLY:
                continue
            value = next(override.sweep_string_iterator())
            first.append(f"{override.get_key_element()}={value}")
        else:
            first.append(override.input_line or "")
    return first


def problems(command: str) -> list[str]:
    """What is wrong with one documented command (empty when it runs as written)."""
    module, args = module_and_args(command)
    if module != "ghsweep":
        return [] if importlib.util.find_spec(module) else [f"no module {module}"]
    overrides = overrides_of(args)
    refused = refusals(overrides)
    if refused:
        return refused
    try:
        compose_config(*first_combination(overrides), hydra=True)
    except Exception as exc:  # Hydra's errors have no common base class
        return [f"does not compose: {str(exc).splitlines()[0]}"]
    return []


DOCUMENTED = [(page.relative_to(REPO).as_posix(), command) for page in PAGES for command in commands(page.read_text())]


def test_the_pages_give_their_commands():
    pages = {page for page, _ in DOCUMENTED}
    assert {"README.md", "docs/running.md", "docs/ci.md", "docs/tuning.md"} <= pages
    readme = [command for page, command in DOCUMENTED if page == "README.md"]
    assert "python -m ghsweep -m experiment=smoke precision=fp32,bf16" in readme
    assert "python -m ghsweep -m precision=bf16,fp8 offload=on,off" in readme


@pytest.mark.parametrize("page,command", DOCUMENTED)
def test_a_documented_command_runs_as_written(page, command):
    assert problems(command) == [], f"{page}: {command}"


def test_a_mistaken_command_is_caught():
    assert problems("python -m ghsweep -m precison=bf16")
    assert problems("python -m ghsweep -m precision=bf16,fp9")
    assert problems("python -m ghsweep hydra/launcher=gh2000")
    assert problems("python -m ghsweep.gates SWEEP --against ref.json") == ["no module ghsweep.gates"]
    assert problems("python -m ghsweep experiment=smoke train.max_steps=3") == []


def test_code_is_read_from_blocks_and_inline():
    text = (
        "Run `python -m ghsweep -m seed=1,2` or\n\n"
        "    CUDA_VISIBLE_DEVICES=2 python -m ghsweep -m peft=lora \\\n"
        "        precision=bf16   # a comment\n\n"
        "```\n$ pip install -e . && python3 -m ghsweep.status multirun/x\n```\n"
    )
    assert commands(text) == [
        "python -m ghsweep -m seed=1,2",
        "python -m ghsweep -m peft=lora precision=bf16   # a comment",
        "python3 -m ghsweep.status multirun/x",
    ]


def combinations(overrides: list[str]) -> set[str]:
    """Each combination of a grid sweep, as the gate names it (its identity overrides, sorted)."""
    values = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in OverridesParser.create().parse_overrides(overrides)
    ]
    return {" ".join(sorted(identity_overrides(list(c)))) for c in itertools.product(*values)}


def test_the_first_command_runs_what_the_readme_gates_it_against():
    """The README's first command, gated against benchmarks/cpu_smoke.json as the README says, finds every
    combination of the reference (CI's sweep: the same combinations, its workers started fresh)."""
    first = next(command for page, command in DOCUMENTED if page == "README.md" and " -m experiment=smoke" in command)
    assert "--against benchmarks/cpu_smoke.json" in (REPO / "README.md").read_text()
    reference = json.loads((REPO / "benchmarks" / "cpu_smoke.json").read_text())
    assert combinations(overrides_of(module_and_args(first)[1])) == set(reference["runs"])
    assert combinations(overrides_of(shlex.split(reference["command"])[3:])) == set(reference["runs"])
