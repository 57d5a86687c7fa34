"""The node daemon: Prometheus collectors for GPU counters and job signals, and the job table."""
