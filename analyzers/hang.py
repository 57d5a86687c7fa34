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

from collections import Counter

from gpudiag.analyzers.hang_place import group_name, job_line, locate, main_thread, nothing_pending
from gpudiag.incident import Collective, Evidence, RankState, Verdict, WaveRow


def _ranks(rs: list[int]) -> str:
    if not rs:
        return "no rank"
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, sorted(rs)))


def _wait(rs: list[int]) -> str:
    """"rank 0 waits", "ranks 0, 2 wait"."""
    return f"{_ranks(rs)} {'waits' if len(rs) == 1 else 'wait'}"


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


def _skipped(mine: list[str], usual: list[str]) -> str | None:
    """The op a rank left out of its step: its step's ops so far are the usual step's (a whole
    step of a rank in step) with exactly one op missing before them."""
    for i in range(min(len(mine) + 1, len(usual))):
        if mine[:i] == usual[:i] and mine[i:] == usual[i + 1:i + 1 + len(mine) - i] and mine[i:]:
            return usual[i]
    return None


def _usual_step(recs: list[Collective], step: int | None) -> list[str]:
    """A rank's ops in the last whole step before ``step``."""
    if step is None:
        return []
    before = [c.step for c in recs if c.step is not None and c.step < step]
    return _step_ops(recs, max(before)) if before else []


def _desync(ev: Evidence, pg: str, seq: int, at: dict[int, Collective], ops: dict[int, str],
            ranks: dict[int, list[Collective]], by_rank: dict[int, RankState]) -> Verdict:
    skips = {}
    for r in at:   # which rank's step so far is an ordinary step with one op left out
        others = [o for o in at if o != r]
        usual = _usual_step(ranks[others[0]], at[others[0]].step) if others else []
        op = _skipped(_step_ops(ranks[r], at[r].step), usual)
        if op is not None:
            skips[r] = (op, usual)
    culprits, want = _minority(ops)
    if not culprits and len(skips) == 1:   # a tie: the rank that left an op out of its step
        culprits = list(skips)
        want = next(ops[o] for o in at if o not in skips)
    g = group_name(pg, at[min(at)].pg_desc)
    if culprits:
        c = culprits[0]
        head = f"desync: {_ranks(culprits)} called {ops[c]} where the others called {want}, #{seq} ({g})"
    else:
        head = f"desync at #{seq} ({g}): " + "; ".join(f"rank {r} called {o}" for r, o in sorted(ops.items()))
    details = []
    for c in culprits:
        if c in skips:
            op, usual = skips[c]
            mine = ", ".join(_step_ops(ranks[c], at[c].step))
            details.append(f"rank {c} skipped {op} in step {at[c].step}: its step called {mine} "
                           f"where a step calls {', '.join(usual)}")
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
        main = main_thread(p) if p is not None else None
        fr = job_line(main.frames) if main is not None else at[r].where
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
    waits = [now - entered for r in v.waiting if (c := at.get(r)) and (entered := c.entered)]
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
        place = locate(by_rank[c], ev)
        details += place.details
        where = where or place.where
        if place.kind != "hung":
            kind = place.kind
        parts.append(place.text)
    places = parts[0] if len(parts) == 1 else "; ".join(
        f"rank {c}: {p}" for c, p in zip(culprits, parts, strict=True))
    head = (f"{kind}: {_ranks(culprits)} never entered {front_row.op} #{front} ({g}); {places}; "
            f"{_wait(waiting)} in that {front_row.op} ({wait_s:.0f} s)")
    return Verdict(kind=kind, headline=head, details=details, culprits=culprits, waiting=waiting, pg=pg,
                   seq=front, op=front_row.op, where=where, for_s=by_rank[culprits[0]].stalled_s,
                   wavefront=rows, numbers={"waiting_s": round(wait_s, 3)})


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
    return nothing_pending(ev)
