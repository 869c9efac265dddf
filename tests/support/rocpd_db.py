"""A rocpd database written from the published schema, for the tests of its readers.

The DDL follows rocprofiler-sdk ``source/share/rocprofiler-sdk-rocpd/rocpd_tables.sql`` (the tables,
suffixed with the run's uuid; the columns the readers and their joins use, with the published names and
types) and ``rocpd_views.sql`` (an un-suffixed view over each table). Two generations: ``direct``
(ROCm 7.0: start/end and pid/tid/agent ids on the rows) and ``tracked`` (rows point to ``rocpd_track``
and ``rocpd_timestamp``). Counters: ``rocpd_info_pmc`` and ``rocpd_pmc_event`` as in the same file.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

UUID = "_0123abcd"
GUID = "00000000-0000-0000-0000-000000000001"

COMMON = """
CREATE TABLE rocpd_metadata{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT NOT NULL, value TEXT NOT NULL);
CREATE TABLE rocpd_string{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, string TEXT NOT NULL UNIQUE);
CREATE TABLE rocpd_info_node{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, hash BIGINT NOT NULL,
    machine_id TEXT NOT NULL, system_name TEXT, hostname TEXT, release TEXT, version TEXT, hardware_name TEXT,
    domain_name TEXT);
CREATE TABLE rocpd_info_process{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    ppid INTEGER, pid INTEGER NOT NULL, init BIGINT, fini BIGINT, start BIGINT, "end" BIGINT, command TEXT,
    environment JSONB DEFAULT '{{}}' NOT NULL, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_thread{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    ppid INTEGER, pid INTEGER NOT NULL, tid INTEGER NOT NULL, name TEXT, start BIGINT, "end" BIGINT,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_agent{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, type TEXT CHECK (type IN ('CPU', 'GPU')), absolute_index INTEGER, logical_index INTEGER,
    type_index INTEGER, uuid INTEGER, name TEXT, model_name TEXT, vendor_name TEXT, product_name TEXT,
    user_name TEXT, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_queue{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, name TEXT, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_stream{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, name TEXT, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_kernel_symbol{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, code_object_id INTEGER NOT NULL, kernel_name TEXT,
    display_name TEXT, kernel_object INTEGER, kernarg_segment_size INTEGER, kernarg_segment_alignment INTEGER,
    group_segment_size INTEGER, private_segment_size INTEGER, sgpr_count INTEGER, arch_vgpr_count INTEGER,
    accum_vgpr_count INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_event{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, category_id INTEGER,
    stack_id INTEGER, parent_stack_id INTEGER, correlation_id INTEGER, call_stack JSONB DEFAULT '{{}}' NOT NULL,
    line_info JSONB DEFAULT '{{}}' NOT NULL, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_info_pmc{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, agent_id INTEGER, target_arch TEXT, event_code INTEGER, instance_id INTEGER,
    name TEXT NOT NULL, symbol TEXT NOT NULL, description TEXT, long_description TEXT DEFAULT '', component TEXT,
    units TEXT DEFAULT '', value_type TEXT, block TEXT, expression TEXT, is_constant INTEGER, is_derived INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_pmc_event{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, event_id INTEGER,
    pmc_id INTEGER NOT NULL, value REAL DEFAULT 0.0, extdata JSONB DEFAULT '{{}}');
"""
DIRECT = """
CREATE TABLE rocpd_track{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER, tid INTEGER, name_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_region{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL,
    name_id INTEGER NOT NULL, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_kernel_dispatch{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER, agent_id INTEGER NOT NULL, kernel_id INTEGER NOT NULL,
    dispatch_id INTEGER NOT NULL, queue_id INTEGER NOT NULL, stream_id INTEGER NOT NULL, start BIGINT NOT NULL,
    "end" BIGINT NOT NULL, private_segment_size INTEGER, group_segment_size INTEGER,
    workgroup_size_x INTEGER NOT NULL, workgroup_size_y INTEGER NOT NULL, workgroup_size_z INTEGER NOT NULL,
    grid_size_x INTEGER NOT NULL, grid_size_y INTEGER NOT NULL, grid_size_z INTEGER NOT NULL,
    region_name_id INTEGER, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_memory_copy{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER, start BIGINT NOT NULL, "end" BIGINT NOT NULL, name_id INTEGER NOT NULL,
    dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, src_address INTEGER, size INTEGER NOT NULL,
    queue_id INTEGER, stream_id INTEGER, region_name_id INTEGER, event_id INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
"""
TRACKED = """
CREATE TABLE rocpd_track{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, nid INTEGER NOT NULL,
    ppid INTEGER, pid INTEGER, tid INTEGER, agent_id INTEGER, queue_id INTEGER, stream_id INTEGER, name_id INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_timestamp{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, value BIGINT NOT NULL,
    phase INTEGER, track_id INTEGER);
CREATE TABLE rocpd_region{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL, track_id INTEGER NOT NULL,
    name_id INTEGER NOT NULL, start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, event_id INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_kernel_dispatch{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    track_id INTEGER NOT NULL, kernel_id INTEGER NOT NULL, dispatch_id INTEGER NOT NULL, start_id INTEGER NOT NULL,
    end_id INTEGER NOT NULL, private_segment_size INTEGER, group_segment_size INTEGER,
    workgroup_size_x INTEGER NOT NULL, workgroup_size_y INTEGER NOT NULL, workgroup_size_z INTEGER NOT NULL,
    grid_size_x INTEGER NOT NULL, grid_size_y INTEGER NOT NULL, grid_size_z INTEGER NOT NULL,
    region_name_id INTEGER, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE rocpd_memory_copy{u} (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    track_id INTEGER NOT NULL, start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, name_id INTEGER NOT NULL,
    dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, src_address INTEGER, size INTEGER NOT NULL,
    region_name_id INTEGER, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
"""
TABLES = [
    "metadata",
    "string",
    "info_node",
    "info_process",
    "info_thread",
    "info_agent",
    "info_queue",
    "info_stream",
    "info_kernel_symbol",
    "event",
    "track",
    "region",
    "kernel_dispatch",
    "memory_copy",
    "info_pmc",
    "pmc_event",
]


class Db:
    """Writes a rocpd database of one process: agents, symbols, HIP launches, rocTX ranges, dispatches."""

    def __init__(self, path: Path, tracked: bool) -> None:
        self.con = sqlite3.connect(path)
        self.tracked = tracked
        self.con.executescript(COMMON.format(u=UUID) + (TRACKED if tracked else DIRECT).format(u=UUID))
        tables = TABLES + (["timestamp"] if tracked else [])
        for t in tables:
            self.con.execute(f"CREATE VIEW rocpd_{t} AS SELECT * FROM rocpd_{t}{UUID}")
        self.con.execute(f"INSERT INTO rocpd_metadata{UUID} (tag, value) VALUES ('schema_version', '3')")
        self.con.execute(
            f"INSERT INTO rocpd_info_node{UUID} (guid, hash, machine_id, hostname) VALUES (?, 1, 'm', 'host')", (GUID,)
        )
        self.con.execute(f"INSERT INTO rocpd_info_process{UUID} (guid, nid, pid) VALUES (?, 1, 4242)", (GUID,))
        for tid in (4242, 4243):
            self.con.execute(
                f"INSERT INTO rocpd_info_thread{UUID} (guid, nid, pid, tid) VALUES (?, 1, 1, ?)", (GUID, tid)
            )
        agents = [("CPU", 0, 0, "AMD EPYC"), ("GPU", 1, 0, "gfx942"), ("GPU", 2, 1, "gfx942")]
        for kind, absolute, type_index, name in agents:
            self.con.execute(
                f"INSERT INTO rocpd_info_agent{UUID} (guid, nid, pid, type, absolute_index, logical_index, "
                "type_index, name, product_name) VALUES (?, 1, 1, ?, ?, ?, ?, ?, ?)",
                (GUID, kind, absolute, absolute, type_index, name, "AMD Instinct MI300X" if kind == "GPU" else name),
            )
        self.con.execute(f"INSERT INTO rocpd_info_queue{UUID} (guid, nid, pid, name) VALUES (?, 1, 1, 'q0')", (GUID,))
        self.con.execute(f"INSERT INTO rocpd_info_stream{UUID} (guid, nid, pid, name) VALUES (?, 1, 1, 's0')", (GUID,))
        for k in range(1, 6):
            self.con.execute(
                f"INSERT INTO rocpd_info_kernel_symbol{UUID} (guid, nid, pid, code_object_id, kernel_name, "
                "display_name) VALUES (?, 1, 1, 1, ?, ?)",
                (GUID, f"_Z4gemm{k}v", f"gemm{k}()"),
            )
        self.strings: dict[str, int] = {}

    def string(self, s: str) -> int:
        if s not in self.strings:
            cur = self.con.execute(f"INSERT INTO rocpd_string{UUID} (guid, string) VALUES (?, ?)", (GUID, s))
            self.strings[s] = cur.lastrowid
        return self.strings[s]

    def event(self, category: str, corr: int, extdata: dict | None = None) -> int:
        cur = self.con.execute(
            f"INSERT INTO rocpd_event{UUID} (guid, category_id, correlation_id, extdata) VALUES (?, ?, ?, ?)",
            (GUID, self.string(category), corr, json.dumps(extdata or {})),
        )
        return cur.lastrowid

    def stamps(self, start: int, end: int) -> tuple[int, int]:
        s = self.con.execute(f"INSERT INTO rocpd_timestamp{UUID} (guid, value, phase) VALUES (?, ?, 1)", (GUID, start))
        e = self.con.execute(f"INSERT INTO rocpd_timestamp{UUID} (guid, value, phase) VALUES (?, ?, 2)", (GUID, end))
        return s.lastrowid, e.lastrowid

    def track(self, tid: int, agent: int | None = None) -> int:
        cur = self.con.execute(
            f"INSERT INTO rocpd_track{UUID} (guid, nid, pid, tid, agent_id, queue_id, stream_id) "
            "VALUES (?, 1, 4242, ?, ?, 1, 1)",
            (GUID, tid, agent),
        )
        return cur.lastrowid

    def region(self, name: str, category: str, corr: int, start: int, end: int, tid_row: int, msg: str = "") -> None:
        ev = self.event(category, corr, {"message": msg} if msg else None)
        if self.tracked:
            s, e = self.stamps(start, end)
            self.con.execute(
                f"INSERT INTO rocpd_region{UUID} (guid, track_id, name_id, start_id, end_id, event_id) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (GUID, self.track(4242 + tid_row - 1), self.string(name), s, e, ev),
            )
        else:
            self.con.execute(
                f'INSERT INTO rocpd_region{UUID} (guid, nid, pid, tid, start, "end", name_id, event_id) '
                "VALUES (?, 1, 1, ?, ?, ?, ?, ?)",
                (GUID, tid_row, start, end, self.string(name), ev),
            )

    def dispatch(self, corr: int, kernel: int, agent: int, start: int, end: int, dispatch: int | None = None) -> int:
        """A kernel dispatch (its id ``corr`` unless given); returns its event's id."""
        ev = self.event("KERNEL_DISPATCH", corr)
        dims = (256, 1, 1, 65536, 1, 1)
        if self.tracked:
            s, e = self.stamps(start, end)
            self.con.execute(
                f"INSERT INTO rocpd_kernel_dispatch{UUID} (guid, track_id, kernel_id, dispatch_id, start_id, end_id, "
                "workgroup_size_x, workgroup_size_y, workgroup_size_z, grid_size_x, grid_size_y, grid_size_z, "
                "event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (GUID, self.track(4243, agent), kernel, dispatch or corr, s, e, *dims, ev),
            )
        else:
            self.con.execute(
                f"INSERT INTO rocpd_kernel_dispatch{UUID} (guid, nid, pid, tid, agent_id, kernel_id, dispatch_id, "
                'queue_id, stream_id, start, "end", workgroup_size_x, workgroup_size_y, workgroup_size_z, '
                "grid_size_x, grid_size_y, grid_size_z, event_id) VALUES (?, 1, 1, 2, ?, ?, ?, 1, 1, ?, ?, ?, ?, ?, "
                "?, ?, ?, ?)",
                (GUID, agent, kernel, dispatch or corr, start, end, *dims, ev),
            )
        return ev

    def copy(self, corr: int, name: str, src: int, dst: int, start: int, end: int, size: int) -> None:
        ev = self.event("MEMORY_COPY", corr)
        if self.tracked:
            s, e = self.stamps(start, end)
            self.con.execute(
                f"INSERT INTO rocpd_memory_copy{UUID} (guid, track_id, start_id, end_id, name_id, dst_agent_id, "
                "src_agent_id, size, event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (GUID, self.track(4243), s, e, self.string(name), dst, src, size, ev),
            )
        else:
            self.con.execute(
                f'INSERT INTO rocpd_memory_copy{UUID} (guid, nid, pid, tid, start, "end", name_id, dst_agent_id, '
                "src_agent_id, size, queue_id, stream_id, event_id) VALUES (?, 1, 1, 2, ?, ?, ?, ?, ?, ?, 1, 1, ?)",
                (GUID, start, end, self.string(name), dst, src, size, ev),
            )

    def symbol(self, name: str) -> int:
        """A kernel symbol named ``name``; returns its id."""
        cur = self.con.execute(
            f"INSERT INTO rocpd_info_kernel_symbol{UUID} (guid, nid, pid, code_object_id, kernel_name, display_name) "
            "VALUES (?, 1, 1, 1, ?, ?)",
            (GUID, name, name),
        )
        return cur.lastrowid

    def pmc(self, name: str, agent: int, instance: int | None = None) -> int:
        """A counter of ``agent`` (one of its instances when ``instance`` is given, as the writer adds them)."""
        symbol = name if instance is None else f"{name}:dimension_instance={instance}"
        cur = self.con.execute(
            f"INSERT INTO rocpd_info_pmc{UUID} (guid, nid, pid, agent_id, target_arch, name, symbol, component, "
            "value_type, is_constant, is_derived) VALUES (?, 1, 1, ?, 'GPU', ?, ?, 'rocm', 'ABS', 0, 0)",
            (GUID, agent, name, symbol),
        )
        return cur.lastrowid

    def pmc_event(self, event: int, pmc: int, value: float) -> None:
        """One counter instance's value for the dispatch of ``event``."""
        self.con.execute(
            f"INSERT INTO rocpd_pmc_event{UUID} (guid, event_id, pmc_id, value) VALUES (?, ?, ?, ?)",
            (GUID, event, pmc, value),
        )
