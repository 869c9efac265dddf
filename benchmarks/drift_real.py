"""Drift detection on real, labelled series: the Turing Change Point Dataset, scored as TCPDBench scores it.

The series are the univariate TCPD series carried in ``benchmarks/data/tcpd/`` (their sources,
licences and the commit they came from: ``PROVENANCE.md``), with every annotator's change points
(``annotations.json``). Multivariate series are left out: the agent's detectors are univariate and
the paper reports univariate and multivariate scores apart, so only the univariate figures compare.

Methods, all in this run, each scored by the benchmark's F1 (margin 5) and cover
(``changepoint_metrics``, written from the paper's definitions):

- ``cusum``, ``ewma``: ``aaco.analyzers.drift`` with default settings, run as the drift analyzer runs
  them: one detector per series, fed one value at a time, missing values (``null``) skipped before the
  detector as the analyzer skips non-finite values; a change point is ``ChangePoint.index`` mapped back
  to the series' own positions;
- ``zero``: the paper's trivial method, which reports no change (only the start);
- ``pelt``, ``binseg``: offline references from ``ruptures`` (l2 cost, i.e. changes in mean, on the
  z-scored series with an MBIC-like penalty ``3 ln n``, as TCPDBench's default experiment runs
  ``changepoint``'s PELT and BinSeg with the MBIC penalty; BinSeg capped at 5 change points as
  ``changepoint``'s default ``Q``). They see the whole series at once.

Prints one JSON line: mean F1 and cover per method over the series, the ratios of each to ``zero`` and
to the best offline method measured here, and the paper's default univariate figures (best default
method: BinSeg, cover 0.706, F1 0.744; zero: cover 0.583, F1 0.669; over all 37 real univariate
series, so they compare with the ones measured here only roughly).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import ruptures as rpt
from changepoint_metrics import cover_score, f1_score

from aaco.analyzers.drift import DETECTORS

DATA = Path(__file__).resolve().parent / "data" / "tcpd"
PAPER = {"binseg": {"cover": 0.706, "f1": 0.744}, "zero": {"cover": 0.583, "f1": 0.669}}
BINSEG_MAX_CPS = 5


def load() -> list[tuple[str, np.ndarray, dict[str, list[int]]]]:
    """The carried univariate series (``null`` as NaN) with their annotations, by name."""
    annotations = json.loads((DATA / "annotations.json").read_text())
    out = []
    for path in sorted(DATA.glob("*.json")):
        if path.name == "annotations.json":
            continue
        doc = json.loads(path.read_text())
        if doc["n_dim"] != 1:
            raise ValueError(f"{path.name}: {doc['n_dim']} dimensions; only univariate series are scored")
        raw = doc["series"][0]["raw"]
        x = np.array([math.nan if v is None else float(v) for v in raw])
        out.append((doc["name"], x, annotations[doc["name"]]))
    return out


def online(name: str, options: dict) -> Callable[[np.ndarray], list[int]]:
    """The agent's detector ``name``: finite values fed one at a time, change points mapped back."""

    def detect(x: np.ndarray) -> list[int]:
        det = DETECTORS[name](**options)
        kept = np.flatnonzero(np.isfinite(x))
        found = []
        for v in x[kept].tolist():
            cp = det.update(v)
            if cp is not None:
                found.append(int(kept[cp.index]))
        return found

    return detect


def _standardised(x: np.ndarray) -> np.ndarray:
    """Finite values z-scored (offline methods cannot take gaps: they see the series without them)."""
    y = x[np.isfinite(x)]
    sd = float(y.std())
    return (y - y.mean()) / (sd if sd > 0 else 1.0)


def offline(kind: str) -> Callable[[np.ndarray], list[int]]:
    """``ruptures`` PELT or BinSeg, l2 cost, penalty ``3 ln n``, change points mapped back over gaps."""

    def detect(x: np.ndarray) -> list[int]:
        kept = np.flatnonzero(np.isfinite(x))
        y = _standardised(x)
        pen = 3.0 * math.log(y.size)
        if kind == "pelt":
            bkps = rpt.Pelt(model="l2", min_size=2, jump=1).fit(y).predict(pen=pen)
        else:
            algo = rpt.Binseg(model="l2", min_size=2, jump=1).fit(y)
            bkps = algo.predict(pen=pen)
            if len(bkps) - 1 > BINSEG_MAX_CPS:
                bkps = algo.predict(n_bkps=BINSEG_MAX_CPS)
        return [int(kept[b]) for b in bkps[:-1]]

    return detect


def main() -> None:
    """Score every method on every carried series and print one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--options", default="{}", help="detector options (JSON) instead of the defaults")
    args = ap.parse_args()
    options = json.loads(args.options)
    t0 = time.perf_counter()
    methods: dict[str, Callable[[np.ndarray], list[int]]] = {
        "cusum": online("cusum", options),
        "ewma": online("ewma", options),
        "zero": lambda x: [],
        "pelt": offline("pelt"),
        "binseg": offline("binseg"),
    }
    series = load()
    per: dict[str, dict[str, dict[str, float]]] = {m: {} for m in methods}
    for name, x, ann in series:
        for m, detect in methods.items():
            found = detect(x)
            per[m][name] = {"f1": f1_score(ann, found, x.size), "cover": cover_score(ann, found, x.size)}
    mean = {m: {s: float(np.mean([r[s] for r in rows.values()])) for s in ("f1", "cover")} for m, rows in per.items()}
    best = max(("pelt", "binseg"), key=lambda m: mean[m]["f1"] + mean[m]["cover"])
    ratios = {
        m: {
            f"{s}_vs_{base}": mean[m][s] / mean[ref][s]
            for s in ("f1", "cover")
            for base, ref in (("zero", "zero"), ("best_offline", best))
        }
        for m in ("cusum", "ewma")
    }
    print(
        json.dumps(
            {
                "benchmark": "drift_real",
                "dataset": "TCPD (univariate, carried)",
                "series": len(series),
                "values": int(sum(x.size for _, x, _ in series)),
                "detectors": {m: DETECTORS[m](**options).params() for m in ("cusum", "ewma")},
                "mean": mean,
                "best_offline": best,
                "ratios": ratios,
                "paper_default_univariate": PAPER,
                "per_series": per,
                "elapsed_s": round(time.perf_counter() - t0, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
