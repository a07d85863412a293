#!/usr/bin/env python3
"""The import graph of app/ate_devplugin: rooms, arrows, circles and upward arrows.

A room is a subpackage (``config``, ``host``, ...) or a top-level module (``daemon``);
the generated ``api`` is one room. Every import counts, those under ``if TYPE_CHECKING:``
and those inside functions too: each says what a module needs to be understood.

    tools/import-graph.py                   the summary (rooms, arrows, circles, upward arrows)
    tools/import-graph.py --mermaid         the room graph as a mermaid flowchart (docs/architecture.md)
    tools/import-graph.py --dot [--svg F]   Graphviz dot; with --svg, rendered by `dot` if installed
    tools/import-graph.py --sizes           lines per room and per module
    tools/import-graph.py --rev main        the graph of a git revision instead of the work tree
    tools/import-graph.py --check           exit 1 on a circle, an upward arrow or a room without a layer
    tools/import-graph.py --doc FILE        write the summary and the mermaid graph between FILE's
                                            markers (with --check: exit 1 when they differ instead)

Layers run from the bottom up: a room may import only rooms of lower layers (and itself).
Rooms of one layer are peers and import none of each other.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "ate_devplugin"
ROOT = f"app/{PACKAGE}"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "ate_devplugin api",  # the version; the generated protocol code
        "cpu",  # x86 CPU features, CPU and restore profiles: pure data
        "config",  # the config file's model: depends on nothing of ours but the CPU's data
        "settings",  # flags and environment, one part per subsystem
        "tasks",  # guarded tasks, bounded stops, bounded blocking calls
        "observability",  # metrics, traces, logs, HTTP endpoints
        "host kvm",  # devices, CDI specs, filesystem events, unix-socket servers; KVM's probe and facts
        "kvmstate",  # the KVM state the KVM health component tells
        "view",  # the one view of each resource every component renders
        "components",  # the protocol the supervisor drives
        "deviceplugin dra podresources kvmhealth",  # handing out devices (two ways), who holds them, KVM health
        "reload",  # reading the config file again
        "daemon",  # the supervisor
        "runtime",  # the composition root
        "cli",  # the command line
        "__main__",  # python -m ate_devplugin
    )
)

# The first layout's flat modules and the room each went to, so that its graph can be
# measured against the same layers (docs/architecture.md, "before").
FLAT_LAYOUT = {
    "agent": "deviceplugin",
    "cdi": "host",
    "config": "config",
    "devices": "host",
    "dra_plugin": "dra",
    "dra_registration": "dra",
    "dra_service": "dra",
    "dra_slices": "dra",
    "events": "deviceplugin",
    "httpserver": "observability",
    "inventory": "deviceplugin",
    "kube": "dra",
    "logs": "observability",
    "metrics": "observability",
    "podresources": "deviceplugin",
    "ports": "deviceplugin",
    "reconciler": "deviceplugin",
    "registration": "deviceplugin",
    "server": "deviceplugin",
    "servicer": "deviceplugin",
    "tracing": "observability",
    "watcher": "host",
}


@dataclass(frozen=True)
class Arrow:
    source: str  # module, e.g. "daemon" or "config.files"
    target: str
    kind: str  # "import", "typing" (under TYPE_CHECKING) or "lazy" (inside a function)


@dataclass
class Graph:
    modules: set[str] = field(default_factory=set)
    arrows: set[Arrow] = field(default_factory=set)
    flat: bool = False  # the first layout: rooms are measured by where their modules went

    def room(self, module: str) -> str:
        first = module.split(".")[0]
        return FLAT_LAYOUT.get(first, first) if self.flat else first

    def rooms(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for module in sorted(self.modules):
            out.setdefault(module.split(".")[0], []).append(module)
        return out

    def room_arrows(self) -> dict[tuple[str, str], set[str]]:
        """(source room, target room) -> the kinds of its module arrows; rooms as named in the tree."""
        out: dict[tuple[str, str], set[str]] = {}
        for a in self.arrows:
            pair = (a.source.split(".")[0], a.target.split(".")[0])
            if pair[0] != pair[1]:
                out.setdefault(pair, set()).add(a.kind)
        return out

    def circles(self) -> list[list[str]]:
        """Every strongly connected set of more than one module (Tarjan)."""
        edges: dict[str, set[str]] = {m: set() for m in self.modules}
        for a in self.arrows:
            if a.source != a.target:
                edges[a.source].add(a.target)
        return [sorted(c) for c in _components(edges) if len(c) > 1]

    def room_circles(self) -> list[list[str]]:
        edges: dict[str, set[str]] = {r: set() for r in self.rooms()}
        for source, target in self.room_arrows():
            edges[source].add(target)
        return [sorted(c) for c in _components(edges) if len(c) > 1]

    def layer(self, module: str) -> int | None:
        room = self.room(module)
        return next((i for i, layer in enumerate(LAYERS) if room in layer), None)

    def upward(self) -> list[Arrow]:
        """Arrows to a room of the same or a higher layer (one room's own imports aside)."""
        out = []
        for a in sorted(self.arrows, key=lambda a: (a.source, a.target)):
            low, high = self.layer(a.target), self.layer(a.source)
            if self.room(a.source) == self.room(a.target) or low is None or high is None:
                continue
            if low >= high:
                out.append(a)
        return out

    def unplaced(self) -> list[str]:
        return sorted({self.room(m) for m in self.modules if self.layer(m) is None})


def _components(edges: dict[str, set[str]]) -> Iterator[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[set[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                yield from visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            yield component

    for node in sorted(edges):
        if node not in index:
            yield from visit(node)


# --- reading the sources ------------------------------------------------------------------


def sources(rev: str | None) -> dict[str, str]:
    """Module name (relative to the package, "" for its __init__) -> source text."""
    if rev is None:
        files = {p.relative_to(REPO / ROOT).as_posix(): p.read_text() for p in (REPO / ROOT).rglob("*.py")}
    else:
        listing = _git("ls-tree", "-r", "--name-only", rev, ROOT).splitlines()
        files = {p[len(ROOT) + 1 :]: _git("show", f"{rev}:{p}") for p in listing if p.endswith(".py")}
    out = {}
    for path, text in files.items():
        parts = path[: -len(".py")].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = text
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def node(module: str) -> str:
    """The generated API collapses to one node per API version (api.dra.v1)."""
    if module.startswith("api.") and module.endswith(("_pb2", "_pb2_grpc")):
        return module.rpartition(".")[0]
    return module or PACKAGE


def build(files: dict[str, str]) -> Graph:
    graph = Graph(flat="dra_plugin" in files or "agent" in files)
    generated = {node(m) for m in files if m.startswith("api.") and m.endswith("_pb2")}
    for module, text in files.items():
        if module.startswith("api") and node(module) not in generated:
            continue  # a package only holding versions
        graph.modules.add(node(module))
        if node(module) in generated:
            continue  # generated: its imports are protoc's
        package = module if module in _packages(files) else module.rpartition(".")[0]
        for target, kind in _imports(ast.parse(text), package, files):
            if node(target) != node(module):
                graph.arrows.add(Arrow(node(module), node(target), kind))
    return graph


def _packages(files: dict[str, str]) -> set[str]:
    return {m.rpartition(".")[0] for m in files if "." in m} | {""}


def _imports(tree: ast.Module, package: str, files: dict[str, str]) -> Iterator[tuple[str, str]]:
    for statement, kind in _walk(tree.body, "import"):
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    yield _known(alias.name[len(PACKAGE) + 1 :], files), kind
        elif isinstance(statement, ast.ImportFrom):
            if statement.level:
                base = package.split(".") if package else []
                base = base[: len(base) - statement.level + 1]
                origin = ".".join([*base, *([statement.module] if statement.module else [])])
            elif statement.module and (statement.module == PACKAGE or statement.module.startswith(PACKAGE + ".")):
                origin = statement.module[len(PACKAGE) + 1 :]
            else:
                continue
            for alias in statement.names:
                name = f"{origin}.{alias.name}" if origin else alias.name
                yield _known(name if name in files else origin, files), kind


def _known(module: str, files: dict[str, str]) -> str:
    while module and module not in files:
        module = module.rpartition(".")[0]
    return module


def _walk(body: Iterable[ast.stmt], kind: str) -> Iterator[tuple[ast.stmt, str]]:
    for statement in body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement, kind
        elif isinstance(statement, ast.If) and _is_type_checking(statement.test):
            yield from _walk(statement.body, "typing")
            yield from _walk(statement.orelse, kind)
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(statement.body, "lazy" if kind == "import" else kind)
        else:
            for child in ast.iter_child_nodes(statement):
                if isinstance(child, ast.stmt):
                    yield from _walk([child], kind)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


# --- output -----------------------------------------------------------------------------------


def summary(graph: Graph) -> str:
    rooms = graph.rooms()
    lines = [
        f"rooms: {len(rooms)} ({len(graph.modules)} modules)",
        f"arrows: {len(graph.room_arrows())} between rooms ({len(graph.arrows)} between modules)",
        f"circles: {len(graph.circles())} of modules, {len(graph.room_circles())} of rooms",
        *(f"  circle: {' <-> '.join(c)}" for c in graph.circles()),
        *(f"  room circle: {' <-> '.join(c)}" for c in graph.room_circles()),
        f"upward arrows: {len(graph.upward())}",
        *(f"  {a.source} -> {a.target} ({a.kind})" for a in graph.upward()),
    ]
    if graph.unplaced():
        lines.append(f"rooms without a layer: {', '.join(graph.unplaced())}")
    return "\n".join(lines)


def sizes(files: dict[str, str]) -> str:
    """Lines per room and per module (generated code aside), largest first within each room."""
    rooms: dict[str, dict[str, int]] = {}
    for module, text in files.items():
        if module.startswith("api") or not text.strip():
            continue  # generated, or a package marker
        rooms.setdefault(module.split(".")[0] or PACKAGE, {})[module or PACKAGE] = len(text.splitlines())
    out = []
    for room, modules in sorted(rooms.items(), key=lambda kv: -sum(kv[1].values())):
        out.append(f"{room:<14} {sum(modules.values()):>5} lines")
        out += [f"  {m:<30} {n:>5}" for m, n in sorted(modules.items(), key=lambda kv: -kv[1]) if m != room]
    return "\n".join(out)


def _id(name: str) -> str:
    return name.replace(".", "_")


def mermaid(graph: Graph) -> str:
    """The room graph; a dotted arrow is type-only or lazy (inside a function) throughout."""
    lines = ["flowchart BT"]
    for room, modules in graph.rooms().items():
        inside = [m.split(".", 1)[1] for m in modules if "." in m]
        label = f"{room}/<br/>{'<br/>'.join(inside)}" if inside else room
        lines.append(f'  {_id(room)}["{label}"]')
    upward = {(graph.room(a.source), graph.room(a.target)) for a in graph.upward()}
    for (source, target), kinds in sorted(graph.room_arrows().items()):
        arrow = "-->" if "import" in kinds else "-.->"
        mark = "|upward|" if (graph.room(source), graph.room(target)) in upward else ""
        lines.append(f"  {_id(source)} {arrow}{mark} {_id(target)}")
    return "\n".join(lines)


def dot(graph: Graph) -> str:
    lines = ["digraph ate_devplugin {", "  rankdir=BT; node [shape=box, fontname=monospace];"]
    for room, modules in graph.rooms().items():
        lines.append(f'  subgraph "cluster_{room}" {{ label="{room}";')
        lines += [f'    "{m}";' for m in modules]
        lines.append("  }")
    upward = set(graph.upward())
    for a in sorted(graph.arrows, key=lambda a: (a.source, a.target)):
        style = "dashed" if a.kind != "import" else "solid"
        color = ', color="red"' if a in upward else ""
        lines.append(f'  "{a.source}" -> "{a.target}" [style={style}{color}];')
    lines.append("}")
    return "\n".join(lines)


BEGIN, END = "<!-- import-graph: generated -->", "<!-- /import-graph -->"


def doc_block(graph: Graph) -> str:
    return f"{BEGIN}\n\n```\n{summary(graph)}\n```\n\n```mermaid\n{mermaid(graph)}\n```\n\n{END}"


def update_doc(path: Path, graph: Graph, check: bool) -> bool:
    """Whether the document's block already said this; rewritten unless ``check``."""
    text = path.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + doc_block(graph) + text[end:]
    if not check and new != text:
        path.write_text(new)
    return new == text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the work tree)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--mermaid", action="store_true", help="the room graph as a mermaid flowchart")
    out.add_argument("--dot", action="store_true", help="the module graph as Graphviz dot")
    out.add_argument("--sizes", action="store_true", help="lines per room and per module")
    parser.add_argument("--svg", type=Path, help="with --dot: render to this file (needs Graphviz's dot)")
    parser.add_argument("--check", action="store_true", help="exit 1 on a circle, an upward arrow or an unplaced room")
    parser.add_argument("--doc", type=Path, help="the document whose generated block to write (or --check)")
    args = parser.parse_args(argv)
    files = sources(args.rev)
    graph = build(files)
    if args.sizes:
        print(sizes(files))
    elif args.doc is not None:
        if not update_doc(args.doc, graph, args.check) and args.check:
            print(f"import-graph: {args.doc} is out of date: run tools/import-graph.py --doc FILE", file=sys.stderr)
            return 1
    elif args.mermaid:
        print(mermaid(graph))
    elif args.dot:
        text = dot(graph)
        if args.svg is None:
            print(text)
        elif shutil.which("dot") is None:
            print("import-graph: --svg needs Graphviz's dot (apt-get install graphviz)", file=sys.stderr)
            return 2
        else:
            subprocess.run(["dot", "-Tsvg", "-o", str(args.svg)], input=text, text=True, check=True)
    else:
        print(summary(graph))
    if args.check and (graph.circles() or graph.room_circles() or graph.upward() or graph.unplaced()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
