"""Arrow event schemas: required columns per docs/architecture.md (Event schemas), conform, empty, EventBatch."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aaco.contract.schemas import REQUIRED, SCHEMAS, TIME_COLUMN, EventBatch, SchemaError, conform, empty

# docs/architecture.md, Event schemas, verbatim.
DESIGN_REQUIRED = {
    "kernels": (
        "start_ns",
        "end_ns",
        "node",
        "pid",
        "tid",
        "device",
        "stream",
        "name",
        "kind",
        "correlation_id",
        "source",
    ),
    "telemetry": ("ts_ns", "node", "device", "metric", "value", "unit"),
    "sched": ("ts_ns", "node", "pid", "tid", "metric", "value", "offcpu_start_ns", "offcpu_end_ns"),
    "iterations": ("start_ns", "end_ns", "node", "pid", "model", "run_id", "trace_id", "span_id", "source"),
    "findings": ("ts_ns", "node", "analyzer", "subject", "severity", "confidence", "summary", "evidence_json"),
    "requests": ("start_ns", "end_ns", "node", "model", "trace_id", "span_id", "source"),
    "counters": (
        "start_ns",
        "end_ns",
        "node",
        "pid",
        "device",
        "dispatch_id",
        "kernel",
        "counter",
        "value",
        "source",
    ),
}

SAMPLE_VALUES = {pa.int64(): 1, pa.float64(): 1.5, pa.string(): "x"}


def minimal(kind: str, n: int = 2) -> dict[str, pa.Array]:
    """Only the required columns of ``kind``, ``n`` rows of plausible values."""
    schema = SCHEMAS[kind]
    return {
        name: pa.array([SAMPLE_VALUES[schema.field(name).type]] * n, schema.field(name).type) for name in REQUIRED[kind]
    }


def test_required_columns_match_design_for_every_kind():
    assert set(REQUIRED) == set(DESIGN_REQUIRED) == set(SCHEMAS)
    for kind, cols in DESIGN_REQUIRED.items():
        assert REQUIRED[kind] == cols, kind
        # required columns come first in the full schema, in the documented order
        assert tuple(SCHEMAS[kind].names[: len(cols)]) == cols


def test_time_column_is_a_required_int64_column():
    for kind, col in TIME_COLUMN.items():
        assert col in REQUIRED[kind]
        assert SCHEMAS[kind].field(col).type == pa.int64()
        assert not SCHEMAS[kind].field(col).nullable


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_conform_fills_optional_columns_with_nulls(kind):
    out = conform(kind, minimal(kind, 3))
    assert out.schema == SCHEMAS[kind]
    assert out.num_rows == 3
    for name in SCHEMAS[kind].names:
        if name not in REQUIRED[kind]:
            assert out.column(name).null_count == 3, name
            assert out.column(name).type == SCHEMAS[kind].field(name).type


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_empty_has_full_schema(kind):
    b = empty(kind)
    assert b.num_rows == 0
    assert b.schema == SCHEMAS[kind]


def test_conform_reorders_columns_and_keeps_values():
    data = minimal("kernels", 2)
    data["start_ns"] = pa.array([10, 20], pa.int64())
    data["launch_start_ns"] = pa.array([5, None], pa.int64())
    reordered = dict(reversed(list(data.items())))
    out = conform("kernels", pa.table(reordered))
    assert out.schema.names == SCHEMAS["kernels"].names
    assert out.column("start_ns").to_pylist() == [10, 20]
    assert out.column("launch_start_ns").to_pylist() == [5, None]


def test_conform_accepts_record_batch_table_and_dict():
    data = minimal("telemetry", 2)
    as_batch = conform("telemetry", pa.RecordBatch.from_pydict(data))
    as_table = conform("telemetry", pa.table(data))
    as_dict = conform("telemetry", data)
    assert as_batch.equals(as_table)
    assert as_table.equals(as_dict)
    assert isinstance(as_dict, pa.RecordBatch)


def test_conform_combines_chunked_columns():
    t1 = pa.table(minimal("telemetry", 2))
    t2 = pa.table(minimal("telemetry", 3))
    table = pa.concat_tables([t1, t2])
    assert table.column("ts_ns").num_chunks == 2
    out = conform("telemetry", table)
    assert out.num_rows == 5
    assert out.column("value").to_pylist() == [1.5] * 5


def test_conform_casts_safely_to_declared_types():
    data = minimal("telemetry", 2)
    data["ts_ns"] = pa.array([1, 2], pa.int32())
    data["value"] = pa.array([3, 4], pa.int64())
    out = conform("telemetry", data)
    assert out.column("ts_ns").type == pa.int64()
    assert out.column("ts_ns").to_pylist() == [1, 2]
    assert out.column("value").type == pa.float64()
    assert out.column("value").to_pylist() == [3.0, 4.0]


def test_conform_refuses_truncating_float_to_int():
    data = minimal("telemetry", 1)
    data["ts_ns"] = pa.array([1.5], pa.float64())
    with pytest.raises(SchemaError, match=r"telemetry\.ts_ns"):
        conform("telemetry", data)


def test_conform_refuses_out_of_range_integer():
    data = minimal("kernels", 1)
    data["pid"] = pa.array([2**63], pa.uint64())
    with pytest.raises(SchemaError, match=r"kernels\.pid"):
        conform("kernels", data)


def test_conform_refuses_non_numeric_string_in_numeric_column():
    data = minimal("telemetry", 1)
    data["value"] = pa.array(["abc"], pa.string())
    with pytest.raises(SchemaError, match=r"telemetry\.value"):
        conform("telemetry", data)


def test_conform_refuses_numeric_looking_string_in_numeric_column():
    data = minimal("telemetry", 1)
    data["value"] = pa.array(["1.5"], pa.string())
    with pytest.raises(SchemaError):
        conform("telemetry", data)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_conform_errors_on_each_missing_required_column(kind):
    for col in REQUIRED[kind]:
        data = minimal(kind)
        del data[col]
        with pytest.raises(SchemaError, match=rf"missing required column\(s\) {col}\b"):
            conform(kind, data)


def test_conform_missing_lists_every_missing_column():
    data = minimal("iterations")
    del data["model"], data["span_id"]
    with pytest.raises(SchemaError) as exc:
        conform("iterations", data)
    assert "model" in str(exc.value)
    assert "span_id" in str(exc.value)


def test_conform_errors_on_undeclared_column():
    data = minimal("kernels")
    data["made_up"] = pa.array([1, 2], pa.int64())
    with pytest.raises(SchemaError, match=r"undeclared column.*made_up"):
        conform("kernels", data)


@pytest.mark.parametrize(
    ("kind", "col"),
    [
        ("kernels", "start_ns"),
        ("kernels", "end_ns"),
        ("kernels", "node"),
        ("iterations", "start_ns"),
        ("iterations", "end_ns"),
        ("iterations", "node"),
        ("telemetry", "ts_ns"),
        ("telemetry", "node"),
        ("sched", "ts_ns"),
        ("sched", "node"),
        ("findings", "ts_ns"),
        ("findings", "node"),
    ],
)
def test_conform_errors_on_null_in_time_or_node(kind, col):
    data = minimal(kind, 2)
    typ = SCHEMAS[kind].field(col).type
    data[col] = pa.array([SAMPLE_VALUES[typ], None], typ)
    with pytest.raises(SchemaError, match=rf"{kind}\.{col}: 1 null"):
        conform(kind, data)


def test_conform_allows_nulls_in_other_required_columns():
    data = minimal("kernels", 2)
    data["pid"] = pa.array([None, 3], pa.int64())
    data["correlation_id"] = pa.array([None, None], pa.int64())
    out = conform("kernels", data)
    assert out.column("pid").to_pylist() == [None, 3]
    assert out.column("correlation_id").null_count == 2


def test_conform_errors_on_unknown_kind():
    with pytest.raises(SchemaError, match="unknown event kind 'spans'"):
        conform("spans", {"ts_ns": [1]})
    assert issubclass(SchemaError, ValueError)


def test_not_null_fields_in_schema():
    for kind, schema in SCHEMAS.items():
        for f in schema:
            assert f.nullable == (f.name not in {"start_ns", "end_ns", "ts_ns", "node"}), (kind, f.name)


def test_event_batch_rows():
    b = conform("telemetry", minimal("telemetry", 4))
    eb = EventBatch("telemetry", b, "src")
    assert eb.rows == 4
    assert EventBatch("telemetry", empty("telemetry"), "src").rows == 0
    with pytest.raises(AttributeError):
        eb.kind = "kernels"  # type: ignore[misc]
