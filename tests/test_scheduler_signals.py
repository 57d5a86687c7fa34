"""Every runtime reads the agent's series with one meaning of a signal's age: time since the
agent last heard from the job. A ``--monitor`` job re-traces every 10 minutes, so the age of its
trace passes the policy's 300 s staleness limit while it still reports every 15 s."""

from __future__ import annotations

import math

from gpudiag.scheduler.model import Policy
from gpudiag.scheduler.priority import signal_usable
from gpudiag.scheduler.signals import parse_metrics
from gpudiag.scheduler.slurm.sources import QUERIES, parse_prometheus_answers

NOW = 1_800_000_000.0
EXPOSITION = f"""# TYPE gpudiag_job_mfu_ratio gauge
gpudiag_job_mfu_ratio{{job_id="slurm:7"}} 0.31
gpudiag_job_mfu_ratio{{job_id="local:1"}} 0.2
# TYPE gpudiag_job_bottleneck gauge
gpudiag_job_bottleneck{{job_id="slurm:7",label="memory-bound"}} 1.0
gpudiag_job_bottleneck{{job_id="slurm:7",label="host-bound"}} 0.0
# TYPE gpudiag_job_signal_confidence gauge
gpudiag_job_signal_confidence{{job_id="slurm:7"}} 0.8
# TYPE gpudiag_job_signal_age_seconds gauge
gpudiag_job_signal_age_seconds{{job_id="slurm:7"}} 540.0
# TYPE gpudiag_job_last_signal_timestamp_seconds gauge
gpudiag_job_last_signal_timestamp_seconds{{job_id="slurm:7"}} {NOW - 12}
"""


def test_an_agents_exposition_gives_age_since_last_report_not_trace_age():
    sigs = parse_metrics(EXPOSITION, NOW, prefix="slurm:")
    assert set(sigs) == {"slurm:7"}
    s = sigs["slurm:7"]
    assert (s.mfu, s.label, s.confidence) == (0.31, "memory-bound", 0.8)
    assert s.age_s == 12.0  # the trace is 540 s old; the job reported 12 s ago
    assert signal_usable(s, Policy())
    assert math.isinf(parse_metrics(EXPOSITION, NOW)["local:1"].age_s)  # never heard: stale


def test_prometheus_answers_give_the_same_signal():
    def vec(metric, value, **labels):
        return {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": metric, "job_id": "slurm:7", "instance": "n:9835", **labels},
             "value": [NOW - 5, str(value)]}]}}
    answers = {"mfu": vec("gpudiag_job_mfu_ratio", 0.31),
               "label": vec("gpudiag_job_bottleneck", 1, label="memory-bound"),
               "confidence": vec("gpudiag_job_signal_confidence", 0.8),
               "seen": vec("gpudiag_job_last_signal_timestamp_seconds", NOW - 12)}
    assert set(answers) == set(QUERIES)
    assert parse_prometheus_answers(answers, NOW) == parse_metrics(EXPOSITION, NOW, prefix="slurm:")
