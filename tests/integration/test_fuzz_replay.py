"""Fuzz, the heavy and special cases (issue 13, point 8): memory bounded, nothing blocks, nothing escapes.

Deep nesting (unclosed and closed), 200 KB of ``[`` and gzip bombs (1 GiB of padding in ~1 MB)
run in a child process under an address-space limit (``AS_LIMIT``): the child must finish
without MemoryError or being killed, under 1 GiB peak RSS, with only ``TraceFormatError`` or
conforming chunks (``mutate.parse_rows``), and keep the events before the damage where there are
some. Directories named like traces, FIFOs and symlink loops are refused by name and never
waited on. The mutations of ordinary size are in ``tests/unit/test_fuzz_formats.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import mutate as mu
from tests.unit.test_rocprof_json import build as build_rocprofv3_json

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 2 << 30  # address space of the child: a parser that needs more fails with MemoryError
PEAK_RSS = 1 << 30
GIB = 1 << 30
KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "gemm",
    "pid": 0,
    "tid": 7,
    "ts": 1_700_000_000_000_000,
    "dur": 5,
    "args": {"correlation": 1, "device": 0, "stream": 7},
}
KINETO_HEAD = b'{"schemaVersion": 1, "traceEvents": [' + json.dumps(KERNEL).encode()
ORT_HEAD = b'[{"cat": "Session", "pid": 1, "tid": 1, "dur": 50, "ts": 100, "ph": "X", "name": "model_run", "args": {}}'
CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from collections.abc import Callable
from pathlib import Path
from tests.support import mutate as mu
got = mu.parse_rows(Path(sys.argv[1]))
# VmHWM: this process's own peak since exec (ru_maxrss keeps the forking parent's peak across exec,
# and the parent is a test worker of about 1 GiB)
status = Path("/proc/self/status").read_text()
rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
print(json.dumps({{"rows": sum(mu.rows(got).values()), "refused": getattr(got, "message", None), "rss_kb": rss_kb}}))
"""


def rocprofv3_json_head() -> bytes:
    """A rocprofv3 JSON document cut right after its first kernel dispatch record."""
    data = json.dumps(build_rocprofv3_json(5, copies=1)[0], indent=1).encode()
    at = data.index(b'"kernel_dispatch"')
    ends = [end for end, _ in mu.complete_values(data, 5) if end > at]
    return data[: ends[0]]


def rocprof_v1_head(samples: Path) -> bytes:
    """The real rocprof v1 results.json cut after its 40th event (its first GPU events included)."""
    data = (samples / "rocprof-v1/hip_trace_results.json").read_bytes()
    return data[: [end for end, _ in mu.complete_values(data, 2)][40]]


def closed_deep() -> bytes:
    """A valid Kineto document whose second kernel's args nest 100k arrays deep, a third kernel after it."""
    deep = dict(KERNEL, args={"deep": "__deep__"})
    doc = json.dumps({"traceEvents": [KERNEL, deep, KERNEL], "schemaVersion": 1})
    return doc.replace('"__deep__"', mu.closed_nesting(100_000)).encode()


NEST = mu.unclosed_nesting(200_000)
# name -> (file name, content from the samples, rows at least kept: the events before the damage)
HEAVY: dict[str, tuple[str, Callable[[Path], bytes], int]] = {
    # the control: a real trace, undamaged, parses whole under the same limit (its 98 GPU events)
    "kineto_a100_control": ("a100.json.gz", lambda s: (s / "kineto/a100_alexnet_trace.json.gz").read_bytes(), 98),
    "kineto_unclosed_200k": ("kineto.json", lambda _: KINETO_HEAD + b"," + NEST, 1),
    "kineto_closed_100k": ("deep.json", lambda _: closed_deep(), 1),
    "ort_unclosed_200k": ("onnxruntime_profile.json", lambda _: ORT_HEAD + b"," + NEST, 0),
    "rocprofv3_json_unclosed_200k": ("1_results.json", lambda _: rocprofv3_json_head() + b"," + NEST, 1),
    "rocprof_v1_json_unclosed_200k": ("results.json", lambda s: rocprof_v1_head(s) + b"," + NEST, 1),
    "brackets_200k": ("trace.json", lambda _: NEST, 0),
    "kineto_gzip_bomb_1g": ("bomb.json.gz", lambda _: mu.gzip_bomb(KINETO_HEAD + b",", GIB, b" ", b"{}]}"), 0),
    "ort_gzip_bomb_1g": ("onnxruntime_profile.json.gz", lambda _: mu.gzip_bomb(ORT_HEAD + b",", GIB, b" ", b"{}]"), 0),
    "rocprofv3_csv_gzip_bomb_1g": ("1_kernel_trace.csv.gz", lambda s: mu.gzip_bomb(kernel_csv(s), GIB, b"\0"), 0),
}


def kernel_csv(samples: Path) -> bytes:
    return (samples / "rocprofv3/kernel_trace.csv").read_bytes()


@pytest.mark.parametrize("case", HEAVY)
def test_memory_bounded(samples, tmp_path, case):
    """identify + parse_any in a child limited to 2 GiB of address space: done, under 1 GiB peak, rows kept."""
    name, build, kept = HEAVY[case]
    path = tmp_path / name
    path.write_bytes(build(samples))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=AS_LIMIT), str(path)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"{case}: the child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rss_kb"] * 1024 < PEAK_RSS, f"{case}: peak RSS {out['rss_kb'] >> 10} MiB"
    assert out["rows"] >= kept, f"{case}: {out['rows']} rows, the {kept} before the damage lost: {out['refused']}"


# --- special files -------------------------------------------------------------------------------

NAMES = ("x.json", "trace.json.gz", "1234_kernel_trace.csv", "results.csv", "run.db", "onnxruntime_profile.json")


@pytest.mark.parametrize("name", NAMES)
def test_special_files(tmp_path, samples, name):
    """A directory named like a trace, a FIFO and a symlink loop are refused by name, never read or waited on."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "1_kernel_trace.csv").write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    mu.expect_refused(tmp_path / name, "a directory")
    fifo = mu.make_fifo(tmp_path / f"fifo_{name}")
    mu.guarded(fifo, lambda: mu.expect_refused(fifo, "a FIFO"))
    loop = mu.make_symlink_loop(tmp_path / f"loop_{name}")
    mu.expect_refused(loop, "a symlink loop")


def test_file_replaced_by_fifo_after_recognition(tmp_path, samples):
    """Recognised, then replaced by a FIFO before it is read (a rotating spool): refused, never blocked on."""
    p = tmp_path / "1_kernel_trace.csv"
    p.write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    mu.guarded(p, lambda: mu.parse_rows(p, then=lambda q: (q.unlink(), mu.make_fifo(q))))
