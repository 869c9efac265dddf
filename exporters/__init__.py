"""Exporters: ship event batches and analyzer snapshots (OpenTelemetry exporter contract)."""
