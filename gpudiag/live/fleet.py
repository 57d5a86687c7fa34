"""The fleet's GPU-hours from range-query answers: pure sums, no I/O (``fleet_query`` reads).

Definitions (docs/fleet.md says the same to the reader):

- a **GPU-second** is a GPU series (``gpudiag_gpu_up``) present at an evaluation instant, times
  the step; Prometheus marks a target's series stale when a scrape fails or a series leaves the
  exposition, so an agent that restarts leaves a gap, never a second copy, and no counter is
  read, so no counter reset can double anything. The sum is within one step of the truth per
  stretch of presence (a Riemann sum at the step).
- **useful GPU-hours** = GPU-hours x the job's MFU at the same instant. Where the job had no MFU
  series at that instant its GPU-hours are **no signal**: counted, never given a guessed MFU.
  Several owners reporting one job id on one node (only a forged signal does that) count at the
  lowest MFU: useful work is never overstated.
- **idle** GPU-hours: held by a job while below ``IDLE_ACTIVITY`` SM activity.
- **stalled** GPU-hours: held by a job while it finished no step (``gpudiag_job_stalled_seconds``:
  at an instant t with value s, the job has been stalled since t - s, so the stretch is dated
  back to its last step, not to when its limit ran out). They count at MFU 0 whatever MFU series
  the agent still had, and all of them are lost, with their cause.
- **lost** GPU-hours of a job: its stalled GPU-hours, plus its other signalled GPU-hours x
  (1 - its MFU while not stalled / the median of that MFU over the jobs of its size class), when
  below that median: the GPU-hours it would have saved running as well as its peers.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from gpudiag.live.fleet_query import QUERIES, FleetData, Series

TOP_WASTERS = 20
STALLED = "stalled"
NO_SIGNAL = "no signal"
NO_JOB = "no job"
UNKNOWN = "(unknown)"


@dataclass
class JobRow:
    job_id: str
    nodes: list[str]
    owner: str             # the login name of the uid behind the job's signals, "uid N", or UNKNOWN
    team: str              # the team its signals named, or UNKNOWN
    gpus: int              # most GPUs held at once (all nodes)
    size_class: str
    gpu_hours: float
    useful_gpu_hours: float
    no_signal_gpu_hours: float
    idle_gpu_hours: float
    mfu: float | None      # GPU-hour weighted over the signalled hours; None: no signal at all
    label: str | None      # the last label it reported
    confidence: float | None
    step_s: float | None
    action: str | None     # its top recommendation's id
    predicted_step_s: float | None
    lost_gpu_hours: float = 0.0
    class_median_mfu: float | None = None
    stalled_gpu_hours: float = 0.0   # held while it finished no step (counted at MFU 0, all lost)
    stall_cause: str | None = None   # the cause of its longest stall
    running_mfu: float | None = None  # over its signalled hours while not stalled (the class median's)


@dataclass
class Group:
    name: str
    jobs: int
    gpu_hours: float
    useful_gpu_hours: float
    no_signal_gpu_hours: float
    idle_gpu_hours: float


@dataclass
class FleetSummary:
    """Everything the page, the terminal and ``--json`` show: one source for all three."""

    prometheus: str
    start: float
    end: float
    step_s: float
    gpu_hours: float          # GPU-hours held by jobs
    useful_gpu_hours: float
    no_signal_gpu_hours: float
    idle_gpu_hours: float     # held by a job while idle
    unallocated_gpu_hours: float  # GPUs no job held
    gpus_max: int
    jobs: list[JobRow]
    teams: list[Group]
    users: list[Group]
    wasters: list[JobRow]
    label_mix: dict[str, list[float]]   # label -> GPUs at each instant of ``times``
    times: list[float]
    scheduler: list[dict]
    gaps: list[tuple[float, float]] = field(default_factory=list)  # no GPU series at all: no agent answered
    stalled_gpu_hours: float = 0.0   # held by jobs that finished no step
    queries: dict[str, str] = field(default_factory=dict)
    query_urls: dict[str, str] = field(default_factory=dict)

    @property
    def no_signal_share(self) -> float | None:
        return self.no_signal_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["no_signal_share"] = self.no_signal_share
        return d


def size_class(gpus: int) -> str:
    """1, 2, 3-4, 5-8, 9-16, ...: jobs compared with jobs of their power-of-two size."""
    if gpus <= 2:
        return str(max(gpus, 1))
    hi = 1 << (gpus - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def _by(series: list[Series], *keys: str) -> dict[tuple, dict[float, float]]:
    out: dict[tuple, dict[float, float]] = {}
    for s in series:
        k = tuple(s.labels.get(x, "") for x in keys)
        pts = out.setdefault(k, {})
        for t, v in s.points:
            pts[t] = v
    return out


def _last_label(series: list[Series], label: str) -> dict[str, tuple[float, str, str]]:
    """job_id -> (time, label value, owner) of the latest point of a labelled info series."""
    out: dict[str, tuple[float, str, str]] = {}
    for s in series:
        if not s.points:
            continue
        k = s.labels.get("job_id", "")
        t = s.points[-1][0]
        if k not in out or t > out[k][0]:
            out[k] = (t, s.labels.get(label, ""), s.labels.get("owner_uid", ""))
    return out


def _last_value(series: list[Series]) -> dict[str, tuple[float, float]]:
    """job_id -> (time, value) of its latest point on any node."""
    out: dict[str, tuple[float, float]] = {}
    for s in series:
        if s.points:
            j = s.labels.get("job_id", "")
            t, v = s.points[-1]
            if j not in out or t > out[j][0]:
                out[j] = (t, v)
    return out


def owner_name(uid: str, name: str) -> str:
    """How a job's owner reads on the page: the login name the node's agent gave for the uid
    that wrote the job's signals, else that uid, else UNKNOWN (a job that sent no signal)."""
    if name:
        return name
    return f"uid {uid}" if uid else UNKNOWN


def summarise(data: FleetData) -> FleetSummary:
    step_h = data.step / 3600.0
    gpus = _by(data.series.get("gpus", []), "instance", "job_id")
    idle = _by(data.series.get("idle_gpus", []), "instance", "job_id")
    mfu_owned = _by(data.series.get("mfu", []), "instance", "job_id", "owner_uid")
    # a job's MFU and label are the job's, whichever node's agent took its signals (rank 0's):
    # they apply to its GPUs on every node
    mfu: dict[str, dict[float, float]] = defaultdict(dict)
    for (_inst, job, _owner), pts in mfu_owned.items():
        for t, v in pts.items():
            cur = mfu[job].get(t)
            mfu[job][t] = v if cur is None else min(cur, v)   # never overstate
    labels_at: dict[tuple[str, float], str] = {}
    for s in data.series.get("label", []):
        for t, _ in s.points:
            labels_at[(s.labels.get("job_id", ""), t)] = s.labels.get("label", "")
    last_label = _last_label(data.series.get("label", []), "label")
    last_action = _last_label(data.series.get("action", []), "action")
    last_team = _last_label(data.series.get("team", []), "team")
    last_user = _last_label(data.series.get("user", []), "user")
    owners = {s.labels.get("job_id", ""): s.labels.get("owner_uid", "")
              for s in data.series.get("mfu", []) + data.series.get("step", [])}
    conf, step, pred = (_last_value(data.series.get(n, [])) for n in ("confidence", "step", "predicted"))
    stalls = _stall_spans(data.series.get("stalled", []))

    acc: dict[str, dict] = {}
    per_t: dict[float, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    unallocated = 0.0
    gpus_at: dict[float, float] = defaultdict(float)
    for (inst, job), pts in gpus.items():
        for t, n in pts.items():
            gpus_at[t] += n
        if job == "":
            unallocated += sum(pts.values()) * step_h
            for t, n in pts.items():
                per_t[t][NO_JOB] += n
            continue
        a = acc.setdefault(job, {"nodes": set(), "gpu_h": 0.0, "useful_h": 0.0, "nosig_h": 0.0,
                                 "idle_h": 0.0, "gpus_at": defaultdict(float), "stall_h": 0.0,
                                 "causes": defaultdict(float)})
        a["nodes"].add(inst)
        m = mfu.get(job, {})
        spans = stalls.get(job, [])
        for t, n in pts.items():
            a["gpu_h"] += n * step_h
            a["gpus_at"][t] += n
            cause = _stalled_at(spans, t)
            if cause is not None and t in m:   # a stall: no model work, whatever MFU was still exported
                a["stall_h"] += n * step_h
                a["causes"][cause] += n * step_h
                per_t[t][STALLED] += n
            elif t in m:
                a["useful_h"] += n * m[t] * step_h
                per_t[t][labels_at.get((job, t), NO_SIGNAL)] += n
            else:
                a["nosig_h"] += n * step_h
                per_t[t][NO_SIGNAL] += n
        a["idle_h"] += sum(idle.get((inst, job), {}).values()) * step_h

    rows = []
    for job, a in acc.items():
        signalled = a["gpu_h"] - a["nosig_h"]
        n_max = int(round(max(a["gpus_at"].values(), default=0)))
        lab, act, team, user = (t[job][1:] if job in t else None
                                for t in (last_label, last_action, last_team, last_user))
        rows.append(JobRow(
            job_id=job, nodes=sorted(a["nodes"]),
            owner=owner_name(owners.get(job, ""), user[0] if user else ""),
            team=team[0] if team else UNKNOWN, gpus=n_max, size_class=size_class(n_max),
            gpu_hours=a["gpu_h"], useful_gpu_hours=a["useful_h"], no_signal_gpu_hours=a["nosig_h"],
            idle_gpu_hours=a["idle_h"], mfu=a["useful_h"] / signalled if signalled > 0 else None,
            label=lab[0] if lab else None, confidence=conf[job][1] if job in conf else None,
            step_s=step[job][1] if job in step else None, action=act[0] if act else None,
            predicted_step_s=pred[job][1] if job in pred else None,
            stalled_gpu_hours=a["stall_h"],
            stall_cause=max(a["causes"], key=a["causes"].get) if a["causes"] else None,
            running_mfu=a["useful_h"] / (signalled - a["stall_h"]) if signalled - a["stall_h"] > 0 else None))

    by_class: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.running_mfu is not None:
            by_class[r.size_class].append(r.running_mfu)
    medians = {c: statistics.median(v) for c, v in by_class.items()}   # once a class: 13,000 jobs
    for r in rows:
        r.lost_gpu_hours = r.stalled_gpu_hours
        if r.running_mfu is None or r.size_class not in medians:
            continue
        r.class_median_mfu = medians[r.size_class]
        if r.class_median_mfu > 0 and r.running_mfu < r.class_median_mfu:
            running_h = r.gpu_hours - r.no_signal_gpu_hours - r.stalled_gpu_hours
            r.lost_gpu_hours += running_h * (1 - r.running_mfu / r.class_median_mfu)
    rows.sort(key=lambda r: (-r.gpu_hours, r.job_id))
    wasters = sorted((r for r in rows if r.lost_gpu_hours > 0), key=lambda r: -r.lost_gpu_hours)[:TOP_WASTERS]

    times = sorted(per_t)
    mix_names = sorted({k for v in per_t.values() for k in v})
    label_mix = {k: [per_t[t].get(k, 0.0) for t in times] for k in mix_names}
    return FleetSummary(
        prometheus=data.base, start=data.start, end=data.end, step_s=data.step,
        gpu_hours=sum(r.gpu_hours for r in rows), useful_gpu_hours=sum(r.useful_gpu_hours for r in rows),
        no_signal_gpu_hours=sum(r.no_signal_gpu_hours for r in rows),
        idle_gpu_hours=sum(r.idle_gpu_hours for r in rows), unallocated_gpu_hours=unallocated,
        gpus_max=int(round(max(gpus_at.values(), default=0))), jobs=rows,
        teams=_groups(rows, "team"), users=_groups(rows, "owner"), wasters=wasters,
        label_mix=label_mix, times=times, scheduler=_scheduler(data.series.get("scheduler", [])),
        gaps=_gaps(times, data.start, data.step), stalled_gpu_hours=sum(r.stalled_gpu_hours for r in rows),
        queries=dict(QUERIES), query_urls={n: data.query_url(n) for n in QUERIES})


Spans = list[tuple[float, float, str]]


def _stall_spans(series: list[Series]) -> dict[str, Spans]:
    """job_id -> its stalled stretches (since, until, cause), disjoint and in order: a point
    (t, s) of the stalled series says the job had finished no step since t - s."""
    raw: dict[str, Spans] = defaultdict(list)
    for s in series:
        for t, v in s.points:
            raw[s.labels.get("job_id", "")].append((t - v, t, s.labels.get("cause", "") or "unknown"))
    out: dict[str, Spans] = {}
    for job, spans in raw.items():
        merged: Spans = []
        for lo, hi, cause in sorted(spans):
            if merged and lo <= merged[-1][1]:
                if hi > merged[-1][1]:   # the later point's cause: the verdict, once it was known
                    merged[-1] = (merged[-1][0], hi, cause)
            else:
                merged.append((lo, hi, cause))
        out[job] = merged
    return out


def _stalled_at(spans: Spans, t: float) -> str | None:
    """The cause of a stall the job was in at ``t`` (None: it was not stalled then)."""
    i = bisect.bisect_left(spans, (t,)) - 1
    for lo, hi, cause in spans[max(0, i):i + 2]:
        if lo < t <= hi:
            return cause
    return None


def _gaps(times: list[float], start: float, step: float) -> list[tuple[float, float]]:
    """Stretches between the first and last instant with no GPU series at all (every agent
    down, or Prometheus not scraping): (first missing instant, last missing instant)."""
    idx = sorted({round((t - start) / step) for t in times})
    return [(start + (a + 1) * step, start + (b - 1) * step)
            for a, b in zip(idx, idx[1:], strict=False) if b - a > 1]


def _groups(rows: list[JobRow], attr: str) -> list[Group]:
    out: dict[str, Group] = {}
    for r in rows:
        g = out.setdefault(getattr(r, attr), Group(getattr(r, attr), 0, 0.0, 0.0, 0.0, 0.0))
        g.jobs += 1
        g.gpu_hours += r.gpu_hours
        g.useful_gpu_hours += r.useful_gpu_hours
        g.no_signal_gpu_hours += r.no_signal_gpu_hours
        g.idle_gpu_hours += r.idle_gpu_hours
    return sorted(out.values(), key=lambda g: (-g.gpu_hours, g.name))


def _scheduler(series: list[Series]) -> list[dict]:
    """Each exported scheduler counter's increase over the range; a drop is a reset (the
    scheduler restarted), after which its new value is all new counts."""
    out = []
    for s in series:
        total, prev = 0.0, None
        for _, v in s.points:
            if prev is not None:
                total += v - prev if v >= prev else v
            prev = v
        if not math.isfinite(total):
            continue
        out.append({"metric": s.labels.get("__name__", ""), "action": s.labels.get("action", ""),
                    "tier": s.labels.get("tier", ""), "count": total})
    return sorted(out, key=lambda d: (d["metric"], d["action"], d["tier"]))
