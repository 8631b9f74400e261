"""The package's shape: one folder per stage of the flow, imports that point down it, no cycles, small modules.

The flow is suite → case → run → train → measure → theory (checks) → store → report, with ``cli`` on top.
Each folder (or top-level module) has a rank; a module may import only from a lower rank, or from its own
folder.  ``measure`` sits below ``theory``, so a probe can never learn what it is expected to find.  The
graph is read from the source with ``ast`` (imports inside functions included), so nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import ckptbench

PACKAGE_DIR = pathlib.Path(ckptbench.__file__).parent
MAX_LINES = 400

# unit (a folder of ckptbench/, or a top-level module) -> rank.  Lower ranks never import higher ones.
RANKS = {
    "__init__": 0,  # the package's version
    "base": 1,  # errors and exit statuses, the host, opening a file a run reads, the finite test
    "point": 2,  # what a point is: Case, ModelSpec, [train] settings, setup, strategy, cards, preset sizes
    "sources": 3,  # where its model and data come from: configs, transformers' kept answers, the corpus
    "suite": 4,  # TOML in, Cases out: the keys, the setup and strategy axes
    "measure": 5,  # probes: see, never expect
    "train": 6,  # models, checkpointing, step loops (probed by measure)
    "theory": 7,  # predictions and checks (the simulation runs train's step on fake tensors)
    "store": 8,  # records on disk, compare
    "run": 9,  # processes: sweep, fork server, worker, torchrun
    "track": 10,  # a user's own Trainer / Accelerate / plain loop measured as a sweep point; pytest plugin
    "report": 11,  # HTML, tables, GPU summary
    "history": 11,  # asv benchmarks per commit, and what changed between commits (beside report, not on it)
    "cli": 12, "__main__": 13,
}


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py under `root` (a package named `package`)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, path: pathlib.Path, known: set[str], package: str) -> set[str]:
    """The package's modules that `name` imports anywhere in its source (lazy imports included)."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports a submodule when one of that name exists
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            if target == package or target.startswith(package + "."):
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                if target != name:
                    found.add(target)
    return found


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    names = module_names(root, package)
    return {name: imports_of(name, path, set(names), package) for name, path in names.items()}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(graph: dict[str, set[str]], ranks: dict[str, int]) -> list[str]:
    """Edges that point up the flow (or sideways between two units of one rank), as readable lines."""
    out = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            a, b = unit_of(src), unit_of(dst)
            if a == b or dst == src.split(".")[0]:
                continue
            if a not in ranks or b not in ranks:
                out.append(f"{src} -> {dst}: unit {a if a not in ranks else b!r} has no rank")
            elif ranks[b] >= ranks[a]:
                out.append(f"{src} -> {dst}: {a} (rank {ranks[a]}) may not import {b} (rank {ranks[b]})")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


# ------------------------------------------------------------------------------------------ the real tree

GRAPH = import_graph(PACKAGE_DIR, "ckptbench")


def test_every_unit_has_a_rank():
    assert {unit_of(m) for m in GRAPH} <= set(RANKS)


def test_imports_point_down_the_flow():
    assert layer_violations(GRAPH, RANKS) == []


# theory's subpackages by what they predict -> rank: bytes, then what collectives move, then seconds (which
# price both), then the settings chosen and the verdicts made from all three
THEORY_RANKS = {"memory": 1, "comm": 2, "time": 3, "policy": 4, "verdicts": 4}


def test_theory_is_in_parts_whose_imports_point_one_way():
    theory = {m: ts for m, ts in GRAPH.items() if m.startswith("ckptbench.theory.")}
    assert all(m.count(".") == 3 or m.count(".") == 2 for m in theory)
    assert {m.split(".")[2] for m in theory} == set(THEORY_RANKS)  # no module loose beside the parts
    sub = {m.split(".", 1)[1]: {t.split(".", 1)[1] for t in ts if t.startswith("ckptbench.theory.")}
           for m, ts in theory.items()}
    assert layer_violations(sub, THEORY_RANKS) == []


def test_measure_never_imports_theory():
    leaks = [(m, t) for m, ts in GRAPH.items() if unit_of(m) == "measure" for t in ts if unit_of(t) == "theory"]
    assert leaks == []


def test_no_import_cycle():
    assert find_cycle(GRAPH) is None


def test_graph_sees_lazy_and_relative_imports():
    # the checker must read what the code really imports, or the two tests above pass on an empty graph
    assert "ckptbench.theory.memory.simulate" in GRAPH["ckptbench.theory.memory.simulated"]  # inside a function
    assert "ckptbench.measure.storage" in GRAPH["ckptbench.theory.memory.simulate"]  # `from ...measure.storage`
    assert "ckptbench.theory.memory.estimate" in GRAPH["ckptbench.cli.estimate"]  # `from ..theory.memory import estimate`
    assert len(GRAPH) >= 40


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_no_module_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


# ------------------------------------------------------------------- the checker fails on wrong trees


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, set[str]]:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(root, "pkg")


def test_a_synthetic_cycle_is_found(tmp_path):
    graph = _tree(tmp_path, {
        "theory/__init__.py": "",
        "theory/a.py": "from .b import f\n",
        "theory/b.py": "def f():\n    from . import c\n",  # lazy: still an edge
        "theory/c.py": "from pkg.theory.a import x\n",
    })
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"pkg.theory.a", "pkg.theory.b", "pkg.theory.c"}


def test_a_probe_that_imports_theory_is_a_violation(tmp_path):
    graph = _tree(tmp_path, {
        "measure/__init__.py": "",
        "measure/probe.py": "def expected():\n    from ..theory.estimate import estimate\n",
        "theory/__init__.py": "",
        "theory/estimate.py": "from ..measure import probe\n",  # theory reading a probe is fine
    })
    assert layer_violations(graph, RANKS) == [
        "pkg.measure.probe -> pkg.theory.estimate: measure (rank 5) may not import theory (rank 7)"]
    assert find_cycle(graph) == ["pkg.measure.probe", "pkg.theory.estimate", "pkg.measure.probe"]


def test_an_unranked_folder_is_a_violation(tmp_path):
    graph = _tree(tmp_path, {"misc/__init__.py": "", "misc/util.py": "from ..point import X\n", "point.py": ""})
    assert layer_violations(graph, RANKS) == ["pkg.misc.util -> pkg.point: unit 'misc' has no rank"]
