"""What a dashboard is, in the project's own small model: queries, panels (``Stat``,
``TimeSeries``, ``StateTimeline``, ``Table``), rows of panels on a ``Board``, and its
variables. grafana.py and perses.py each turn a board into their tool's dashboard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

Step = tuple[float | None, str]  # from this value up (None: from the lowest), this colour
ValueText = tuple[int, str, str]  # a value, the text shown for it, its colour


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    exemplar: bool = False
    color: str = ""  # one colour for all its series (green: success, red: failure); else the palette


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: Sequence[Query]
    unit: str  # Grafana's unit id; UNITS gives the Perses format
    width: int
    height: int


@dataclass(frozen=True)
class Stat(Panel):
    steps: Sequence[Step]
    mappings: Sequence[ValueText]
    label_as_value: str = ""  # show this label's value instead of the number (e.g. version)


@dataclass(frozen=True)
class TimeSeries(Panel):
    bars: bool = False
    stack: bool = False
    list_legend: bool = False  # names only, side by side; else a table with the last and highest value


@dataclass(frozen=True)
class StateTimeline(Panel):
    mappings: Sequence[ValueText] = ()


@dataclass(frozen=True)
class ColumnStyle:
    """How one table column is shown: its value mapping, threshold colours, a link, a unit
    (a value column with a unit is a measure, not a count of problems)."""

    mappings: Sequence[ValueText] = ()
    steps: Sequence[Step] = ()
    link: dict[str, str] | None = None
    unit: str = ""


@dataclass(frozen=True)
class Table(Panel):
    columns: dict[str, str] = field(default_factory=dict)  # label or "#A" (query A's value) -> header
    styles: dict[str, ColumnStyle] = field(default_factory=dict)  # header -> style
    sort_by: str = ""
    problems: bool = False  # every value column without a unit counts problems: 0 is fine, more is not


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    text: str
    color: str


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    selector: str  # the series whose label values are offered ("" for a constant)
    multi: bool
    hidden: bool = False
    constant: str = ""  # a hidden constant's value, which whoever installs the board sets (the chart)


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: Sequence[tuple[str, Sequence[Panel]]]
    collapsed: Sequence[tuple[str, Sequence[Panel]]]  # closed until clicked: modes many nodes do not run
    variables: Sequence[Variable]
    annotations: Sequence[Annotation] = ()


def rows_layout(panels: Sequence[Panel]) -> list[tuple[Panel, int, int]]:
    """(panel, x, y) within a row: left to right, a new line where the next one does not fit."""
    out, x, y, line_height = [], 0, 0, 0
    for panel in panels:
        if x + panel.width > 24:
            x, y, line_height = 0, y + line_height, 0
        out.append((panel, x, y))
        x += panel.width
        line_height = max(line_height, panel.height)
    return out


def label_name(variable: Variable) -> str:
    return "resource_name" if variable.name == "resource" else variable.name
