"""``aaco run``, ``aaco replay`` and ``aaco agent``: the commands that run the agent's pipeline.

``run`` profiles an ONNX model, ``replay`` pushes trace files through, ``agent`` is the long-lived
daemon. Each builds an agent config (the embedded default plus its options as overrides) and runs
the same ``AgentService`` as the daemon (``aaco.agent.cli.runner``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from aaco.agent.cli.common import (
    AsJson,
    LogLevel,
    fail,
    load_config_or_exit,
    out_console,
    print_error,
    print_note,
    setup_logging,
)
from aaco.agent.cli.runner import return_large_buffers, run_service, use_system_memory_pool
from aaco.contract.errors import AacoError

REPLAY_EPILOG = (
    "Exit status: 0 when every file was read and everything asked for was sent; 2 bad usage, an unwritable lake or "
    "damaged input (a file that could not be read completely: its events read so far are kept); 3 spans or metrics "
    "it was asked to send over OTLP were dropped (upstream down or refusing, queue or byte budget full, shutdown "
    "deadline), or lake parts did not reach the object store of --out s3://..., said with how many and why. With "
    "both damaged input and lost data, 2 (both are said)."
)
RUN_EPILOG = (
    "Exit status: 0 when the model ran and everything asked for was sent; 2 bad usage, a model that cannot be "
    "loaded or an unwritable lake; 3 spans or metrics for --otlp-endpoint were dropped, or lake parts did not reach "
    "the object store of --out s3://..., said with how many and why."
)
AGENT_EPILOG = (
    "Exit status: 0 once stopped by SIGTERM/SIGINT, bad input met or not (each bad file is counted in "
    "aaco_source_errors_total, quarantined and logged when met); 2 if the config does not validate."
)

LakeOut = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        help="The lake: a directory (default exporters.lake.path, ./aaco-data), or an object store URL "
        "(s3://BUCKET/PREFIX, gs://, abfs://) each sealed part is shipped to, exactly once, from the local "
        "copy in exporters.lake.path (AACO_EXPORTERS_LAKE_PATH). S3 settings: AWS_ENDPOINT_URL, AWS_REGION, "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.",
        metavar="DIR|URL",
    ),
]
NodeName = Annotated[
    str | None,
    typer.Option("--node", help="Node name written on every event (default $AACO_NODE, $NODE_NAME, the host name)."),
]
NoProgress = Annotated[
    bool,
    typer.Option("--no-progress", help="No progress on stderr (bars at a terminal, a line every few seconds piped)."),
]
OtlpEndpoint = Annotated[str | None, typer.Option("--otlp-endpoint", help="Send traces over OTLP here.")]


def lake_override(out: str) -> dict[str, Any]:
    """``exporters.lake`` for ``--out``: a URL of an object store is the remote, anything else the directory."""
    from aaco.contract.stores import is_remote

    return {"remote": out} if is_remote(out) else {"path": out}


def exporter_overrides(
    out: str | None,
    metrics_port: int | None,
    otlp_endpoint: str | None,
    serve: bool = False,
    node: str | None = None,
    replay: bool = False,
) -> dict[str, Any]:
    """The sections that the options of ``aaco run`` and ``aaco replay`` override."""
    ex: dict[str, Any] = {"prometheus": {"enabled": metrics_port is not None or serve}, "otlp": {}}
    if metrics_port is not None:
        ex["prometheus"]["port"] = metrics_port
    if out is not None:
        ex["lake"] = lake_override(out)
    if otlp_endpoint:
        ex["otlp"]["endpoint"] = otlp_endpoint
    if replay:  # the span rate budget on the trace's own clock: the same spans however fast the machine reads
        ex["otlp"]["rate_clock"] = "trace"
    return {"exporters": ex, **({"node": node} if node else {})}


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
    out: LakeOut = None,
    node: NodeName = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics on this port while running."),
    ] = None,
    otlp_endpoint: OtlpEndpoint = None,
    no_progress: NoProgress = False,
    as_json: AsJson = False,
    log_level: LogLevel = "warning",
) -> None:
    """Run an ONNX model under ONNX Runtime with profiling, analyse it, write the lake, print a summary."""
    setup_logging(log_level)
    from aaco.agent.cli import report
    from aaco.agent.sources.ort.models import load_model, resolve_model
    from aaco.agent.sources.ort.session import resolve_provider

    try:
        model_path = resolve_model(model)
        load_model(model_path, given_as="--model")
        resolve_provider(provider)
    except AacoError as exc:
        raise fail(exc) from None
    source = {
        "type": "ort",
        "model": str(model_path),
        "iterations": iterations,
        "warmup": warmup,
        "provider": provider,
        "cycles": 1,
    }
    overrides = exporter_overrides(out, metrics_port, otlp_endpoint, node=node)
    config = load_config_or_exit(None, {"sources": [source], **overrides})
    service = run_service(config, progress=not no_progress, stop_when_done=True)
    models = report.summary(service)
    if as_json:
        doc = {"models": models, "lake": report.lake_doc(service), "kernel_spans": report.kernel_spans(service.stats)}
        typer.echo(json.dumps(doc))
    else:
        out_console.print(report.summary_table(models))
        report.report_summarised(service.stats, service.config.exporters.otlp.rate_clock)
        out_console.print(f"lake: {report.lake_where(service)}", highlight=False)
    if report.undelivered(service):
        raise typer.Exit(3)


def replay(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Trace files or directories: rocprofv3 CSV/JSON/rocpd, rocprof v1/v2 results, Kineto/PyTorch "
            "profiler JSON, ONNX Runtime profiles (.gz accepted; recognised by content)."
        ),
    ],
    out: LakeOut = None,
    node: NodeName = None,
    otlp_endpoint: OtlpEndpoint = None,
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
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="The distributed job the traces are ranks of (default: named from their distributedInfo and "
            "profiled steps, docs/jobs.md); also their model unless --model-name.",
        ),
    ] = None,
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
    no_progress: NoProgress = False,
    as_json: AsJson = False,
    log_level: LogLevel = "warning",
) -> None:
    """Push trace files through the pipeline: lake, analysis, metrics and traces as if live."""
    setup_logging(log_level)
    from aaco.agent.cli import report
    from aaco.agent.sources.traces.detect import recognise
    from aaco.agent.sources.traces.files import expand_paths

    expanded = expand_paths(paths)
    files = expanded.files
    if not files:
        for known in expanded.not_read[:-1]:
            print_error(f"{known.path}: {known.message}")
        last = expanded.not_read[-1] if expanded.not_read else None
        if last is not None:
            raise fail(AacoError(f"{last.message}; no trace file AACO reads was given", subject=last.path))
        raise fail(AacoError("no trace files found", subject=" ".join(map(str, paths))))
    bad = []
    for f in files:
        try:
            recognise(f)
        except AacoError as exc:
            bad.append(exc)
    if bad:
        for exc in bad[:-1]:
            print_error(exc)
        raise fail(bad[-1])
    source = {
        "type": "replay",
        "paths": [str(p) for p in paths],
        "model": model_name,
        "job": job,
        "force": force,
        "clock_offset_ns": clock_offset,
    }
    config = load_config_or_exit(
        None, {"sources": [source], **exporter_overrides(out, metrics_port, otlp_endpoint, serve, node, replay=True)}
    )
    extra = []
    if perfetto is not None:
        from aaco.contract.stats import Stats
        from aaco.exporters.perfetto import PerfettoExporter

        extra.append(PerfettoExporter(perfetto, Stats()))
    service = run_service(config, progress=not no_progress, stop_when_done=not serve, extra_exporters=extra)
    if perfetto is not None:
        print_note(f"perfetto trace: {perfetto.resolve()} (open it in https://ui.perfetto.dev)")
    read, rows, already = report.files_read(service, "replay")
    models = report.summary(service)
    if as_json:
        doc = {
            "files": {"given": len(files), "read": read, "already_in_lake": already},
            "rows": rows,
            "models": models,
            "lake": report.lake_doc(service),
            "kernel_spans": report.kernel_spans(service.stats),
        }
        typer.echo(json.dumps(doc))
    else:
        if not serve and models:
            out_console.print(report.summary_table(models))
        elif not serve and read:
            print_note("nothing to summarise: no kernels, launches or iterations in what was read")
        if already:
            new_rows = "" if read else ", 0 new rows"
            print_note(f"already in the lake: {already} file(s){new_rows}; --force to read again")
        report.report_summarised(service.stats, service.config.exporters.otlp.rate_clock)
        print_note(f"replayed {read} file(s), {rows} rows, into {report.lake_where(service)}")
    if report.undelivered(service):
        raise typer.Exit(3)


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
    lake: Annotated[
        str | None,
        typer.Option(
            "--lake",
            help="Override exporters.lake.path, or exporters.lake.remote for an object store URL (s3://BUCKET/PREFIX).",
            metavar="DIR|URL",
        ),
    ] = None,
    node: NodeName = None,
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
    use_system_memory_pool()  # before pyarrow is imported (by the config)
    from aaco.agent.config import AgentConfig, load_config

    overrides: dict[str, Any] = {}
    prometheus: dict[str, Any] = {}
    if metrics_port is not None:
        prometheus.update(port=metrics_port, enabled=True)
    if web_config_file is not None:
        prometheus["web_config_file"] = str(web_config_file)
    if prometheus:
        overrides.setdefault("exporters", {})["prometheus"] = prometheus
    if lake is not None:
        overrides.setdefault("exporters", {})["lake"] = lake_override(lake)
    if node is not None:
        overrides["node"] = node
    if log_level is not None:
        overrides["log_level"] = log_level
    cfg = load_config_or_exit(config, overrides)
    setup_logging(cfg.log_level)
    return_large_buffers()

    def reload() -> AgentConfig:
        return load_config(config, overrides)  # a reload that fails is logged by the service, which keeps running

    run_service(
        cfg,
        progress=False,
        stop_when_done=False,
        reload_config=reload if config is not None else None,
        report_input=False,
    )
