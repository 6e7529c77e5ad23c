"""The layers of ARCHITECTURE.md, checked on the source: a package imports only from layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ghsweep"

# Lower never imports higher (ARCHITECTURE.md), and packages of one layer do not import each other.
LAYERS = {
    "core": 0,
    "config": 1,
    # What records a run while it trains: the worker (train), the job (launch) and the analysis's
    # export and ncu pass (profile) use it.
    "capture": 2,
    "train": 3,
    "profile": 3,
    "tracking": 3,
    "report": 4,
    "launch": 5,
    "tune": 6,
    # The command-line entry points.
    "__main__": 7,
    "analyze": 7,
    "status": 7,
    "gate": 7,
    "bench": 7,
}


# Every import whose module is named at run time, which the layer checks above cannot read: (file,
# the call as written) -> why it stays dynamic. A ghsweep module is imported with an import statement.
DYNAMIC_IMPORTS = {
    ("train/warm_worker.py", "importlib.import_module(module)"): "third-party modules a forked worker would import",
    ("launch/bytecode_cache.py", "importlib.util.find_spec(PROBE)"): "where torch's source is (a test probes its own)",
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


def wrong_imports(found: list[tuple[str, str, str]]) -> list[str]:
    """The imports of `found` (as imports() gives them) that run up or sideways, one line each."""
    wrong = []
    for source, layer, module in found:
        target = module.split(".")[1]
        if target != layer and LAYERS[target] >= LAYERS[layer]:
            wrong.append(f"{source} ({layer}, layer {LAYERS[layer]}) imports {module} (layer {LAYERS[target]})")
    return wrong


def test_no_layer_imports_a_layer_above_or_beside_it():
    assert wrong_imports(imports()) == []


def test_an_import_up_or_sideways_is_named():
    planted = [
        ("capture/torch_capture.py", "capture", "ghsweep.profile.analysis"),  # up: capture reads no recording
        ("train/torch_train.py", "train", "ghsweep.profile.result"),  # sideways
        ("profile/pipeline.py", "profile", "ghsweep.capture.nsight_commands"),  # down
        ("train/torch_train.py", "train", "ghsweep.capture.torch_capture"),  # down
        ("capture/profiler_plan.py", "capture", "ghsweep.capture.nsight_commands"),  # within
    ]
    assert wrong_imports(planted) == [
        "capture/torch_capture.py (capture, layer 2) imports ghsweep.profile.analysis (layer 3)",
        "train/torch_train.py (train, layer 3) imports ghsweep.profile.result (layer 3)",
    ]


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


# MlflowStore's methods that write; tracking/records.py alone calls them (the record's format is its own).
STORE_WRITES = {
    "start_run",
    "log_params",
    "set_tags",
    "log_metrics",
    "log_metric_series",
    "log_artifacts",
    "finish",
    "end_run",
    "reopen",
}


def store_writes(source: str) -> list[str]:
    """`.WRITE(` calls on an object named `store` in `source`."""
    return [
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in STORE_WRITES
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "store"
    ]


def test_every_mlflow_write_goes_through_the_tracking_records():
    outside = {
        str(path.relative_to(PACKAGE)): writes
        for path in PACKAGE.rglob("*.py")
        if "tracking" not in path.relative_to(PACKAGE).parts and (writes := store_writes(path.read_text()))
    }
    assert outside == {}
    assert store_writes("store.reopen(run_id)\nstore.search(role)\nrecords.end_run(store, 1, e)") == ["reopen"]
