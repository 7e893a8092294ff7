"""The house's layers: no module imports one that imports it back, directly or through others.

Imports are read with `ast`, every one of them, including those inside functions: an import
deferred into a function still makes the two modules depend on each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

from runwatch.paths import REPO

PACKAGES = ("trainer", "exporter", "oncall", "console", "runwatch")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that `name` imports anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from runwatch import lab` imports the module runwatch.lab
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        found |= {t for t in targets if t in known and t != name and t not in PACKAGES}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by depth-first search (one per back edge)."""
    out, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                out.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return out


def test_the_walker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    found = cycles(graph)
    assert not found, "\n".join(" -> ".join(c) for c in found)


# Low in the house: shared by every layer, importing nothing of the project.
LEAVES = ("runwatch.command", "runwatch.files", "runwatch.names", "trainer.record")


def test_the_shared_modules_import_nothing_of_the_project():
    mods = modules()
    for name in LEAVES:
        assert imports(name, mods[name], set(mods)) == set(), name


def test_the_pager_stands_alone():
    """oncall/ talks to the rest of the lab over HTTP only: of the project it imports itself and
    the command-line conventions every command shares, nothing else."""
    mods = modules()
    for name in (m for m in mods if m.startswith("oncall.")):
        others = {t for t in imports(name, mods[name], set(mods)) if not t.startswith("oncall.")}
        assert others <= {"runwatch.command"}, (name, others)


# What the console may use of the house: the command-line conventions, the lab's names, the
# incidents a diagnosis may name, and the dashboards' queries with the plate that runs them (one
# copy of the PromQL). Not the lab, the drill or the command line: it acts through `runwatch ack`
# and `runwatch diagnose`.
CONSOLE_USES = {
    "runwatch.command", "runwatch.names", "runwatch.dashboard_queries", "runwatch.plate", "runwatch.paths",
    "runwatch.promserver", "trainer.config",
}  # fmt: skip


def test_the_console_stands_alone():
    mods = modules()
    for name in (m for m in mods if m.startswith("console.")):
        others = {t for t in imports(name, mods[name], set(mods)) if not t.startswith("console.")}
        assert others <= CONSOLE_USES, (name, others - CONSOLE_USES)


def test_the_standalone_console_listens_where_the_lab_says():
    from console.serve import parser
    from runwatch.names import PORTS

    assert parser().get_default("port") == PORTS["console"]


def test_the_exporter_takes_a_record_not_the_trainer():
    """exporter/ depends on the trainer's record type only, so it pulls in no numpy and no model."""
    mods = modules()
    for name in (m for m in mods if m.startswith("exporter.")):
        assert imports(name, mods[name], set(mods)) <= {"trainer.record", "exporter.metrics"}, name


def test_the_standalone_pager_listens_where_the_lab_says():
    """The pager keeps its own default port (it stands alone); it must be the lab's."""
    from oncall.follow import PROMETHEUS
    from oncall.pager import RUNBOOK_BASE
    from runwatch.names import PORTS, url

    text = (REPO / "oncall" / "follow.py").read_text()
    assert f'"--port", type=_port, default={PORTS["pager"]}' in text
    assert RUNBOOK_BASE == f"{url('pager')}/runbooks"
    assert PROMETHEUS == url("prometheus")  # where `runwatch pager` looks for alerts that never paged


def test_no_function_is_longer_than_a_screen():
    """Long functions are split along the steps they comment (60 lines: the longest today is
    trainer.live.run_live, whose loop sections are labelled)."""
    files = [*(p for pkg in PACKAGES for p in (REPO / pkg).glob("*.py")), REPO / "grafana" / "dashboards.py"]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{path.relative_to(REPO)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
