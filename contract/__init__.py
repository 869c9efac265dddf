"""The neutral contract every layer shares (see docs/architecture.md).

Event schemas, metric definitions, ids, errors, the config base, snapshot and finding types, and the
vocabularies (telemetry metric names, scheduler rows, kernel families) that sources, analyzers and
exporters agree on. It imports nothing of ``aaco.agent``, ``aaco.analyzers`` or ``aaco.exporters``.
"""
