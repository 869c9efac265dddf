"""Holistic Trace Analysis' own CUPTI counter figures for HTA's sample (tests/data/cupti_hta).

Run by an interpreter that has HTA 0.5.0 and pandas < 3 (HTA 0.5.0's call graph, which
``get_cupti_counter_data_with_operators`` builds, raises on pandas 3: ``np.unique(axis=0)`` on an
object column). It needs nothing but HTA and the standard library:

    python tests/integration/hta_cupti_oracle.py            prints HTA's rows (JSON);
    python tests/integration/hta_cupti_oracle.py --write    writes them to tests/data/cupti_hta/hta-0.5.0.json.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "data" / "kineto-hta" / "cupti_profiler_trace.json.gz"
OUT = ROOT / "tests" / "data" / "cupti_hta" / "hta-0.5.0.json"
FIELDS = ("ts", "name", "top_level_op", "bottom_level_op")


def rows() -> list[dict]:
    """HTA's get_cupti_counter_data_with_operators on the sample, in time order: names, operators, counters."""
    from hta.analyzers.cupti_counter_analysis import CUDA_SASS_INSTRUCTION_COUNTER_FLOPS
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(TRACE, Path(d) / "rank-0.json.gz")
        (frame,) = TraceAnalysis(trace_dir=d).get_cupti_counter_data_with_operators()
    out = []
    for r in frame.sort_values("ts").to_dict("records"):
        row = {k: (int(r[k]) if k == "ts" else str(r[k])) for k in FIELDS}
        row["counters"] = {k: int(r[k]) for k in sorted(CUDA_SASS_INSTRUCTION_COUNTER_FLOPS)}
        out.append(row)
    return out


if __name__ == "__main__":
    found = rows()
    if "--write" in sys.argv[1:]:
        OUT.write_text(json.dumps({"rows": found}, indent=1) + "\n")
    else:
        print(json.dumps(found))
