"""rocprofv3's counter collection in its JSON output (``--pmc ... --output-format json``).

Layout (rocprofiler-sdk ``source/docs/rocprofv3-schema.json``; the writer
``source/lib/rocprofiler-sdk-tool/generateJSON.cpp`` and ``helper.hpp``): ``{"rocprofiler-sdk-tool":
[process, ...]}``, each process with ``metadata.pid``, ``agents`` (``id.handle``, ``type`` 2 = GPU,
``node_id``, ``name`` = the architecture), ``counters`` (``id.handle`` -> ``name``), ``kernel_symbols``
(``kernel_id`` -> names), ``callback_records.counter_collection``: per dispatch ``dispatch_data``
(``correlation_id.internal``, ``dispatch_info.{dispatch_id, agent_id.handle, kernel_id}``) and
``records``, one ``{"counter_id": {"handle"}, "value"}`` per counter *instance* (dimension). As the
tool's own CSV writer does (``generateCSV.cpp``, ``counter_name_value``), a dispatch's instances of one
counter are summed into one row, and the device is the agent's ``node_id`` (the CSV's ``Agent_Id``).
Times come from the ``buffer_records.kernel_dispatch`` record of the same dispatch id when the run also
traced kernels, else 0 (the file's time).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from aaco.agent.sources.counters.files import WorkloadError, load_json
from aaco.contract.counters import Dispatch

ROOT: Final = "rocprofiler-sdk-tool"
GPU: Final = 2
NAME_KEYS: Final = ("formatted_kernel_name", "demangled_kernel_name", "kernel_name")


def read_rocprofv3_counters(
    path: Path, problems: list[str] | None = None, meta: dict[str, str] | None = None
) -> Iterator[Dispatch]:
    """Every dispatch of every process's counter collection, its instances summed per counter.

    ``meta`` receives ``arch``, the first GPU agent's name (``gfx90a``), before the first dispatch.
    """
    said = problems if problems is not None else []
    root = load_json(path, said)
    if root is None:
        return
    procs = root.get(ROOT) if isinstance(root, dict) else None
    if isinstance(procs, dict):
        procs = [procs]
    if not isinstance(procs, list):
        raise WorkloadError(f"not a rocprofv3 JSON output: no {ROOT!r} list", subject=path)
    for proc in (p for p in procs if isinstance(p, dict)):
        if meta is not None and "arch" not in meta and (arch := _arch(proc)):
            meta["arch"] = arch
        yield from _process(proc, path, said)


def _process(proc: dict[str, Any], path: Path, said: list[str]) -> Iterator[Dispatch]:
    pid = _int(_get(proc, "metadata", "pid"))
    names = {_int(_get(c, "id", "handle")): c.get("name") for c in _list(proc.get("counters"))}
    nodes = {_int(_get(a, "id", "handle")): _int(a.get("node_id")) for a in _list(proc.get("agents"))}
    kernels = {_int(k.get("kernel_id")): _kernel_name(k) for k in _list(proc.get("kernel_symbols"))}
    times = {
        _int(_get(d, "dispatch_info", "dispatch_id")): (_int(d.get("start_timestamp")), _int(d.get("end_timestamp")))
        for d in _list(_get(proc, "buffer_records", "kernel_dispatch"))
    }
    records = _list(_get(proc, "callback_records", "counter_collection"))
    for i, rec in enumerate(records):
        info = _get(rec, "dispatch_data", "dispatch_info")
        dispatch = _int(_get(info, "dispatch_id"))
        if dispatch is None:
            said.append(f"{path}: counter_collection[{i}]: no dispatch_info.dispatch_id: skipped")
            continue
        counters: dict[str, float] = {}
        for r in _list(rec.get("records")):
            name, value = names.get(_int(_get(r, "counter_id", "handle"))), r.get("value")
            if not isinstance(name, str) or not isinstance(value, int | float) or isinstance(value, bool):
                said.append(f"{path}: dispatch {dispatch}: a record without a known counter or a number: skipped")
                continue
            counters[name] = counters.get(name, 0.0) + float(value)
        start, end = times.get(dispatch, (None, None))
        node = nodes.get(_int(_get(info, "agent_id", "handle")))
        yield Dispatch(
            dispatch,
            kernels.get(_int(_get(info, "kernel_id"))) or f"kernel_id {_get(info, 'kernel_id')}",
            "" if node is None else str(node),
            start or 0,
            end or 0,
            _int(_get(rec, "dispatch_data", "correlation_id", "internal")),
            pid,
            counters,
        )


def _arch(proc: dict[str, Any]) -> str | None:
    for agent in _list(proc.get("agents")):
        if agent.get("type") == GPU and isinstance(agent.get("name"), str) and agent["name"]:
            return str(agent["name"])
    return None


def _kernel_name(symbol: dict[str, Any]) -> str | None:
    return next((symbol[k] for k in NAME_KEYS if isinstance(symbol.get(k), str) and symbol[k]), None)


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _list(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
