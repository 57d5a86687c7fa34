"""What one user may hold in the queue, and a team lead's requests over many jobs at once.

``Policy.max_pending_per_user`` is read before anything else is done for a submit (jobs whose
command check still runs count too); why: docs/scheduler.md, "Settings". Cancelling several ids,
or all of one user's jobs, is one request: pending jobs leave in one transaction, running ones get
SIGTERM and their grace as a single cancel would give them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from gpudiag.scheduler.local import runner
from gpudiag.scheduler.local.protocol import Peer, Refused, is_job_id, user_of
from gpudiag.scheduler.local.store import CANCELLED, FINAL, PENDING, JobRow, Store

MAX_IDS = 10_000   # ids in one cancel request (a request is at most 1 MiB anyway)


def pending_refusal(user: str, uid: int, pending: Iterable[JobRow], in_check: int, limit: int) -> str | None:
    """Why ``user`` may not queue another job now, or None. ``limit`` 0: no limit."""
    if limit <= 0:
        return None
    n = sum(1 for r in pending if r.uid == uid) + in_check
    if n < limit:
        return None
    return (f"{user} has {n} jobs waiting, the most one user may queue here (--max-pending {limit}): "
            f"wait for some to start, or cancel some (gpudiag cancel --user {user})")


def ids_of(req: dict) -> list[int]:
    """The job ids a cancel request names (``ids``, or an older client's ``id``)."""
    ids = req.get("ids", [req.get("id")] if "id" in req else None)
    if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS or not all(map(is_job_id, ids)):
        raise Refused(f"cancel: give 1 to {MAX_IDS} positive job numbers, or --user NAME")
    return list(dict.fromkeys(ids))


def cancel_request(req: dict, peer: Peer, pending: dict[int, JobRow], active: Mapping[int, JobRow],
                   store: Store, job_for: Callable[[int], JobRow],
                   stop: Callable[[JobRow, str], None]) -> dict:
    """``gpudiag cancel ID ID ...`` (each refused alone: no such job, not the asker's, ended) or
    ``gpudiag cancel --user NAME`` (every pending and running job of NAME: NAME's own or root's
    request). ``job_for``: the row of an id the asker may act on, else ``Refused``."""
    results: list[dict] = []
    if "user" in req:
        if "ids" in req:
            raise Refused("give job ids or --user, not both")
        name = user_of(req)
        if peer.uid not in (0, os.geteuid()) and runner.user_name(peer.uid) != name:
            raise Refused(f"cancel --user {name}: only {name} or root may cancel all of {name}'s jobs")
        rows = [r for r in (*pending.values(), *active.values()) if r.user == name]
    else:
        rows = []
        for job_id in ids_of(req):
            try:
                row = job_for(job_id)
                if row.state in FINAL:
                    raise Refused(f"job {row.id} has already ended ({row.state})")
                rows.append(row)
            except Refused as e:
                results.append({"id": job_id, "error": str(e)})

    def who(r: JobRow) -> str:
        return "root" if peer.uid == 0 and r.uid != 0 else r.user

    by_id = {d["id"]: d for d in [*_cancel_rows(store, pending, rows, who, stop), *results]}
    return {"ok": True, "jobs": [by_id[i] for i in sorted(by_id)]}


def _cancel_rows(store: Store, pending: dict[int, JobRow], rows: list[JobRow], who: Callable[[JobRow], str],
                 stop: Callable[[JobRow, str], None]) -> list[dict]:
    """The pending in one transaction (one fsync, not one per job), then a stop for each
    running one, as a single cancel gives it."""
    now = time.time()
    waiting = [r for r in rows if r.state == PENDING]
    store.update_many([(r, {"state": CANCELLED, "ended_t": now,
                            "reason": f"cancelled by {who(r)} while pending"}) for r in waiting])
    for r in waiting:
        pending.pop(r.id, None)
    for r in rows:
        if r.state not in FINAL and r.state != PENDING:
            stop(r, f"cancelled by {who(r)}")
    return [{"id": r.id, "state": r.state} for r in rows]
