"""Regression verdicts from finished lakes: read a lake back, record its baseline, judge a session against it.

``lake`` reads a lake's Parquet parts, ``environment`` says what a lake was recorded on (GPU, driver,
ROCm/CUDA, ONNX Runtime, clocks), ``baselines`` builds, saves and loads baselines and compares a
session with one through ``aaco.analyzers.baseline`` and ``aaco.analyzers.verdict``
(``aaco baseline save`` and ``aaco diff``; docs/regression_verdict.md).
"""
