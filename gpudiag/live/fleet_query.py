"""What ``gpudiag fleet`` asks Prometheus: a handful of range queries, the only I/O of the command.

Why range queries on aggregated expressions: the agents already export one series per GPU and
per job, so a month of 1,000 GPUs is millions of samples; Prometheus aggregates them where they
live (``count by (instance, job_id)`` of the GPU series) and returns one series per (node, job)
at ``step``. The step is sized to the range (at most ``MAX_POINTS`` points a series), so the
answer's size depends on the jobs, not on the range or the scrape interval.

Why each query is cut into spans of at most SPAN_POINTS instants: Prometheus evaluates a range
query step by step over every series the range selects, so its work is (series) x (steps). Jobs
come and go, and each brings new series (its GPUs carry its ``job_id``): a month of 1,000 GPUs
is about 100,000 GPU series, each alive for hours. One query over the month walks all of them
at every step; a day's span selects only the series alive that day. The spans are on the one
grid (``start + k * step``, each instant in exactly one span), run PARALLEL_QUERIES at a time,
and their answers are joined series by series, so the sums are those of one query.

Why instants and not ``increase()`` of counters: GPU-time is read as "this GPU series was present
at this instant", and Prometheus marks every series of a target stale when a scrape fails or the
series leaves the exposition. An agent restart is a gap, never a second copy, and there is no
counter to reset. Sums over the instants are in ``gpudiag.live.fleet``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from gpudiag.errors import GpudiagError

MAX_POINTS = 1000          # points per series: a week at a 10-minute step, a month at 43 minutes
MIN_STEP_S = 1.0           # finer than any sensible scrape interval
QUERY_TIMEOUT_S = 30.0     # per query, passed to Prometheus too (`timeout=`)
MAX_ANSWER_BYTES = 256 * 1024 * 1024
PARALLEL_QUERIES = 4       # at once: a busy Prometheus is not flooded
SPAN_POINTS = 48           # instants per query (docs/fleet.md: measured against other spans)
IDLE_ACTIVITY = 0.05       # a GPU below 5 % SM activity (or NVML utilisation) is idle

# name -> PromQL. Every number on the page names the query it came from (``QUERIES[name]``).
QUERIES: dict[str, str] = {
    # GPUs present per node and job (job_id "" = a GPU no job holds)
    "gpus": "count by (instance, job_id) (gpudiag_gpu_up)",
    # of those, GPUs below IDLE_ACTIVITY: SM activity where GPM exists, else NVML utilisation
    "idle_gpus": ("count by (instance, job_id) ((gpudiag_gpu_sm_activity_ratio or "
                  f"gpudiag_gpu_utilization_ratio) < {IDLE_ACTIVITY})"),
    "mfu": "max by (instance, job_id, owner_uid) (gpudiag_job_mfu_ratio)",
    "label": "max by (instance, job_id, owner_uid, label) (gpudiag_job_bottleneck == 1)",
    "confidence": "max by (instance, job_id, owner_uid) (gpudiag_job_signal_confidence)",
    "step": "max by (instance, job_id, owner_uid) (gpudiag_job_step_seconds)",
    "action": "max by (instance, job_id, owner_uid, action) (gpudiag_job_recommendation_info == 1)",
    "predicted": ("max by (instance, job_id, owner_uid) "
                  "(gpudiag_job_recommendation_predicted_step_seconds)"),
    "team": "max by (instance, job_id, owner_uid, team) (gpudiag_job_team_info == 1)",
    # the owner's login name, as the node that took the job's signals resolved its uid
    "user": "max by (instance, job_id, owner_uid, user) (gpudiag_job_owner_info == 1)",
    # seconds since a stalled job's last step (only while stalled), with the stall's cause
    "stalled": "max by (instance, job_id, owner_uid, cause) (gpudiag_job_stalled_seconds)",
    # a scheduler's actions, where one exports them as gpudiag_scheduler_*_total counters
    "scheduler": 'sum by (__name__, action, tier) ({__name__=~"gpudiag_scheduler_.+_total"})',
}


class PrometheusUnavailable(GpudiagError):
    """Prometheus did not answer, or answered something that is not its API."""

    exit_code = 1


Points = list[tuple[float, float]]


@dataclass
class Series:
    labels: dict[str, str]
    points: Points


@dataclass
class FleetData:
    """Each query's series over [start, end] at ``step``, as Prometheus answered."""

    base: str
    start: float
    end: float
    step: float
    series: dict[str, list[Series]] = field(default_factory=dict)

    def query_url(self, name: str) -> str:
        """The Prometheus graph page of one query over the same range: a link on every number."""
        q = urllib.parse.urlencode({"g0.expr": QUERIES[name], "g0.tab": "0",
                                    "g0.range_input": f"{int(self.end - self.start)}s",
                                    "g0.end_input": _iso(self.end), "g0.step_input": f"{self.step:g}"})
        return f"{self.base}/graph?{q}"


def step_for(start: float, end: float) -> float:
    """At most MAX_POINTS points a series, in whole seconds, never under MIN_STEP_S."""
    return max(MIN_STEP_S, float(math.ceil((end - start) / MAX_POINTS)))


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def range_query(base: str, expr: str, start: float, end: float, step: float,
                timeout: float = QUERY_TIMEOUT_S) -> list[Series]:
    """One ``/api/v1/query_range``; PrometheusUnavailable with one line on anything else."""
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                "step": f"{step:g}", "timeout": f"{timeout:g}s"})
    url = f"{base.rstrip('/')}/api/v1/query_range?{q}"
    try:
        with urllib.request.urlopen(url, timeout=timeout + 5) as r:  # noqa: S310 - the user's URL
            doc = json.loads(r.read(MAX_ANSWER_BYTES))
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read(65536)).get("error", "")
        except (ValueError, AttributeError, OSError):
            detail = ""
        raise PrometheusUnavailable(f"Prometheus at {base} refused a query (HTTP {e.code}"
                                    f"{': ' + detail if detail else ''}); is it a Prometheus "
                                    "API base URL such as http://HOST:9090?") from None
    except (OSError, urllib.error.URLError) as e:
        raise PrometheusUnavailable(f"Prometheus at {base} did not answer: "
                                    f"{getattr(e, 'reason', None) or e}; check --prometheus") from None
    except ValueError:
        raise PrometheusUnavailable(f"{base} answered, but not with Prometheus' JSON API; "
                                    "check --prometheus (http://HOST:9090)") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        raise PrometheusUnavailable(f"Prometheus at {base} failed a query: {err or doc!r}")
    data = doc.get("data") or {}
    if data.get("resultType") != "matrix":
        raise PrometheusUnavailable(f"Prometheus at {base}: result type {data.get('resultType')!r}, "
                                    "expected a matrix")
    out = []
    for r in data.get("result", []):
        labels = {str(k): str(v) for k, v in r.get("metric", {}).items()}
        pts = [(float(t), float(v)) for t, v in r.get("values", [])]
        out.append(Series(labels, [(t, v) for t, v in pts if math.isfinite(v)]))
    return out


def spans(start: float, end: float, step: float, points: int = SPAN_POINTS) -> list[tuple[float, float]]:
    """[start, end] at ``step`` cut into (first, last) instants, at most ``points`` instants
    each, all on the grid ``start + k * step``: every instant of the whole range in one span."""
    if points < 1 or step <= 0:
        raise ValueError(f"spans: points {points} and step {step} must be positive")
    n = int((end - start) // step) + 1
    return [(start + k * step, start + (min(n, k + points) - 1) * step) for k in range(0, n, points)]


def join(parts: list[list[Series]]) -> list[Series]:
    """The answers of consecutive spans of one query, one Series per label set, its points in
    time order (a series alive across a span's edge is one series again)."""
    out: dict[tuple, Series] = {}
    for part in parts:
        for s in part:
            key = tuple(sorted(s.labels.items()))
            have = out.get(key)
            if have is None:
                out[key] = Series(s.labels, list(s.points))
            else:
                have.points.extend(s.points)
    for s in out.values():
        s.points.sort()
    return list(out.values())


def read_fleet(base: str, start: float, end: float, step: float | None = None,
               span_points: int = SPAN_POINTS, timeout: float = QUERY_TIMEOUT_S) -> FleetData:
    """Every query of QUERIES over [start, end], cut into spans (see the module's docstring),
    PARALLEL_QUERIES at a time. The first failure is raised as its one line, and the queries
    not yet sent are not sent."""
    from concurrent.futures import ThreadPoolExecutor

    step = step or step_for(start, end)
    data = FleetData(base.rstrip("/"), start, end, step)
    cut = spans(start, end, step, span_points)
    with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:
        futures = {name: [pool.submit(range_query, data.base, expr, a, b, step, timeout)
                      for a, b in cut]
                   for name, expr in QUERIES.items()}
        try:
            for name, futs in futures.items():
                data.series[name] = join([f.result() for f in futs])
        except PrometheusUnavailable:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return data
