"""The layout of the tests, checked on their source: helpers live in tests/support/ (or in a folder's
helper module), fixtures in conftest.py files, and no test module imports tests/conftest.py or another
test module; Hydra's compose API is called in tests/support/compose.py alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
COMPOSE_HELPER = TESTS / "support" / "compose.py"
# Hydra's compose API: whoever calls it composes conf/ their own way (another version_base, another config).
HYDRA_COMPOSE_NAMES = {"compose", "initialize", "initialize_config_dir", "initialize_config_module"}


def module_name(path: Path) -> str:
    parts = path.relative_to(TESTS).with_suffix("").parts
    return ".".join(("tests", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_modules(tree: ast.AST, module: str) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) of every import in `tree`, relative imports resolved from `module`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            found.append((base, [a.name for a in node.names]))
    return found


def fixtures_of(tree: ast.AST) -> set[str]:
    """The functions of a module that are pytest fixtures (`@pytest.fixture`, with or without arguments)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) in ("pytest.fixture", "fixture"):
                    names.add(node.name)
    return names


def wrong_imports(sources: dict[str, str]) -> list[str]:
    """What the modules of `sources` (dotted name -> source) import that they must not: tests/conftest.py,
    a test module (test_*), or a fixture (pytest finds fixtures in conftest.py files; one imported into
    several modules is set up once per module that imports it)."""
    trees = {name: ast.parse(source) for name, source in sources.items()}
    fixtures = {name: fixtures_of(tree) for name, tree in trees.items()}
    wrong = []
    for name, tree in trees.items():
        for module, names in imported_modules(tree, name):
            if not module.startswith("tests"):
                continue
            taken = [f"{module}.{n}" for n in names] or [module]
            for target in [module, *taken]:
                last = target.rsplit(".", 1)[-1]
                if last == "conftest" or last.startswith("test_"):
                    wrong.append(f"{name} imports {target}")
                    break
            else:
                wrong += [f"{name} imports the fixture {module}.{n}" for n in names if n in fixtures.get(module, ())]
    return wrong


def hydra_compose_calls(source: str) -> list[str]:
    """The places `source` takes Hydra's compose API: `from hydra import compose, ...` or `hydra.compose(...)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hydra":
            found += [
                f"line {node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name in HYDRA_COMPOSE_NAMES
            ]
        elif (
            isinstance(node, ast.Attribute) and node.attr in HYDRA_COMPOSE_NAMES and ast.unparse(node.value) == "hydra"
        ):
            found.append(f"line {node.lineno}: hydra.{node.attr}")
    return found


def sources_of_tests() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(TESTS.rglob("*.py"))}


TEST_SOURCES = sources_of_tests()


def test_no_module_imports_tests_conftest_a_test_module_or_a_fixture():
    assert wrong_imports({module_name(path): source for path, source in TEST_SOURCES.items()}) == []


def test_the_compose_helper_is_the_only_hydra_compose():
    elsewhere = {
        str(path.relative_to(TESTS)): calls
        for path, source in TEST_SOURCES.items()
        if path != COMPOSE_HELPER and (calls := hydra_compose_calls(source))
    }
    assert elsewhere == {}
    assert hydra_compose_calls(COMPOSE_HELPER.read_text())


def test_mlflow_telemetry_is_turned_off_in_tests_conftest_alone():
    setting = [
        str(path.relative_to(TESTS))
        for path, source in TEST_SOURCES.items()
        if "MLFLOW_DISABLE_TELEMETRY" in source and path != Path(__file__).resolve()
    ]
    # Set there as the tests start, it reaches every MLflow client: here and in the processes started.
    assert setting == ["conftest.py"]


@pytest.mark.parametrize(
    "sources, expected",
    [
        ({"tests.a.test_x": "from tests.conftest import run_cli\n"}, ["tests.a.test_x imports tests.conftest"]),
        ({"tests.a.test_x": "from tests.a.test_y import helper\n"}, ["tests.a.test_x imports tests.a.test_y"]),
        ({"tests.a.test_x": "from .test_y import helper\n"}, ["tests.a.test_x imports tests.a.test_y"]),
        ({"tests.a.test_x": "from tests.a import test_y\n"}, ["tests.a.test_x imports tests.a.test_y"]),
        (
            {
                "tests.a.test_x": "from tests.a.helpers import made  # noqa: F401\n",
                "tests.a.helpers": "import pytest\n\n@pytest.fixture(scope='module')\ndef made():\n    return 1\n",
            },
            ["tests.a.test_x imports the fixture tests.a.helpers.made"],
        ),
        ({"tests.a.test_x": "from tests.support.cli import run_cli\nfrom tests.optional_env import require\n"}, []),
    ],
)
def test_the_import_check_finds_what_it_refuses(sources, expected):
    assert wrong_imports(sources) == expected


def test_the_compose_check_finds_hydra_s_compose_api():
    assert hydra_compose_calls("from hydra import compose, initialize_config_dir\n") == [
        "line 1: from hydra import compose",
        "line 1: from hydra import initialize_config_dir",
    ]
    assert hydra_compose_calls("import hydra\ncfg = hydra.compose('config')\n") == ["line 2: hydra.compose"]
    assert hydra_compose_calls("from hydra.core.global_hydra import GlobalHydra\n") == []
