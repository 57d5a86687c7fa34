"""What ``gpudiag fleet`` asks Prometheus: a handful of range queries over windows that tile the
range, the only I/O of the sums (``fleet_slurm`` asks Slurm who ran the silent jobs).

**Windows, not instants.** The range (start, end] is cut into ``n`` windows of ``step`` that
tile it exactly (``Grid``), at most MAX_POINTS of them, and every query counts the *samples* in
each window: ``sum_over_time(gpudiag_gpus_held[step])`` (a job's GPUs on a node at each scrape,
one series per job and node; per GPU, ``gpudiag_gpu_up``, for older agents: ``fleet_read``).
A GPU-second is a GPU in a stored sample times its target's scrape interval. An instant
query instead asks "was a sample within the 5-minute lookback?" at each step: at a week's
605 s step a 5-minute job falls between two instants or is counted for a whole step.
Counted samples are exact at any step, a sample belongs to exactly one window, and an agent
that restarts leaves fewer samples, never a second copy.

Prometheus 2.x selects a window's samples in [t - w, t], both ends included; 3.x in (t - w, t].
So on 2.x the window is one millisecond short of the step (samples carry millisecond
timestamps): each millisecond of the range is in one window either way.

**Spans.** Prometheus evaluates a range query window by window over every series the whole
range selects, so its work is (series) x (windows). Jobs come and go and each brings new series
(a GPU's series carry its ``job_id``): one query over a month walks all of them at each of
1,000 windows. So each query is cut into spans of SPAN_POINTS windows on the one grid, run
PARALLEL_QUERIES at a time, and the answers are joined series by series: the sums are those of
one query (tests/system/fleet/test_fleet.py checks it against the real Prometheus).

**One window where one number is kept.** Of a query whose sums keep only each series' latest
point or its total (KEEP: "last", "sum"), the whole range is one instant query over one window,
the union of the n (``Grid.whole``): one point a series instead of one a window. Where a job's
series of such a query differ in what the sums read of them (``ambiguous``: the latest window's
series wins), that job is read again window by window (``for_jobs``).

What is asked in which order, and the scheduler's counters: ``fleet_read``.
"""

from __future__ import annotations

import math
import operator
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpudiag import contract as c
from gpudiag.live.prom_client import Prometheus, PrometheusUnavailable

MAX_POINTS = 1000          # windows per range: a week at 605 s, a month at 43 minutes
MIN_STEP_MS = 1000         # no window shorter than a second
QUERY_TIMEOUT_S = 30.0     # per query, passed to Prometheus too (`timeout=`)
PARALLEL_QUERIES = 4       # at once: a busy Prometheus is not flooded
SPAN_POINTS = 150          # windows per query (docs/fleet.md: measured against other spans)
SCHEDULER_COUNTERS = 'gpudiag_scheduler_.+_total'

W = "{w}"   # one window's width, put in by FleetData.expr / read_series

# name -> PromQL over one window ``{w}``. What each number on the page is a sum of.
QUERIES: dict[str, str] = {
    # GPU samples per node and job (job_id "" = GPUs no job holds): x the scrape interval = GPU-s.
    # gpudiag_gpus_held is one series per job and node (its GPUs at each scrape), not one per GPU
    "gpu_samples": f"sum by (instance, job_id) (sum_over_time({c.GPUS_HELD}[{W}]))",
    # the scrapes in which the job held GPUs there: how long it held them in the window
    "gpu_presence": f"max by (instance, job_id) (count_over_time({c.GPUS_HELD}[{W}]))",
    # GPU samples below the agent's idle threshold
    "idle_samples": f"sum by (instance, job_id) (sum_over_time({c.GPUS_IDLE}[{W}]))",
    # any signal of the job: the job runs under gpudiag (with or without an MFU)
    "signal_samples": f"max by (instance, job_id, owner_uid) (count_over_time({c.JOB_LAST_SIGNAL}[{W}]))",
    # the job's MFU (one place: fleet.job_mfu reads these two)
    "mfu_mean": f"max by (instance, job_id, owner_uid) (avg_over_time({c.JOB_MFU}[{W}]))",
    "mfu_samples": f"max by (instance, job_id, owner_uid) (count_over_time({c.JOB_MFU}[{W}]))",
    "label_samples": (f"max by (instance, job_id, owner_uid, label) "
                      f"(count_over_time({c.JOB_BOTTLENECK}[{W}]))"),
    "confidence": f"max by (instance, job_id, owner_uid) (last_over_time({c.JOB_CONFIDENCE}[{W}]))",
    "step": f"max by (instance, job_id, owner_uid) (last_over_time({c.JOB_STEP_SECONDS}[{W}]))",
    "predicted": f"max by (instance, job_id, owner_uid) (last_over_time({c.JOB_PREDICTED_STEP}[{W}]))",
    "action": (f"max by (instance, job_id, owner_uid, action) "
               f"(last_over_time({c.JOB_RECOMMENDATION}[{W}]))"),
    "team": f"max by (instance, job_id, owner_uid, team) (last_over_time({c.JOB_TEAM}[{W}]))",
    # the login name of the uid that wrote the job's signals, as its node resolved it
    "user": f"max by (instance, job_id, owner_uid, user) (last_over_time({c.JOB_OWNER}[{W}]))",
    # seconds since a stalled job's last step, only while it is stalled, with the stall's cause
    # (docs/stall.md): the largest in a window is its last sample there
    "stalled": f"max by (instance, job_id, owner_uid, cause) (max_over_time({c.JOB_STALLED}[{W}]))",
    # when the job last finished a step: dates a stall exactly, whatever the windows' edges
    "last_step": f"max by (instance, job_id, owner_uid) (last_over_time({c.JOB_LAST_STEP}[{W}]))",
    # the uid that runs a GPU's job (its processes, else its job-mapping file), for silent jobs
    "holder": f"max by (instance, job_id, owner_uid, user) (last_over_time({c.GPU_JOB_OWNER}[{W}]))",
}

# What the sums need of each query's answer (the rest is dropped as each span arrives, so a
# month of 10,000 jobs holds per-window points only for these five): "windows" every point,
# "last" each series' latest point, "sum" each series' total (one point, at its latest time).
KEEP: dict[str, str] = {"gpu_samples": "windows", "gpu_presence": "windows", "idle_samples": "sum",
                        "signal_samples": "last", "mfu_mean": "windows", "mfu_samples": "windows",
                        "label_samples": "windows", "confidence": "last", "step": "last",
                        "predicted": "last", "action": "last", "team": "last", "user": "last",
                        "holder": "last", "stalled": "windows", "last_step": "windows"}

Points = list[tuple[float, float]]


@dataclass
class Series:
    labels: dict[str, str]
    points: Points


@dataclass(frozen=True)
class Grid:
    """``n`` windows of ``step_ms`` ending at ``end_ms``: window k is (t_k - step, t_k] with
    t_k = end - (n - 1 - k) x step; together they tile (start, end]."""

    end_ms: int
    step_ms: int
    n: int
    left_open: bool = False   # Prometheus >= 3 selects (t - w, t]; 2.x [t - w, t]

    @property
    def step(self) -> float:
        return self.step_ms / 1000.0

    @property
    def end(self) -> float:
        return self.end_ms / 1000.0

    @property
    def start(self) -> float:
        return (self.end_ms - self.n * self.step_ms) / 1000.0

    @property
    def first(self) -> float:
        """The first window's instant (its end)."""
        return (self.end_ms - (self.n - 1) * self.step_ms) / 1000.0

    @property
    def window(self) -> str:
        return f"{self.step_ms if self.left_open else self.step_ms - 1}ms"

    @property
    def whole(self) -> str:
        """One window that is the union of the n: each millisecond of the range once."""
        return f"{self.n * self.step_ms if self.left_open else self.n * self.step_ms - 1}ms"

    def index(self, t: float) -> int:
        return round((t * 1000.0 - (self.end_ms - (self.n - 1) * self.step_ms)) / self.step_ms)

    def indexer(self) -> Callable[[float], int]:
        """``index`` with its constants bound: called once per point of every answer."""
        first, step = self.end_ms - (self.n - 1) * self.step_ms, float(self.step_ms)
        return lambda t: round((t * 1000.0 - first) / step)

    def previous(self) -> Grid:
        """The same windows over the range just before this one."""
        return Grid(self.end_ms - self.n * self.step_ms, self.step_ms, self.n, self.left_open)


def grid_for(start: float, end: float, left_open: bool = False, max_points: int = MAX_POINTS) -> Grid:
    """At most ``max_points`` windows of whole milliseconds, never under MIN_STEP_MS, ending
    at ``end``. The windows start at most one step before ``start`` and, once the range is
    over 1,000 s, less than a second before it (docs/fleet.md)."""
    end_ms = int(round(end * 1000))
    span = max(1, end_ms - int(round(start * 1000)))
    step_ms = max(MIN_STEP_MS, math.ceil(span / max_points))
    return Grid(end_ms, step_ms, math.ceil(span / step_ms), left_open)


def left_open(version: str) -> bool:
    """Whether this Prometheus selects (t - w, t] (3.0 and later) rather than [t - w, t]."""
    try:
        return int(version.split(".")[0]) >= 3
    except ValueError:
        return False


def spans(grid: Grid, points: int = SPAN_POINTS) -> list[tuple[float, float]]:
    """The grid's instants cut into (first, last) instants of at most ``points`` each, on the
    grid: every window of the range in exactly one span."""
    if points < 1:
        raise ValueError(f"spans: points {points} must be positive")
    out = []
    for k in range(0, grid.n, points):
        last = min(grid.n, k + points) - 1
        out.append(((grid.end_ms - (grid.n - 1 - k) * grid.step_ms) / 1000.0,
                    (grid.end_ms - (grid.n - 1 - last) * grid.step_ms) / 1000.0))
    return out


def join(parts: list[list[Series]]) -> list[Series]:
    """The answers of consecutive spans of one query, in time order, one Series per label set
    (a series alive across a span's edge is one series again); each span's points come after
    the previous span's, so the joined points are in time order too."""
    out: dict[tuple[Any, ...], Series] = {}
    for part in parts:
        for s in part:
            key = tuple(s.labels.items())     # in name order (_matrix sorts them)
            have = out.get(key)
            if have is None:
                out[key] = s        # the spans' answers are the join's own: extended in place
            else:
                have.points.extend(s.points)
    return list(out.values())


def keep(series: list[Series], how: str) -> list[Series]:
    """``series`` reduced to what KEEP says the sums need (applied to each span's answer and
    again to their join, which gives the same as to one answer of the whole range)."""
    if how == "last":
        return [Series(s.labels, s.points[-1:]) for s in series]
    if how == "sum":
        return [Series(s.labels, [(s.points[-1][0], sum(v for _, v in s.points))] if s.points else [])
                for s in series]
    return series


def _points(values: list[Any], how: str) -> Points:
    """One series' points as ``keep(how)`` would leave them (a "last" series converts only the
    point it keeps: most of an answer's points are dropped unread)."""
    isfinite = math.isfinite
    if how == "last":
        for t, v in reversed(values):      # the latest finite point
            if isfinite(float(v)):
                return [(float(t), float(v))]
        return []
    pts = [(float(t), float(v)) for t, v in values]
    if not isfinite(sum(v for _, v in pts)):     # a NaN or an Inf among them: no number to sum
        pts = [(t, v) for t, v in pts if isfinite(v)]
    if how == "sum" and pts:
        pts = [(pts[-1][0], sum(v for _, v in pts))]
    return pts


def _matrix(data: object, base: str, how: str = "windows") -> list[Series]:
    """An answer's series (decoded as JSON), as ``keep(how)`` would leave them."""
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PrometheusUnavailable(f"Prometheus at {base}: result type {got!r}, expected a matrix")
    return [Series({str(k): str(v) for k, v in sorted(r.get("metric", {}).items())},
                   _points(r.get("values", []), how)) for r in data.get("result", [])]


class _MatrixSeries(msgspec.Struct):
    metric: dict[str, str] = {}
    values: list[tuple[float, float]] = []


class _MatrixData(msgspec.Struct):
    result_type: str = msgspec.field(name="resultType")
    result: list[_MatrixSeries] = []


class _MatrixAnswer(msgspec.Struct):
    """A successful range answer, its values decoded as floats where Prometheus writes strings
    ("8", "NaN", "-Inf": msgspec's non-strict mode; "+Inf" it refuses, and such an answer takes
    the general path)."""

    status: str
    data: _MatrixData | None = None


def _decode_matrix(prom: Prometheus, raw: bytes, how: str) -> list[Series]:
    """A range answer's series: decoded straight into floats (no Python per point but the
    finiteness check), else, for any answer that is not a plain successful matrix of numbers,
    through ``Prometheus.data`` and ``_matrix`` (the same series, or the same one-line error)."""
    try:
        doc = msgspec.json.decode(raw, type=_MatrixAnswer, strict=False)
    except msgspec.DecodeError:     # ValidationError too: "+Inf", or not the shape of an answer
        doc = None
    if doc is None or doc.status != "success" or doc.data is None or doc.data.result_type != "matrix":
        return _matrix(prom.data(raw), prom.base, how)
    out = []
    isfinite, second = math.isfinite, operator.itemgetter(1)
    for r in doc.data.result:
        labels = dict(sorted(r.metric.items()))
        values = r.values
        if how == "last" or not isfinite(sum(map(second, values))):
            out.append(Series(labels, _points(values, how)))
        elif how == "sum":
            out.append(Series(labels, [(values[-1][0], sum(map(second, values)))] if values else []))
        else:
            out.append(Series(labels, values))
    return out


def range_query(prom: Prometheus, expr: str, first: float, last: float, step_ms: int,
                timeout: float = QUERY_TIMEOUT_S, how: str = "windows") -> list[Series]:
    """One ``/api/v1/query_range`` from instant ``first`` to ``last``, reduced as ``how`` says."""
    raw = prom.get_raw("/api/v1/query_range", {"query": expr, "start": f"{first:.3f}", "end": f"{last:.3f}",
                                               "step": f"{step_ms / 1000:.3f}", "timeout": f"{timeout:g}s"},
                       timeout + 5)
    return _decode_matrix(prom, raw, how)


def instant_query(prom: Prometheus, expr: str, at: float,
                  timeout: float = QUERY_TIMEOUT_S) -> list[dict[str, Any]]:
    data = prom.get("/api/v1/query", {"query": expr, "time": f"{at:.3f}", "timeout": f"{timeout:g}s"},
                    timeout + 5)
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusUnavailable(f"Prometheus at {prom.base}: expected a vector answer")
    return [r for r in data.get("result", []) if isinstance(r, dict)]


class _Sample(msgspec.Struct):
    metric: dict[str, str] = {}
    value: tuple[float, float] = (0.0, math.nan)


class _VectorData(msgspec.Struct):
    result_type: str = msgspec.field(name="resultType")
    result: list[_Sample] = []


class _VectorAnswer(msgspec.Struct):
    status: str
    data: _VectorData | None = None


def whole_query(prom: Prometheus, expr: str, grid: Grid, timeout: float = QUERY_TIMEOUT_S) -> list[Series]:
    """``expr`` over the whole range as one window (``Grid.whole``), one instant query at its end:
    each series' one point, at the range's end (a non-finite one is kept: ``read_series`` reads
    that job window by window)."""
    raw = prom.get_raw("/api/v1/query", {"query": expr.replace("{w}", grid.whole), "time": f"{grid.end:.3f}",
                                         "timeout": f"{timeout:g}s"}, timeout + 5)
    try:
        doc = msgspec.json.decode(raw, type=_VectorAnswer, strict=False)
    except msgspec.DecodeError:     # "+Inf", or not the shape of an answer: the general path
        doc = None
    if doc is None or doc.status != "success" or doc.data is None or doc.data.result_type != "vector":
        data = prom.data(raw)
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusUnavailable(f"Prometheus at {prom.base}: expected a vector answer")
        out = []
        for r in data.get("result", []):
            try:
                v = float(r.get("value", [0, "nan"])[1])
            except (TypeError, ValueError, IndexError, AttributeError):
                continue
            out.append(Series({str(k): str(x) for k, x in sorted((r.get("metric") or {}).items())},
                              [(grid.end, v)]))
        return out
    end = grid.end
    return [Series(dict(sorted(r.metric.items())), [(end, r.value[1])]) for r in doc.data.result]


# "last" queries whose value ``fleet.latest`` reads (the others: a label, or only who and where)
LATEST_VALUE = frozenset({"confidence", "step", "predicted"})
MAX_REREAD_JOBS = 100     # jobs re-read by name in one regex (a URL of a few KB, as proxies take)


def ambiguous(name: str, series: list[Series]) -> set[str]:
    """Jobs whose latest answer the whole range cannot give: several series that differ in
    what ``fleet.latest`` reads of them (a label such as the action, the owner, or the value),
    where only the latest window's series counts; or a value that is not a number. Series
    that differ only in their node (a job on two nodes, reporting the same) are not."""
    out: set[str] = set()
    isfinite, several = math.isfinite, KEEP.get(name) == "last"
    first: dict[str, Series] = {}
    for s in series:
        job = s.labels.get("job_id", "")
        if not s.points or not isfinite(s.points[-1][1]):
            out.add(job)
        elif several:
            other = first.setdefault(job, s)
            if other is not s and _reads(name, other) != _reads(name, s):
                out.add(job)
    return out


def _reads(name: str, s: Series) -> tuple[Any, ...]:
    """What ``fleet.latest`` reads of a series: its labels but the node, and the value where
    it is the number read."""
    return (tuple((k, v) for k, v in s.labels.items() if k != "instance"),
            s.points[-1][1] if name in LATEST_VALUE else None)


def regex_of(values: list[str]) -> str:
    """An RE2 regex matching exactly these strings, as a PromQL string's content."""
    esc = ["".join("\\" + ch if ch in ".+*?()|[]{}^$\\" else ch for ch in v) for v in values]
    return ("^(?:" + "|".join(esc) + ")$").replace("\\", "\\\\").replace('"', '\\"')


def for_jobs(expr: str, jobs: list[str]) -> str:
    """``expr`` (one selector, ``name[{w}]``) selecting only these jobs' series."""
    rx = regex_of(jobs)
    out, n = re.subn(r"([A-Za-z_:][A-Za-z0-9_:]*)\[\{w\}\]",
                     lambda m: f'{m.group(1)}{{job_id=~"{rx}"}}[{{w}}]', expr)
    if n != 1:
        raise ValueError(f"for_jobs: {expr!r} is not one plain selector")
    return out


@dataclass
class FleetData:
    """Each query's series over the grid's windows, as Prometheus answered, and what turns
    samples into seconds: each instance's scrape interval."""

    base: str
    grid: Grid
    series: dict[str, list[Series]] = field(default_factory=dict)
    intervals: dict[str, float] = field(default_factory=dict)   # instance -> seconds per sample
    scheduler: list[dict[str, Any]] = field(default_factory=list)         # counters' increase over the range
    requested: tuple[float, float] = (0.0, 0.0)                 # the range asked for, before clipping
    default_interval: float | None = None   # for an instance with signals but no GPU series

    def interval(self, instance: str) -> float:
        """Seconds one sample of ``instance`` stands for."""
        got = self.intervals.get(instance)
        if got is not None:
            return got
        if self.default_interval is None:
            common = Counter(self.intervals.values()).most_common(1)
            self.default_interval = common[0][0] if common else 0.0
        return self.default_interval

    def expr(self, name: str) -> str:
        return QUERIES[name].replace("{w}", self.grid.window)


def read_series(prom: Prometheus, grid: Grid, span_points: int = SPAN_POINTS,
                timeout: float = QUERY_TIMEOUT_S, names: list[str] | None = None,
                exprs: dict[str, str] | None = None, whole: bool = True) -> dict[str, list[Series]]:
    """Every query of QUERIES (or ``names``, or ``exprs``: name -> PromQL) over the grid,
    PARALLEL_QUERIES at a time: those of which the sums keep every window cut into spans (the
    module's docstring); those of which they keep a series' latest point or its total as one
    instant query over the whole range (``whole``), the jobs that one cannot answer
    (``ambiguous``) then read window by window. The first failure is raised as its one line
    and the queries not yet sent are not sent."""
    cut = spans(grid, span_points)
    out: dict[str, list[Series]] = {}
    todo = exprs or {name: QUERIES[name] for name in (names or list(QUERIES))}
    at_once = {n for n in todo if whole and KEEP[n] in ("last", "sum")}
    with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:
        futures = {name: ([pool.submit(whole_query, prom, expr, grid, timeout)] if name in at_once else
                          [pool.submit(range_query, prom, expr.replace("{w}", grid.window),
                                       a, b, grid.step_ms, timeout, KEEP[name]) for a, b in cut])
                   for name, expr in todo.items()}
        try:
            for name, futs in futures.items():
                # an instant answer is one point a series already: nothing to join or reduce
                out[name] = (futs[0].result() if name in at_once
                             else keep(join([f.result() for f in futs]), KEEP[name]))
                futs.clear()
        except PrometheusUnavailable:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    for name in sorted(at_once):
        jobs = sorted(ambiguous(name, out[name]))
        if not jobs:
            continue
        expr = todo[name] if len(jobs) > MAX_REREAD_JOBS else for_jobs(todo[name], jobs)
        again = read_series(prom, grid, span_points, timeout, exprs={name: expr}, whole=False)[name]
        chosen = set(jobs)
        out[name] = ([s for s in out[name] if s.labels.get("job_id", "") not in chosen]
                     + [s for s in again if s.labels.get("job_id", "") in chosen])
    return out


def job_series_url(base: str, start: float, end: float, job_id: str) -> str:
    """The Prometheus graph of one job's own series over the range (its GPUs' SM activity and
    its MFU, one panel): the one template every job link on the page comes from."""
    sel = job_id.replace("\\", "\\\\").replace('"', '\\"')
    expr = f'{{job_id="{sel}",__name__=~"{c.GPU_SM_ACTIVITY}|{c.JOB_MFU}"}}'
    q = urllib.parse.urlencode({"g0.expr": expr, "g0.tab": "0",
                                "g0.range_input": f"{max(1, round(end - start))}s",
                                "g0.end_input": _iso(end)})
    return f"{base}/graph?{q}"


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
