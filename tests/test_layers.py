"""The house's layers: one namespace, imports that run one way, and subcommands that stand apart.

Imports are read with `ast`, every one of them, including those inside functions: an import
deferred into a function still makes the two modules depend on each other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runwatch.core.paths import REPO

# Where each part of the namespace lives in the checkout (pyproject.toml's package-dir).
FOLDERS = {
    "runwatch": REPO / "runwatch",
    "runwatch.trainer": REPO / "trainer",
    "runwatch.exporter": REPO / "exporter",
    "runwatch.oncall": REPO / "oncall",
    "runwatch.console": REPO / "console",
}

# The layers, lowest first: a module may import its own package and anything of a lower layer,
# never a higher one or another package of its own layer. The longest prefix decides. The
# trainer's record sits below the exporter, which publishes it; the rest of the trainer above it
# (a live run publishes through the exporter).
LAYERS = [
    ("runwatch.core",),
    ("runwatch.trainer.record", "runwatch.prom"),
    ("runwatch.exporter",),
    ("runwatch.watch",),  # the client a user's own training loop imports: the exporter's names, no trainer
    ("runwatch.callbacks",),  # transformers' and Lightning's adapters over it
    ("runwatch.trainer",),
    ("runwatch.drill.answer", "runwatch.readouts", "runwatch.oncall"),
    ("runwatch.cluster", "runwatch.backtest", "runwatch.console"),
    (
        "runwatch.train",
        "runwatch.check",
        "runwatch.probe",
        "runwatch.query",
        "runwatch.lesson",
        "runwatch.lab",
        "runwatch.credentials",
    ),
    ("runwatch.drill",),
    ("runwatch.cli",),
    ("runwatch.__main__",),
]


def modules() -> dict[str, Path]:
    """Every module of the namespace, by its import name, and its file in the checkout."""
    assert all((f / "__init__.py").read_text().lstrip().startswith('"""') for f in FOLDERS.values())
    out = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            if path.name != "__init__.py":  # a package's __init__ holds its docstring only
                out[".".join([package, *path.relative_to(folder).with_suffix("").parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that `name` imports anywhere in its text (a package's own
    __init__ is not counted: it holds only its docstring)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from runwatch.lab import up` imports the module runwatch.lab.up
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        found |= {t for t in targets if t in known and t != name and not is_package(t)}
    return found


def is_package(name: str) -> bool:
    return name in FOLDERS or (REPO / "runwatch" / name.removeprefix("runwatch.").replace(".", "/")).is_dir()


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> tuple[int, str]:
    """(the layer of a module, the prefix that placed it there)."""
    best = max(
        ((i, p) for i, ps in enumerate(LAYERS) for p in ps if name == p or name.startswith(f"{p}.")),
        key=lambda ip: len(ip[1]),
        default=None,
    )
    assert best is not None, f"{name} is in no layer of tests/test_layers.py: add it where it belongs"
    return best


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


def test_the_walker_sees_every_part_of_the_namespace():
    mods = modules()
    expected = ["runwatch.cli", "runwatch.core.names", "runwatch.trainer.run", "runwatch.exporter.metrics"]
    expected += ["runwatch.oncall.app", "runwatch.console.app", "runwatch.backtest.inline", "runwatch.lab.supervise"]
    for name in expected:
        assert name in mods, name
    assert not [m for m in mods if ".configuration" in m]


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(graph())
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_imports_run_one_way_down_the_layers():
    """Data flows from the trainer's records to the exporter, the lab and the command line; a
    module never imports one above it, nor another package of its own layer."""
    wrong = []
    for name, targets in graph().items():
        (mine, my_prefix) = layer(name)
        for target in targets:
            (theirs, their_prefix) = layer(target)
            if theirs > mine or (theirs == mine and their_prefix != my_prefix):
                wrong.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_core_imports_nothing_of_the_project():
    """Low in the house: shared by every layer. The trainer's record is the other leaf."""
    g = graph()
    for name in (m for m in g if m.startswith("runwatch.core.")):
        assert {t for t in g[name] if not t.startswith("runwatch.core.")} == set(), name
    assert g["runwatch.trainer.record"] == set()


def subcommands() -> set[str]:
    """The modules `runwatch.cli` dispatches to, as its tables name them (it imports each one
    only when its command is asked for)."""
    from runwatch import cli

    return {module for _, _, module, _ in cli.COMMANDS} | {module for module, _ in cli.DELEGATED.values()}


def closure(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in g[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_subcommands_are_found():
    found = subcommands()
    expected = {"runwatch.train", "runwatch.backtest.command", "runwatch.lab.up", "runwatch.drill.drill"}
    expected |= {"runwatch.lab.down", "runwatch.lab.status", "runwatch.lab.reload"}
    expected |= {"runwatch.readouts.plate", "runwatch.oncall.pager", "runwatch.console.serve", "runwatch.probe"}
    expected |= {
        "runwatch.oncall.pager_serve",
        "runwatch.drill.ack",
        "runwatch.drill.diagnose",
        "runwatch.drill.postmortem",
    }
    assert expected <= found


def test_no_subcommand_imports_another_subcommand():
    """Shared code lives in the packages' libraries; a subcommand never reaches into another's
    module (directly or through others), nor into the command line that dispatches to it."""
    g, commands = graph(), subcommands()
    wrong = {name: sorted(closure(g, name) & (commands | {"runwatch.cli"})) for name in commands}
    assert not {k: v for k, v in wrong.items() if v}, wrong


@pytest.mark.parametrize("package", sorted({*FOLDERS, *(f"runwatch.{d.name}" for d in (REPO / "runwatch").iterdir()
                                                        if (d / "__init__.py").is_file())}))  # fmt: skip
def test_every_package_says_what_it_holds(package):
    folder = FOLDERS.get(package) or REPO / "runwatch" / package.removeprefix("runwatch.")
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    assert doc and len(doc.splitlines()) >= 2, f"{folder}/__init__.py: say what the package holds and must not import"


def test_the_pager_stands_alone():
    """oncall/ talks to the rest of the lab over HTTP only: of the project it imports itself,
    the command-line conventions every command shares, the lab's names (its runbooks' address),
    the Host names a server answers to (core.addresses) and the server stack (core.serving), as
    the console does; nothing else."""
    g = graph()
    allowed = {"runwatch.core.command", "runwatch.core.addresses", "runwatch.core.names", "runwatch.core.serving"}
    allowed |= {"runwatch.core.token"}  # the lab's token, read as `runwatch ack` reads it
    for name in (m for m in g if m.startswith("runwatch.oncall.")):
        others = {t for t in g[name] if not t.startswith("runwatch.oncall.")}
        assert others <= allowed, (name, others)


# What the console may use of the house: the command-line conventions, the lab's names and where
# a lab of a state directory listens, atomic writes (the Rules page writes the learner's rule file),
# bounded reads (it reads the rules folder and lab.json, which may be hostile), the
# incidents a diagnosis may name, and the dashboards' queries with the plate that runs them (one
# copy of the PromQL). Not the lab, the drill or the command line: it acts through `runwatch ack`
# and `runwatch diagnose`.
CONSOLE_USES = {
    "runwatch.core.command", "runwatch.core.names", "runwatch.core.paths", "runwatch.core.addresses",
    "runwatch.readouts.dashboard_queries", "runwatch.readouts.picture", "runwatch.prom.server",
    "runwatch.trainer.config", "runwatch.core.files", "runwatch.core.bounded", "runwatch.core.durations",
    "runwatch.core.serving", "runwatch.core.token", "runwatch.readouts.colours", "runwatch.core.credentials",
}  # fmt: skip


def test_the_console_stands_alone():
    g = graph()
    for name in (m for m in g if m.startswith("runwatch.console.")):
        others = {t for t in g[name] if not t.startswith("runwatch.console.")}
        assert others <= CONSOLE_USES, (name, others - CONSOLE_USES)


def test_the_standalone_console_listens_where_the_lab_says():
    from runwatch.console.serve import parser
    from runwatch.core.names import PORTS

    assert parser().get_default("port") == PORTS["console"]


def test_the_watched_trainer_does_not_import_its_watchers_client():
    """Issue 39: trainer.live asked Prometheus itself (runwatch.prom.server's baselines_ready), an
    edge from the watched process up to its watcher. The command that starts it asks, and hands
    the trainer a callable."""
    g = graph()
    trainer = [n for n in g if n.startswith("runwatch.trainer.")]
    wrong = {n: sorted(t for t in g[n] if t.startswith("runwatch.prom")) for n in trainer}
    assert not {n: t for n, t in wrong.items() if t}, wrong


def test_the_exporter_takes_a_record_not_the_trainer():
    """exporter/ depends on the trainer's record type only, so it pulls in no numpy and no model
    (and on the lab's names, which import nothing: its loopback address has one home)."""
    g = graph()
    for name in (m for m in g if m.startswith("runwatch.exporter.")):
        assert g[name] <= {"runwatch.trainer.record", "runwatch.exporter.metrics", "runwatch.core.names"}, name


def test_the_standalone_pager_listens_where_the_lab_says():
    """The pager keeps its own default port (it stands alone); it must be the lab's."""
    from runwatch.core.names import PORTS, RUNBOOK_BASE, url
    from runwatch.oncall.pager import PROMETHEUS
    from runwatch.oncall.pager_serve import _serve_parser

    assert _serve_parser().get_default("port") == PORTS["pager"]
    assert RUNBOOK_BASE == f"{url('pager')}/runbooks"
    assert PROMETHEUS == url("prometheus")  # where `runwatch pager` looks for alerts that never paged


# The backtest's modules in the order its data flows (issue 39): the plate's signatures and the
# helpers the stages share, then the stages rules -> plan -> data -> evaluate -> report, the
# workbench's report, the command that runs them, the replay of recorded runs (which reuses the
# stages, not the command) and last the dispatch between the two. Each imports only modules before it.
BACKTEST_FLOW = ["signatures", "inline", "remote_write", "datacache", "rules", "variants", "plan", "data",
                 "evaluate", "report", "sweep", "backtest", "overlay", "recorded_report", "recorded",
                 "command"]  # fmt: skip
BACKTEST_STAGES = ["rules", "plan", "data", "evaluate", "report", "backtest"]


def test_the_backtest_flows_one_way():
    """A stage imports only the stages before it: following the rules folder through the
    backtest never returns to a module it has left (issue 39 walked it through 8 stays, 4 returns)."""
    g = graph()
    found = sorted(m.removeprefix("runwatch.backtest.") for m in g if m.startswith("runwatch.backtest."))
    assert found == sorted(BACKTEST_FLOW), "place each module of runwatch/backtest/ in BACKTEST_FLOW"
    assert [m for m in BACKTEST_FLOW if m in BACKTEST_STAGES] == BACKTEST_STAGES
    wrong = []
    for i, name in enumerate(BACKTEST_FLOW):
        later = {f"runwatch.backtest.{m}" for m in BACKTEST_FLOW[i:]}
        wrong += [f"{name} imports {t}" for t in sorted(g[f"runwatch.backtest.{name}"] & later)]
    assert not wrong, "\n".join(sorted(wrong))


def test_only_the_rules_stage_reads_the_rules_folder():
    """The rules folder goes in at the first stage and is not read again further down."""
    readers = [path.name for path in sorted((REPO / "runwatch" / "backtest").glob("*.py"))
               if path.name != "rules.py" and re.search(r"\b(rule_files|load_yaml)\(", path.read_text())]  # fmt: skip
    assert readers == []


def test_every_module_of_the_backtest_is_under_400_lines():
    """Issue 39: backtest.py had grown to 1,048 lines, with four stages in one file."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in (REPO / "runwatch" / "backtest").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n >= 400} == {}


def test_no_function_is_longer_than_a_screen():
    """Long functions are split along the steps they comment (60 lines: the longest today is
    trainer.live.run_live, whose loop sections are labelled)."""
    files = [*modules().values(), REPO / "grafana" / "dashboards.py"]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{path.relative_to(REPO)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_every_test_security_md_names_exists():
    """SECURITY.md's tables name the test of each attack: a renamed or deleted test is caught here."""
    import re

    from runwatch.core.paths import REPO

    named = []
    for cell in re.findall(r"`tests/[^|]*", (REPO / "SECURITY.md").read_text()):
        file = None
        for ref in re.findall(r"`(tests/\w+\.py)?(?:::(\w+))?`", cell):
            file = ref[0] or file
            if ref[1]:
                named.append((file, ref[1]))
    assert len(named) > 40
    missing = [f"{f}::{t}" for f, t in named if not re.search(rf"^def {t}\(", (REPO / f).read_text(), re.M)]
    assert missing == []


def _constants(path: Path) -> list[tuple[int, str]]:
    """The string constants a module's code holds (its docstrings are prose, and left out)."""
    tree = ast.parse(path.read_text())
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose]  # fmt: skip


def alert_names() -> set[str]:
    """Every alert core.names lists (its *_ALERTS tuples)."""
    from runwatch.core import names

    return {a for k, v in vars(names).items() if k.endswith("_ALERTS") for a in v}


def test_each_name_and_address_has_one_home():
    """Issue 39: the threshold rule's name was defined in three modules, and the pager's and the
    follower's addresses were written out where core.names says them. A second home of any of
    core.names' strings (a recording rule's name, the loopback address) fails here."""
    from runwatch.core import names

    address = re.compile(r"(?:https?://)?127\.0\.0\.1:\d+")
    homed = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)} - alert_names()  # next test
    assert {"alert:runwatch_threshold:ratio", "127.0.0.1", "run_alert:runwatch_train_step:first_fired"} <= homed
    found = []
    for name, path in {**modules(), "grafana.dashboards": REPO / "grafana" / "dashboards.py"}.items():
        if name.startswith("runwatch.core."):
            continue
        for line, value in _constants(path):
            if value in homed or address.match(value):
                found.append(f"{path.relative_to(REPO)}:{line} {value!r}")
    assert not found, f"use runwatch.core.names (THRESHOLD, url(), PORTS): {found}"


def _alert_lists(path: Path, alerts: set[str]) -> list[tuple[int, str]]:
    """The alert names a module defines rather than uses: a name assigned to a constant, or one
    of a tuple, list or set written out. A name as a key of a table (the plate's signatures) or
    an argument (the dashboard panel of one alert) is a use."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            values = [node.value]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            values = node.elts
        else:
            continue
        found += [(v.lineno, v.value) for v in values if isinstance(v, ast.Constant) and v.value in alerts]
    return found


def test_each_list_of_alerts_has_one_home():
    """Issue 39: the backtest's report kept lists of its own (the alerts that name a rank, the
    one leads are counted against, TrainerDown written out beside core.names' lists). A list or
    constant of alert names anywhere but runwatch.core.names fails here."""

    alerts = alert_names()
    assert {"TrainingLossJump", "TrainerDown", "StragglerRank", "Watchdog"} <= alerts
    found = []
    for name, path in {**modules(), "grafana.dashboards": REPO / "grafana" / "dashboards.py"}.items():
        if name != "runwatch.core.names":
            found += [f"{path.relative_to(REPO)}:{line} {value!r}" for line, value in _alert_lists(path, alerts)]
    assert not found, f"use runwatch.core.names' lists of alerts: {found}"


# Issue 39: a module a newcomer can read through.
SMALL_PACKAGES = (REPO / "oncall", REPO / "runwatch" / "backtest", REPO / "runwatch" / "lab")


@pytest.mark.parametrize("folder", SMALL_PACKAGES, ids=lambda f: f.name)
def test_each_module_of_the_pager_the_backtest_and_the_lab_is_under_400_lines(folder):
    long = {p.name: n for p in sorted(folder.glob("*.py")) if (n := len(p.read_text().splitlines())) >= 400}
    assert not long, f"{folder.relative_to(REPO)}: split these by concern: {long}"


# The cluster, in one place (issue 39, item 4): its trainer (a rank, its collective, its GPU, its
# faults), its exporter (a rank's series and the launcher's) and its supervision (runwatch.cluster)
# live where the layout puts trainers, exporters and commands, and are entered from outside only
# at these doors, each for the reason given.
CLUSTER = ("runwatch.trainer.rank", "runwatch.trainer.parallel", "runwatch.trainer.gpu", "runwatch.trainer.faults",
           "runwatch.exporter.rank_metrics", "runwatch.cluster")  # fmt: skip
CLUSTER_DOORS = {
    "runwatch.trainer.offline": "the backtest's ranks, simulated offline with the live ranks' faults, GPU and series",
    "runwatch.watch": "a user's rank serves the series the cluster's rules read, by the exporter's names",
    "runwatch.trainer.run": "the plate's run in one process shares its gradient as its N ranks would, bit for bit",
    "runwatch.train": "`runwatch train --ranks N` is the launcher's command line",
    "runwatch.lab.start": "`runwatch up --ranks N` writes the ranks' targets",
}


def in_cluster(name: str) -> bool:
    return any(name == c or name.startswith(f"{c}.") for c in CLUSTER)


def test_the_cluster_is_entered_only_at_its_doors():
    entered = {name: sorted(filter(in_cluster, found)) for name, found in graph().items() if not in_cluster(name)}
    entered = {name: found for name, found in entered.items() if found}
    assert sorted(entered) == sorted(CLUSTER_DOORS), entered
