"""Building blocks of the AACO dashboards: datasources, template variables, panels, trace links.

Every panel made here has a unit, a description and Prometheus targets on the ``$datasource``
variable; the dashboards share the variables ``datasource``, ``traces`` (Tempo or Jaeger),
``node``, ``gpu``, ``model`` (the workload's model) and ``namespace`` (of the pods GPUs are
allocated to). Multi-value variables default to All, which Grafana sends as ``.*``.

The dashboards are written with grafana-foundation-sdk (Grafana's own typed builders, pinned in
the ``dev`` extra so the generated JSON is reproducible); where its model lacks a field Grafana
reads (``titleFormat``/``tagKeys``/``step`` of Prometheus annotations), ``finalize`` adds it to
the encoded JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import quote

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
    xychart,
)
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import xychart as xm

PROMETHEUS: Final = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TRACE_PLUGINS: Final = ("tempo", "jaeger")
SERVICE_NAME: Final = "aaco-agent"  # the agent's OTLP resource service.name (exporters/otlp_traces.py)

# Label matchers of the template variables, by the labels a family of metrics carries.
GPU: Final = 'node=~"$node", gpu=~"$gpu", namespace=~"$namespace"'
DEVICE: Final = 'node=~"$node", gpu=~"$gpu"'
WORKLOAD: Final = 'node=~"$node", model=~"$model"'
NODE: Final = 'node=~"$node"'
MODEL: Final = 'model=~"$model"'
RATE: Final = "$__rate_interval"


@dataclass(frozen=True)
class Q:
    """One Prometheus query of a panel: the expression, its legend, and how Grafana runs it."""

    expr: str
    legend: str = ""
    instant: bool = False
    exemplar: bool = False
    heatmap: bool = False
    table: bool = False

    def build(self, ref: str) -> prometheus.Dataquery:
        """The SDK target with reference id ``ref``."""
        q = prometheus.Dataquery().expr(self.expr).ref_id(ref).datasource(PROMETHEUS)
        if self.legend:
            q = q.legend_format(self.legend)
        q = q.instant() if self.instant else q.range()
        if self.exemplar:
            q = q.exemplar(True)
        if self.heatmap:
            q = q.format(pm.PromQueryFormat.HEATMAP)
        elif self.table:
            q = q.format(pm.PromQueryFormat.TABLE)
        return q


def _targets(panel: Any, queries: Sequence[Q]) -> Any:
    if not queries:
        raise ValueError("a panel needs at least one query")
    for i, q in enumerate(queries):
        panel = panel.with_target(q.build(chr(ord("A") + i)))
    return panel


def _common(panel: Any, title: str, description: str, unit: str, width: int, height: int) -> Any:
    if not description.strip():
        raise ValueError(f"panel {title!r} needs a description")
    if not unit:
        raise ValueError(f"panel {title!r} needs a unit")
    return panel.title(title).description(description).unit(unit).datasource(PROMETHEUS).span(width).height(height)


def thresholds(*steps: tuple[str, float | None]) -> db.ThresholdsConfig:
    """Absolute thresholds: ``("green", None)`` is the base colour, then ``(colour, from_value)``."""
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for c, v in steps])
    )


def value_map(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMap]:
    """Value mappings: raw value -> (text, colour)."""
    return [
        dm.ValueMap(
            options={
                k: dm.ValueMappingResult(text=t, color=c, index=i) for i, (k, (t, c)) in enumerate(mapping.items())
            }
        )
    ]


def _legend(table_mode: bool = True) -> cb.VizLegendOptions:
    legend = cb.VizLegendOptions().show_legend(True).placement(cm.LegendPlacement.BOTTOM)
    if table_mode:
        return legend.display_mode(cm.LegendDisplayMode.TABLE).calcs(["lastNotNull", "max"])
    return legend.display_mode(cm.LegendDisplayMode.LIST)


def ts(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    width: int = 12,
    height: int = 8,
    min_val: float | None = None,
    max_val: float | None = None,
    stack: bool = False,
    bars: bool = False,
    fill: float = 10,
    steps: tuple[tuple[str, float | None], ...] = (),
    links: Sequence[db.DashboardLink] = (),
    no_value: str = "",
    legend_table: bool = True,
) -> timeseries.Panel:
    """A time series panel."""
    p = _common(timeseries.Panel(), title, description, unit, width, height)
    p = _targets(p, queries)
    p = p.line_width(1).fill_opacity(100 if stack else fill).legend(_legend(legend_table))
    p = p.tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    if stack:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS)
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if steps:
        p = p.thresholds(thresholds(*steps)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED)
        )
    if links:
        p = p.data_links(list(links))
    if no_value:
        p = p.no_value(no_value)
    return p


def single_stat(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    width: int = 4,
    height: int = 4,
    steps: tuple[tuple[str, float | None], ...] = (("green", None),),
    decimals: int | None = None,
    mappings: dict[str, tuple[str, str]] | None = None,
) -> stat.Panel:
    """A stat panel of the latest value, coloured by thresholds."""
    p = _common(stat.Panel(), title, description, unit, width, height)
    p = _targets(p, queries)
    p = (
        p.thresholds(thresholds(*steps))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.AREA)
    )
    p = p.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if decimals is not None:
        p = p.decimals(decimals)
    if mappings:
        p = p.mappings(value_map(mappings))
    return p


def heat(
    title: str,
    description: str,
    unit: str,
    query: Q,
    *,
    width: int = 12,
    height: int = 8,
    exemplars: bool = False,
) -> heatmap.Panel:
    """A heatmap of a Prometheus histogram's buckets (already bucketed: no calculation)."""
    p = _common(heatmap.Panel(), title, description, unit, width, height)
    p = _targets(p, [query])
    p = p.calculate(False).y_axis(heatmap.YAxisConfig().unit(unit)).cell_values(heatmap.CellValues().unit("short"))
    p = p.color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges").steps(64))
    p = p.show_legend().rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
    if exemplars:
        p = p.exemplars_color("rgba(255,0,255,0.7)")
    return p


def timeline(
    title: str,
    description: str,
    queries: Sequence[Q],
    mapping: dict[str, tuple[str, str]],
    *,
    width: int = 12,
    height: int = 8,
    unit: str = "none",
) -> statetimeline.Panel:
    """A state timeline: one row per series, coloured by value mappings."""
    p = _common(statetimeline.Panel(), title, description, unit, width, height)
    p = _targets(p, queries)
    return p.mappings(value_map(mapping)).show_value(cm.VisibilityMode.NEVER).merge_values(True).row_height(0.8)


def tbl(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    width: int = 12,
    height: int = 8,
    sort_by: str = "",
) -> table.Panel:
    """A table of instant queries, joined on their labels (one column per query)."""
    p = _common(table.Panel(), title, description, unit, width, height)
    p = _targets(p, queries)
    if len(queries) > 1:
        p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(
        dm.DataTransformerConfig(id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": {}})
    )
    if sort_by:
        p = p.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(True)])
    return p


def scatter(
    title: str,
    description: str,
    unit: str,
    x: Q,
    y: Q,
    *,
    x_name: str,
    y_name: str,
    width: int = 12,
    height: int = 8,
) -> xychart.Panel:
    """Points of two instant table queries joined on their labels: ``x`` across, ``y`` up (log scales).

    A roofline: each series of ``x`` (arithmetic intensity) paired with the ``y`` series of the same labels
    (FLOP/s); the values are renamed ``x_name`` and ``y_name`` and mapped to the axes by name.
    """
    p = _common(xychart.Panel(), title, description, unit, width, height)
    p = _targets(p, [replace(x, instant=True, table=True), replace(y, instant=True, table=True)])
    p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(
        dm.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": {"Time": True}, "renameByName": {"Value #A": x_name, "Value #B": y_name}},
        )
    )
    series = (
        xychart.XYSeriesConfig()
        .x(xychart.XychartXYSeriesConfigX().matcher(FieldByName(x_name)))
        .y(xychart.XychartXYSeriesConfigY().matcher(FieldByName(y_name)))
    )
    log = cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10)
    return p.mapping(xm.SeriesMapping.MANUAL).series([series]).show(xm.XYShowMode.POINTS).scale_distribution(log)


class FieldByName(cogbuilder.Builder[xm.MatcherConfig]):
    """A field matcher by name (the SDK has its model, not a builder for it)."""

    def __init__(self, name: str) -> None:
        self._internal = xm.MatcherConfig(id_val="byName", options=name)

    def build(self) -> xm.MatcherConfig:
        """The matcher."""
        return self._internal


def bars(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    width: int = 12,
    height: int = 8,
    steps: tuple[tuple[str, float | None], ...] = (("green", None),),
    min_val: float | None = None,
    max_val: float | None = None,
) -> bargauge.Panel:
    """A horizontal bar gauge of the latest values (rankings: worst nodes, top models)."""
    p = _common(bargauge.Panel(), title, description, unit, width, height)
    p = _targets(p, queries)
    p = p.orientation(cm.VizOrientation.HORIZONTAL).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
    p = p.thresholds(thresholds(*steps)).reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return p


def _explore_url(pane: dict[str, Any], tokens: dict[str, str]) -> str:
    """A Grafana Explore URL for ``pane``; ``tokens`` are placeholders kept unencoded (Grafana variables)."""
    encoded = quote(json.dumps({"traces": pane}, separators=(",", ":")), safe="")
    for placeholder, variable in tokens.items():
        encoded = encoded.replace(quote(placeholder, safe=""), variable)
    return f"/explore?schemaVersion=1&orgId=1&panes={encoded}"


def trace_links(
    plugin: str, label: str = "model", *, attribute: str = "", service: str = SERVICE_NAME
) -> list[db.DashboardLink]:
    """Data links from a latency series to its model's traces in the ``$traces`` datasource.

    Exemplars (the trace IDs on the latency histogram's buckets) link to single traces through the
    Prometheus datasource's exemplar settings; this link searches every trace of the series' model
    in the time range shown: spans of ``service`` (any service when empty) whose span attribute
    ``attribute`` (default ``aaco.<label>``) is the series' label value.
    """
    if plugin not in TRACE_PLUGINS:
        raise ValueError(f"traces plugin must be one of {TRACE_PLUGINS}, not {plugin!r}")
    tokens = {
        "@DS@": "${traces}",
        "@VALUE@": "${__field.labels." + label + "}",
        "@FROM@": "${__from}",
        "@TO@": "${__to}",
    }
    ds = {"type": plugin, "uid": "@DS@"}
    attribute = attribute or f"aaco.{label}"
    if plugin == "tempo":
        conditions = [f'resource.service.name="{service}"'] if service else []
        conditions.append(f'span.{attribute}="@VALUE@"')
        query: dict[str, Any] = {
            "refId": "A",
            "datasource": ds,
            "queryType": "traceql",
            "query": "{" + " && ".join(conditions) + "}",
        }
    else:
        query = {"refId": "A", "datasource": ds, "queryType": "search", "tags": f"{attribute}=@VALUE@"}
        if service:
            query["service"] = service
    pane = {"datasource": "@DS@", "queries": [query], "range": {"from": "@FROM@", "to": "@TO@"}}
    return [
        db.DashboardLink(f"Traces of ${{__field.labels.{label}}} ({plugin})")
        .url(_explore_url(pane, tokens))
        .target_blank(True)
    ]


def query_variable(name: str, label: str, query: str, description: str) -> db.QueryVariable:
    """A multi-value variable from a Prometheus query on ``$datasource``, All (``.*``) by default."""
    return (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(PROMETHEUS)
        .query(query)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
    )


def standard_variables(traces_plugin: str, sources: Mapping[str, tuple[str, str]] | None = None) -> list[Any]:
    """The variables every AACO dashboard has, in order.

    ``sources`` replaces the query and description of a query variable by name (a dashboard whose
    ``model`` comes from other series).
    """
    sources = sources or {}

    def query(name: str, label: str, expr: str, description: str) -> db.QueryVariable:
        return query_variable(name, label, *sources.get(name, (expr, description)))

    return [
        db.DatasourceVariable("datasource")
        .label("Prometheus")
        .description("The Prometheus that scrapes the AACO agents and evaluates dashboards/rules/.")
        .type("prometheus"),
        db.DatasourceVariable("traces")
        .label(f"Traces ({traces_plugin})")
        .description("Where the agents' OTLP traces land: latency panels link to the traces of a model there.")
        .type(traces_plugin),
        query(
            "node",
            "Node",
            "label_values(aaco_agent_info, node)",
            "Nodes with an AACO agent (the agent's node name).",
        ),
        query(
            "namespace",
            "Namespace",
            'label_values(aaco_gpu_up{node=~"$node"}, namespace)',
            "Kubernetes namespace of the pods GPUs are allocated to (GPU panels; empty for unallocated GPUs).",
        ),
        query(
            "gpu",
            "GPU",
            'label_values(aaco_gpu_up{node=~"$node", namespace=~"$namespace"}, gpu)',
            "GPU index on its node (GPU and device panels).",
        ),
        query(
            "model",
            "Model",
            'label_values(aaco_iteration_latency_seconds_count{node=~"$node"}, model)',
            "The workload's model (ONNX model, trace or profile name) in workload panels.",
        ),
    ]


def dashboard_links() -> list[db.DashboardLink]:
    """A menu of the other AACO dashboards, carrying the time range and variables."""
    return [
        db.DashboardLink("AACO")
        .type(dm.DashboardLinkType.DASHBOARDS)
        .tags(["aaco"])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    ]


@dataclass(frozen=True)
class Annotation:
    """A Prometheus annotation: a marker on every time series panel wherever ``expr`` has a value."""

    name: str
    expr: str
    color: str
    title: str
    tags: tuple[str, ...] = ()

    def build(self) -> db.AnnotationQuery:
        """The SDK part (name, datasource, expression, colour)."""
        return (
            db.AnnotationQuery()
            .name(self.name)
            .datasource(PROMETHEUS)
            .expr(self.expr)
            .icon_color(self.color)
            .enable(True)
        )

    def extras(self) -> dict[str, Any]:
        """Fields Grafana's Prometheus annotations read that the SDK model lacks."""
        return {"titleFormat": self.title, "tagKeys": ",".join(self.tags), "step": "1m", "useValueForTime": False}


@dataclass
class Spec:
    """One dashboard: its identity and its rows of panels."""

    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Any]]]
    extra_variables: list[Any] = field(default_factory=list)
    variable_sources: dict[str, tuple[str, str]] = field(default_factory=dict)
    annotations: list[Annotation] = field(default_factory=list)
    tags: tuple[str, ...] = ()


def build(spec: Spec, traces_plugin: str = "tempo") -> dict[str, Any]:
    """The Grafana JSON model of ``spec``."""
    d = (
        db.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["aaco", *spec.tags])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .editable()
        .links(dashboard_links())
    )
    for variable in [*standard_variables(traces_plugin, spec.variable_sources), *spec.extra_variables]:
        d = d.with_variable(variable)
    for annotation in spec.annotations:
        d = d.annotation(annotation.build())
    for row_title, panels in spec.rows:
        d = d.with_row(db.Row(row_title))
        for panel in panels:
            d = d.with_panel(panel)
    return finalize(d, spec.annotations)


def finalize(d: cogbuilder.Builder[dm.Dashboard], annotations: Iterable[Annotation] = ()) -> dict[str, Any]:
    """Encode, number the panels 1..n in layout order, and add the annotation fields the SDK lacks."""
    doc: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, panel in enumerate(doc["panels"], start=1):
        panel["id"] = i
    extras = {a.name: a.extras() for a in annotations}
    for entry in doc.get("annotations", {}).get("list", []):
        entry.update(extras.get(entry["name"], {}))
    return doc


def iter_panels(doc: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Every panel of a dashboard JSON model (rows' collapsed panels included), rows excluded."""
    for panel in doc.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel
