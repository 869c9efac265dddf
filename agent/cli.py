"""The ``aaco`` command line.

Exit codes: 0 success; 1 an unexpected failure (a bug: the log says where); 2 bad usage or bad
input (a missing or corrupt file, a config that does not validate), reported as one clear line
naming the file and what is wrong, without a traceback; 3 (``aaco replay``) spans or metrics it was
asked to send over OTLP were dropped (upstream down or refusing, queue or byte budget full, shutdown
deadline), said with how many and why. Damaged input and lost data together exit 2 (the input is
the first thing to fix; both are said). ``aaco agent``, a daemon, stopped by a signal
exits 0 whatever input it met: bad input is counted, quarantined and logged as it is met, and a
non-zero status would read as a crash to the supervisor that stopped it (Kubernetes, systemd).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.abc
import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.rich_utils
from rich.console import Console
from rich.table import Table

from aaco.agent import __version__
from aaco.contract.errors import AacoError, ConfigError

if TYPE_CHECKING:  # the config, the service and its sources cost ~0.8 s to import: each command imports its own
    from aaco.agent.config import AgentConfig
    from aaco.agent.service import AgentService

app = typer.Typer(
    name="aaco",
    help="AACO: GPU observability agent. Kernel traces, GPU telemetry and scheduler events become "
    "OpenTelemetry traces and metrics, Prometheus metrics and a Parquet lake, with analyzers that "
    "say where the time went and why latency changed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)
config_app = typer.Typer(help="Work with agent configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")

PIPED_WIDTH = 160  # columns for tables and help when stdout is not a terminal and COLUMNS does not say


def _piped_width() -> int | None:
    """``PIPED_WIDTH`` when output goes to a pipe or a file (rich would assume 80 and cut), else None."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"):
        return None
    return PIPED_WIDTH


out_console = Console(width=_piped_width())
if typer.rich_utils.MAX_WIDTH is None:  # typer's documented knob (TERMINAL_WIDTH) for its help console
    typer.rich_utils.MAX_WIDTH = _piped_width()
err_console = Console(stderr=True)
log = logging.getLogger("aaco")


def _print_version(value: bool) -> None:
    """``--version``: print the version and exit, before any command or option is looked at."""
    if value:
        typer.echo(f"aaco {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", is_eager=True, callback=_print_version, help="Print the version of AACO and exit."
        ),
    ] = False,
) -> None:
    """AACO: GPU observability agent."""


def setup_logging(level: str) -> None:
    """Log to stderr at ``level``."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


class RichProgress:
    """Progress bars on stderr (rich), one per task; thread-safe."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start(self, task: str, total: int | None) -> None:
        """Begin a bar."""
        self._tasks[task] = self._progress.add_task(task, total=total)

    def advance(self, task: str, steps: int = 1) -> None:
        """Move a bar."""
        if task in self._tasks:
            self._progress.advance(self._tasks[task], steps)

    def finish(self, task: str) -> None:
        """Remove a finished bar."""
        tid = self._tasks.pop(task, None)
        if tid is not None:
            self._progress.remove_task(tid)


def _fail(exc: AacoError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(2)


def _exporter_overrides(
    out: Path | None, metrics_port: int | None, otlp_endpoint: str | None, serve: bool = False
) -> dict[str, Any]:
    ex: dict[str, Any] = {"prometheus": {"enabled": metrics_port is not None or serve}}
    if metrics_port is not None:
        ex["prometheus"]["port"] = metrics_port
    if out is not None:
        ex["lake"] = {"path": str(out)}
    if otlp_endpoint:
        ex["otlp"] = {"endpoint": otlp_endpoint}
    return {"exporters": ex}


def _report_problems(service: AgentService) -> bool:
    """Print input problems; True (exit 2) if a file could not be read completely.

    The events read from a damaged file are kept; bad rows inside a readable file are warnings.
    """
    from aaco.agent.sources.ingest import DAMAGED

    errors = [p for p in service.problems if p.fatal or p.reason in DAMAGED]
    for p in errors:
        err_console.print(f"[bold red]error:[/] {p.subject}: {p.message}", highlight=False, soft_wrap=True)
    warnings = [p for p in service.problems if p not in errors]
    for p in warnings[:20]:
        err_console.print(f"[yellow]warning:[/] {p.subject}: {p.message}", highlight=False, soft_wrap=True)
    if len(warnings) > 20:
        err_console.print(f"[yellow]warning:[/] ... and {len(warnings) - 20} more (see the log)", highlight=False)
    return bool(errors)


@app.command()
def run(
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", "-m", help="ONNX model (default: light_resnet50.onnx from the onnx wheel, no download)."
        ),
    ] = None,
    iterations: Annotated[int, typer.Option("--iterations", "-n", min=1, help="Timed iterations.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed warmup iterations.")] = 3,
    provider: Annotated[
        str,
        typer.Option(
            "--provider",
            help="ONNX Runtime execution provider: auto, cpu, cuda, rocm or migraphx (auto: the best present).",
        ),
    ] = "auto",
    out: Annotated[Path, typer.Option("--out", "-o", help="Lake directory.")] = Path("aaco-data"),
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics on this port while running."),
    ] = None,
    otlp_endpoint: Annotated[str | None, typer.Option("--otlp-endpoint", help="Send traces over OTLP here.")] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "warning",
) -> None:
    """Run an ONNX model under ONNX Runtime with profiling, analyse it, write the lake, print a summary."""
    setup_logging(log_level)
    from aaco.agent.cli_report import summary_table
    from aaco.agent.config import load_config
    from aaco.agent.run.models import load_model, resolve_model
    from aaco.agent.run.session import resolve_provider

    try:
        model_path = resolve_model(model)
        load_model(model_path)
        resolve_provider(provider)
        source = {
            "type": "ort",
            "model": str(model_path),
            "iterations": iterations,
            "warmup": warmup,
            "provider": provider,
            "cycles": 1,
        }
        overrides = {"sources": [source], **_exporter_overrides(out, metrics_port, otlp_endpoint)}
        config = load_config(None, overrides)
    except AacoError as exc:
        raise _fail(exc) from None
    service = _run_service(config, progress=not no_progress, stop_when_done=True)
    out_console.print(summary_table(service))
    out_console.print(f"lake: {out.resolve()}", highlight=False)


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import hook that refuses pandas (used once, see ``keep_pandas_out``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        """Refuse pandas; leave every other import to the other finders."""
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("pandas is kept out of the agent")


def keep_pandas_out() -> None:
    """Stop pyarrow from importing pandas in this process (the agent never uses it).

    pyarrow imports pandas, when it is installed, the first time it converts a Python list; in a
    long-running agent that costs ~40 MiB of RSS for nothing (measured by benchmarks/telemetry_cost.py:
    pandas arrives in a development environment through a test-only dependency). pyarrow tries the
    import once and remembers the answer, so it is asked once here while the import is refused.
    """
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def _run_service(
    config: AgentConfig,
    *,
    progress: bool,
    stop_when_done: bool,
    reload_config: Any = None,
    extra_exporters: list[Any] | None = None,
    report_input: bool = True,
) -> AgentService:
    """Run the service until stopped (or done); with ``report_input``, say what OTLP lost; exit 2 on damaged input."""
    from aaco.agent.cli_report import report_lost
    from aaco.agent.service import AgentService, run_until_stopped

    keep_pandas_out()
    bars = RichProgress(err_console) if progress and err_console.is_terminal else None
    service = AgentService(config, progress=bars, extra_exporters=extra_exporters)
    try:
        if bars is not None:
            with bars:
                run_until_stopped(service, stop_when_sources_done=stop_when_done, reload_config=reload_config)
        else:
            run_until_stopped(service, stop_when_sources_done=stop_when_done, reload_config=reload_config)
    except AacoError as exc:
        service.shutdown()
        raise _fail(exc) from None
    if report_input:
        damaged = _report_problems(service)
        report_lost(service.stats, err_console)
        if damaged:
            raise typer.Exit(2)
    return service


@app.command(
    epilog="Exit status: 0 when every file was read and everything asked for was sent; 2 bad usage or damaged "
    "input (a file that could not be read completely: its events read so far are kept); 3 spans or metrics it was "
    "asked to send over OTLP were dropped (upstream down or refusing, queue or byte budget full, shutdown "
    "deadline), said with how many and why. With both damaged input and lost data, 2 (both are said)."
)
def replay(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Trace files or directories: rocprofv3 CSV/JSON/rocpd, rocprof v1/v2 results, Kineto/PyTorch "
            "profiler JSON, ONNX Runtime profiles (.gz accepted; recognised by content)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Lake directory.")] = Path("aaco-data"),
    otlp_endpoint: Annotated[str | None, typer.Option("--otlp-endpoint", help="Send traces over OTLP here.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve", help="Keep /metrics up after the replay until SIGTERM/SIGINT (port 9464 unless --metrics-port)."
        ),
    ] = False,
    model_name: Annotated[str | None, typer.Option("--model-name", help="Model name for the iterations.")] = None,
    perfetto: Annotated[
        Path | None, typer.Option("--perfetto", help="Also write the events as a trace that ui.perfetto.dev opens.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Read files again even if the lake already holds them.")
    ] = False,
    clock_offset: Annotated[
        int | None,
        typer.Option(
            "--clock-offset",
            help="Epoch ns minus CLOCK_BOOTTIME ns of the recording boot (rocprofv3, rocprof v1 traces): used as "
            "given, instead of this host's offset and the re-anchoring of traces from another boot.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "warning",
) -> None:
    """Push trace files through the pipeline: lake, analysis, metrics and traces as if live."""
    setup_logging(log_level)
    from aaco.agent.cli_report import lost_exports, summary_table
    from aaco.agent.config import load_config
    from aaco.agent.sources.formats import expand, recognise
    from aaco.contract.stats import Stats

    bad = []
    files = expand(paths)
    if not files:
        raise _fail(AacoError("no trace files found", subject=" ".join(map(str, paths))))
    for f in files:
        try:
            recognise(f)
        except AacoError as exc:
            bad.append(exc)
    if bad:
        for exc in bad[:-1]:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise _fail(bad[-1])
    source = {
        "type": "replay",
        "paths": [str(p) for p in paths],
        "model": model_name,
        "force": force,
        "clock_offset_ns": clock_offset,
    }
    try:
        config = load_config(
            None, {"sources": [source], **_exporter_overrides(out, metrics_port, otlp_endpoint, serve)}
        )
    except AacoError as exc:
        raise _fail(exc) from None
    extra = []
    if perfetto is not None:
        from aaco.exporters.perfetto import PerfettoExporter

        extra.append(PerfettoExporter(perfetto, Stats()))
    service = _run_service(config, progress=True, stop_when_done=not serve, extra_exporters=extra)
    if perfetto is not None:
        err_console.print(f"perfetto trace: {perfetto.resolve()} (open it in https://ui.perfetto.dev)", highlight=False)
    if not serve:
        out_console.print(summary_table(service))
    err_console.print(f"replayed {len(files)} file(s) into {out.resolve()}", highlight=False)
    if lost_exports(service.stats):
        raise typer.Exit(3)


@app.command(
    epilog="Exit status: 0 once stopped by SIGTERM/SIGINT, bad input met or not (each bad file is counted in "
    "aaco_source_errors_total, quarantined and logged when met); 2 if the config does not validate."
)
def agent(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML config (default: the embedded one: "
            "the default model under ONNX Runtime, lake ./aaco-data, "
            "metrics on 127.0.0.1:9464).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", min=0, max=65535, help="Override exporters.prometheus.port.")
    ] = None,
    lake: Annotated[Path | None, typer.Option("--lake", help="Override exporters.lake.path.")] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="Override log_level.")] = None,
    web_config_file: Annotated[
        Path | None,
        typer.Option(
            "--web-config-file",
            help="Override exporters.prometheus.web_config_file: a Prometheus web-config file "
            "(TLS, basic auth), as node-exporter's --web.config.file.",
        ),
    ] = None,
) -> None:
    """Run the long-lived agent (DaemonSet mode) until SIGTERM/SIGINT; SIGHUP reloads the config file."""
    from aaco.agent.config import load_config

    overrides: dict[str, Any] = {}
    prometheus: dict[str, Any] = {}
    if metrics_port is not None:
        prometheus.update(port=metrics_port, enabled=True)
    if web_config_file is not None:
        prometheus["web_config_file"] = str(web_config_file)
    if prometheus:
        overrides.setdefault("exporters", {})["prometheus"] = prometheus
    if lake is not None:
        overrides.setdefault("exporters", {})["lake"] = {"path": str(lake)}
    if log_level is not None:
        overrides["log_level"] = log_level
    try:
        cfg = load_config(config, overrides)
    except AacoError as exc:
        raise _fail(exc) from None
    setup_logging(cfg.log_level)
    _return_large_buffers()
    reload_config = (lambda: load_config(config, overrides)) if config is not None else None
    _run_service(cfg, progress=False, stop_when_done=False, reload_config=reload_config, report_input=False)


def _return_large_buffers(threshold: int = 1024 * 1024) -> None:
    """Have glibc mmap every allocation of ``threshold`` bytes or more, so it goes back to the OS when freed.

    glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), after which OTLP request
    bodies of a few MB are carved from per-thread arenas that keep their pages: 4 clients flooding the
    receiver with 3.7 MB requests grew the agent by about 420 MiB with it and 285 MiB with a fixed 1 MiB
    threshold (the byte budget itself being 256 MiB). No-op without glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD (malloc.h); fixing it also stops the dynamic raise
    except (OSError, AttributeError):
        return


@config_app.command("check")
def config_check(
    file: Annotated[Path, typer.Argument(help="The YAML configuration to validate.")],
) -> None:
    """Validate a configuration (with AACO_* environment overrides) and list every error with its path."""
    from aaco.agent.config import load_config

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        err_console.print(str(exc), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    kinds = ", ".join(s.type for s in cfg.sources) or "none"
    out_console.print(f"{file}: ok (node {cfg.node}; sources: {kinds})", highlight=False)


@config_app.command("example")
def config_example() -> None:
    """Print an annotated configuration with every key, its default and what it does."""
    from aaco.agent.config_doc import example_config

    typer.echo(example_config(), nl=False)


@app.command()
def graph(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Summarise an ONNX graph: all nodes and the nodes that run (KAR's denominator, docs/kar.md), ops, opsets."""
    from aaco.agent.run.models import load_model
    from aaco.agent.sources.onnx_graph import summarize

    try:
        summary = summarize(load_model(model))
    except AacoError as exc:
        raise _fail(exc) from None
    doc = summary.to_dict()
    if as_json:
        out_console.print_json(json.dumps(doc))
        return
    out_console.print(
        f"{model}: {doc['nodes']} nodes ({doc['top_level_nodes']} top level, {doc['subgraphs']} subgraphs), "
        f"{doc['running_nodes']} running, {doc['folded_nodes']} folded at load; opset {summary.opset_text()}",
        highlight=False,
        soft_wrap=True,  # one line however long the path: the terminal wraps it, not rich
    )
    table = Table()
    table.add_column("op", overflow="fold")
    for col in ("nodes", "folded", "running"):
        table.add_column(col, justify="right", overflow="fold")
    folded = doc["folded_ops"]
    for op, n in doc["ops"].items():
        table.add_row(op, str(n), str(folded.get(op, 0)), str(n - folded.get(op, 0)))
    table.add_row("total", str(doc["nodes"]), str(doc["folded_nodes"]), str(doc["running_nodes"]), style="bold")
    out_console.print(table)


@app.command()
def metrics(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table of docs/metrics.md.")] = False,
) -> None:
    """List every metric the agent exports: Prometheus and OpenTelemetry names, type, unit, labels."""
    from aaco.agent.metrics_doc import all_metrics, markdown_table, prom_exposed_name

    if markdown:
        typer.echo(markdown_table())
        return
    table = Table()
    for col in ("prometheus", "type", "unit", "labels", "description"):
        table.add_column(col, overflow="fold")
    for m in all_metrics():
        table.add_row(prom_exposed_name(m), m.kind, m.unit, ",".join(m.labels), m.description)
    out_console.print(table)


@app.command()
def version() -> None:
    """Print the versions of AACO and of the runtimes it uses."""
    import onnxruntime
    import pyarrow

    out_console.print(
        f"aaco {__version__} (python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, "
        f"pyarrow {pyarrow.__version__})",
        highlight=False,
    )


def main() -> None:
    """Console-script entry point."""
    app(prog_name="aaco")


# Commands that live in their own modules register themselves on `app` when imported (one line each).
COMMAND_MODULES: tuple[str, ...] = ("cli_capture", "cli_sched", "cli_telemetry", "cli_verdict")
for _module in COMMAND_MODULES:
    importlib.import_module(f"aaco.agent.{_module}")
