"""How a root daemon touches a job's folder: every name in it is the job's user's to replace.

The folder is opened once (``O_NOFOLLOW|O_DIRECTORY``) and every file relative to it with
``O_NOFOLLOW|O_NONBLOCK|O_NOCTTY``; ``fstat`` must show a regular file of the job's user with one
link, read within bounds; the job's own output is created with its user's credentials
(``acting_as``). Why: docs/scheduler-daemon.md, "Files in a job's folder are the user's, so hostile".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class UnsafeFile(OSError):
    """A job file the daemon refuses to use; the message names the file and what it is."""


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse(what: str, e: OSError, dir_fd: int | None = None, name: str = "", folder: bool = False,
            uid: int | None = None) -> UnsafeFile:
    """The one line for an entry that could not be opened: what it is where that explains it
    (writing to a FIFO without a reader fails with ENXIO, opening a link with ELOOP, opening
    root's file as the user with EACCES)."""
    if name:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
                return UnsafeFile(e.errno or errno.EIO, f"{what} is {kind_of(st.st_mode)}, not "
                                  f"{'a folder' if folder else 'a regular file'}: refused")
            why = None if folder or uid is None else _not_the_users(st, what, uid)
            if why:
                return UnsafeFile(errno.EPERM, why)
        except OSError:
            pass
    if e.errno == errno.ELOOP:
        return UnsafeFile(errno.ELOOP, f"{what} is a symbolic link: refused")
    return UnsafeFile(e.errno or errno.EIO, f"{what}: {e.strerror or e}")


def _not_the_users(st: os.stat_result, what: str, uid: int) -> str | None:
    """Why a regular file is not the job user's own to have read or written for them."""
    if st.st_uid != uid:
        return f"{what} belongs to uid {st.st_uid}, not to the job's user: refused"
    if st.st_nlink != 1:
        return f"{what} has {st.st_nlink} links (a hard link to another file?): refused"
    return None


@contextlib.contextmanager
def acting_as(uid: int, gid: int, groups: list[int]) -> Iterator[None]:
    """File-system calls in this block are the job user's (effective uid, gid and groups): what
    they create is theirs, and what they may not open fails. A no-op unless the daemon is root
    and the user is not. The daemon is one thread, and its real and saved uid stay root, so it
    returns to root afterwards, and no user may signal it meanwhile."""
    if os.geteuid() != 0 or uid == 0:
        yield
        return
    egid, saved = os.getegid(), os.getgroups()
    try:
        os.setgroups(groups)
        os.setegid(gid)
        os.seteuid(uid)
        yield
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(saved)


@contextlib.contextmanager
def open_dir(path: Path | str, uid: int, dir_fd: int | None = None) -> Iterator[int]:
    """A descriptor of the folder ``path`` (under ``dir_fd`` when given), after checking it is
    a real folder of the job's user (or of the daemon's, before it was handed over)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=dir_fd)
    except OSError as e:
        raise _refuse(f"folder {path}", e, dir_fd, str(path), folder=True) from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (uid, os.geteuid()):
            raise UnsafeFile(errno.EPERM, f"folder {path} belongs to uid {st.st_uid}, not {uid}")
        yield fd
    finally:
        os.close(fd)


def _check_regular(fd: int, what: str, uid: int) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(errno.EINVAL, f"{what} is {kind_of(st.st_mode)}, not a regular file: refused")
    why = _not_the_users(st, what, uid)
    if why:
        raise UnsafeFile(errno.EPERM, why)
    return st


def read_file(dir_fd: int, name: str, uid: int, limit: int, offset: int = 0, what: str = "") -> bytes:
    """At most ``limit`` bytes of the regular file ``name`` from ``offset``; b"" when it does
    not exist. ``UnsafeFile`` for anything else that is there."""
    what = what or name
    try:
        fd = os.open(name, os.O_RDONLY | _OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        return b""
    except OSError as e:
        raise _refuse(what, e, dir_fd, name, uid=uid) from None
    try:
        _check_regular(fd, what, uid)
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def open_output(dir_fd: int, name: str, uid: int) -> int:
    """A job's stdout or stderr for appending, created where missing. Call it ``acting_as``
    the job's user, so that the file is created by and for them (never root's for a moment in
    their folder) and a name they could not open themselves is not opened for them. The caller
    closes it; the job inherits it as an ordinary blocking file."""
    flags = os.O_WRONLY | os.O_APPEND | _OPEN
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        raise _refuse(name, e, dir_fd, name, uid=uid) from None
    try:
        _check_regular(fd, name, uid)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def make_dir(dir_fd: int, name: str, uid: int, gid: int) -> None:
    """``name`` under ``dir_fd``: a folder of the job's user (made if missing), through a
    descriptor so that a link put in its place is refused, never followed."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=dir_fd)
    except OSError as e:
        raise _refuse(name, e, dir_fd, name, folder=True) from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (uid, os.geteuid()):
            raise UnsafeFile(errno.EPERM, f"{name} belongs to uid {st.st_uid}, not to the job's user")
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def dir_mtime(dir_fd: int, name: str) -> float | None:
    """When the folder ``name`` last changed (lstat: a link, or anything but a folder, is None)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISDIR(st.st_mode) else None
