"""The tier of a test, from what it needs (pyproject.toml's markers): `systems` (a SLURM cluster, an
MLflow server, a browser, the NeMo or AutoModel environment), `cli` (processes started here: the CLI's
real sweeps, a worker, any subprocess), `gpu` (marked by hand, as today), else `quick` (in-process).

A test's needs are read from its code, the code of the fixtures it uses and of the test helpers they
call (every function of tests/, followed by name), so a new test is put in its tier without being
marked: a call of run_cli makes it `cli`, the slurm_cluster fixture `systems`. A test that starts a
process through ghsweep's own code (a worker, a compiler) names none of these: it is marked `cli` by
hand, and a quick test that starts one anyway fails, saying so (`no_processes`)."""

from __future__ import annotations

import _posixsubprocess
import os
import platform
import subprocess
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("systems", "cli", "gpu", "quick")
# Markers that already say a test needs a system: an optional environment of its own.
SYSTEMS_MARKERS = {"nemo", "automodel"}
# Names in a test's code (or its fixtures' and helpers') that start a cluster, a server or a browser.
SYSTEMS_NAMES = {"running_cluster", "start_server", "sync_playwright"}
# Names that start a process on this machine.
PROCESS_NAMES = {"run_cli", "start_cli", "subprocess", "Popen", "multiprocessing", "fork", "posix_spawn"}


class ProcessInQuickTest(BaseException):
    """A quick test started a process. A BaseException: code under test that catches Exception (a
    command that is missing, a process that fails) must not take it for the process's own failure."""


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and the code nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _in_tests(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or getattr(obj, "__name__", "")).startswith("tests.")


def names_used(functions: Iterable[Callable[..., Any]]) -> set[str]:
    """The global and attribute names the code of `functions` uses, and of every function or class of
    tests/ they reach by those names (ghsweep's own code is not followed: its processes are marked by hand)."""
    names: set[str] = set()
    todo = list(functions)
    seen: set[int] = set()
    while todo:
        func = todo.pop()
        func = getattr(func, "__func__", func)  # a test class's method
        func = getattr(func, "__wrapped__", func)
        if id(func) in seen:
            continue
        seen.add(id(func))
        if isinstance(func, type):
            todo += [v for v in vars(func).values() if isinstance(v, types.FunctionType)]
            continue
        if not isinstance(func, types.FunctionType):
            continue
        used = {name for code in _code_objects(func.__code__) for name in code.co_names}
        names |= used
        scope = func.__globals__
        modules = [scope[n] for n in used if isinstance(scope.get(n), types.ModuleType) and _in_tests(scope[n])]
        for name in used:
            for obj in [scope.get(name), *(getattr(m, name, None) for m in modules)]:
                if isinstance(obj, (types.FunctionType, type)) and _in_tests(obj):
                    todo.append(obj)
    return names


def fixture_functions(item: pytest.Item) -> list[Callable[..., Any]]:
    """The functions of the fixtures `item` uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [fixturedef.func for name in item.fixturenames for fixturedef in info.name2fixturedefs.get(name, ())]


def tier_of(item: pytest.Item) -> str:
    """`item`'s tier: the one it is marked with, else the one its code and fixtures need."""
    # gpu first: a GPU test runs with the GPU tests, whatever else it needs.
    marked = [tier for tier in ("gpu", *TIERS) if item.get_closest_marker(tier)]
    if marked:
        return marked[0]
    if any(item.get_closest_marker(name) for name in SYSTEMS_MARKERS):
        return "systems"
    test = getattr(item, "function", None)
    return tier_needed(names_used([*([test] if test else []), *fixture_functions(item)]))


def tier_needed(names: set[str]) -> str:
    if names & SYSTEMS_NAMES:
        return "systems"
    if names & PROCESS_NAMES:
        return "cli"
    return "quick"


@contextmanager
def no_processes(nodeid: str) -> Iterator[None]:
    """Starting a process (subprocess, fork, spawn, multiprocessing) raises ProcessInQuickTest inside."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ProcessInQuickTest(
            f"{nodeid} is in the quick tier (its code and fixtures call nothing that starts a process) and "
            "started one; mark it @pytest.mark.cli (or systems) where it needs the process (pyproject.toml's markers)"
        )

    # The standard library asks `uname -p` once per interpreter, the first time anything wants
    # platform.processor() (MLflow's import does): asked here, before the guard, so a library's first
    # import inside a quick test is not taken for the test starting a process.
    platform.processor()
    patched: list[tuple[Any, str, Any]] = [
        (subprocess.Popen, "_execute_child", refuse),
        (_posixsubprocess, "fork_exec", refuse),  # multiprocessing's spawn and forkserver
        *((os, name, refuse) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, replacement in patched:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
