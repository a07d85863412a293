"""The architecture holds: no import circle, no upward import, a supervisor that knows its
components only by their protocol, docs/architecture.md true to the tree, and three rules
of the code (each with a test that it sees what it forbids):

1. components tell each other through the supervisor (components.Notice), never through a
   list of callables one of them keeps (a listener list);
2. every public member of the daemon's code is used by the daemon's code (app/, bench/,
   tools/, dashboards/): none is there only for the tests;
3. a failure said once while it lasts is said through observability.logs.SaidOnce, not
   by a flag or a remembered message beside a log call.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app" / "ate_devplugin"
DOC = ROOT / "docs" / "architecture.md"
GENERATED = APP / "api"


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


# --- the three rules ------------------------------------------------------------------

Sources = Mapping[str, str]  # file name -> its text


def read(*roots: Path) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for root in roots for p in sorted(root.rglob("*.py"))}


def ours(sources: Sources) -> dict[str, ast.Module]:
    """The hand-written modules, parsed (the generated API code is not ours to judge)."""
    generated = str(GENERATED.relative_to(ROOT))
    return {name: ast.parse(text) for name, text in sources.items() if not name.startswith(generated)}


def self_targets(node: ast.AST) -> Iterator[tuple[ast.Attribute, ast.expr | None, ast.expr | None]]:
    """Each ``self.x`` assigned at ``node``, with its annotation and value."""
    targets: list[ast.expr]
    annotation: ast.expr | None = None
    value: ast.expr | None
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, ast.AnnAssign):
        targets, annotation, value = [node.target], node.annotation, node.value
    else:
        return
    for target in targets:
        for t in target.elts if isinstance(target, ast.Tuple) else [target]:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                yield t, annotation, value


LISTENER_NAME = re.compile(r"(listener|callback|subscriber|observer|handler|hook)s$", re.IGNORECASE)
CALLABLES = re.compile(r"^(list|set|deque|dict|Sequence|MutableSequence)\[.*Callable")


def listener_lists(sources: Sources) -> list[str]:
    """Rule 1: attributes that keep callables to call back (by their type or their name)."""
    found = []
    for name, tree in ours(sources).items():
        for node in ast.walk(tree):
            for target, annotation, _ in self_targets(node):
                typed = annotation is not None and CALLABLES.match(ast.unparse(annotation))
                if typed or LISTENER_NAME.search(target.attr):
                    found.append(f"{name}:{target.lineno}: self.{target.attr}")
    return found


def public_members(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Rule 2's candidates: public module functions, and what a class that is not a
    Protocol defines as public: methods, fields, attributes set on self."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            yield node.name, node.lineno
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any("Protocol" in ast.unparse(base) for base in cls.bases):
            continue  # a protocol's members are what its implementations must have
        for item in cls.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_"):
                yield "." + item.name, item.lineno
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id[0] != "_":
                yield "." + item.target.id, item.lineno
            inside = ast.walk(item) if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) else iter(())
            for target, _, _ in (t for node in inside for t in self_targets(node)):
                if not target.attr.startswith("_"):
                    yield "." + target.attr, target.lineno


def uses(sources: Sources) -> Counter[str]:
    """How often each name is read: ``x`` and ``.x`` for an attribute, a keyword, an import."""
    count: Counter[str] = Counter()
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                count[node.id] += 1
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                count["." + node.attr] += 1
                count[node.attr] += 1  # a module's function, called through the module
            elif isinstance(node, ast.keyword) and node.arg:
                count["." + node.arg] += 1
            elif isinstance(node, ast.alias):
                count[node.name.rsplit(".", 1)[-1]] += 1
    return count


def unused_members(app: Sources, users: Sources) -> list[str]:
    """Rule 2: public members no code of ``app`` or ``users`` reads (by name: a name some
    other code reads counts as used)."""
    used = uses({**app, **users})
    return sorted(
        f"{name}:{line}: {member}"
        for name, tree in ours(app).items()
        for member, line in public_members(tree)
        if used[member] == 0
    )


LOG = re.compile(r"^(log|logger|logging)$")


def _logs(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and bool(LOG.match(node.func.value.id))
    )


def _level(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "logging"


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def logged_once_by_hand(sources: Sources) -> list[str]:
    """Rule 3: a log call (or a log level) chosen by a condition on ``self.x``, where the same
    function sets ``self.x`` to True or to what the condition compares it with."""
    found = []
    for name, tree in ours(sources).items():
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            given: dict[str, list[str]] = {}
            for node in ast.walk(function):
                for target, _, value in self_targets(node):
                    if value is not None:
                        given.setdefault(target.attr, []).append(ast.unparse(value))
            for node in ast.walk(function):
                if isinstance(node, ast.If):
                    branches: list[ast.AST] = [*node.body, *node.orelse]
                    guards = any(_logs(n) for branch in branches for n in ast.walk(branch))
                elif isinstance(node, ast.IfExp):
                    guards = any(_level(n) for branch in (node.body, node.orelse) for n in ast.walk(branch))
                else:
                    continue
                test = ast.unparse(node.test)
                read = {
                    a.attr
                    for a in ast.walk(node.test)
                    if isinstance(a, ast.Attribute) and ast.unparse(a.value) == "self"
                }
                said = sorted(a for a in read for value in given.get(a, ()) if value == "True" or value in test)
                if guards and said:
                    found.append(f"{name}:{node.lineno}: {function.name} remembers self.{', self.'.join(said)}")
    return found


CACHED = re.compile(r"\b(Discovery|KvmStates?|ResourceView|View)\b")


def cached_state(sources: Sources) -> list[str]:
    """Rule 4: a component (a class that renders the view, ``on_view``) keeping discovery, KVM
    state or a view of its own (by name or type), or a class besides the supervisor's
    ``Views`` hearing the KVM state (``on_kvm``): the two streams joined again by a consumer."""
    found = []
    for name, tree in ours(sources).items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
            if "on_kvm" in methods and cls.name != "Views" and not _is_protocol(cls):
                found.append(f"{name}:{cls.lineno}: {cls.name}.on_kvm")
            if "on_view" not in methods:
                continue
            for node in ast.walk(cls):
                for target, annotation, _ in self_targets(node):
                    typed = annotation is not None and CACHED.search(ast.unparse(annotation))
                    if typed or target.attr in ("_found", "_kvm"):
                        found.append(f"{name}:{target.lineno}: {cls.name} keeps self.{target.attr}")
    return found


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any("Protocol" in ast.unparse(base) for base in cls.bases)


def test_components_render_the_view_and_keep_no_discovery_or_kvm_state() -> None:
    assert cached_state(read(APP)) == []


def test_components_tell_each_other_through_notices_not_listener_lists() -> None:
    assert listener_lists(read(APP)) == []


def test_no_member_is_there_only_for_the_tests() -> None:
    assert unused_members(read(APP), read(ROOT / "bench", ROOT / "tools", ROOT / "dashboards")) == []


def test_a_failure_said_once_is_said_through_said_once() -> None:
    assert logged_once_by_hand(read(APP)) == []


def test_each_rule_sees_what_it_forbids() -> None:
    """Each rule on what it was written against (the shapes the KVM work once brought back)."""
    listeners = {
        "a.py": "class KvmHealth:\n"
        "    def __init__(self) -> None:\n"
        "        self.listeners: list[Listener] = []\n"
        "        self._told: list[Callable[[str], None]] = []\n"
    }
    assert listener_lists(listeners) == ["a.py:3: self.listeners", "a.py:4: self._told"]
    test_only = {
        "b.py": "class ProberLink:\n"
        "    def __init__(self) -> None:\n"
        "        self.connections = 0\n"
        "        self.path = ''\n"
        "    def serve(self) -> None:\n"
        "        self.connections += 1\n"
        "        print(self.path)\n"
        "    @property\n"
        "    def connected(self) -> bool:\n"
        "        return True\n"
    }
    assert unused_members(test_only, {"c.py": "ProberLink().serve()\n"}) == [
        "b.py:3: .connections",
        "b.py:9: .connected",
    ]
    by_hand = {
        "d.py": "class FeatureFile:\n"
        "    def write(self, exc: OSError) -> None:\n"
        "        if str(exc) != self._failed:\n"
        "            log.warning('cannot write: %s', exc)\n"
        "        self._failed = str(exc)\n"
        "    def wait(self) -> None:\n"
        "        level = logging.DEBUG if self._said else logging.INFO\n"
        "        log.log(level, 'waiting')\n"
        "        self._said = True\n"
        "    def state(self) -> None:\n"
        "        if self._registered:\n"
        "            log.info('our socket is gone')\n"
        "        self._registered = False\n"
    }
    assert logged_once_by_hand(by_hand) == [
        "d.py:3: write remembers self._failed",
        "d.py:7: wait remembers self._said",
    ]  # a state change that is logged (the last function) is not a log once
    joined = {
        "e.py": "class DraPlugin:\n"
        "    def __init__(self) -> None:\n"
        "        self._found: Mapping[str, object] = {}\n"
        "        self.last: dict[str, Discovery] = {}\n"
        "    def on_kvm(self, states: KvmStates) -> None:\n"
        "        self.states: KvmStates = states\n"
        "    def on_view(self, view: View) -> None:\n"
        "        self.rendered = len(view)\n"
    }
    assert cached_state(joined) == [
        "e.py:1: DraPlugin.on_kvm",
        "e.py:3: DraPlugin keeps self._found",
        "e.py:4: DraPlugin keeps self.last",
        "e.py:6: DraPlugin keeps self.states",
    ]
