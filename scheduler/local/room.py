"""Disk space for the scheduler's own records: a full state folder is load, not a crash.

Essential writes (a cancel, a stop, a kill, a job's end) have a reserve inside SQLite's files, where
no job can take it (blocks allocated past the WAL's end, free pages: ``Store.top_up``); optional
ones (a submit, a start, a signal) are refused in one line below ``RESERVE_BYTES``, changing
nothing. Each tick tops the reserve up again. docs/scheduler-daemon.md, "A full state folder is
load, not a crash".
"""

from __future__ import annotations

import ctypes
import errno
import os
import sqlite3
from pathlib import Path

RESERVE_BYTES = 4 << 20     # > the log's 1,000-page checkpoint size, and thousands of job ends in the file
FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
SQLITE_FULL = 13
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class StateFull(ValueError):
    """A write that could not be made for lack of space; its message is the one line to show."""


def is_full(e: BaseException) -> bool:
    """``e`` says the disk (or the user's quota) is full: SQLite's SQLITE_FULL, or ENOSPC/EDQUOT."""
    if isinstance(e, sqlite3.Error):
        return (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL
    return isinstance(e, OSError) and e.errno in _FULL_ERRNOS


def size_words(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def _fallocate_keep_size(fd: int, offset: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    if libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Room:
    """The state folder's free space and the reserve in the database's files."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.folder = db_path.parent
        self.supported = True     # False: this filesystem cannot reserve (no fallocate)
        self.short = False        # the last look found less than RESERVE_BYTES free
        self.announced = False    # the log has said so (once per episode)

    def free(self) -> int:
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize

    def line(self) -> str:
        return f"the scheduler's state folder is full: {size_words(self.free())} free; no job was changed"

    def check(self) -> None:
        """Before an optional write: ``StateFull`` while less than the reserve is free, so that
        a submit never takes the room a job's end needs."""
        if self.free() < RESERVE_BYTES:
            self.short = True
            raise StateFull(self.line())

    def top_up(self) -> str | None:
        """Reserve ``RESERVE_BYTES`` beyond the end of the database's log, where there is room;
        returns a line for the log when the folder's state changed (full, or room again)."""
        free = self.free()
        if free < RESERVE_BYTES:
            self.short = True
            if self.announced:
                return None
            self.announced = True
            return f"{self.line()}: refusing submits and starts until there is room again"
        note = f"the state folder has room again: {size_words(free)} free" if self.announced else None
        self.short = self.announced = False
        if not self.supported:
            return note
        try:
            fd = os.open(f"{self.db_path}-wal", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return note   # no log yet: SQLite makes it at the first write
        try:
            st = os.fstat(fd)
            if st.st_blocks * 512 < st.st_size + RESERVE_BYTES // 2:
                _fallocate_keep_size(fd, st.st_size, RESERVE_BYTES)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                self.supported = False
                return f"the state folder's filesystem cannot reserve space (fallocate: {e.strerror})"
            if e.errno not in _FULL_ERRNOS:
                raise
        finally:
            os.close(fd)
        return note
