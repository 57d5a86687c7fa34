"""Where the scheduler keeps its state, the limits on what a client may send, and who may trust whom.

The state folder holds the database, the socket and one folder per job. Everything a client
or the daemon trusts there must be out of reach of other users: a folder anyone may write to
lets anyone replace the socket (and read the environment every submit sends) or the database.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpudiag.contract import ENV_SCHEDULER_DIR
from gpudiag.errors import BadInput

SOCKET_NAME = "sock"
DB_NAME = "scheduler.db"
LOCK_NAME = "daemon.lock"
JOBS_DIR = "jobs"

# Linux limits one argv/env string to 128 KiB (MAX_ARG_STRLEN) and all of them to ARG_MAX
# (2 MiB with the default 8 MiB stack): a command and environment within these always exec.
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_BYTES = 256 * 1024
MAX_ARGS = 4096
# One request is one JSON line: command + environment + a little more.
MAX_REQUEST_BYTES = 1024 * 1024
MAX_NAME = 64            # --name / --team: they become keys and label values
MAX_GRACE_S = 3600.0     # Slurm's KillWait-style grace beyond an hour is a misconfiguration
MAX_TIME_LIMIT_S = 365 * 86400.0


def default_state_dir(for_client: bool = False) -> Path:
    """$GPUDIAG_SCHEDULER_DIR, else /var/lib/gpudiag/scheduler for root (beside the agent's state),
    else ~/.local/state/gpudiag/scheduler. A client that is not root also looks for the
    machine's root daemon first: on a shared machine that is the one everybody submits to."""
    env = os.environ.get(ENV_SCHEDULER_DIR)
    if env:
        return Path(env)
    system = Path("/var/lib/gpudiag/scheduler")
    if os.geteuid() == 0 or (for_client and (system / SOCKET_NAME).exists()):
        return system
    return Path(os.path.expanduser("~/.local/state/gpudiag/scheduler"))


def unsafe_reason(path: Path, trusted_uids: set[int]) -> str | None:
    """Why ``path`` (a folder or the socket) cannot be trusted, or None when it can.

    Trusted: owned by one of ``trusted_uids`` and not writable by group or others (a socket
    is connectable by everyone by design, so only its owner counts).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path}: {e.strerror}"
    if st.st_uid not in trusted_uids:
        return f"{path} is owned by uid {st.st_uid}, not by {' or '.join(map(str, sorted(trusted_uids)))}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_client_dir(state_dir: Path) -> Path:
    """The socket path, after checking that the folder and socket are the daemon's to give.

    A client trusts root or itself: another user's daemon could read the environment a
    submit sends, so talking to it is refused rather than risked.
    """
    trusted = {0, os.geteuid()}
    sock = state_dir / SOCKET_NAME
    for p in (state_dir, sock):
        why = unsafe_reason(p, trusted)
        if why:
            raise BadInput(f"unsafe scheduler state: {why}")
    if not sock.exists():
        raise BadInput(f"no scheduler is running at {state_dir} (start one: gpudiag scheduler serve)")
    return sock


def prepare_daemon_dir(state_dir: Path) -> None:
    """Create the state folder (0755: clients must reach the socket) or check the one there."""
    uid = os.geteuid()
    if state_dir.exists():
        why = unsafe_reason(state_dir, {uid})
        if why:
            raise BadInput(f"unsafe state dir: {why}")
        if not state_dir.is_dir():
            raise BadInput(f"state dir {state_dir} is not a folder")
    else:
        try:
            state_dir.mkdir(parents=True, mode=0o755)
            os.chmod(state_dir, 0o755)
        except OSError as e:
            raise BadInput(f"cannot create state dir {state_dir}: {e.strerror}") from None
    for name in (DB_NAME, JOBS_DIR):
        why = unsafe_reason(state_dir / name, {uid})
        if why:
            raise BadInput(f"unsafe state dir: {why}")
    (state_dir / JOBS_DIR).mkdir(mode=0o755, exist_ok=True)
