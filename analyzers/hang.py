"""The verdict of a stall: which rank holds the job, in which collective, where, for how long. Pure.

From an incident's ``Evidence`` (``gpudiag/incident.py``), in this order:

1. **desync / mismatch**: the first collective (same process group, same sequence number) that
   the ranks called differently: another op (``rank 1 called broadcast where the others called
   all_reduce, #77``) or the same op on another shape (gloo aborts the process there; NCCL
   hangs or corrupts). The majority is the expectation; with a tie, the rank whose step holds
   one collective fewer than the others' skipped one.
2. **hung** (the wavefront, as NVIDIA's resiliency tools read Flight Recorder dumps): in a
   process group, the ranks that never entered the collective the others wait in, and where each
   of them is: its main thread's own line, or, where that thread waits for its DataLoader, the
   worker's; what the kernel says it waits on (a read, a lock, a sleep); for how long. A culprit
   whose threads wait for each other's locks is a **deadlock**; one whose process is gone,
   **exited**.
3. No collective pending: **deadlock** where a process's own threads wait on each other's locks,
   **idle** where no process of the job used the CPU (IDLE_CORES) or the GPUs (GPU_IDLE), and
   **busy** otherwise (an unmarked eval, a loop that never ends a step).

Each source of records is compared only with itself: the Flight Recorder (every collective,
DDP's too) where every rank answered, else the black boxes (the Python API's calls; they
outlive a crash).
"""

from __future__ import annotations

import re
from collections import Counter

from gpudiag.incident import (
    Collective,
    Evidence,
    Frame,
    ProcessInfo,
    RankState,
    ThreadStack,
    Verdict,
    WaveRow,
    user_frame,
)

IDLE_CORES = 0.05   # a job using under 5% of a core over the window is not computing
GPU_IDLE = 0.05     # as ``gpudiag fleet``'s idle GPU: under 5% activity
_LOCK_LINE = re.compile(r"^\s*with\s+[^:]+:\s*(#.*)?$|\.acquire\(")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\(")
WAITS = {"read": "waiting on a read", "pread64": "waiting on a read", "readv": "waiting on a read",
         "recvfrom": "waiting on a network receive", "recvmsg": "waiting on a network receive",
         "futex": "waiting on a lock or condition", "poll": "waiting for I/O", "ppoll": "waiting for I/O",
         "select": "waiting for I/O", "pselect6": "waiting for I/O", "epoll_wait": "waiting for I/O",
         "epoll_pwait": "waiting for I/O", "nanosleep": "sleeping", "clock_nanosleep": "sleeping",
         "wait4": "waiting for a child process", "accept": "waiting for a connection",
         "accept4": "waiting for a connection", "write": "waiting on a write", "running": "running on a CPU"}


def group_name(pg: str | None, desc: str = "") -> str:
    if pg in (None, "0", "default_pg"):
        return "default group"
    return f"group {pg}" + (f" ({desc})" if desc and desc not in ("undefined", "") else "")


def _ranks(rs: list[int]) -> str:
    if not rs:
        return "no rank"
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, sorted(rs)))


def _wait(rs: list[int]) -> str:
    """"rank 0 waits", "ranks 0, 2 wait"."""
    return f"{_ranks(rs)} {'waits' if len(rs) == 1 else 'wait'}"


def _user(frames: list[Frame]) -> Frame | None:
    return user_frame(frames)


def _where(fr: Frame | None) -> str | None:
    return None if fr is None else fr.where()


def _call(fr: Frame | None) -> str | None:
    """What the job's line calls (``time.sleep`` in ``time.sleep(3600)``), where it can be read."""
    m = _CALL.search(fr.code) if fr is not None and fr.code else None
    return m.group(1) if m else None


def _main(p: ProcessInfo) -> ThreadStack | None:
    return next((t for t in p.threads if t.main), p.threads[-1] if p.threads else None)


# -- sources --------------------------------------------------------------------------------------

def _groups(ev: Evidence) -> dict[str, dict[int, list[Collective]]]:
    """pg -> rank -> its records of one source, by seq: the Flight Recorder where every rank with
    a record of the group has one there, else the black boxes."""
    out: dict[str, dict[int, list[Collective]]] = {}
    pgs = {c.pg for r in ev.ranks for c in r.collectives}
    for pg in sorted(pgs):
        by: dict[str, dict[int, list[Collective]]] = {"flight recorder": {}, "black box": {}}
        for r in ev.ranks:
            for c in r.collectives:
                if c.pg == pg:
                    by[c.source].setdefault(r.rank, []).append(c)
        fr, bb = by["flight recorder"], by["black box"]
        use = fr if fr and set(bb) <= set(fr) else bb
        out[pg] = {rank: sorted(recs, key=lambda c: c.seq) for rank, recs in use.items()}
    return out


def _status(r: RankState, pg: str, recs: list[Collective]) -> tuple[int, int]:
    """(last entered, last completed) seq of a rank in a group."""
    entered = max((c.seq for c in recs), default=0)
    done = max((c.seq for c in recs if c.state in ("completed", "issued (async)")), default=0)
    st = r.fr_status.get(pg) if recs and recs[0].source == "flight recorder" else None
    if st:
        entered = max(entered, st.get("last_enqueued_collective", entered))
        done = max(done, st.get("last_completed_collective", done))
    return entered, done


# -- 1. desync / mismatch -------------------------------------------------------------------------

def _divergence(ev: Evidence, groups: dict[str, dict[int, list[Collective]]]) -> Verdict | None:
    by_rank = {r.rank: r for r in ev.ranks}
    for pg, ranks in groups.items():
        if len(ranks) < 2:
            continue
        seqs = set.intersection(*({c.seq for c in recs} for recs in ranks.values()))
        for seq in sorted(seqs):
            at = {rank: next(c for c in recs if c.seq == seq) for rank, recs in ranks.items()}
            ops = {rank: c.op for rank, c in at.items()}
            shapes = {rank: c.shape for rank, c in at.items()}
            if len(set(ops.values())) > 1:
                return _desync(ev, pg, seq, at, ops, groups[pg], by_rank)
            if len(set(shapes.values())) > 1:
                return _mismatch(ev, pg, seq, at, shapes, ranks, by_rank)
    return None


def _minority(values: dict[int, str]) -> tuple[list[int], str | None]:
    """(the ranks that differ from the majority, the majority's value); no majority: ([], None)."""
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return [], None
    want = counts[0][0]
    return sorted(r for r, v in values.items() if v != want), want


def _step_ops(recs: list[Collective], step: int | None) -> list[str]:
    return [c.op for c in recs if step is not None and c.step == step]


def _desync(ev: Evidence, pg: str, seq: int, at: dict[int, Collective], ops: dict[int, str],
            ranks: dict[int, list[Collective]], by_rank: dict[int, RankState]) -> Verdict:
    culprits, want = _minority(ops)
    if not culprits:   # a tie: the rank whose step holds one collective fewer skipped one
        steps = {r: _step_ops(ranks[r], at[r].step) for r in at}
        short = [r for r in at if any(len(steps[r]) < len(steps[o]) for o in at if o != r)]
        if len(short) == 1:
            culprits = short
            want = next(ops[o] for o in at if o not in short)
    g = group_name(pg, at[min(at)].pg_desc)
    if culprits:
        c = culprits[0]
        head = f"desync: {_ranks(culprits)} called {ops[c]} where the others called {want}, #{seq} ({g})"
    else:
        head = f"desync at #{seq} ({g}): " + "; ".join(f"rank {r} called {o}" for r, o in sorted(ops.items()))
    details = []
    for c in culprits:
        step = at[c].step
        mine = _step_ops(ranks[c], step)
        other = next((_step_ops(ranks[o], at[o].step) for o in at if o not in culprits), [])
        missing = [o for o in other if o not in mine] if len(mine) < len(other) else []
        if missing:
            details.append(f"rank {c} skipped {missing[0]} in step {step}: its step called "
                           f"{', '.join(mine) or 'nothing'} where the others called {', '.join(other)}")
        fr = at[c].where
        if fr is not None:
            details.append(f"rank {c} called it at {fr.where()}" + (f": `{fr.code}`" if fr.code else ""))
    waiting = sorted(r for r in at if r not in culprits and at[r].state == "in flight")
    v = Verdict(kind="desync", headline=head, details=details, culprits=culprits, waiting=waiting, pg=pg,
                seq=seq, op=want, wavefront=_wave_rows(ev, pg, ranks, by_rank))
    _add_wait(v, at, ev.detected_at)
    return v


def _mismatch(ev: Evidence, pg: str, seq: int, at: dict[int, Collective], shapes: dict[int, str],
              ranks: dict[int, list[Collective]], by_rank: dict[int, RankState]) -> Verdict:
    culprits, want = _minority(shapes)
    op = at[min(at)].op
    g = group_name(pg, at[min(at)].pg_desc)
    if culprits:
        got = ", ".join(f"rank {c}: [{shapes[c]}]" for c in culprits)
        head = (f"mismatch: {op} #{seq} ({g}) got a tensor of another shape on {got}, "
                f"where the others have [{want}]")
    else:
        head = f"mismatch: {op} #{seq} ({g}) got tensors of different shapes: " + "; ".join(
            f"rank {r}: [{s}]" for r, s in sorted(shapes.items()))
    details = []
    for r in sorted(at):
        p = by_rank[r].processes[0] if by_rank[r].processes else None
        if p is not None and p.crash:
            details.append(f"rank {r} died in it: {p.crash}")
        fr = _user(_main(p).frames) if p is not None and _main(p) is not None else at[r].where
        if fr is not None and r in (culprits or at):
            details.append(f"rank {r} called it at {fr.where()}" + (f": `{fr.code}`" if fr.code else ""))
    return Verdict(kind="mismatch", headline=head, details=details, culprits=culprits, pg=pg, seq=seq, op=op,
                   wavefront=_wave_rows(ev, pg, ranks, by_rank))


# -- 2. the wavefront -------------------------------------------------------------------------------

def _wave_rows(ev: Evidence, pg: str, ranks: dict[int, list[Collective]],
               by_rank: dict[int, RankState]) -> list[WaveRow]:
    rows = []
    places = {r: _status(by_rank[r], pg, recs) for r, recs in ranks.items() if r in by_rank}
    front = max((e for e, _ in places.values()), default=0)
    for r, (entered, done) in sorted(places.items()):
        rec = next((c for c in ranks[r] if c.seq == entered), None)
        if not by_rank[r].alive and ev.source != "exit":
            state = "gone"
        elif entered < front:
            state = "behind"
        elif done < entered:
            state = "waiting"
        else:
            state = "idle"
        rows.append(WaveRow(pg=pg, rank=r, entered=entered, completed=done, op=rec.op if rec else "",
                            shape=rec.shape if rec else "", state=state,
                            for_s=ev.detected_at - rec.entered if rec and rec.entered and state == "waiting"
                            and ev.source != "exit" else None))
    return rows


def _add_wait(v: Verdict, at: dict[int, Collective], now: float) -> None:
    waits = [now - at[r].entered for r in v.waiting if at.get(r) and at[r].entered]
    if v.waiting and waits:
        v.details.append(f"{_wait(v.waiting)} in it ({max(waits):.0f} s)")
        v.numbers["waiting_s"] = round(max(waits), 3)


def _wavefront(ev: Evidence, groups: dict[str, dict[int, list[Collective]]]) -> Verdict | None:
    by_rank = {r.rank: r for r in ev.ranks}
    best: tuple[float, str, list[WaveRow]] | None = None
    for pg, ranks in groups.items():
        rows = _wave_rows(ev, pg, ranks, by_rank)
        if any(w.state == "behind" for w in rows) and any(w.state == "waiting" for w in rows):
            oldest = min((ev.detected_at - (w.for_s or 0) for w in rows if w.state == "waiting"), default=0.0)
            if best is None or oldest < best[0]:
                best = (oldest, pg, rows)
    if best is None:
        return None
    _, pg, rows = best
    front = max(w.entered for w in rows)
    front_row = next(w for w in rows if w.entered == front)
    culprits = [w.rank for w in rows if w.state == "behind"]
    waiting = [w.rank for w in rows if w.state == "waiting"]
    g = group_name(pg)
    wait_s = max((w.for_s or 0.0) for w in rows if w.state == "waiting")
    kind, details, where = "hung", [], None
    parts = []
    for c in culprits:
        k, place, more = _locate(by_rank[c], ev)
        details += more
        where = where or place
        if k != "hung":
            kind = k
        parts.append(place)
    places = parts[0] if len(parts) == 1 else "; ".join(
        f"rank {c}: {p}" for c, p in zip(culprits, parts, strict=True))
    head = (f"{kind}: {_ranks(culprits)} never entered {front_row.op} #{front} ({g}); {places}; "
            f"{_wait(waiting)} in that {front_row.op} ({wait_s:.0f} s)")
    return Verdict(kind=kind, headline=head, details=details, culprits=culprits, waiting=waiting, pg=pg,
                   seq=front, op=front_row.op, where=where, for_s=by_rank[culprits[0]].stalled_s,
                   wavefront=rows, numbers={"waiting_s": round(wait_s, 3)})


def _deadlock(p: ProcessInfo) -> list[ThreadStack]:
    """The job's own threads blocked at a lock (their innermost frame is the job's code, at a
    ``with ...:`` or ``.acquire(`` line, in a futex or with no CPU used): two or more wait on
    each other."""
    out = []
    for t in p.threads:
        fr = t.frames[0] if t.frames else None
        if fr is None or _user([fr]) is None or not _LOCK_LINE.search(fr.code or ""):
            continue
        if t.syscall not in (None, "futex") or (t.cpu_s or 0.0) > IDLE_CORES * (p.window_s or 1.0):
            continue
        out.append(t)
    return out if len(out) >= 2 else []


def _locate(r: RankState, ev: Evidence) -> tuple[str, str, list[str]]:
    """(kind, where the rank is in words, details) for a rank the others wait for."""
    stalled = f"for {r.stalled_s:.0f} s" if r.stalled_s is not None else ""
    if not r.alive:
        crash = next((p.crash for p in r.processes if p.crash), None)
        return "exited", f"its process is gone{' (' + crash + ')' if crash else ''}", []
    if not r.processes or not r.processes[0].threads:
        last = max(r.collectives, key=lambda c: (c.entered or 0.0, c.seq), default=None)
        if last is None:
            return "hung", f"no stack and no collective could be read from it {stalled}".strip(), []
        at = f", called at {last.where.where()}" if last.where is not None else ""
        return "hung", (f"its last collective was {last.op} #{last.seq} ({group_name(last.pg)}, "
                        f"{last.state}){at}; no stack was read from it"), []
    proc = r.processes[0]
    locked = _deadlock(proc)
    if locked:
        a, b = locked[0], locked[1]
        main = _main(proc)
        mf = _user(main.frames) if main else None
        details = [f"rank {r.rank}: thread {t.name!r} waits at {t.frames[0].where()}: `{t.frames[0].code}`"
                   for t in locked]
        if main is not None and main not in locked and mf is not None:
            details.append(f"rank {r.rank}: its main thread waits at {mf.where()}"
                           + (f": `{mf.code}`" if mf.code else ""))
        return ("deadlock", f"it is deadlocked: threads {a.name!r} ({a.frames[0].where()}) and {b.name!r} "
                f"({b.frames[0].where()}) wait for each other's lock {stalled}".strip(), details)
    main = _main(proc)
    frames = main.frames if main else []
    if any("/torch/utils/data/" in f.file for f in frames):
        for w in r.processes[1:]:
            wm = _main(w)
            wf = _user(wm.frames) if wm else None
            if wf is not None:
                word = WAITS.get(wm.syscall or "", "")
                return ("hung", f"it is in {wf.where()} (DataLoader worker pid {w.pid}), "
                        f"{word + ' ' if word else ''}{stalled}".strip(),
                        [f"rank {r.rank}: its main thread waits for its DataLoader at "
                         f"{_where(_user(frames)) or '?'}",
                         f"worker pid {w.pid}: `{wf.code}`" if wf.code else ""])
    fr = _user(frames)
    word = WAITS.get(main.syscall or "", "") if main else ""
    call = _call(fr)
    place = f"it is in {fr.where() if fr else '?'}" + (f" (`{call}`)" if call else "")
    return "hung", f"{place}, {word + ' ' if word else ''}{stalled}".strip().rstrip(","), []


# -- 3. nothing pending -----------------------------------------------------------------------------

def _nothing_pending(ev: Evidence) -> Verdict:
    for r in ev.ranks:
        for p in r.processes:
            locked = _deadlock(p)
            if locked:
                a, b = locked[0], locked[1]
                head = (f"deadlock: rank {r.rank}'s threads {a.name!r} ({a.frames[0].where()}) and "
                        f"{b.name!r} ({b.frames[0].where()}) wait for each other's lock; "
                        "no collective pending")
                return Verdict(kind="deadlock", culprits=[r.rank], where=a.frames[0].where(), headline=head,
                               for_s=r.stalled_s,
                               details=[f"thread {t.name!r}: `{t.frames[0].code}`" for t in locked])
    cores = {r.rank: sum((p.cpu_s or 0.0) / (p.window_s or 1.0) for p in r.processes) for r in ev.ranks}
    gpu = [g.sm_active if g.sm_active is not None else g.util for g in ev.gpus]
    gpu_busy = any(v is not None and v >= GPU_IDLE for v in gpu)
    mains = {r.rank: _main(r.processes[0]) if r.processes else None for r in ev.ranks}
    frames = {k: _user(t.frames) if t else None for k, t in mains.items()}
    first = next((f for f in frames.values() if f is not None), None)
    call = _call(first)
    at = f"`{call}` ({first.where()})" if call and first else (first.where() if first else "an unknown place")
    stalled = max((r.stalled_s or 0.0 for r in ev.ranks), default=0.0)
    numbers = {"job_cores": round(sum(cores.values()), 3), "stalled_s": round(stalled, 1)}
    if all(c < IDLE_CORES for c in cores.values()) and not gpu_busy:
        same = len({f.where() if f else None for f in frames.values()}) == 1
        head = (f"idle: all ranks idle, no collective pending, main thread in {at}" if same else
                "idle: all ranks idle, no collective pending; " + "; ".join(
                    f"rank {k}: {f.where() if f else '?'}" for k, f in sorted(frames.items())))
        shown = ", ".join(f"{v:.0%}" for v in gpu if v is not None)
        return Verdict(kind="idle", headline=head + f", for {stalled:.0f} s", where=_where(first),
                       for_s=stalled, numbers=numbers,
                       details=[f"the GPUs were idle: {shown}"] if shown else [])
    busy = sorted((k for k, c in cores.items() if c >= IDLE_CORES), key=lambda k: -cores[k])
    head = (f"busy: no step for {stalled:.0f} s and no collective pending, but the job computes: "
            + ("; ".join(f"rank {k} ({cores[k]:.2f} cores) in {_where(frames[k]) or '?'}" for k in busy)
               or f"its GPUs are busy ({', '.join(f'{v:.0%}' for v in gpu if v is not None)})")
            + " (an unmarked eval or checkpoint? mark it with gpudiag.phase)")
    return Verdict(kind="busy", headline=head, culprits=busy, where=_where(first), for_s=stalled,
                   numbers=numbers)


def verdict(ev: Evidence) -> Verdict:
    groups = _groups(ev)
    v = _divergence(ev, groups) or _wavefront(ev, groups)
    if v is not None:
        v.details = [d for d in v.details if d]
        return v
    by_rank = {r.rank: r for r in ev.ranks}
    for pg, ranks in groups.items():
        rows = _wave_rows(ev, pg, ranks, by_rank)
        gone = [w.rank for w in rows if w.state == "gone"]
        waiting = [w.rank for w in rows if w.state == "waiting"]
        if waiting and gone:
            return Verdict(kind="exited", culprits=gone, waiting=waiting, pg=pg, wavefront=rows,
                           headline=f"exited: {_ranks(gone)} exited while {_wait(waiting)} in "
                                    f"{rows[0].op} #{max(w.entered for w in rows)} ({group_name(pg)})")
        if waiting and len(waiting) == len(rows):
            w = rows[0]
            head = (f"hung: every rank waits in {w.op} #{w.entered} ({group_name(pg)}) and none is behind: "
                    "the transport, or a peer outside these ranks")
            return Verdict(kind="hung", waiting=waiting, pg=pg, seq=w.entered, op=w.op, wavefront=rows,
                           headline=head, for_s=max((x.for_s or 0.0) for x in rows))
    if ev.source == "exit":
        return Verdict(kind="unknown", headline="the job ended; its ranks' records show no collective "
                       "called differently and none left behind")
    if not any(r.processes for r in ev.ranks):
        return Verdict(kind="unknown", headline="no evidence could be read from the job's processes")
    return _nothing_pending(ev)
