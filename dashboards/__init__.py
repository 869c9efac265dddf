"""AACO's Grafana dashboards as code (grafana-foundation-sdk), generated into the JSON beside them.

``python -m dashboards.generate`` writes ``dashboards/*.json``; ``--check`` fails when they are
stale. The Prometheus rules the Fleet dashboard reads are in ``dashboards/rules/``.
"""
