"""The architecture holds: no import circle, no upward import, a supervisor that knows its
components only by their protocol, and docs/architecture.md true to the tree."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app" / "ate_devplugin"
DOC = ROOT / "docs" / "architecture.md"


def import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import-graph.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_circle_no_upward_arrow_and_every_room_in_a_layer() -> None:
    tool = import_graph()
    graph = tool.build(tool.sources(None))
    assert graph.circles() == []
    assert graph.room_circles() == []
    assert graph.upward() == []
    assert graph.unplaced() == []


def test_the_check_sees_a_circle_an_upward_arrow_and_an_unplaced_room() -> None:
    tool = import_graph()
    graph = tool.build(
        {
            "config.model": "from ate_devplugin.host import cdi\n",
            "host.cdi": "from ate_devplugin.config.model import ResourceConfig\n",
            "gadget": "import ate_devplugin.config.model\n",
        }
    )
    assert graph.circles() == [["config.model", "host.cdi"]]
    assert [(a.source, a.target) for a in graph.upward()] == [("config.model", "host.cdi")]
    assert graph.unplaced() == ["gadget"]


def test_the_supervisor_knows_components_only_by_their_protocol() -> None:
    tool = import_graph()
    graph = tool.build(tool.sources(None))
    imported = {a.target for a in graph.arrows if a.source == "daemon"}
    assert not {m for m in imported if m.startswith(("deviceplugin", "dra", "host.cdi"))}
    assert len((APP / "daemon.py").read_text().splitlines()) < 200


def test_the_pictures_in_the_doc_are_current() -> None:
    tool = import_graph()
    assert tool.update_doc(DOC, tool.build(tool.sources(None)), check=True), (
        "run tools/import-graph.py --doc docs/architecture.md"
    )


def test_the_module_list_in_the_doc_is_the_tree() -> None:
    section = DOC.read_text().split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    listed: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            listed += re.findall(r"`([^`]+)`", line.split(": ", 1)[0])
    modules = {
        p.relative_to(APP).as_posix()
        for p in APP.rglob("*.py")
        if p.name != "__init__.py" and p.relative_to(APP).parts[0] != "api"
    }
    apis = {p.parent.relative_to(APP).as_posix() + "/" for p in APP.glob("api/**/api_pb2.py")}
    assert sorted(listed) == sorted(modules | apis)
