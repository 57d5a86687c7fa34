"""The fleet's GPU-hours from the windows' sample counts: pure sums, no I/O (``fleet_query``
reads Prometheus, ``fleet_slurm`` asks Slurm).

Definitions (docs/fleet.md says the same to the reader):

- a **GPU-second** is a GPU in a stored sample (``gpudiag_gpus_held``, or ``gpudiag_gpu_up`` from
  older agents) times its target's scrape interval: exact at any range, since a sample is
  counted once, in the one window it is in;
- a job is **signalled** when it ran under gpudiag: it reported (any ``gpudiag_job_*`` signal)
  in the range, with or without an MFU. Its GPU-hours split into those with an MFU at the time
  (**useful** = those x the MFU) and those without one (**no MFU**: a job without matmuls, or
  before its first report). A job that never reported holds **no signal** GPU-hours, and is
  still attributed (its Slurm account and user, or the uid its node saw running it);
- **idle**: the job's GPUs the agent counted idle at each scrape (``gpudiag_gpus_idle``);
- **stalled**: held by a job while it finished no step (``gpudiag_job_stalled_seconds``: a
  sample of value s at t says the job has been stalled since t - s, so the stretch is dated back
  to its last step, not to when its limit ran out). They count at MFU 0 whatever MFU series the
  agent still had, are left out of the job's MFU (and so of its class' median), and are all lost,
  with their cause;
- a job's **loss** per cause (``job_losses``) and its **fix** (``fix_gpu_hours``): what the
  page ranks. Every per-job number is made in ``_job_row``, the one place a new category
  (a stall) joins the accounting.

Several owners reporting one job id on one node (only a forged signal does that) count at the
lowest MFU: useful work is never overstated.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudiag.live.fleet_model import (
    NO_JOB,
    NO_LABEL,
    NO_SIGNAL,
    STALLED,
    UNATTRIBUTED,
    WEEK_S,
    Coverage,
    FleetSummary,
    JobRow,
    Period,
    Totals,
)
from gpudiag.live.fleet_query import QUERIES, FleetData, Grid, Series
from gpudiag.live.fleet_report import fixes_of, groups, label_mix, most_lost, nodes_of
from gpudiag.live.fleet_stalls import Spans, stall_spans, stalled_in

SLURM_PREFIX = "slurm:"


@dataclass(frozen=True)
class SlurmJob:
    """Who ran a Slurm job, as Slurm says (``fleet_slurm``)."""

    user: str
    account: str


@dataclass
class _Held:
    """One job's GPU time per window (keyed by the window's end, as Prometheus gives it: every
    query of one read answers on the same instants), over all its nodes."""

    nodes: set[str] = field(default_factory=set)
    held: dict[float, float] = field(default_factory=lambda: defaultdict(float))      # GPU-seconds
    presence: dict[float, float] = field(default_factory=lambda: defaultdict(float))  # seconds
    idle_s: float = 0.0


def size_class(gpus: int) -> str:
    """1, 2, 3-4, 5-8, 9-16, ...: jobs compared with jobs of their power-of-two size."""
    if gpus <= 2:
        return str(max(gpus, 1))
    hi = 1 << (gpus - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


@dataclass
class _Node:
    """One node's GPU time: per job ("" = no job), its GPUs at each window, its idle time."""

    held: dict[str, float] = field(default_factory=lambda: defaultdict(float))      # GPU-seconds
    gpus_at: dict[float, float] = field(default_factory=lambda: defaultdict(float))
    idle_s: float = 0.0


def held_time(data: FleetData) -> tuple[dict[str, _Held], dict[str, _Held], dict[str, _Node]]:
    """(job -> its GPU time, instance -> the GPU time no job held there, instance -> its node
    totals), in one pass over the GPU series."""
    ivl = data.interval
    jobs: dict[str, _Held] = defaultdict(_Held)
    free: dict[str, _Held] = defaultdict(_Held)
    nodes: dict[str, _Node] = defaultdict(_Node)
    present: dict[tuple[str, str], dict[float, float]] = {}
    for s in data.series.get("gpu_presence", []):
        inst, job = s.labels.get("instance", ""), s.labels.get("job_id", "")
        acc, sec = (jobs[job] if job else free[inst]), ivl(inst)
        mine = present[(inst, job)] = dict(s.points)
        pres = acc.presence
        for k, n in mine.items():
            if n * sec > pres[k]:
                pres[k] = n * sec
    for s in data.series.get("gpu_samples", []):
        inst, job = s.labels.get("instance", ""), s.labels.get("job_id", "")
        acc, sec, node = (jobs[job] if job else free[inst]), ivl(inst), nodes[inst]
        acc.nodes.add(inst)
        held, mine, gpus_at = acc.held, present.get((inst, job), {}), node.gpus_at
        total = 0.0
        for t, n in s.points:
            held[t] += n * sec
            total += n
            p = mine.get(t, 0.0)
            if p > 0:
                gpus_at[t] += round(n / p)
        node.held[job] += total * sec
    for s in data.series.get("idle_samples", []):
        inst, job = s.labels.get("instance", ""), s.labels.get("job_id", "")
        if job:
            idle = sum(v for _, v in s.points) * ivl(inst)
            jobs[job].idle_s += idle
            nodes[inst].idle_s += idle
    return dict(jobs), dict(free), dict(nodes)


def job_mfu(data: FleetData) -> dict[str, dict[float, tuple[float, float]]]:
    """job -> window -> (its mean MFU in the window, seconds of the window it had one): the
    one place the MFU series are read. A job's MFU is the job's, whichever node took its
    signals: it applies to its GPUs on every node. Several owners or nodes: the lowest."""
    seconds: dict[tuple[Any, ...], dict[float, float]] = {}
    for s in data.series.get("mfu_samples", []):
        seconds[tuple(sorted(s.labels.items()))] = dict(s.points)
    out: dict[str, dict[float, tuple[float, float]]] = defaultdict(dict)
    for s in data.series.get("mfu_mean", []):
        inst, job = s.labels.get("instance", ""), s.labels.get("job_id", "")
        counts, sec, mine = seconds.get(tuple(sorted(s.labels.items())), {}), data.interval(inst), out[job]
        for t, v in s.points:
            cur = mine.get(t)
            if cur is None or v < cur[0]:
                mine[t] = (v, counts.get(t, 0.0) * sec)
    return out


def _label_seconds(data: FleetData) -> dict[str, dict[float, dict[str, float]]]:
    out: dict[str, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for s in data.series.get("label_samples", []):
        inst, job, label = (s.labels.get(x, "") for x in ("instance", "job_id", "label"))
        sec, mine = data.interval(inst), out[job]
        for t, n in s.points:
            cell = mine[t]
            cell[label] = max(cell.get(label, 0.0), n * sec)
    return out


def latest(series: list[Series], label: str | None = None) -> dict[str, tuple[float, str | float, str]]:
    """job -> (time, the label's value or the point's value, owner_uid) of its latest point."""
    out: dict[str, tuple[float, str | float, str]] = {}
    for s in series:
        if not s.points:
            continue
        job = s.labels.get("job_id", "")
        t, v = s.points[-1]
        if job not in out or t > out[job][0]:
            out[job] = (t, s.labels.get(label, "") if label else v, s.labels.get("owner_uid", ""))
    return out


def slurm_ids(data: FleetData) -> set[str]:
    """The Slurm job ids whose user or team the agents' series do not name (``fleet_slurm``
    looks them up)."""
    named = set(latest(data.series.get("user", []), "user")) & \
        set(latest(data.series.get("team", []), "team"))
    jobs = {s.labels.get("job_id", "") for s in data.series.get("gpu_samples", [])}
    return {j[len(SLURM_PREFIX):] for j in jobs - named if j.startswith(SLURM_PREFIX)}


@dataclass
class _Facts:
    """What the signals, Slurm and the nodes say about each job: looked up once per summary."""

    signalled: set[str]
    last: dict[str, dict[str, tuple[float, str | float, str]]]
    slurm: dict[str, SlurmJob]


def _facts(data: FleetData, slurm: dict[str, SlurmJob]) -> _Facts:
    last = {name: latest(data.series.get(name, []), name if name in ("action", "team", "user") else None)
            for name in ("confidence", "step", "predicted", "action", "team", "user")}
    last["label"] = latest(data.series.get("label_samples", []), "label")
    last["holder"] = latest(data.series.get("holder", []), "user")
    last["signal"] = latest(data.series.get("signal_samples", []))
    signalled = set(last["signal"]) | set(last["label"]) | {
        s.labels.get("job_id", "") for s in data.series.get("mfu_samples", []) if s.points}
    return _Facts(signalled, last, slurm)


def attribute(job: str, f: _Facts) -> tuple[str, str, str, str]:
    """(user, its source, team, its source): the job's signals first (the kernel's word on
    who wrote them), then Slurm (``squeue``/``sacct``), then the uid its node saw running it."""
    sj = f.slurm.get(job[len(SLURM_PREFIX):]) if job.startswith(SLURM_PREFIX) else None
    user, src = UNATTRIBUTED, ""
    sig_uid = f.last["signal"].get(job, (0, 0, ""))[2]
    holder = f.last["holder"].get(job)
    for name, source in ((f.last["user"].get(job, (0, "", ""))[1], "signal"),
                         (sj.user if sj else "", "slurm"), (holder[1] if holder else "", "node"),
                         (f"uid {sig_uid}" if sig_uid else "", "signal"),
                         (f"uid {holder[2]}" if holder and holder[2] else "", "node")):
        if name:
            user, src = str(name), source
            break
    team, tsrc = UNATTRIBUTED, ""
    if job in f.last["team"]:
        team, tsrc = str(f.last["team"][job][1]), "signal"
    elif sj is not None and sj.account:
        team, tsrc = sj.account, "slurm"
    return user, src, team, tsrc


@dataclass
class _Tally:
    """A job's GPU-seconds over its windows, by what they were spent on."""

    useful: float
    with_mfu: float
    no_mfu: float
    no_signal: float
    stalled: float
    causes: dict[str, float]
    gpus: int


def _job_row(job: str, h: _Held, mfu: dict[float, tuple[float, float]], labels: dict[float, dict[str, float]],
             f: _Facts, mix: dict[float, dict[str, float]], grid: Grid, stalls: Spans) -> JobRow:
    """Every per-job number: its windows' GPU time split into stalled, with an MFU, without one
    and without a signal, by label too (``mix`` gets the split per window), then the job's row."""
    signalled = job in f.signalled
    return _row(job, h, f, signalled, _windows(h, mfu, labels, signalled, mix, grid, stalls))


def _windows(h: _Held, mfu: dict[float, tuple[float, float]], labels: dict[float, dict[str, float]],
             signalled: bool, mix: dict[float, dict[str, float]], grid: Grid, stalls: Spans) -> _Tally:
    """The job's windows, each split into stalled, with an MFU, without one and without a signal
    (and by label, into ``mix``). A new category is one more share of a window here."""
    useful = with_mfu = no_mfu = no_signal = stalled = 0.0
    causes: dict[str, float] = defaultdict(float)
    gpus = 0
    presence, step, rest = h.presence, grid.step, NO_LABEL if signalled else NO_SIGNAL
    none, no_labels = (0.0, 0.0), dict[str, float]()
    for t, held in h.held.items():     # once per window of every job: kept to plain arithmetic
        pres = presence.get(t, 0.0)
        mean, secs = mfu.get(t, none)
        if pres > 0:
            g = round(held / pres)
            if g > gpus:
                gpus = g
            cover = min(1.0, secs / pres)
        else:
            cover = 0.0
        if stalls:
            stuck, cause = stalled_in(stalls, t - step, t)
            stuck = min(1.0, stuck / pres) if pres > 0 else 0.0
            if stuck > 0:
                stalled += held * stuck
                causes[cause or "unknown"] += held * stuck
        else:
            stuck = 0.0
        # the MFU counts where the job ran: not while stalled, whatever MFU it still exported (an
        # agent keeps a job's last MFU until it finds the stall, dated back to the last step)
        running = max(0.0, cover - stuck)
        useful += held * running * mean
        with_mfu += held * running
        if signalled:
            no_mfu += held * (1 - max(cover, stuck))
        else:
            no_signal += held
        labs = labels.get(t, no_labels)
        cell = mix[t]
        if labs:
            tot = sum(labs.values())
            shown = min(1.0 - stuck, tot / pres) if pres > 0 and tot > 0 else 0.0
            for lab, secs_l in labs.items():
                cell[lab] += held * shown * secs_l / tot
        else:
            shown = 0.0
        cell[STALLED] += held * stuck
        cell[rest] += held * (1 - stuck - shown)
    return _Tally(useful, with_mfu, no_mfu, no_signal, stalled, causes, gpus)


def _row(job: str, h: _Held, f: _Facts, signalled: bool, w: _Tally) -> JobRow:
    """The job's row: its tally in hours, who it belongs to, its last signal's values."""
    user, usrc, team, tsrc = attribute(job, f)
    last = f.last

    def val(name: str) -> float | None:
        return float(last[name][job][1]) if job in last[name] else None

    def text(name: str) -> str | None:
        return str(last[name][job][1]) if job in last[name] else None

    ks = sorted(h.held)
    row = JobRow(job_id=job, user=user, user_source=usrc, team=team, team_source=tsrc,
                 nodes=sorted(h.nodes), gpus=w.gpus, size_class=size_class(w.gpus), signalled=signalled,
                 gpu_hours=sum(h.held.values()) / 3600, useful_gpu_hours=w.useful / 3600,
                 mfu_gpu_hours=w.with_mfu / 3600, no_mfu_gpu_hours=w.no_mfu / 3600,
                 no_signal_gpu_hours=w.no_signal / 3600, idle_gpu_hours=h.idle_s / 3600,
                 stalled_gpu_hours=w.stalled / 3600,
                 stall_cause=max(w.causes, key=w.causes.__getitem__) if w.causes else None,
                 mfu=w.useful / w.with_mfu if w.with_mfu > 0 else None, label=text("label"),
                 confidence=val("confidence"), step_s=val("step"), action=text("action"),
                 predicted_step_s=val("predicted"), first_seen=ks[0] if ks else 0.0,
                 last_seen=ks[-1] if ks else 0.0)
    row.fix_gpu_hours = fix_gpu_hours(row)
    return row


def fix_gpu_hours(r: JobRow) -> float:
    """The job's GPU-hours x the share of its step its top recommendation predicts saving."""
    if r.step_s is None or r.predicted_step_s is None or r.step_s <= 0 or r.action is None:
        return 0.0
    return r.gpu_hours * max(0.0, 1.0 - max(r.predicted_step_s, 0.0) / r.step_s)


def job_losses(r: JobRow) -> dict[str, float]:
    """GPU-hours a job lost, by cause (fleet_model.LOSS_CAUSES); ``lost`` weighs them."""
    out = {}
    if r.stalled_gpu_hours > 0:
        out["stalled"] = r.stalled_gpu_hours
    if r.idle_gpu_hours > 0:
        out["idle"] = r.idle_gpu_hours
    if r.mfu is not None and r.class_median_mfu and r.mfu < r.class_median_mfu:
        out["below_peers"] = r.mfu_gpu_hours * (1 - r.mfu / r.class_median_mfu)
    if r.fix_gpu_hours > 0:
        out["fixable"] = r.fix_gpu_hours
    return out


def lost(losses: dict[str, float]) -> tuple[float, str | None]:
    """(GPU-hours lost, the cause of most of them): the stalled hours and those run below the
    peers are disjoint and add up; idle hours and a fix's win overlap them, so the largest of
    the three stands."""
    ran = losses.get("stalled", 0.0) + losses.get("below_peers", 0.0)
    ran_cause = max(("stalled", "below_peers"), key=lambda c: losses.get(c, 0.0))
    best = max(((ran, ran_cause), (losses.get("idle", 0.0), "idle"), (losses.get("fixable", 0.0), "fixable")),
               key=lambda x: x[0])
    return (best[0], best[1]) if best[0] > 0 else (0.0, None)


def _rank_losses(rows: list[JobRow]) -> None:
    by_class: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.mfu is not None:
            by_class[r.size_class].append(r.mfu)
    medians = {c: statistics.median(v) for c, v in by_class.items()}   # once a class: 13,000 jobs
    for r in rows:
        r.class_median_mfu = medians.get(r.size_class) if r.mfu is not None else None
        r.losses = job_losses(r)
        r.lost_gpu_hours, r.lost_cause = lost(r.losses)


def coverage(data: FleetData) -> Coverage:
    index = data.grid.indexer()
    held_at = {t for s in data.series.get("gpu_samples", []) for t, n in s.points if n > 0}
    ks = sorted({index(t) for t in held_at})
    g = data.grid
    at = [g.first + k * g.step for k in range(g.n)]
    gaps = [(at[a + 1], at[b - 1]) for a, b in zip(ks, ks[1:], strict=False) if b - a > 1]
    return Coverage(at[ks[0]] if ks else None, at[ks[-1]] if ks else None, len(ks), g.n, gaps)


def summarise(data: FleetData, slurm: dict[str, SlurmJob] | None = None,
              previous: FleetSummary | None = None, notes: Iterable[str] = ()) -> FleetSummary:
    jobs, free, per_node = held_time(data)
    mfu, labels, f = job_mfu(data), _label_seconds(data), _facts(data, slurm or {})
    stalls = stall_spans(data.series.get("stalled", []), data.series.get("last_step", []))
    mix: dict[float, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = [_job_row(j, h, mfu.get(j, {}), labels.get(j, {}), f, mix, data.grid, stalls.get(j, []))
            for j, h in jobs.items()]
    for h in free.values():
        for k, v in h.held.items():
            mix[k][NO_JOB] += v
    _rank_losses(rows)
    rows.sort(key=lambda r: (-r.gpu_hours, r.job_id))
    g = data.grid
    nodes = nodes_of(rows, per_node, data)
    totals = Totals(
        gpu_hours=sum(r.gpu_hours for r in rows), useful_gpu_hours=sum(r.useful_gpu_hours for r in rows),
        mfu_gpu_hours=sum(r.mfu_gpu_hours for r in rows),
        no_mfu_gpu_hours=sum(r.no_mfu_gpu_hours for r in rows),
        no_signal_gpu_hours=sum(r.no_signal_gpu_hours for r in rows),
        idle_gpu_hours=sum(r.idle_gpu_hours for r in rows),
        stalled_gpu_hours=sum(r.stalled_gpu_hours for r in rows),
        unallocated_gpu_hours=sum(n.unallocated_gpu_hours for n in nodes),
        lost_gpu_hours=sum(r.lost_gpu_hours for r in rows), jobs=len(rows),
        signalled_jobs=sum(r.signalled for r in rows),
        teams=len({r.team for r in rows} - {UNATTRIBUTED}),
        users=len({r.user for r in rows} - {UNATTRIBUTED}),
        gpus_max=int(max((sum(x) for x in _by_window(per_node)), default=0)))
    teams, users = groups(rows, "team", previous), groups(rows, "user", previous)
    silent = [r for r in rows if not r.signalled]
    attribution = {src or "none": sum(1 for r in silent if r.user_source == src)
                   for src in ("slurm", "node", "")}
    return FleetSummary(
        prometheus=data.base, requested_start=data.requested[0], requested_end=data.requested[1],
        start=g.start, end=g.end, step_s=g.step, clipped_to_now=data.requested[1] > g.end + 1e-3,
        totals=totals, coverage=coverage(data), jobs=rows, teams=teams, users=users, nodes=nodes,
        fixes=fixes_of(rows, (g.end - g.start) / WEEK_S), most_lost=most_lost(rows),
        label_mix=label_mix(mix, g), scheduler=data.scheduler, scrape_intervals=dict(data.intervals),
        queries={n: data.expr(n) for n in QUERIES}, notes=list(notes),
        previous=(Period(previous.start, previous.end, previous.totals, previous.coverage)
                  if previous else None),
        attribution=attribution)


def _by_window(nodes: dict[str, _Node]) -> list[list[float]]:
    """Per window, each node's GPUs (held by a job or none)."""
    at: dict[float, list[float]] = defaultdict(list)
    for n in nodes.values():
        for k, g in n.gpus_at.items():
            at[k].append(g)
    return list(at.values())
