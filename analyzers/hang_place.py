"""Where a rank is and what holds it: its threads' own lines, what the kernel says they wait on,
a deadlock between its threads, and, when no collective is pending, whether the job is idle or
computing. Pure; the second half of ``analyzers/hang.py``'s verdict.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gpudiag.incident import Evidence, Frame, ProcessInfo, RankState, ThreadStack, Verdict, user_frame


def group_name(pg: str | None, desc: str = "") -> str:
    """A process group as a person reads it: torch names the default group "0"."""
    if pg in (None, "0", "default_pg"):
        return "default group"
    return f"group {pg}" + (f" ({desc})" if desc and desc not in ("undefined", "") else "")


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


def job_line(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the job's own code (``incident.user_frame``)."""
    return user_frame(frames)


def _where(fr: Frame | None) -> str | None:
    return None if fr is None else fr.where()


def _call(fr: Frame | None) -> str | None:
    """What the job's line calls (``time.sleep`` in ``time.sleep(3600)``), where it can be read."""
    m = _CALL.search(fr.code) if fr is not None and fr.code else None
    return m.group(1) if m else None


def main_thread(p: ProcessInfo) -> ThreadStack | None:
    return next((t for t in p.threads if t.main), p.threads[-1] if p.threads else None)


def _deadlock(p: ProcessInfo) -> list[ThreadStack]:
    """The job's own threads blocked at a lock (their innermost frame is the job's code, at a
    ``with ...:`` or ``.acquire(`` line, in a futex or with no CPU used): two or more wait on
    each other."""
    out = []
    for t in p.threads:
        fr = t.frames[0] if t.frames else None
        if fr is None or job_line([fr]) is None or not _LOCK_LINE.search(fr.code or ""):
            continue
        if t.syscall not in (None, "futex") or (t.cpu_s or 0.0) > IDLE_CORES * (p.window_s or 1.0):
            continue
        out.append(t)
    return out if len(out) >= 2 else []


class Place(NamedTuple):
    kind: str              # hung | deadlock | exited
    text: str              # where the rank is, in words
    details: list[str]
    where: str | None      # "file.py:88 func": the job's own line that holds it


# the kernel's wait channel, where /proc/PID/syscall could not be read (another user's process)
_WCHAN = {"pipe_read": "read", "futex": "futex", "nanosleep": "nanosleep", "ep_poll": "epoll_wait",
          "do_select": "select", "do_sys_poll": "poll", "sk_wait_data": "recvfrom",
          "unix_stream_read": "recvmsg", "do_wait": "wait4"}


def _waits_on(t: ThreadStack | None) -> str:
    """What a thread waits on, in words ("waiting on a read"), or ""."""
    if t is None:
        return ""
    call = t.syscall if t.syscall and not t.syscall.startswith("syscall ") else None
    if call is None and t.wchan:
        call = next((v for k, v in _WCHAN.items() if k in t.wchan), None)
    return WAITS.get(call or "", "")


def locate(r: RankState, ev: Evidence) -> Place:
    """Where a rank the others wait for is, and what holds it."""
    stalled = f"for {r.stalled_s:.0f} s" if r.stalled_s is not None else ""
    if not r.alive:
        crash = next((p.crash for p in r.processes if p.crash), None)
        return Place("exited", f"its process is gone{' (' + crash + ')' if crash else ''}", [], None)
    if not r.processes or not r.processes[0].threads:
        last = max(r.collectives, key=lambda c: (c.entered or 0.0, c.seq), default=None)
        if last is None:
            return Place("hung", f"no stack and no collective could be read from it {stalled}".strip(), [],
                         None)
        at = f", called at {last.where.where()}" if last.where is not None else ""
        return Place("hung", f"its last collective was {last.op} #{last.seq} ({group_name(last.pg)}, "
                      f"{last.state}){at}; no stack was read from it", [], _where(last.where))
    proc = r.processes[0]
    main = main_thread(proc)
    locked = _deadlock(proc)
    if locked:
        a, b = locked[0], locked[1]
        mf = job_line(main.frames) if main else None
        details = [f"rank {r.rank}: thread {t.name!r} waits at {t.frames[0].where()}: `{t.frames[0].code}`"
                   for t in locked]
        if main is not None and main not in locked and mf is not None:
            details.append(f"rank {r.rank}: its main thread waits at {mf.where()}"
                           + (f": `{mf.code}`" if mf.code else ""))
        return Place("deadlock", f"it is deadlocked: threads {a.name!r} ({a.frames[0].where()}) and "
                      f"{b.name!r} ({b.frames[0].where()}) wait for each other's lock {stalled}".strip(),
                      details, a.frames[0].where())
    frames = main.frames if main else []
    if any("/torch/utils/data/" in f.file for f in frames):
        for w in r.processes[1:]:
            wm = main_thread(w)
            wf = job_line(wm.frames) if wm else None
            if wf is not None:
                word = _waits_on(wm)
                return Place("hung", f"it is in {wf.where()} (DataLoader worker pid {w.pid}), "
                              f"{word + ' ' if word else ''}{stalled}".strip(),
                              [f"rank {r.rank}: its main thread waits for its DataLoader at "
                               f"{_where(job_line(frames)) or '?'}",
                               f"worker pid {w.pid}: `{wf.code}`" if wf.code else ""], wf.where())
    fr = job_line(frames)
    word = _waits_on(main)
    call = _call(fr)
    place = f"it is in {fr.where() if fr else '?'}" + (f" (`{call}`)" if call else "")
    text = f"{place}, {word + ' ' if word else ''}{stalled}".strip().rstrip(",")
    return Place("hung", text, [], _where(fr))


def nothing_pending(ev: Evidence) -> Verdict:
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
    mains = {r.rank: main_thread(r.processes[0]) if r.processes else None for r in ev.ranks}
    # the job's own line, else (a job in torch's teardown, say) the innermost frame there is
    frames = {k: (job_line(t.frames) or (t.frames[0] if t.frames else None)) if t else None
              for k, t in mains.items()}
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


