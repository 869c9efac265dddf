"""A job of N ranks made from HTA's two real ranks of a 128-rank job (tests and benchmarks; nothing checked in).

``tests/data/kineto-multirank/trace_filter_sampled_rank-0`` and ``-1`` are the only real ranks of one
job the repository carries. ``write_rank_copies(dst, n)`` writes ``rank-0.json.gz`` ... ``rank-<n-1>``:
rank ``r`` is a copy of real rank ``r % 2`` whose ``distributedInfo`` says ``{"backend": "nccl",
"rank": r, "world_size": n}``; nothing else changes (no time is shifted, every other byte of the
JSON text is the original's), so ranks of the same parity are identical but for their rank.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

MULTIRANK = Path(__file__).resolve().parents[1] / "data" / "kineto-multirank"
REAL_RANKS = (MULTIRANK / "trace_filter_sampled_rank-0.json.gz", MULTIRANK / "trace_filter_sampled_rank-1.json.gz")
_INFO = re.compile(r'"distributedInfo": \{[^{}]*\}')


def write_rank_copies(dst: Path, n: int = 8) -> list[Path]:
    """The ``n`` rank files of one job (world size ``n``) in ``dst``, in rank order."""
    texts = [gzip.decompress(p.read_bytes()).decode() for p in REAL_RANKS]
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for rank in range(n):
        text = texts[rank % 2]
        info = f'"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {n}}}'
        new, count = _INFO.subn(info, text, count=1)
        if count != 1:
            raise ValueError(f"{REAL_RANKS[rank % 2]}: no distributedInfo to rewrite")
        path = dst / f"rank-{rank}.json.gz"
        path.write_bytes(gzip.compress(new.encode(), compresslevel=6, mtime=0))
        out.append(path)
    return out
