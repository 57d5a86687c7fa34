"""An incident's evidence, assembled from every source at the moment a job stalls (or ends badly).

Sources, each of which may be missing (the evidence then says which, and the verdict weighs
what is there): each rank's black box (steps, phase, the collectives it called: always there,
read from outside); its watcher's answer (Python stacks with thread names, the Flight Recorder's
record of every collective, DDP's included: only where its interpreter is free to answer);
faulthandler's stacks on the signal (every process, workers included, even with the interpreter
held); the kernel's view of each thread (state, wait channel, system call, CPU over the window);
the GPU samples and host samples around the stall; the step timer's last rows.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from gpudiag.collectors import blackbox, stall_evidence
from gpudiag.collectors.blackbox import BlackBox
from gpudiag.incident import (
    Collective,
    Evidence,
    Frame,
    GpuActivity,
    ProcessInfo,
    RankState,
    ThreadStack,
    read_rank_answer,
    stacks_path,
    user_frame,
)
from gpudiag.rundir import collectives_wait_s, gpu_samples_path, read_host_cpu, read_jsonl, read_steps

TIMELINE_STEPS = 30
# the CPU each thread used is read twice, this far apart at least: the kernel counts in 10 ms
# ticks, so a shorter window cannot tell 5% of a core (the idle line) from nothing
MIN_WINDOW_S = 1.0
_FR_OPS = {"_allgather_base": "all_gather", "allgather": "all_gather", "allreduce": "all_reduce",
           "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
           "all_gather_into_tensor": "all_gather", "alltoall_base": "all_to_all", "alltoall": "all_to_all",
           "_broadcast_oop": "broadcast"}

def fr_collectives(dump: dict[str, Any]) -> tuple[list[Collective], dict[str, dict[str, int]]]:
    """A Flight Recorder dump (PyTorch's format, ``torch.distributed.flight_recorder``) as
    collectives, and per process group its last enqueued/completed sequence numbers."""
    status: dict[str, dict[str, int]] = {}
    names: dict[str, str] = {}
    out = []
    for e in dump.get("entries") or []:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group") or ("?", "")
        if not isinstance(pg, (list, tuple)):
            pg = (pg, "")
        name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
        names[str(e.get("pg_id"))] = name
        raw = str(e.get("profiling_name", "?")).split(":", 1)[-1].split(" ")[0]
        sizes = e.get("input_sizes") or []
        shape = "x".join(str(d) for d in sizes[0]) if sizes and isinstance(sizes[0], (list, tuple)) else ""
        dtypes = e.get("input_dtypes") or []
        p2p = bool(e.get("is_p2p"))
        seq = int(e.get("p2p_seq_id" if p2p else "collective_seq_id") or 0)
        frames = [stall_evidence.with_code(Frame(str(f.get("filename", "?")), int(f.get("line", 0) or 0),
                                                 str(f.get("name", "?"))))
                  for f in e.get("frames") or [] if isinstance(f, dict)]
        created = e.get("time_created_ns")
        done_ns = e.get("time_discovered_completed_ns")
        completed = bool(e.get("retired")) or e.get("state") == "completed"
        out.append(Collective(source="flight recorder", pg=name, pg_desc=desc, seq=seq,
                              op=_FR_OPS.get(raw, raw), state="completed" if completed else "in flight",
                              shape=shape, dtype=str(dtypes[0]).lower() if dtypes else "",
                              entered=created / 1e9 if isinstance(created, (int, float)) else None,
                              done=done_ns / 1e9 if isinstance(done_ns, (int, float)) and done_ns else None,
                              where=user_frame(frames)))
    for pg_id, st in (dump.get("pg_status") or {}).items():
        if isinstance(st, dict) and str(pg_id) in names:
            status[names[str(pg_id)]] = {k: int(v) for k, v in st.items()
                                         if k in ("last_enqueued_collective", "last_completed_collective")
                                         and isinstance(v, int)}
    # a completed seq the status knows of is completed, whatever the entry still says
    for c in out:
        last = status.get(c.pg, {}).get("last_completed_collective")
        if last is not None and c.seq <= last and c.state == "in flight":
            c.state = "completed"
    return out, status


def box_collectives(box: BlackBox) -> list[Collective]:
    return [Collective(source="black box", pg=s.pg, seq=s.seq, op=s.op, state=s.state, shape=s.shape,
                       dtype=s.dtype, entered=s.entered, done=s.done, step=s.step + 1)
            for s in box.slots]


def _threads_from_answer(answer: dict[str, Any]) -> list[ThreadStack]:
    out = []
    for t in answer.get("threads") or []:
        if t.get("watcher"):
            continue   # gpudiag's own thread, answering
        frames = [stall_evidence.with_code(Frame(str(f["file"]), int(f["line"]), str(f["func"])))
                  for f in t.get("frames") or []]
        out.append(ThreadStack(name=str(t.get("name", "?")), ident=str(t.get("ident", "?")), frames=frames,
                               source="python", main=bool(t.get("main")), native_id=t.get("native_id")))
    return out


def _annotate(threads: list[ThreadStack], pid: int, a: stall_evidence.ProcRaw | None,
              b: stall_evidence.ProcRaw | None) -> None:
    """The kernel's view of each thread: state, wait channel, system call, CPU in the window.
    faulthandler's threads carry no thread id; its main thread (listed last: CPython lists its
    threads newest first) is the process's own (tid = pid)."""
    if b is None:
        return
    if threads and all(t.source == "faulthandler" for t in threads):
        threads[-1].main = True
    for t in threads:
        tid = t.native_id if t.native_id is not None else (pid if t.main else None)
        raw = b.threads.get(tid) if tid is not None else None
        if tid is None or raw is None:
            continue
        t.state, t.wchan, t.syscall = raw.state, raw.wchan, raw.syscall
        t.cpu_s = stall_evidence.cpu_seconds(a.threads.get(tid) if a else None, raw)


def processes_of(rank: int, pid: int, snap0: dict[int, stall_evidence.ProcRaw],
                 snap1: dict[int, stall_evidence.ProcRaw], stacks: dict[int, str],
                 answer: dict[str, Any] | None, window: float) -> list[ProcessInfo]:
    """The rank's process and its children (DataLoader workers), each with its threads."""
    kids: dict[int, list[int]] = {}
    for proc in snap1.values():
        kids.setdefault(proc.ppid, []).append(proc.pid)
    order, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        order.append(p)
        todo.extend(sorted(kids.get(p, [])))
    out = []
    for p in order:
        threads, crash = stall_evidence.parse_faulthandler(stacks.get(p, ""))
        answered = p == pid and answer is not None
        if p == pid and answer is not None:
            threads = _threads_from_answer(answer)
        a, b = snap0.get(p), snap1.get(p)
        _annotate(threads, p, a, b)
        ours = {t.get("native_id") for t in (answer or {}).get("threads") or [] if t.get("watcher")}
        cpu = None   # the job's own threads: gpudiag's watcher, answering meanwhile, is not the job
        if a is not None and b is not None:
            cpu = sum(stall_evidence.cpu_seconds(a.threads.get(tid), th) or 0.0
                      for tid, th in b.threads.items() if tid not in ours or p != pid)
        role = "rank" if p == pid else ("dataloader worker" if b is not None and b.ppid == pid else "child")
        out.append(ProcessInfo(pid=p, role=role, rank=rank, ppid=b.ppid if b else None,
                               alive=b is not None and b.state != "Z", state=b.state if b else None,
                               cpu_s=cpu, window_s=window,
                               threads=threads, answered=answered, crash=crash))
    return out


def gpu_activity(run_dir: Path, since: float) -> list[GpuActivity]:
    rows = [r for r in read_jsonl(gpu_samples_path(run_dir))
            if isinstance(r.get("gpu"), int) and isinstance(r.get("t"), (int, float)) and r["t"] >= since]
    out = []
    for g in sorted({r["gpu"] for r in rows}):
        mine = [r for r in rows if r["gpu"] == g]
        util = [r["util_gpu"] / 100 for r in mine if isinstance(r.get("util_gpu"), (int, float))]
        sm = [r["gpm_sm_activity"] for r in mine if isinstance(r.get("gpm_sm_activity"), (int, float))]
        out.append(GpuActivity(gpu=g, samples=len(mine), util=statistics.fmean(util) if util else None,
                               sm_active=statistics.fmean(sm) if sm else None))
    return out


def timeline(run_dir: Path, boxes: dict[int, BlackBox]) -> dict[str, list[list[float]]]:
    """Per rank, its last steps as [step, end, seconds, seconds waited in collectives]: the step
    timer's rows, which are flushed about once a second; where they lag the black box (a rank
    that stalled before its rows were flushed), the black box's own step durations, counted
    back from its last step (their waits unknown: 0)."""
    out = {}
    steps = read_steps(run_dir)
    for rank in sorted(set(steps) | set(boxes)):
        rows = steps.get(rank, [])
        box = boxes.get(rank)
        lags = not rows or (box is not None and rows[-1].step < box.step)
        if box is not None and box.last_step_t is not None and box.dts and lags:
            end, made = box.last_step_t, []
            for i, dt in enumerate(reversed(box.dts[-TIMELINE_STEPS:])):
                made.append([box.step - i, end, dt, 0.0])
                end -= dt
            out[str(rank)] = made[::-1]
            continue
        out[str(rank)] = [[r.step, r.t, r.dt, collectives_wait_s(r)] for r in rows[-TIMELINE_STEPS:]]
    return out


def rank_state(box: BlackBox, limit: Any, answer: dict[str, Any] | None, now: float) -> RankState:
    """A rank's state from its black box, its stall limit and its watcher's answer."""
    rs = RankState(rank=box.rank, pid=box.pid, alive=stall_evidence.alive(box.pid), step=box.step,
                   last_step_t=box.last_step_t, phase=box.phase, phase_since=box.phase_since,
                   collectives=box_collectives(box))
    if box.dts:
        rs.median_step_s = statistics.median(box.dts)
    if limit is not None:
        rs.stalled_s, rs.limit_s, rs.limit_why = limit.idle_s, limit.limit_s, limit.why
    if answer is None:
        rs.fr_note = "the rank did not answer (its interpreter is held, or it is gone)"
    elif answer.get("fr") is None:
        rs.fr_note = str(answer.get("fr_error") or "no Flight Recorder dump")
    else:
        fr, rs.fr_status = fr_collectives(answer["fr"])
        if not fr:
            rs.fr_note = "the Flight Recorder holds no collective (TORCH_FR_BUFFER_SIZE unset or 0?)"
        for c in fr:   # the step it was called in: the black box's record of the same call
            at = c.entered
            near = [(abs(b.entered - at), b) for b in rs.collectives if b.op == c.op and b.entered is not None
                    and at is not None and abs(b.entered - at) < 0.5]
            if near:
                c.step = min(near, key=lambda nb: nb[0])[1].step
        rs.collectives += fr
    return rs


def collect(run_dir: Path, ident: str, root_pid: int, boxes: dict[int, BlackBox], limits: dict[int, Any],
            answer_wait_s: float = 4.0, rule: str = "") -> Evidence:
    """Everything about the job now; asks every rank (the request file, the stack signal) and
    waits at most ``answer_wait_s`` for the ranks whose interpreter can answer."""
    from gpudiag.incident import incidents_dir, request_path

    now = time.time()
    folder = incidents_dir(run_dir) / ident
    folder.mkdir(parents=True, exist_ok=True)
    req = request_path(run_dir)
    tmp = req.with_name(f".{req.name}.partial")
    tmp.write_text(f'{{"id": "{ident}", "t": {now}}}')
    tmp.replace(req)
    pids = sorted({p for b in boxes.values() for p in stall_evidence.job_pids(b.pid)}
                  if boxes else stall_evidence.job_pids(root_pid))  # the ranks and their children
    t0 = time.monotonic()
    snap0 = stall_evidence.snapshot(pids)
    stacks = stall_evidence.signal_stacks(run_dir, pids)
    answers: dict[int, dict[str, Any]] = {}
    waiting = {r for r, b in boxes.items() if stall_evidence.alive(b.pid)}
    while waiting and time.monotonic() - t0 < answer_wait_s:
        for r in list(waiting):
            a = read_rank_answer(folder / f"rank-{r}.json")
            if a is not None:
                answers[r] = a
                waiting.discard(r)
        if waiting:
            time.sleep(0.1)
    time.sleep(max(0.0, MIN_WINDOW_S - (time.monotonic() - t0)))
    window = time.monotonic() - t0
    snap1 = stall_evidence.snapshot(pids)
    ev = Evidence(id=ident, source="stall", detected_at=now, rule=rule, timeline=timeline(run_dir, boxes))
    for r, box in sorted(boxes.items()):
        rs = rank_state(box, limits.get(r), answers.get(r), now)
        rs.processes = processes_of(r, box.pid, snap0, snap1, stacks, answers.get(r), window)
        ev.ranks.append(rs)
    since = min((r.last_step_t or now for r in ev.ranks), default=now)
    ev.gpus = gpu_activity(run_dir, since)
    ev.job_cores = sum(p.cpu_s or 0.0 for r in ev.ranks for p in r.processes) / window
    host = read_host_cpu(run_dir)
    if host and host[-1].machine_busy is not None:
        ev.machine_busy = host[-1].machine_busy
    if waiting:
        ev.notes.append(f"rank(s) {', '.join(map(str, sorted(waiting)))} did not answer within "
                        f"{answer_wait_s:g} s: their interpreter is held; stacks from the signal only")
    return ev


def exit_evidence(run_dir: Path, ident: str, now: float) -> Evidence | None:
    """After the job ended badly: the black boxes (they outlive every process) and the stacks
    faulthandler wrote at a crash. None when no rank left a black box."""
    boxes = blackbox.read_all(run_dir)
    if not boxes:
        return None
    ev = Evidence(id=ident, source="exit", detected_at=now, timeline=timeline(run_dir, boxes))
    for r, box in sorted(boxes.items()):
        rs = rank_state(box, None, None, now)
        rs.alive, rs.fr_note = False, "the job has ended (the Flight Recorder lived in its memory)"
        text = ""
        try:
            text = stacks_path(run_dir, box.pid).read_text(errors="replace")
        except OSError:
            pass
        threads, crash = stall_evidence.parse_faulthandler(text)
        if threads and all(t.source == "faulthandler" for t in threads):
            threads[-1].main = True
        rs.processes = [ProcessInfo(pid=box.pid, role="rank", rank=r, alive=False,
                                    threads=threads if crash else [], crash=crash)]
        ev.ranks.append(rs)
    return ev
