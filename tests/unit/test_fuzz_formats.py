"""Fuzz: seeded mutations of every trace format through ``identify`` + ``parse_any`` (issue 13, point 8).

The contract, for any input: ``TraceFormatError`` naming the file, or chunks that conform to the
schemas with times inside 1990..2100 and ``end >= start`` (``mutate.contract_rows``); any other
exception is a bug. Beyond that, the rows before the damage are kept: the complete lines before
a CSV's cut and every line no flipped byte touched, the events before a JSON document's cut
(compared with a parse of the undamaged document's prefix), all but the damaged row when one
value is replaced, every row when only a companion file (HIP API, agent info) is damaged.

Seeds are the real captures in ``examples/data`` plus generated files for the formats without
one (rocprofv3 JSON, memory-copy / HIP API / marker / agent-info CSVs, the 18-column kernel CSV,
rocprof v1 results.csv, rocpd, ONNX Runtime profiles), built by the generators of the format
tests. Mutations draw from ``random.Random`` seeded with (seed file, mutation, one of ``SEEDS``);
each test runs every mutation and reports every failing (seed file, mutation, seed, damage) with
its traceback. Special files (a directory named like a trace, a FIFO, a symlink loop) and the
memory-heavy cases (deep nesting, gzip bombs, in a subprocess under an address-space limit) are
in ``tests/integration/test_fuzz_replay.py``.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from aaco.agent.sources.traces.detect import FORMATS
from tests.support import mutate as mu

from .test_ort_profile import cpu_profile, gpu_profile
from .test_rocpd import UUID
from .test_rocpd import build as build_rocpd
from .test_rocprof_csv import AGENT_INFO, LAYOUT_18, MARKERS, MEMORY_COPY, hip_trace, sample_rows
from .test_rocprof_json import build as build_rocprofv3_json
from .test_rocprof_v1 import V1_CSV

SEEDS = (11, 23, 37)
Outcome = mu.Rows | mu.Refused
# Columns no parser needs: a damaged value there never loses its row.
SPARE_CSV = frozenset(
    {
        *("LDS_Block_Size", "Scratch_Size", "VGPR_Count", "Accum_VGPR_Count", "SGPR_Count"),  # rocprofv3
        *("Private_Segment_Size", "Group_Segment_Size"),  # rocprofv3, older layouts
        *("queue-index", "lds", "scr", "arch_vgpr", "accum_vgpr", "sgpr", "wave_size", "sig", "obj"),  # rocprof v1
        *("DispatchNs", "CompleteNs"),
    }
)
# Columns that say what a row is: another value there makes another kind of row (an API call that is no rocTX
# range, a record that is no dispatch), which is left out without being a bad row.
RECLASSIFY = frozenset({"Kind", "Domain", "Function", "Direction"})
# rocprofv3 ids that are unsigned 64-bit: 2**63 .. 2**64-1 is a valid value and keeps its row.
UINT64_CSV = frozenset({"Correlation_Id", "Dispatch_Id", "Kernel_Id"})
UINT64_JSON = frozenset({"handle", "internal", "external", "dispatch_id", "thread_id"})
# A damaged ONNX Runtime session event loses the run it frames, with its nodes: not one row.
ORT_FRAMES = frozenset({"Session"})
# A GPU-provider node is a row of its own only until the kernels it launched are read.
ORT_GPU_NODES = frozenset({"Conv"})
# (table, column) of a rocpd database that value mutations write over.
ROCPD_COLUMNS = tuple(
    (f"rocpd_{table}{UUID}", column)
    for table, columns in (
        ("kernel_dispatch", "agent_id kernel_id dispatch_id queue_id stream_id start end tid pid grid_size_x event_id"),
        ("memory_copy", "start end size src_agent_id dst_agent_id name_id"),
        ("region", "start end tid event_id"),
        ("event", "correlation_id"),
        ("info_agent", "type_index"),
    )
    for column in columns.split()
)


@dataclass
class Seed:
    """A run directory of undamaged files, the file mutations damage, and what its rows must do."""

    name: str
    format: str
    files: dict[str, bytes]
    target: str
    kind: str  # csv | json | sqlite
    check: str = ""  # the file whose rows are compared: the target, or the kernel trace a companion completes
    depth: int = 0  # JSON: how many containers deep its events are
    lists: tuple[tuple[Any, ...], ...] = ()  # JSON: paths of the event lists value mutations pick from
    uint64: frozenset[str] = frozenset()
    frames: frozenset[str] = frozenset()  # JSON: categories of events that frame others (ORT runs)
    volatile: frozenset[str] = frozenset()  # JSON: names of rows that later events may replace
    others: list[bytes] = field(default_factory=list)  # other formats' content (for a file replaced after identify)

    def __post_init__(self) -> None:
        self.check = self.check or self.target

    @property
    def content(self) -> bytes:
        return self.files[self.target]

    @cached_property
    def document(self) -> Any:
        return json.loads(self.content)

    @cached_property
    def leaves(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Numeric leaves inside events, and all others (metadata, events framing others, top-level values)."""
        inside: list[tuple[Any, ...]] = []
        for path in self.lists:
            node = self.document
            for key in path:
                node = node[key]
            for i, ev in enumerate(node):
                if isinstance(ev, dict) and ev.get("ph") != "M" and ev.get("cat") not in self.frames:
                    inside += mu.numeric_leaves(ev, (*path, i))
        taken = set(inside)
        return inside, [p for p in mu.numeric_leaves(self.document) if p not in taken]

    def write(self, d: Path, replace: tuple[str, bytes] | None = None, sql: tuple[Any, ...] | None = None) -> Path:
        """The run in ``d`` with the target written as ``replace`` (name, bytes); ``sql`` damages one database value."""
        d.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            if name != self.target or replace is None:
                (d / name).write_bytes(data)
        if replace is not None:
            (d / replace[0]).write_bytes(replace[1])
        if sql is not None:
            table, column, value, rng = sql
            con = sqlite3.connect(d / self.target)
            n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            required = {r[1] for r in con.execute(f"PRAGMA table_info({table})") if r[3]}
            if column in required and (value is None or value != value):  # NULL (NaN binds as NULL)
                value = ""  # real files keep NOT NULL
            con.execute(
                f'UPDATE {table} SET "{column}" = ? WHERE id = (SELECT id FROM {table} ORDER BY id LIMIT 1 OFFSET ?)',
                (value, rng.randrange(n)),
            )
            con.commit()
            con.close()
        return d / (replace[0] if replace is not None else self.target)


def v1_csv(n: int) -> bytes:
    """A results.csv of ``n`` dispatches from the two rows of the format test, times and durations varied."""
    header, *rows = V1_CSV.encode().splitlines()
    names = [f.decode() for f in mu.csv_fields(header)]
    out = [header]
    for i in range(n):
        f = mu.csv_fields(rows[i % 2])
        f[0] = str(i).encode()
        for col, extra in (("DispatchNs", 0), ("BeginNs", 0), ("EndNs", 10 * i), ("CompleteNs", 10 * i)):
            j = names.index(col)
            f[j] = str(int(f[j]) + i * 1_000_000 + extra).encode()
        out.append(b",".join(f))
    return mu.csv_join(out)


def build_seeds(samples: Path, tmp: Path) -> dict[str, Seed]:
    """Every format, from the real captures where there is one."""
    real_csv = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    run = {
        "1234_kernel_trace.csv": real_csv,
        "1234_memory_copy_trace.csv": MEMORY_COPY.encode(),
        "1234_hip_api_trace.csv": hip_trace(sample_rows(samples / "rocprofv3/kernel_trace.csv")).encode(),
        "1234_marker_api_trace.csv": MARKERS.encode(),
        "1234_agent_info.csv": AGENT_INFO.encode(),
    }
    kernel, memcpy, api, agents = (f"rocprofv3_{k}" for k in ("kernel_csv", "memcpy_csv", "api_csv", "agent_info_csv"))
    build_rocpd(tmp / "run.db", 30)
    v3_json = json.dumps(build_rocprofv3_json(40, copies=4)[0], indent=1).encode()
    records = ("rocprofiler-sdk-tool", 0, "buffer_records")
    seeds = [
        Seed("rocprofv3_kernel_csv", kernel, {"5678_kernel_trace.csv": real_csv}, "5678_kernel_trace.csv", "csv"),
        Seed("rocprofv3_run_kernel", kernel, run, "1234_kernel_trace.csv", "csv", uint64=UINT64_CSV),
        Seed("rocprofv3_run_memcpy", memcpy, run, "1234_memory_copy_trace.csv", "csv", uint64=UINT64_CSV),
        Seed("rocprofv3_run_hip_api", api, run, "1234_hip_api_trace.csv", "csv", check="1234_kernel_trace.csv"),
        Seed("rocprofv3_run_marker", api, run, "1234_marker_api_trace.csv", "csv"),
        Seed("rocprofv3_run_agent_info", agents, run, "1234_agent_info.csv", "csv", check="1234_kernel_trace.csv"),
        Seed(
            "rocprofv3_kernel_csv_18",
            kernel,
            {"77_kernel_trace.csv": LAYOUT_18.encode(), "77_agent_info.csv": AGENT_INFO.encode()},
            "77_kernel_trace.csv",
            "csv",
            uint64=UINT64_CSV,
        ),
        Seed("rocprof_v1_csv", "rocprof_v1_csv", {"results.csv": v1_csv(12)}, "results.csv", "csv"),
        Seed(
            "rocprof_v1_json",
            "rocprof_v1_json",
            {"results.json": (samples / "rocprof-v1/hip_trace_results.json").read_bytes()},
            "results.json",
            "json",
            depth=2,
            lists=(("traceEvents",),),
        ),
        Seed(
            "rocprofv3_json",
            "rocprofv3_json",
            {"4242_results.json": v3_json},
            "4242_results.json",
            "json",
            depth=5,
            lists=tuple((*records, k) for k in ("kernel_dispatch", "memory_copy", "hip_api")),
            uint64=UINT64_JSON,
        ),
        Seed("rocpd", "rocpd", {"run.db": (tmp / "run.db").read_bytes()}, "run.db", "sqlite"),
    ]
    for name, events in (("ort_cpu", cpu_profile()), ("ort_gpu", gpu_profile())):
        target, data = f"onnxruntime_profile_{name}.json", json.dumps(events).encode()
        ort = {"depth": 1, "lists": ((),), "frames": ORT_FRAMES, "volatile": ORT_GPU_NODES}
        seeds.append(Seed(name, "ort_profile", {target: data}, target, "json", **ort))
    for name, rel in (
        ("kineto_a100", "kineto/a100_alexnet_trace.json.gz"),
        ("kineto_mi250", "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        ("kineto_hta_event_sync", "kineto-hta/critical_path_cuda_event_sync_event_sync_trace.json.gz"),
        ("kineto_hta_multi_stream", "kineto-hta/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz"),
        ("kineto_hta_triton", "kineto-hta/triton_example_triton_example.json.gz"),
        ("kineto_hta_cpu_only", "kineto-hta/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    ):
        target = Path(rel).name.removesuffix(".gz")
        data = gzip.decompress((samples / rel).read_bytes())
        seeds.append(Seed(name, "kineto", {target: data}, target, "json", depth=2, lists=(("traceEvents",),)))
    for s in seeds:
        s.others = [o.content for o in seeds if o.format != s.format]
    return {s.name: s for s in seeds}


@pytest.fixture(scope="module")
def seeds(samples, tmp_path_factory) -> dict[str, Seed]:
    return build_seeds(samples, tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def baselines(seeds, tmp_path_factory) -> dict[str, Counter]:
    """The rows of each seed's checked file, undamaged."""
    out = {}
    for name, seed in seeds.items():
        d = seed.write(tmp_path_factory.mktemp(name)).parent
        got = mu.parse_rows(d / seed.check)
        assert isinstance(got, Counter), f"{name}: the undamaged seed is refused: {got}"
        out[name] = got
    return out


# --- expectations --------------------------------------------------------------------------------


def expect_rows(got: Outcome, want: Counter, *, slack: int | None) -> None:
    """``got`` holds every row of ``want`` (the rows before the damage) and at most ``slack`` more (None: any)."""
    missing = want - mu.rows(got)
    lost = f"{sum(missing.values())} of {sum(want.values())} row(s) before the damage lost"
    assert not missing, f"{lost}, e.g. {list(missing)[:2]} ({got if isinstance(got, mu.Refused) else 'read'})"
    extra = sum(mu.rows(got).values()) - sum(want.values())
    assert slack is None or extra <= slack, f"{extra} row(s) more than the undamaged prefix holds"


def expect_most(got: Outcome, base: Counter, *, counted: bool = True) -> None:
    """All rows of ``base`` but the damaged one are still there; one left out is counted as skipped (``counted``)."""
    kept = sum((base & mu.rows(got)).values())
    assert kept >= sum(base.values()) - 1, f"kept {kept} of {sum(base.values())} rows (1 may go); {got}"
    if counted and isinstance(got, mu.Rows) and sum(got.values()) < sum(base.values()):
        assert got.skipped, f"a row was left out without being counted in skipped: {list(base - got)[:2]}"


def expect_companion(seed: Seed, got: Outcome, base: Counter) -> bool:
    """A damaged companion changes no row of the trace it completes; False when the target is no companion."""
    if seed.check == seed.target:
        return False
    assert got == base, f"a damaged companion changed the rows of the trace it completes: {got}"
    return True


def damaged(seed: Seed, work: Path, data: bytes, *, gz: bool = False) -> Outcome:
    """Write the run with the target replaced by ``data`` (``<target>.gz`` when ``gz``); the checked file's rows.

    The damaged file itself is parsed too, under the contract, whatever file is compared.
    """
    path = seed.write(work, replace=(seed.target + (".gz" if gz else ""), data))
    own = mu.parse_rows(path)
    return own if seed.check == seed.target else mu.parse_rows(work / seed.check)


def reference(seed: Seed, work: Path, data: bytes | None) -> Counter:
    """Rows of the undamaged prefix ``data``, parsed as the seed's format (nothing for no prefix)."""
    if not data:
        return Counter()
    return mu.rows(mu.parse_rows(seed.write(work, replace=(seed.target, data)), seed.format))


def expect_json_prefix(seed: Seed, work: Path, got: Outcome, data: bytes, at: int, slack: int | None) -> None:
    """``got`` holds the rows of the events of the JSON ``data`` wholly before offset ``at`` (the undamaged prefix).

    Rows named in ``seed.volatile`` are left out on both sides: later events may replace them.
    """
    want = reference(seed, work / "ref", mu.json_prefix_reference(data, at, seed.depth))
    if seed.volatile and isinstance(got, Counter):
        got = Counter({k: v for k, v in got.items() if k[1] not in seed.volatile})
    expect_rows(got, Counter({k: v for k, v in want.items() if k[1] not in seed.volatile}), slack=slack)


def expect_prefix(seed: Seed, work: Path, cut: int, got: Outcome, base: Counter) -> None:
    """After damage at content offset ``cut``: every row wholly before it (and, in a CSV, the damaged line at most)."""
    if expect_companion(seed, got, base):
        return
    if seed.kind == "csv":
        expect_rows(got, reference(seed, work / "ref", mu.csv_complete_prefix(seed.content[:cut])), slack=1)
    elif seed.kind == "json":
        expect_json_prefix(seed, work, got, seed.content, cut, slack=0)


# --- mutations -----------------------------------------------------------------------------------

Check = Callable[[Seed, random.Random, Path, Counter, mu.Cases], None]


def m_truncate(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    data, cut = mu.truncate(seed.content, rng)
    with cases(f"cut at byte {cut}"):
        expect_prefix(seed, work, cut, damaged(seed, work / "cut", data), base)


def m_gzip_cut(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    packed, inflated = mu.gzip_cut(seed.content, rng)
    with cases(f"gzip cut at byte {len(packed)} ({len(inflated)} bytes inflate)"):
        expect_prefix(seed, work, len(inflated), damaged(seed, work / "gz", packed, gz=True), base)


def m_gzip_flip(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    with cases("bytes flipped in the compressed stream"):
        expect_companion(seed, damaged(seed, work / "gzflip", mu.gzip_flip(seed.content, rng), gz=True), base)


def m_flip(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    full = seed.content
    start = full.index(b"\n") + 1 if seed.kind == "csv" else 0
    data, where = mu.flip_bytes(full, rng, start=start)
    with cases(f"bytes flipped at {where}"):
        got = damaged(seed, work / "flip", data)
        if expect_companion(seed, got, base):
            return
        if seed.kind == "csv":  # every line no flip touched (nor the newlines around it) is kept
            untouched, pos = [], start
            for line in full[start:].split(b"\n"):
                if line and not any(pos - 1 <= w <= pos + len(line) for w in where):
                    untouched.append(line)
                pos += len(line) + 1
            want = reference(seed, work / "ref", full[:start] + b"".join(x + b"\n" for x in untouched))
            expect_rows(got, want, slack=len(where))
        elif seed.kind == "json" and isinstance(got, Counter):  # recognised still: the events before the first flip
            expect_json_prefix(seed, work, got, full, where[0], slack=None)


def m_empty(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    for label, data in (("empty", b""), ("empty_gzip", gzip.compress(b"", mtime=0))):
        with cases(label):
            got = damaged(seed, work / label, data)
            if not expect_companion(seed, got, base):
                assert isinstance(got, mu.Refused), f"taken for a trace: {got}"


def m_replaced(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    """Recognised, then replaced by another format's content before it is read (a rotating spool)."""
    other = rng.choice(seed.others)
    with cases(f"replaced after identify by {other[:30]!r}"):
        mu.parse_rows(seed.write(work / "swap"), then=lambda p: p.write_bytes(other))


def m_csv_columns(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    n = len(mu.csv_fields(seed.content.split(b"\n", 1)[0]))
    a, b = rng.sample(range(n), 2)
    order = list(range(n))
    order[a], order[b] = b, a
    with cases(f"columns {a} and {b} swapped in the header and every row (columns are read by name)"):
        got = damaged(seed, work / "swap", mu.csv_permute_columns(seed.content, order))
        assert got == base, f"rows changed: {got}"
    dup = rng.randrange(n)
    with cases(f"column {dup} duplicated (header and rows)"):
        got = damaged(seed, work / "dup", mu.csv_permute_columns(seed.content, [*range(n), dup]))
        assert isinstance(got, mu.Refused) or got == base, f"rows changed: {got}"


def middle_row(seed: Seed, rng: random.Random) -> int:
    rows = len(mu.csv_lines(seed.content)) - 1
    return rng.randrange(1, rows - 1) if rows >= 3 else rng.randrange(rows)


def m_csv_values(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    header = [f.strip(b'"').decode() for f in mu.csv_fields(seed.content.split(b"\n", 1)[0])]
    todo = [(v, rng.randrange(len(header))) for v in mu.VALUES]
    todo += [(v, rng.choice([i for i, h in enumerate(header) if h in seed.uint64] or [0])) for v in mu.UINT64_VALUES]
    for k, (value, col) in enumerate(todo):
        row = middle_row(seed, rng)
        with cases(f"row {row} column {header[col]} = {value[:24]}"):
            got = damaged(seed, work / f"v{k}", mu.csv_set_field(seed.content, row, col, value.encode()))
            if expect_companion(seed, got, base):
                continue
            if header[col] in SPARE_CSV or (header[col] in seed.uint64 and value in mu.UINT64_VALUES):
                assert got == base, f"a value no parser needs, or a valid unsigned 64-bit id, lost its row: {got}"
            else:
                expect_most(got, base, counted=header[col] not in RECLASSIFY)
    row, (a, b) = middle_row(seed, rng), rng.sample(range(len(header)), 2)
    with cases(f"row {row}: {header[a]} and {header[b]} swapped"):
        got = damaged(seed, work / "swaprow", mu.csv_swap_fields(seed.content, row, a, b))
        if not expect_companion(seed, got, base):
            expect_most(got, base, counted=not {header[a], header[b]} & RECLASSIFY)


def m_json_values(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    inside, outside = seed.leaves
    literals = [mu.json_literal(v) for v in mu.VALUES] + [mu.closed_nesting(5000)]
    for k, literal in enumerate(literals):
        path = rng.choice(inside)
        data, at = mu.json_with(seed.document, path, literal)
        with cases(f"{'/'.join(map(str, path))} = {literal[:24]}"):
            got = damaged(seed, work / f"v{k}", data)
            if path[-1] in seed.uint64 and literal in mu.UINT64_VALUES:
                assert got == base, f"a valid unsigned 64-bit id lost its record: {got}"
            elif mu.well_formed(literal):  # still a JSON document: only the damaged event may go
                expect_most(got, base)
            else:  # not JSON from there on: the events before the damaged one are kept
                expect_json_prefix(seed, work, got, data, at, slack=None)
        if outside:  # a value outside the events (base times, agents, metadata, runs): the contract only
            path = rng.choice(outside)
            with cases(f"{'/'.join(map(str, path))} = {literal[:24]}"):
                damaged(seed, work / f"o{k}", mu.json_with(seed.document, path, literal)[0])


def m_json_nesting(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    ends = [end for end, _ in mu.complete_values(seed.content, seed.depth)][:-1]
    end = rng.choice(ends) if ends else 1
    with cases(f"5000 unclosed [ after byte {end}"):
        got = damaged(seed, work / "nest", seed.content[:end] + b"," + mu.unclosed_nesting(5000))
        expect_prefix(seed, work, end, got, base)


def m_sql_values(seed: Seed, rng: random.Random, work: Path, base: Counter, cases: mu.Cases) -> None:
    for k, value in enumerate((*mu.VALUES, None, float("inf"), float("nan"))):
        table, column = rng.choice(ROCPD_COLUMNS)
        path = seed.write(work / f"v{k}", sql=(table, column, value, rng))
        with cases(f"{table}.{column} = {str(value)[:24]}"):
            expect_most(mu.parse_rows(path), base)


COMMON: dict[str, Check] = {
    "truncate": m_truncate,
    "gzip_cut": m_gzip_cut,
    "gzip_flip": m_gzip_flip,
    "flip": m_flip,
    "empty": m_empty,
    "replaced_after_identify": m_replaced,
}
BY_KIND: dict[str, dict[str, Check]] = {
    "csv": {"csv_columns": m_csv_columns, "csv_values": m_csv_values},
    "json": {"json_values": m_json_values, "json_nesting": m_json_nesting},
    "sqlite": {"sql_values": m_sql_values},
}
SEED_NAMES = (
    *("rocprofv3_kernel_csv", "rocprofv3_kernel_csv_18", "rocprofv3_json", "rocpd"),
    *("rocprof_v1_csv", "rocprof_v1_json"),
    *(f"rocprofv3_run_{f}" for f in ("kernel", "memcpy", "hip_api", "marker", "agent_info")),
    *("ort_cpu", "ort_gpu", "kineto_a100", "kineto_mi250"),
    *(f"kineto_hta_{f}" for f in ("event_sync", "multi_stream", "triton", "cpu_only")),
)


def test_every_format_is_seeded(seeds, baselines):
    """Every format ``sniff`` names has a seed, and every seed rows that damage could lose."""
    assert set(seeds) == set(SEED_NAMES)
    assert {s.format for s in seeds.values()} == set(FORMATS)
    assert all(baselines[n] for n in SEED_NAMES if n != "kineto_hta_cpu_only")  # the seeds have rows to lose


@pytest.mark.parametrize("name", SEED_NAMES)
def test_mutations(seeds, baselines, name, tmp_path):
    """Every mutation of the seed file under every seed: the contract, and the rows before the damage."""
    seed = seeds[name]
    failures: list[str] = []
    for mutation, check in {**COMMON, **BY_KIND[seed.kind]}.items():
        for s in SEEDS:
            cases = mu.Cases(f"{name} ({seed.target}) {mutation} seed={s}")
            work = tmp_path / f"{mutation}-{s}"
            check(seed, random.Random(f"{name}/{mutation}/{s}"), work, baselines[name], cases)
            failures += cases.failures
            shutil.rmtree(work, ignore_errors=True)
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures)
