"""The package's layers: imports point down only, no module imports one that imports it back, and
nothing inside imports the package root. Read from the source (every import statement, those
inside functions included), so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import histocal

PACKAGE = Path(histocal.__file__).parent

# Lowest first: a module may import its own layer and the layers before it.
LAYERS = (
    ("histocal._core", "histocal._version", "histocal.patching", "histocal.threads"),
    ("histocal.io",),
    ("histocal.methods",),
    ("histocal.ort_results",),
    ("histocal.collector",),
    ("histocal.stats",),
    ("histocal.state",),
    ("histocal.calibrators",),
    ("histocal.quark",),
    ("histocal.distributed",),
    ("histocal.report",),
    ("histocal.quantize",),
    ("histocal.diagnose",),
    ("histocal.cli",),
    ("histocal.__main__",),
)
MAX_LINES = 600
# Reaching into another module's or object's private names (issue 25): shared helpers have public
# names inside their modules, objects offer small public methods; what is left reaches into
# onnxruntime or argparse (the 11th: the recipe's weight memo patches onnxruntime's
# ``QDQQuantizer._calc_initializer_quant_params``, issue 37).
MAX_PRIVATE_IMPORTS = 10
MAX_PRIVATE_ATTRIBUTES = 11


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The histocal modules ``name`` imports (``from .. import methods`` names the module methods)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "histocal")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "histocal":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out.update(subs or {target})
    return {m for m in out if m in known or m == "histocal" or m == "histocal._core"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _import_target(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = package.split(".")
    return ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))


def _private_reaches() -> tuple[list[str], list[str]]:
    """``from X import _name`` with X another histocal module (a private module itself, such as
    ``_core``, is fine), and ``obj._attr`` with obj not self, cls or super()."""
    modules = _modules()
    known = set(modules) | {"histocal._core"}
    imports, attributes = [], []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = _import_target(name, path, node)
                if target.split(".")[0] == "histocal" and target != name:
                    imports += [
                        f"{name}:{node.lineno} {target}.{a.name}"
                        for a in node.names
                        if _is_private(a.name) and f"{target}.{a.name}" not in known
                    ]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                attributes.append(f"{name}:{node.lineno} {ast.unparse(owner)}.{node.attr}")
    return imports, attributes


def _layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) | {"histocal._core"}
    return {name: _imports(name, path, known) - {name} for name, path in modules.items() if name != "histocal"}


def test_no_module_imports_the_package_root():
    offenders = sorted(m for m, deps in _graph().items() if "histocal" in deps)
    assert offenders == []


def test_imports_point_down_the_layers():
    upward = sorted((m, d) for m, deps in _graph().items() for d in deps if d != "histocal" and _layer(d) > _layer(m))
    assert upward == []


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append([*path[path.index(d) :], d])
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_no_source_file_over_the_limit():
    long = {
        name: n for name, p in _modules().items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_few_private_names_imported_across_modules():
    imports, _ = _private_reaches()
    assert len(imports) <= MAX_PRIVATE_IMPORTS, "\n".join(imports)


def test_few_private_attributes_reached_on_other_objects():
    _, attributes = _private_reaches()
    assert len(attributes) <= MAX_PRIVATE_ATTRIBUTES, "\n".join(attributes)
