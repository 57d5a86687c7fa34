"""The scheduler's state in SQLite: every job, every transition, and what earlier jobs taught us.

WAL mode with ``synchronous=FULL``: a commit survives a SIGKILL and a power cut. Every state
change is one transaction committed before the side effect that depends on it. Jobs move
pending -> starting -> running [-> finishing] [-> stopping] -> done | failed | cancelled (a
preempted one back to pending, ``restarts`` raised); ``attempt`` counts launches; ``slots`` are
ids, not positions (schema 2). Writes are essential or optional (``room.Room``).
docs/local-scheduler.md, "Crash safety".
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.scheduler.local.room import RESERVE_BYTES, Room, StateFull, is_full

SCHEMA_VERSION = 2   # 2: slots by id; 1: by position in --gpus
PENDING, STARTING, RUNNING, STOPPING = "pending", "starting", "running", "stopping"
# the job's command has ended (so its run.json says), gpudiag profile analyses the run: the job
# keeps its slots until its last process ends, as in every other state that holds them
FINISHING = "finishing"
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
ACTIVE = (STARTING, RUNNING, FINISHING, STOPPING)       # states that hold slots
FINAL = (DONE, FAILED, CANCELLED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid INTEGER NOT NULL, user TEXT NOT NULL, team TEXT NOT NULL, name TEXT NOT NULL,
    key TEXT NOT NULL, tier INTEGER NOT NULL, gpus INTEGER NOT NULL, grace_s REAL NOT NULL,
    time_limit_s REAL, cmd TEXT NOT NULL, env TEXT NOT NULL, cwd TEXT NOT NULL,
    submit_t REAL NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    slots TEXT, attempt INTEGER NOT NULL DEFAULT 0, restarts INTEGER NOT NULL DEFAULT 0,
    pid INTEGER, pid_start INTEGER, started_t REAL,
    stop_kind TEXT, stop_deadline REAL, killed INTEGER NOT NULL DEFAULT 0,
    ended_t REAL, exit_code INTEGER,
    sig_mfu REAL, sig_label TEXT, sig_conf REAL, sig_t REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS reserve (b BLOB);
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, cls TEXT NOT NULL,
    mfu REAL NOT NULL, label TEXT NOT NULL, t REAL NOT NULL
);
"""


@dataclass
class JobRow:
    """One row of ``jobs``: what was asked, and where the job stands."""

    id: int
    uid: int
    user: str
    team: str
    name: str
    key: str
    tier: int
    gpus: int
    grace_s: float
    time_limit_s: float | None
    cmd: list[str]
    env: dict[str, str]
    cwd: str
    submit_t: float
    state: str
    reason: str = ""
    slots: list[str] | None = None   # the ids of the GPUs (or CPU slots) it holds
    attempt: int = 0
    restarts: int = 0
    pid: int | None = None
    pid_start: int | None = None
    started_t: float | None = None
    stop_kind: str | None = None
    stop_deadline: float | None = None
    killed: int = 0
    ended_t: float | None = None
    exit_code: int | None = None
    sig_mfu: float | None = None
    sig_label: str | None = None
    sig_conf: float | None = None
    sig_t: float | None = None
    extra: dict = field(default_factory=dict)   # never stored: the daemon's per-pass scratch

    def public(self) -> dict:
        """What a client may see (not the environment: it may hold the user's secrets)."""
        return {k: getattr(self, k) for k in (
            "id", "uid", "user", "team", "name", "tier", "gpus", "grace_s", "time_limit_s", "cmd",
            "submit_t", "state", "reason", "slots", "attempt", "restarts", "pid", "started_t",
            "stop_kind", "ended_t", "exit_code", "sig_mfu", "sig_label", "sig_conf")}


_COLS = [f for f in JobRow.__dataclass_fields__ if f != "extra"]
_JSON_COLS = {"cmd", "env", "slots"}


def _row(values: tuple) -> JobRow:
    d = dict(zip(_COLS, values, strict=True))
    for k in _JSON_COLS:
        if d[k] is not None:
            d[k] = json.loads(d[k])
    return JobRow(**d)


class Store:
    """The database of one state folder. Not thread-safe: the daemon is one thread.

    ``slot_ids``: the daemon's slots, in order, to read a schema-1 database's positions by."""

    def __init__(self, path: Path, slot_ids: Sequence[str] = ()) -> None:
        self.path = path
        self.room = Room(path)
        self.migrated: list[str] = []
        # the rows hold users' environments: private from the first byte, and the WAL and
        # shared-memory files SQLite creates take the database file's permissions
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if p.exists():
                p.chmod(0o600)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=10.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        with self.tx():
            if self._meta("schema_version") is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                # agent job ids are "<prefix>:<id>": unique per state folder, so two schedulers
                # on one machine (or a fresh database) never share a job's signals
                self.db.execute("INSERT INTO meta VALUES ('prefix', ?)", (f"sched-{secrets.token_hex(3)}",))
        version = self._meta("schema_version")
        if version == "1":
            self.migrated = self._slots_by_id(slot_ids)
        elif version != str(SCHEMA_VERSION):
            raise ValueError(f"{path}: scheduler database schema {version}, "
                             f"this gpudiag reads {SCHEMA_VERSION}")
        self.prefix: str = self._meta("prefix") or ""
        self.top_up()

    def top_up(self) -> str | None:
        """Keep the reserve for essential writes (``room``): blocks after the log's end, and
        ``RESERVE_BYTES`` of free pages in the database, refilled once half of them is used,
        when the folder has room. A line for the log when the folder filled up or has room again."""
        note = self.room.top_up()
        if self.room.short:
            return note
        page, free = (self.db.execute(f"PRAGMA {k}").fetchone()[0] for k in ("page_size", "freelist_count"))
        if page * free < RESERVE_BYTES // 2:
            try:
                blob = f"INSERT INTO reserve VALUES (zeroblob({RESERVE_BYTES}))"
                self._write(lambda: (self.db.execute(blob), self.db.execute("DELETE FROM reserve")),
                            essential=False)
            except StateFull:
                pass   # said by the next look (room.short)
        return note

    def _slots_by_id(self, slot_ids: Sequence[str]) -> list[str]:
        """Schema 1 -> 2: each active job's slot positions become the ids at those positions in
        this start's list (what the daemon that wrote them would have read); a position beyond
        it keeps its number as its id. Returns a note per job converted."""
        notes = []
        with self.tx():
            held = self.db.execute("SELECT id, slots FROM jobs WHERE slots IS NOT NULL").fetchall()
            for job_id, raw in held:
                pos = json.loads(raw)
                ids = [slot_ids[i] if 0 <= i < len(slot_ids) else str(i) for i in pos]
                self.db.execute("UPDATE jobs SET slots=? WHERE id=?", (json.dumps(ids), job_id))
                notes.append(f"job {job_id}: slot positions {pos} read as ids {','.join(ids)}")
            self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        return notes

    def close(self) -> None:
        self.db.close()

    def tx(self) -> _Tx:
        return _Tx(self.db)

    def _meta(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if r is None else r[0]

    # -- reads ---------------------------------------------------------------------------
    def jobs(self, states: tuple[str, ...] | None = None, limit: int | None = None,
             user: str | None = None) -> list[JobRow]:
        sql = f"SELECT {','.join(_COLS)} FROM jobs"
        where, args = [], []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += list(states)
        if user is not None:
            where.append("user=?")
            args.append(user)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_row(r) for r in reversed(self.db.execute(sql, args).fetchall())]

    def job(self, job_id: int) -> JobRow | None:
        r = self.db.execute(f"SELECT {','.join(_COLS)} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if r is None else _row(r)

    def observations(self) -> list[tuple[str, str, float, str, float]]:
        return list(self.db.execute("SELECT key, cls, mfu, label, t FROM observations ORDER BY id"))

    # -- transitions: each one transaction ------------------------------------------------
    def _write(self, body: Callable[[], object], essential: bool) -> object:
        """``body`` in one transaction. A full disk: an optional write is refused (``StateFull``,
        before it is tried while the folder is short of room); an essential one is retried
        once after a checkpoint, into the reserve (``room``), then refused."""
        if not essential:
            self.room.check()
        for attempt in (1, 2):
            try:
                with self.tx():
                    return body()
            except (sqlite3.Error, OSError) as e:
                if not is_full(e):
                    raise
                if not essential or attempt == 2:
                    raise StateFull(self.room.line()) from None
                try:   # rewinds the log into its allocated part once no reader needs its frames
                    self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass
        raise AssertionError("unreachable")

    def submit(self, row: JobRow) -> JobRow:
        vals = {k: getattr(row, k) for k in _COLS if k != "id"}
        for k in _JSON_COLS:
            if vals[k] is not None:
                vals[k] = json.dumps(vals[k])
        sql = f"INSERT INTO jobs ({','.join(vals)}) VALUES ({','.join('?' * len(vals))})"
        row.id = int(self._write(lambda: self.db.execute(sql, list(vals.values())).lastrowid,
                                 essential=False))
        return row

    def update(self, row: JobRow, essential: bool = True, **changes: object) -> JobRow:
        """Apply ``changes`` to the row in one transaction, then to the object (only once durable)."""
        self.update_many([(row, changes)], essential=essential)
        return row

    def update_many(self, items: list[tuple[JobRow, dict]],
                    observation: tuple[str, str, float, str, float] | None = None,
                    essential: bool = True) -> None:
        """Several rows' changes (and what a finished job taught us: key, class, MFU, label,
        time) in one transaction: all of them happen, or none (``StateFull``)."""
        def body() -> None:
            if observation is not None:
                self.db.execute("INSERT INTO observations (key, cls, mfu, label, t) VALUES (?,?,?,?,?)",
                                observation)
            for row, changes in items:
                if not changes:
                    continue
                vals = [json.dumps(v) if k in _JSON_COLS and v is not None else v for k, v in changes.items()]
                self.db.execute(f"UPDATE jobs SET {','.join(f'{k}=?' for k in changes)} WHERE id=?",
                                [*vals, row.id])
        self._write(body, essential)
        for row, changes in items:
            for k, v in changes.items():
                setattr(row, k, v)


def read_prefix(path: Path) -> str:
    """A database's launch prefix, read-only (a test or benchmark ending what a daemon left)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute("SELECT value FROM meta WHERE key='prefix'").fetchone()[0]
    finally:
        con.close()


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): one transaction, taken eagerly so
    a second process on the same file (a benchmark, a test reading it) cannot interleave."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:  # the context-manager protocol
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error:   # a COMMIT that failed (a full disk) leaves the transaction open
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        """ROLLBACK where a transaction is still open: SQLite ends one itself on some errors
        (SQLITE_FULL among them), and a ROLLBACK then would raise in place of the real error."""
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
