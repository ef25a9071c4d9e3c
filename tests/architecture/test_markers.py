"""Every test carries the markers of what it does (pyproject.toml registers them; tests/README.md):

* ``ray``: its module imports ray;
* ``subprocess``: it starts another interpreter (``subprocess``, ``sys.executable``, ``multiprocessing``);
* ``parity``: it runs onnxruntime's own calibration or quantization code as the oracle.

Read from the source: a test reaches what the functions, classes and fixtures it uses reach, through
its own module, the conftest.py files above it and tests/support, so a helper cannot hide a
subprocess or an ORT run. A mark may sit on the test or on the module (``pytestmark``).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = TESTS / "support"

# onnxruntime's calibration and quantization entry points: calling one runs ORT as the oracle.
ORT_ORACLES = {
    "create_calibrator",
    "quantize_static",
    "quantize_dynamic",
    "HistogramCollector",
    "MinMaxCalibrater",
    "EntropyCalibrater",
    "PercentileCalibrater",
    "DistributionCalibrater",
    "compute_scale_zp",
    "compute_scale_zp_float8",
    "load_tensors_data",
    "save_tensors_data",
    "write_calibration_table",
}
ORT_MODULES = {"quantization", "calibrate", "quant_utils", "quantize", "qdq_quantizer"}
SPAWNERS = {"subprocess", "multiprocessing", "sys.executable"}


class Module:
    """One source file: its top-level definitions, what each references, and where its imported names come from."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.defs: dict[str, ast.AST] = {}
        self.oracles: set[str] = set()  # local names bound to an ORT oracle
        self.ort_modules: set[str] = set()  # local names bound to an onnxruntime module
        self.support: dict[str, tuple[str, str | None]] = {}  # local name -> (support module, attribute)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    local = a.asname or a.name
                    if node.module.startswith("onnxruntime") and a.name in ORT_ORACLES:
                        self.oracles.add(local)
                    elif node.module.startswith("onnxruntime") and a.name in ORT_MODULES:
                        self.ort_modules.add(local)
                    if node.module == "support":
                        self.support[local] = (a.name, None)
                    elif node.module.startswith("support.") or node.level == 1 or node.module.startswith("test_"):
                        self.support[local] = (node.module.removeprefix("support."), a.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                for a in node.names:
                    self.support[a.asname or a.name] = (a.name, None)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "onnxruntime":
                        self.ort_modules.add(a.asname or a.name)

    def references(self, node: ast.AST) -> set[str]:
        """Dotted names used in node (``subprocess.run`` gives ``subprocess`` and ``subprocess.run``)."""
        out = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                out.add(f"{n.value.id}.{n.attr}")
            elif isinstance(n, ast.arg):
                out.add(f"fixture:{n.arg}")
        return out


@cache
def _module(path: Path) -> Module:
    return Module(path)


def _helper_path(path: Path, name: str) -> Path | None:
    """The file of module ``name`` imported by ``path``: a support module or a test module beside it."""
    for p in (SUPPORT / f"{name}.py", path.parent / f"{name}.py"):
        if p.exists():
            return p
    return None


def _conftests(path: Path) -> list[Path]:
    out, folder = [], path.parent
    while folder.is_relative_to(TESTS):
        if (folder / "conftest.py").exists():
            out.append(folder / "conftest.py")
        folder = folder.parent
    return out


def reaches(path: Path, node: ast.AST, what: str, seen: set | None = None) -> bool:
    """Whether the definition ``node`` of ``path`` (transitively) spawns (``what="subprocess"``) or runs ORT (``"parity"``)."""
    seen = set() if seen is None else seen
    key = (path, id(node))
    if key in seen:
        return False
    seen.add(key)
    mod = _module(path)
    for ref in mod.references(node):
        if ref.startswith("fixture:"):
            name = ref.removeprefix("fixture:")
            for conf in [path, *_conftests(path)]:
                d = _module(conf).defs.get(name)
                if d is not None and reaches(conf, d, what, seen):
                    return True
            continue
        head, _, attr = ref.partition(".")
        if what == "subprocess" and (ref in SPAWNERS or head in SPAWNERS - {"sys.executable"}):
            return True
        if what == "parity" and (
            (not attr and head in mod.oracles) or (head in mod.ort_modules and attr in ORT_ORACLES)
        ):
            return True
        if head in mod.defs and not attr and mod.defs[head] is not node and reaches(path, mod.defs[head], what, seen):
            return True
        if head in mod.support:
            module, name = mod.support[head]
            target = name if name is not None else attr
            sp = _helper_path(path, module)
            if sp is not None and target:
                d = _module(sp).defs.get(target)
                if d is not None and reaches(sp, d, what, seen):
                    return True
    return False


def _marks(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
            out.add(n.attr)
    return out


def _module_marks(mod: Module) -> set[str]:
    return _marks(mod.defs["pytestmark"]) if "pytestmark" in mod.defs else set()


def _imports_ray(mod: Module) -> bool:
    for n in ast.walk(mod.tree):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "ray" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "ray":
            return True
    return False


def missing_marks() -> dict[str, set[str]]:
    """test id -> the markers it lacks."""
    out: dict[str, set[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        mod = _module(path)
        module_marks = _module_marks(mod)
        for name, node in mod.defs.items():
            if not name.startswith("test_") or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            have = module_marks | _marks(ast.Module(body=node.decorator_list, type_ignores=[]))
            need = {what for what in ("subprocess", "parity") if reaches(path, node, what)}
            if _imports_ray(mod):
                need.add("ray")
            if need - have:
                out[f"{path.relative_to(TESTS)}::{name}"] = need - have
    return out


def test_every_test_carries_the_markers_of_what_it_does():
    assert missing_marks() == {}


def test_the_analysis_finds_subprocesses_and_ort_runs():
    """The analysis itself: a spawning helper and an ORT oracle behind a support helper are found."""
    cli = _module(TESTS / "cli" / "test_cli.py")
    assert reaches(cli.path, cli.defs["test_usage_error_subprocess"], "subprocess")
    assert not reaches(cli.path, cli.defs["test_usage_errors_exit_2"], "subprocess")
    parity = _module(TESTS / "collector" / "test_collector_parity.py")
    assert any(reaches(parity.path, node, "parity") for name, node in parity.defs.items() if name.startswith("test_"))
