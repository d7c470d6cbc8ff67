"""The view's figures, in Bokeh: built once from a :class:`~datavine.dashboard.model.Board`
and updated from it (the live server), or built once and saved (the report).

One page, top to bottom: the run's progress (a header: tasks, bundles, files, events, bytes
by nearness, outcomes, the share of decoded bytes the workers' column caches served); the
workers by rack and host (a table: state, cores, calls running, bundles done and failed,
memory in use against the cap of the bundle they run, peak, CPU) and their memory against
their caps; throughput over
time (Gbps per XCache server with the total, Gbps by nearness: on the host, same rack,
inter-rack; events/s and tasks/s) and the bytes each server served by nearness; the task
stream (each bundle a bar on its worker's line, coloured by its outcome); the failures with
their cause and the slowest files. Models that tests and scripts read carry names
(``progress``, ``workers``, ``stream``, ...): ``Bokeh.documents[0].get_model_by_name(name)``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bokeh.layouts import row
from bokeh.models import (
    ColumnDataSource,
    DataRange1d,
    FactorRange,
    HoverTool,
    LayoutDOM,
    LinearAxis,
    NumeralTickFormatter,
)
from bokeh.models.widgets import (
    DataTable,
    Div,
    NumberFormatter,
    StringFormatter,
    TableColumn,
)
from bokeh.plotting import figure

from datavine.dashboard import columns, model
from datavine.dashboard.columns import Columns, Progress
from datavine.dashboard.model import NEARNESS, NEARNESS_COLOURS, Board

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TOOLS = "pan,wheel_zoom,box_zoom,reset,save"


def _mb() -> NumberFormatter:  # a model belongs to one document: a new one per page
    return NumberFormatter(format="0,0", nan_format="")


def _one() -> NumberFormatter:
    return NumberFormatter(format="0,0.0", nan_format="")


@dataclass
class Page:
    """The page's models and what was last sent to each (so an update sends changes only).
    ``roots``: the page's parts top to bottom, each a root of its own document, so that a
    change in one lays out and repaints that part only."""

    roots: list[LayoutDOM]
    header: Div
    sources: dict[str, ColumnDataSource]
    worker_ranges: list[FactorRange]
    server_range: FactorRange
    sent: dict[str, Columns] = field(default_factory=dict)
    stream_run: int | None = None
    stream_rows: int = 0

    def update(self, board: Board) -> None:
        """Bring every figure up to ``board`` (a live session, every ``refresh_s``)."""
        run = board.run
        self._set_text(header_html(columns.progress(board)))
        workers = columns.worker_columns(board)
        self._set("workers", workers)
        if [*self.worker_ranges[0].factors] != (workers["worker"] or ["-"]):
            for r in self.worker_ranges:
                r.factors = _factors(workers["worker"])
        throughput, servers = columns.throughput_columns(run)
        self._set("servers", servers)
        self._set("throughput", throughput)
        totals = columns.server_totals(run)
        self._set("server_totals", totals)
        if [*self.server_range.factors] != (totals["server"] or ["-"]):
            self.server_range.factors = _factors(totals["server"])
        self._set("failures", columns.failure_columns(run))
        self._set("slowest", columns.slowest_columns(run))
        source = self.sources["stream"]
        number = run.run if run is not None else None
        if number != self.stream_run:
            source.data = _data(columns.stream_columns(run))
            self.stream_run, self.stream_rows = number, len(run.stream) if run else 0
        elif run is not None and len(run.stream) > self.stream_rows:
            source.stream(_data(columns.stream_columns(run, self.stream_rows)))
            self.stream_rows = len(run.stream)

    def _set(self, name: str, data: Columns) -> None:
        if _same(self.sent.get(name), data):
            return
        self.sent[name] = data
        self.sources[name].data = _data(data)

    def _set_text(self, text: str) -> None:
        if self.header.text != text:
            self.header.text = text


def _data(data: Columns) -> DataDict:
    """Columns as Bokeh's sources take them (the same dict, as Bokeh types it)."""
    return {name: values for name, values in data.items()}


def _factors(names: Sequence[object]) -> list[str]:
    """A categorical axis's factors: ``names``, or a placeholder when there is none."""
    return [str(n) for n in names] or ["-"]


def _same(a: Columns | None, b: Columns) -> bool:
    """Equal data, NaN equal to NaN (a cap not known yet)."""
    if a is None or a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if len(x) != len(y):
            return False
        for u, v in zip(x, y, strict=True):
            if u != v and not (isinstance(u, float) and isinstance(v, float)
                               and math.isnan(u) and math.isnan(v)):
                return False
    return True


def build(board: Board, *, title: str = "datavine") -> Page:
    """The page for ``board``, filled with what it holds now."""
    run = board.run
    workers = columns.worker_columns(board)
    throughput, servers = columns.throughput_columns(run)
    totals = columns.server_totals(run)
    sources = {
        "workers": ColumnDataSource(_data(workers), name="workers"),
        "servers": ColumnDataSource(_data(servers), name="servers"),
        "throughput": ColumnDataSource(_data(throughput), name="throughput"),
        "server_totals": ColumnDataSource(_data(totals), name="server_totals"),
        "stream": ColumnDataSource(_data(columns.stream_columns(run)), name="stream"),
        "failures": ColumnDataSource(_data(columns.failure_columns(run)), name="failures"),
        "slowest": ColumnDataSource(_data(columns.slowest_columns(run)), name="slowest"),
    }
    names = _factors(workers["worker"])
    memory_range, stream_range = FactorRange(factors=names), FactorRange(factors=names)
    server_range = FactorRange(factors=_factors(totals["server"]))
    header = Div(text=header_html(columns.progress(board)), name="progress",
                 sizing_mode="stretch_width")
    roots: list[LayoutDOM] = [
        Div(text=f"<h2 style='margin:4px 0'>{html.escape(title)}</h2>"),
        header,
        row(workers_table(sources["workers"]), memory_figure(sources["workers"], memory_range),
            sizing_mode="stretch_width"),
        row(servers_figure(sources["servers"], sources["throughput"]),
            nearness_figure(sources["throughput"]), sizing_mode="stretch_width"),
        row(rates_figure(sources["throughput"]),
            server_totals_figure(sources["server_totals"], server_range),
            sizing_mode="stretch_width"),
        stream_figure(sources["stream"], stream_range),
        row(failures_table(sources["failures"]), slowest_table(sources["slowest"]),
            sizing_mode="stretch_width")]
    page = Page(roots, header, sources, [memory_range, stream_range], server_range)
    page.stream_run = run.run if run is not None else None
    page.stream_rows = len(run.stream) if run is not None else 0
    return page


# --- the header ---------------------------------------------------------------------------------
def header_html(p: Progress) -> str:
    """The run's figures in a line or three of HTML (each figure in a ``<b>`` with a
    ``data-figure`` name, for scripts and tests)."""
    def fig(name: str, value: object) -> str:
        shown = f"{value:,}" if isinstance(value, int) else str(value)
        return f'<b data-figure="{name}">{html.escape(shown)}</b>'

    workers = p.get("workers", {})
    states = ", ".join(f"{fig('workers-' + s.replace(' ', '-'), n)} {s}"
                       for s, n in workers.items() if n)
    lines = [f"workers: {states or 'none yet'}"]
    usage = p.get("usage", {})
    if usage.get("manager"):
        mem, cpu = usage["manager"]
        lines[-1] += f" &middot; manager {mem:,.0f} MB, {cpu:.0f}% CPU"
    if usage.get("host"):
        used, total, cpu = usage["host"]
        lines[-1] += (f" &middot; this host {used / 1024:,.1f} of {total / 1024:,.1f} GB, "
                      f"{cpu:.0f}% CPU")
    if "run" not in p:
        return "<div style='font-size:14px'>" + "<br>".join(lines) + " &middot; no run yet</div>"
    state = "finished" if p["finished"] else "running"
    lines.insert(0, (
        f"run {fig('run', p['run'])} {state}, {fig('elapsed', p['elapsed_s'])} s &middot; "
        f"tasks {fig('tasks-done', p['tasks_done'])} of {fig('tasks', p['tasks'])} &middot; "
        f"bundles done {fig('bundles-done', p['bundles_done'])} of "
        f"{fig('bundles-sent', p['bundles_sent'])} sent ({fig('running', p['running'])} "
        f"running, {fig('queued', p['queued'])} waiting) &middot; "
        f"files {fig('files-done', p['files_done'])} of {fig('files', p['files'])}, "
        f"{fig('files-failed', p['files_failed'])} failed"))
    rate = (f"events {fig('events', p['events'])} ({p['events_per_s']:,.0f}/s) &middot; "
            if p["events"] else "")
    near = p["bytes_by_nearness"]
    lines.insert(1, (
        f"{rate}{p['tasks_per_s']:,.1f} tasks/s &middot; read {p['bytes'] / 1e9:,.3f} GB "
        f"({p['gbps']:,.3f} Gbps): on the host {fig('bytes-on-host', near[model.ON_HOST])}, "
        f"same rack {fig('bytes-same-rack', near[model.SAME_RACK])}, inter-rack "
        f"{fig('bytes-inter-rack', near[model.INTER_RACK])} B &middot; near "
        f"{fig('near-bytes', p['near_bytes'])} B, far {fig('far-bytes', p['far_bytes'])} B"))
    outcomes = ", ".join(f"{fig('outcome-' + o.replace(' ', '-'), n)} {o}"
                         for o, n in p["outcomes"].items() if n)
    lines.insert(2, f"bundles: {outcomes or 'none back yet'}")
    hits, decoded = p["cache_hit_bytes"], p["cache_decoded_bytes"]
    if hits or decoded:  # reads through the workers' column caches (io/cached_arrays.py)
        share = f"{p['cache_hit_fraction']:.1%}"
        lines.insert(3, (
            f"column cache: {fig('cache-hit-percent', share)} "
            f"of the decoded bytes from workers' memory: {fig('cache-hit-bytes', hits)} B "
            f"from memory, {fig('cache-decoded-bytes', decoded)} B decoded from files"))
    return "<div style='font-size:14px;line-height:1.6'>" + "<br>".join(lines) + "</div>"


# --- figures ------------------------------------------------------------------------------------
def workers_table(source: ColumnDataSource) -> DataTable:
    state = StringFormatter(text_color="colour", font_style="bold")
    columns = [TableColumn(field="worker", title="worker", width=110),
               TableColumn(field="rack", title="rack", width=45),
               TableColumn(field="host", title="host", width=110),
               TableColumn(field="state", title="state", formatter=state, width=110),
               TableColumn(field="cores", title="cores", width=45),
               TableColumn(field="running", title="running", width=55),
               TableColumn(field="done", title="done", width=55),
               TableColumn(field="failed", title="failed", width=50),
               TableColumn(field="memory_mb", title="memory MB", formatter=_mb(), width=80),
               TableColumn(field="cap_mb", title="cap MB", formatter=_mb(), width=65),
               TableColumn(field="peak_mb", title="peak MB", formatter=_mb(), width=65),
               TableColumn(field="cpu", title="CPU %", formatter=_one(), width=55)]
    return DataTable(source=source, columns=columns, name="workers-table", index_position=None,
                     height=260, sizing_mode="stretch_width", sortable=True)


def memory_figure(source: ColumnDataSource, y_range: FactorRange) -> figure:
    p = figure(y_range=y_range, x_range=DataRange1d(start=0), height=260, width=480,
               title="memory in use (MB) and cap", tools=TOOLS, name="memory",
               toolbar_location="above")
    p.hbar(y="worker", right="memory_mb", height=0.7, color="colour", source=source,
           legend_label="in use")
    p.scatter(x="cap_mb", y="worker", marker="dash", angle=math.pi / 2, size=18,
              line_width=3, color="black", source=source, legend_label="cap")
    p.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("state", "@state"),
                                    ("memory", "@memory_mb{0,0} MB"), ("cap", "@cap_mb{0,0} MB"),
                                    ("peak", "@peak_mb{0,0} MB")]))
    p.legend.location = "bottom_right"
    return p


def time_figure(title: str, name: str) -> figure:
    """A figure over the run's time, as every time series of the view has (from 0 up)."""
    return figure(height=250, sizing_mode="stretch_width", title=title,
                  x_axis_label="s since the run started", tools=TOOLS, name=name,
                  y_range=DataRange1d(start=0))


def servers_figure(servers: ColumnDataSource, throughput: ColumnDataSource) -> figure:
    p = time_figure("Gbps by XCache server (and in all)", "gbps-servers")
    p.multi_line(xs="xs", ys="ys", line_color="colour", line_width=2, source=servers,
                 legend_field="server")
    p.line(x="t", y="total", line_color="black", line_dash="dashed", source=throughput,
           legend_label="all")
    p.legend.location = "top_left"
    return p


def nearness_figure(source: ColumnDataSource) -> figure:
    p = time_figure("Gbps by nearness to the reading worker", "gbps-nearness")
    p.varea_stack(stackers=list(NEARNESS), x="t", source=source,
                  color=[NEARNESS_COLOURS[n] for n in NEARNESS], legend_label=list(NEARNESS),
                  alpha=0.8)
    p.legend.location = "top_left"
    return p


def rates_figure(source: ColumnDataSource) -> figure:
    p = time_figure("events/s (left) and tasks/s (right)", "rates")
    p.line(x="t", y="events", line_width=2, color="#2ca02c", source=source,
           legend_label="events/s")
    p.yaxis.formatter = NumeralTickFormatter(format="0,0")
    tasks_range = DataRange1d(start=0)
    p.extra_y_ranges = {"tasks": tasks_range}
    tasks = p.line(x="t", y="tasks", line_width=2, color="#1f77b4", source=source,
                   legend_label="tasks/s", y_range_name="tasks")
    tasks_range.renderers = [tasks]
    p.add_layout(LinearAxis(y_range_name="tasks", axis_label="tasks/s"), "right")
    p.legend.location = "top_left"
    return p


def server_totals_figure(source: ColumnDataSource, y_range: FactorRange) -> figure:
    p = figure(y_range=y_range, x_range=DataRange1d(start=0), height=250,
               sizing_mode="stretch_width", title="GB each server served, by nearness",
               tools=TOOLS, name="server-totals")
    p.hbar_stack(list(NEARNESS), y="server", height=0.7, source=source,
                 color=[NEARNESS_COLOURS[n] for n in NEARNESS], legend_label=list(NEARNESS))
    p.legend.location = "bottom_right"
    return p


def stream_figure(source: ColumnDataSource, y_range: FactorRange) -> figure:
    p = figure(y_range=y_range, height=320, sizing_mode="stretch_width",
               title="task stream: bundles per worker, by outcome",
               x_axis_label="s since the run started", tools=TOOLS, name="stream-figure")
    p.hbar(y="worker", left="start", right="end", height=0.8, color="colour", source=source,
           legend_field="outcome", line_color=None)
    p.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("outcome", "@outcome"),
                                    ("tasks", "@tasks"), ("call", "@call"),
                                    ("seconds", "@start{0.00} - @end{0.00}"),
                                    ("memory", "@peak_mb{0,0} / cap @cap_mb{0,0} MB")]))
    p.legend.location = "top_left"
    p.legend.orientation = "horizontal"
    return p


def failures_table(source: ColumnDataSource) -> DataTable:
    columns = [TableColumn(field="at_s", title="at s", width=50),
               TableColumn(field="worker", title="worker", width=100),
               TableColumn(field="outcome", title="outcome", width=150),
               TableColumn(field="cause", title="cause", width=420)]
    return DataTable(source=source, columns=columns, name="failures-table", height=200,
                     sizing_mode="stretch_width", index_position=None)


def slowest_table(source: ColumnDataSource) -> DataTable:
    columns = [TableColumn(field="file", title="slowest files", width=300),
               TableColumn(field="seconds", title="s", formatter=_one(), width=50),
               TableColumn(field="worker", title="worker", width=100),
               TableColumn(field="server", title="server", width=110),
               TableColumn(field="mb", title="MB", formatter=_one(), width=60)]
    return DataTable(source=source, columns=columns, name="slowest-table", height=200,
                     sizing_mode="stretch_width", index_position=None)
