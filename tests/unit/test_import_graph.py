"""The package's layers, held by its static import graph (every import at any depth, lazy ones and those under
``if TYPE_CHECKING:`` included: a type a module names ties it to the module that defines it as much as a call
does): no cycle, and no module imports a layer above its own. The layers are docs/development.md's table."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "launcher"
# Each package's floor; a module may import its own floor and the floors below it. Top-level modules are the
# public faces and entry points, above every layer.
FLOORS = {"base": 1, "topology": 2, "plan": 3, "env": 4, "context": 5, "options": 6, "bind": 7,
          "feed": 5, "launch": 8, "doctor": 8, "show": 8, "slurm": 9, "tune": 9, "cli": 10, "templates": 10}
TOP = 11
# Front ends of one floor import none of each other: each imports the layers. affrun sbatch (slurm) sits above
# the launch commands its scripts run: it checks a job's command with affrun torchrun's own parse.
FRONT_ENDS = {"launch", "doctor", "show"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The affrun modules ``path`` imports, ``if TYPE_CHECKING:`` blocks included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def floor(module: str) -> tuple[int, str]:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP, ""  # launcher itself (its __init__): the public face
    if len(parts) == 2 and parts[1] not in FLOORS:
        return TOP, ""
    return FLOORS[parts[1]], parts[1]


def test_the_graph_is_read() -> None:
    g = graph()
    assert "launcher.bind.wire" in g and "launcher.base.cpulist" in g["launcher.bind.wire"]
    assert len(g) > 50


def test_type_only_imports_are_counted() -> None:
    """An import under ``if TYPE_CHECKING:`` is an edge of the graph too (launcher.plan.kinds names SpillChoice
    only for its types)."""
    assert "launcher.base.choices" in graph()["launcher.plan.kinds"]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle that a depth-first walk of ``g`` meets, each as a path that ends where it starts."""
    state: dict[str, int] = {}
    path: list[str] = []
    found: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                found.append([*path[path.index(dep):], dep])
            elif dep not in state:
                walk(dep)
        path.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            walk(node)
    return found


def test_no_import_cycle() -> None:
    assert [" -> ".join(c) for c in cycles(graph())] == []


def test_no_upward_import_and_front_ends_apart() -> None:
    upward = []
    for module, deps in graph().items():
        mine, my_layer = floor(module)
        for dep in deps:
            theirs, their_layer = floor(dep)
            if theirs > mine or (my_layer in FRONT_ENDS and their_layer in FRONT_ENDS and my_layer != their_layer):
                upward.append(f"{module} -> {dep}")
    assert upward == []


def test_errors_is_a_leaf() -> None:
    """The errors sit below every layer that raises them; launcher.errors is their public face."""
    g = graph()
    assert g["launcher.base.errors"] == set()
    assert g["launcher.errors"] == {"launcher.base.errors"}


def test_the_public_records_are_standard_dataclasses() -> None:
    """No module re-implements the standard library: dataclasses' own functions work on the public types."""
    import dataclasses

    import launcher
    from launcher.topology.model import Topology

    for cls in (launcher.Plan, launcher.RankPlan, launcher.Request, Topology):
        assert dataclasses.is_dataclass(cls), cls
        assert [f.name for f in dataclasses.fields(cls)], cls
    request = dataclasses.replace(launcher.Request(nproc=2), loader_cores=1)
    assert dataclasses.asdict(request)["loader_cores"] == 1


def tier_imports(tier: str, other: str) -> list[str]:
    """Each ``tests/<tier>`` file's imports of ``tests.<other>`` (``from tests import <other>`` included)."""
    reaching = []
    for path in sorted((Path(__file__).resolve().parents[1] / tier).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                     if isinstance(node, ast.Import) else [])
            reaching += [f"{path.name}: {n}" for n in names if n == f"tests.{other}" or n.startswith(f"tests.{other}.")]
    return sorted(set(reaching))


def test_the_fast_tier_imports_nothing_of_the_system_tier() -> None:
    """tests/unit runs with only pytest and hypothesis: none of its files may pull in a tests/system module (and,
    through it, subprocess helpers, torch or Slurm)."""
    assert tier_imports("unit", "system") == []


def test_the_system_tier_imports_nothing_of_the_fast_tier() -> None:
    """The two tiers share helpers through tests/conftest.py and the helper modules beside it (tests/fakesys.py,
    tests/launch.py, tests/machines.py, ...), never by one tier's file importing the other's."""
    assert tier_imports("system", "unit") == []
