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
    "capture": 2,
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
# The training loop runs the PyTorch profiler's capture window; the analysis finds and runs the Nsight tools.
SIDEWAYS = {("train", "ghsweep.capture.torch_capture"), ("profile", "ghsweep.capture.nsight_commands")}


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
