"""The agent's configuration: one YAML file, typed and validated, every field documented.

Shape: ``node``, ``sources: [{type: ...}]``, ``exporters: {prometheus, otlp, lake}``, ``receivers:
{otlp}``, ``analyzers: {...}``, ``pipeline: {...}``, ``admin: {...}``, ``log_level``. Unknown keys
are errors. Every value can be overridden from the environment as ``AACO_<SECTION>_<KEY>`` (for
example ``AACO_EXPORTERS_PROMETHEUS_PORT=9500`` or ``AACO_NODE=gpu-7``; a value is read as YAML, so
``AACO_SOURCES='[{type: ort}]'`` replaces the source list), and command-line flags override both.
Relative paths are relative to the working directory, as on the command line.

``load_config`` reports *every* problem at once, each with its path (``sources[1].paths``), so a
broken file is fixed in one pass.
"""

from __future__ import annotations

import os
import socket
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    create_model,
)

from aaco.agent.admin import AdminConfig
from aaco.agent.receivers.registry import RECEIVERS
from aaco.agent.sources import SOURCES
from aaco.analyzers.registry import AnalyzersConfig
from aaco.contract.component import Registration
from aaco.contract.config_base import StrictModel
from aaco.contract.errors import ConfigError
from aaco.exporters.registry import EXPORTERS

ENV_PREFIX = "AACO_"

SourceConfig = Annotated[
    Union[tuple(reg.config for reg in SOURCES)],  # noqa: UP007 - built from the registry at import
    Field(discriminator="type"),
]


def sections(name: str, doc: str, registry: Iterable[Registration[Any]]) -> type[StrictModel]:
    """A section of the file with one key per registered component's settings (shared settings once)."""
    fields: dict[str, Any] = {}
    for reg in registry:
        cfg = reg.config
        fields.setdefault(cfg.section, (cfg, Field(default_factory=cfg, description=cfg.summary)))
    return create_model(name, __base__=StrictModel, __doc__=doc, __module__=__name__, **fields)


ExportersConfig = sections("ExportersConfig", "Where results go.", EXPORTERS)
ReceiversConfig = sections("ReceiversConfig", "Inbound protocols.", RECEIVERS)


class PipelineConfig(StrictModel):
    """Bounds and timings of the pipeline."""

    queue_max_batches: PositiveInt = Field(1024, description="Bus capacity in batches.")
    queue_max_events: PositiveInt = Field(1_000_000, description="Bus capacity in events.")
    correlator_hold_s: NonNegativeFloat = Field(2.0, description="How long a kernel waits for its iteration.")
    correlator_max_pending_events: PositiveInt = Field(200_000, description="Kernels held at most.")
    snapshot_interval_s: PositiveFloat = Field(5.0, description="How often analyzer results are published.")
    shutdown_timeout_s: PositiveFloat = Field(10.0, description="Deadline for a clean shutdown.")
    stall_timeout_s: PositiveFloat = Field(60.0, description="/healthz fails when the pipeline is stuck this long.")
    memory_limit_mib: NonNegativeInt = Field(
        0,
        description="The memory guard's hard limit on the agent's resident memory: above it, held OTLP data is "
        "shed (forwarded early or dropped, counted); 0: nine tenths of the container's memory limit (its cgroup's), "
        "or 1024 MiB plus twice exporters.otlp.memory_budget_mib where there is none.",
    )
    memory_spike_mib: NonNegativeInt = Field(
        0,
        description="How far under memory_limit_mib the soft limit is (above it new OTLP data is refused with a "
        "retry delay); 0: a fifth of the limit.",
    )


def default_node() -> str:
    """The node name: $NODE_NAME (set by the chart from the downward API), else the host name."""
    return os.environ.get("NODE_NAME") or os.environ.get("K8S_NODE_NAME") or socket.gethostname()


class AgentConfig(StrictModel):
    """The whole configuration of an agent."""

    node: str = Field(default_factory=default_node, min_length=1, description="Node name on every event.")
    sources: list[SourceConfig] = Field(default_factory=list, description="Inputs, each with a type.")
    exporters: ExportersConfig = Field(default_factory=ExportersConfig, description="Outputs.")  # type: ignore[valid-type]
    receivers: ReceiversConfig = Field(default_factory=ReceiversConfig, description="Inbound protocols.")  # type: ignore[valid-type]
    analyzers: AnalyzersConfig = Field(default_factory=AnalyzersConfig, description="Analyzer settings.")
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig, description="Pipeline bounds.")
    admin: AdminConfig = Field(default_factory=AdminConfig, description="Who may run admin actions (captures).")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")


def embedded_default() -> dict[str, Any]:
    """The configuration ``aaco agent`` runs without a file.

    The default model under ONNX Runtime in cycles, the lake in ./aaco-data, metrics on
    127.0.0.1:9464. No GPU and no server needed.
    """
    return {"sources": [{"type": "ort"}]}


# ---------------------------------------------------------------------------------------------------
# Loading, overrides and error reporting


def _field_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _env_path(model: type[BaseModel], parts: list[str]) -> list[str] | None:
    """Match upper-case env name parts against (nested) field names; longest field name first."""
    if not parts:
        return None
    names = sorted(model.model_fields, key=len, reverse=True)
    for name in names:
        n = len(name.split("_"))
        if [p.lower() for p in parts[:n]] == name.split("_"):
            rest = parts[n:]
            if not rest:
                return [name]
            sub = _field_model(model.model_fields[name].annotation)
            if sub is None:
                continue
            tail = _env_path(sub, rest)
            if tail is not None:
                return [name, *tail]
    return None


def _is_str_field(path: list[str]) -> bool:
    """True when the field at ``path`` holds a string (so an env value is taken verbatim)."""
    model: type[BaseModel] | None = AgentConfig
    field = None
    for key in path:
        if model is None:
            return False
        field = model.model_fields[key]
        model = _field_model(field.annotation)
    if field is None:
        return False
    return field.annotation is str or set(typing.get_args(field.annotation)) == {str, type(None)}


def _set(doc: dict[str, Any], path: list[str], value: Any) -> None:
    cur = doc
    for key in path[:-1]:
        nxt = cur.get(key)
        if not isinstance(nxt, dict):
            nxt = cur[key] = {}
        cur = nxt
    cur[path[-1]] = value


def apply_env(doc: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """Apply ``AACO_<SECTION>_<KEY>`` overrides to ``doc`` in place; return problems.

    Variables whose first part is not a section (``AACO_REQUIRE_REAL``, ...) belong to others and
    are left alone; one that names a section but no key in it is an error.
    """
    problems = []
    sections = {name.split("_")[0].upper() for name in AgentConfig.model_fields}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        parts = var[len(ENV_PREFIX) :].split("_")
        if parts[0] not in sections:
            continue
        path = _env_path(AgentConfig, parts)
        if path is None:
            problems.append(f"{var}: no such configuration key")
            continue
        if _is_str_field(path):
            value: Any = env[var]  # AACO_NODE=7 is the node "7", not the number 7
        else:
            try:
                value = yaml.safe_load(env[var])
            except yaml.YAMLError as exc:
                problems.append(f"{var}: not a valid YAML value ({exc.problem})")
                continue
        _set(doc, path, value)
    return problems


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``over`` into a copy of ``base`` (mappings merge, anything else replaces)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _walk(loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None]:
    """The dotted path of a pydantic error location, and the model that holds its last key.

    A source's type tag (``ort``, ``replay``) appears in the location as a step of the
    discriminated union; it is not a key of the file, so it is left out of the path.
    """
    out = ""
    model: type[BaseModel] | None = AgentConfig
    holder = model
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if part in SOURCES and (model is None or part not in model.model_fields):
            model = SOURCES[part].config
            continue
        holder = model
        out += f".{part}" if out else str(part)
        fields = model.model_fields if model is not None else {}
        model = _field_model(fields[part].annotation) if part in fields else None
    return out or "<top level>", holder


def format_errors(exc: ValidationError) -> list[str]:
    """One line per problem: ``path: what is wrong``."""
    out = []
    for err in exc.errors(include_url=False):
        where, holder = _walk(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            allowed = sorted(holder.model_fields) if holder is not None else []
            out.append(f"{where}: unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
        elif err["type"] == "union_tag_invalid":
            known = ", ".join(SOURCES.kinds())
            out.append(f"{where}.type: unknown source type {err['input'].get('type')!r} (known: {known})")
        elif err["type"] == "union_tag_not_found":
            out.append(f"{where}: missing 'type' (one of: {', '.join(SOURCES.kinds())})")
        else:
            out.append(f"{where}: {err['msg']}")
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a config file into a mapping, or raise ``ConfigError`` naming the line at fault."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(path, ["file not found"]) from exc
    except IsADirectoryError as exc:
        raise ConfigError(path, ["is a directory, expected a YAML file"]) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"cannot read: {exc}"]) from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise ConfigError(path, [f"{where}: {getattr(exc, 'problem', None) or exc}"]) from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(path, [f"<top level>: expected a mapping of sections, got {type(doc).__name__}"])
    return doc


def check_files(config: AgentConfig) -> list[str]:
    """Problems with files the configuration names (missing model or trace paths)."""
    problems = []
    for i, src in enumerate(config.sources):
        if getattr(src, "model", None) is not None and isinstance(src.model, Path) and not src.model.is_file():
            problems.append(f"sources[{i}].model: no such file: {src.model}")
        for j, p in enumerate(getattr(src, "paths", None) or []):
            if not Path(p).exists():
                problems.append(f"sources[{i}].paths[{j}]: no such file or directory: {p}")
    return problems


def load_config(
    path: Path | None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    check_paths: bool = True,
) -> AgentConfig:
    """File (or the embedded default) + environment + overrides, validated; ``ConfigError`` lists all problems."""
    doc = read_yaml(path) if path is not None else embedded_default()
    problems = apply_env(doc, os.environ if env is None else env)
    doc = merge(doc, overrides or {})
    config = None
    try:
        config = AgentConfig.model_validate(doc)
    except ValidationError as exc:
        problems += format_errors(exc)
    if config is not None and check_paths:
        problems += check_files(config)
    if problems or config is None:
        raise ConfigError(path, problems)
    return absolutize(config, Path.cwd())


def absolutize(value: Any, base: Path) -> Any:
    """``value`` with every relative ``Path`` in it (models, lists, dicts) made absolute against ``base``.

    Paths are fixed once, when the configuration loads: the working directory is process-wide and
    may change under the agent's threads (bcc changes it while it compiles an eBPF program), so a
    relative lake or spool path must never be resolved later.
    """
    if isinstance(value, Path):
        return value if value.is_absolute() else base / value
    if isinstance(value, BaseModel):
        updates = {}
        for name in type(value).model_fields:
            old = getattr(value, name)
            new = absolutize(old, base)
            if new is not old:
                updates[name] = new
        return value.model_copy(update=updates) if updates else value
    if isinstance(value, list):
        items = [absolutize(v, base) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        items = {k: absolutize(v, base) for k, v in value.items()}
        return items if any(items[k] is not value[k] for k in value) else value
    return value


def source_names(config: AgentConfig) -> list[str]:
    """A unique name per source: its ``name``, or its type (numbered when repeated)."""
    names: list[str] = []
    for src in config.sources:
        base = src.name or src.type
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names
