"""The layers of ARCHITECTURE.md, checked on the source: a package imports only from layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ghsweep"

# Lower never imports higher (ARCHITECTURE.md). Packages of one layer do not import each other, except
# where listed in SIDEWAYS.
LAYERS = {
    "core": 0,
    "config": 1,
    "train": 2,
    "profile": 2,
    "tracking": 2,
    "report": 3,
    "launch": 4,
    "tune": 5,
    # The command-line entry points.
    "__main__": 6,
    "analyze": 6,
    "status": 6,
    "gate": 6,
    "bench": 6,
}
# The training loop runs the PyTorch profiler's capture window, and nothing else of profile.
SIDEWAYS = {("train", "ghsweep.profile.torch_capture")}


# Every import whose module is named at run time, which the layer checks above cannot read: (file,
# the call as written) -> why it stays dynamic. A ghsweep module is imported with an import statement.
DYNAMIC_IMPORTS = {
    ("train/warm_worker.py", "importlib.import_module(module)"): "third-party modules a forked worker would import",
}


def dynamic_imports(source: str) -> list[str]:
    """The calls in `source` that import a module named at run time (importlib.import_module,
    __import__), or ask whether ghsweep's own module or one named at run time is there (find_spec);
    find_spec of a named third-party package (find_spec("rmm")) only probes what is installed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in ("import_module", "__import__"):
            found.append(ast.unparse(node))
        elif name == "find_spec":
            module = node.args[0] if node.args else None
            named = isinstance(module, ast.Constant) and isinstance(module.value, str)
            if not named or module.value.split(".")[0] == "ghsweep":  # type: ignore[union-attr]
                found.append(ast.unparse(node))
    return found


def imports() -> list[tuple[str, str, str]]:
    """(importing module's file, its layer name, imported ghsweep module) for every import of ours."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ghsweep."):
                found.append((str(path.relative_to(PACKAGE)), layer, node.module))
            elif isinstance(node, ast.Import):
                found += [
                    (str(path.relative_to(PACKAGE)), layer, a.name) for a in node.names if a.name.startswith("ghsweep.")
                ]
    return found


def test_every_top_level_module_has_a_layer():
    top = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    assert top == set(LAYERS)


def test_no_layer_imports_a_layer_above_or_beside_it():
    wrong = []
    for source, layer, module in imports():
        target = module.split(".")[1]
        if target == layer or (layer, module) in SIDEWAYS:
            continue
        if LAYERS[target] >= LAYERS[layer]:
            wrong.append(f"{source} ({layer}, layer {LAYERS[layer]}) imports {module} (layer {LAYERS[target]})")
    assert wrong == []


def test_core_imports_nothing_else_of_ghsweep():
    assert [m for _, layer, m in imports() if layer == "core" and not m.startswith("ghsweep.core")] == []


def test_every_dynamic_import_is_listed():
    found = {
        (str(path.relative_to(PACKAGE)), call)
        for path in PACKAGE.rglob("*.py")
        for call in dynamic_imports(path.read_text())
    }
    assert found == set(DYNAMIC_IMPORTS)


def test_the_dynamic_import_check_finds_each_form():
    planted = """
import importlib
import importlib.util
from importlib import import_module
importlib.import_module("ghsweep.launch.job")
import_module(name)
__import__("ghsweep.tune")
importlib.util.find_spec("ghsweep.train.nemo")
importlib.util.find_spec(name)
importlib.util.find_spec("rmm")
"""
    assert dynamic_imports(planted) == [
        "importlib.import_module('ghsweep.launch.job')",
        "import_module(name)",
        "__import__('ghsweep.tune')",
        "importlib.util.find_spec('ghsweep.train.nemo')",
        "importlib.util.find_spec(name)",
    ]
