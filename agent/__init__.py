"""The node daemon (Prometheus exporter) and, later, the gang scheduler. Not built yet."""
