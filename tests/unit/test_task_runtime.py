"""The worker runtime's wiring: no import cycle through the Celery app, and `connect`
registers each lifecycle handler once, in the order they must run."""

from __future__ import annotations

import ast
from pathlib import Path

from celery.signals import task_postrun, worker_process_init

import ocrfleet
from ocrfleet.config import get_settings
from ocrfleet.tasks.app import app
from ocrfleet.tasks.base import FleetTask
from ocrfleet.tasks.routing import INGEST_TASK, PAGE_TASK
from ocrfleet.tasks.worker import connect

PACKAGE = Path(ocrfleet.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Every ocrfleet module -> the ocrfleet modules it imports, at any depth of its code
    (an import inside a function closes a cycle as surely as one at the top)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            edges.update(target for target in targets if target in modules)
        graph[name] = edges - {name}
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A path of imports from `start` to `goal`, or None."""
    seen, stack = {start}, [[start]]
    while stack:
        path = stack.pop()
        for nxt in graph.get(path[-1], ()):
            if nxt == goal:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append([*path, nxt])
    return None


def test_no_worker_runtime_module_is_in_an_import_cycle() -> None:
    graph = _import_graph()
    for module in [name for name in graph if name.startswith("ocrfleet.tasks.")]:
        cycle = _reaches(graph, module, module)
        assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_the_worker_entry_point_connects_the_runtime() -> None:
    """Producers (the client, the API, the autoscaler) import the app, never the worker."""
    graph = _import_graph()
    importers = [name for name, edges in graph.items() if "ocrfleet.tasks.worker" in edges]
    assert importers == []


def _ours(signal: object) -> list[str]:
    return [
        uid
        for (uid, _sender), _receiver in signal.receivers  # type: ignore[attr-defined]
        if isinstance(uid, str) and uid.startswith("ocrfleet.")
    ]


def test_connect_registers_each_handler_once_in_order() -> None:
    before = _ours(worker_process_init), _ours(task_postrun)
    connect(app, get_settings())
    connect(app, get_settings())
    assert (_ours(worker_process_init), _ours(task_postrun)) == before
    init = _ours(worker_process_init)
    # models load first; the heartbeat and the metrics then report the load time
    assert init.index("ocrfleet.worker_process_init") < init.index(
        "ocrfleet.hb.worker_process_init"
    )
    assert init.index("ocrfleet.worker_process_init") < init.index("ocrfleet.mon.init")
    assert len(init) == len(set(init))


def test_every_fleet_task_has_the_base_class_and_its_log_fields() -> None:
    import ocrfleet.tasks.tasks  # noqa: F401 - registers the tasks on the app

    assert isinstance(app.tasks[PAGE_TASK], FleetTask)
    assert app.tasks[PAGE_TASK].log_fields == ("page_id",)
    assert isinstance(app.tasks[INGEST_TASK], FleetTask)
    assert "document_id" in app.tasks[INGEST_TASK].log_fields
