"""Can the submitting user run this command, from this folder? Asked of the kernel, as that user.

Root's view of the filesystem says nothing about what a user may enter or execute, so the check is
the job wrapper's own test (``runner.CAN_RUN``) run by ``/bin/sh`` as the user, beside the loop: a
hung folder delays that one answer (at most ``CHECK_TIMEOUT_S``). docs/scheduler-daemon.md, "A
command that cannot run is refused at submit, checked as its user".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from gpudiag.scheduler.local.runner import CAN_RUN, as_bytes, env_bytes, popen_user

CHECK_TIMEOUT_S = 10.0   # a local folder answers in milliseconds; an NFS mount that hangs, never
# exit codes of the check: the folder, the command, the scheduler's own wrapper command
_SCRIPT = CAN_RUN + 'cd -- "$1" 2>/dev/null || exit 3; can_run "$2" || exit 4; can_run "$3" || exit 5; exit 0'


class CommandCheck:
    """One running check; ``fileno`` becomes readable (end of file) when it is over."""

    def __init__(self, uid: int, user: str, cwd: str, cmd0: str, runner_exe: str,
                 env: dict[str, str]) -> None:
        self.user, self.cwd, self.cmd0, self.runner_exe = user, cwd, cmd0, runner_exe
        self.deadline = time.monotonic() + CHECK_TIMEOUT_S
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", _SCRIPT, "gpudiag-check", *map(as_bytes, (cwd, cmd0, runner_exe))],
                env=env_bytes({k: env[k] for k in ("PATH",) if k in env}), cwd="/", stdin=subprocess.DEVNULL,
                stdout=wfd, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                **popen_user(uid))
        except BaseException:
            os.close(rfd)
            raise
        finally:
            os.close(wfd)
        self.rfd = rfd
        os.set_blocking(rfd, False)

    def fileno(self) -> int:
        return self.rfd

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def verdict(self) -> str | None:
        """None: the user can run it; else why not, in one line. Ends the check."""
        try:
            code = self.proc.wait(timeout=0.5) if not self.expired() else None
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        if code is None:
            return (f"could not check within {CHECK_TIMEOUT_S:.0f} s whether {self.user} can run {self.cmd0} "
                    f"in {self.cwd} (is that folder on a filesystem that hangs?)")
        return {0: None,
                3: f"{self.user} cannot enter {self.cwd} (the job's working folder: submit from a folder "
                   "you can enter)",
                4: f"{self.cmd0}: command not found or not executable (looked up as {self.user}, on the "
                   f"PATH you submitted with, in {self.cwd})",
                5: f"{self.user} cannot run {self.runner_exe}, which runs every job under gpudiag profile "
                   "--monitor (the admin must install gpudiag where every user can run it, or serve with "
                   "--no-monitor)"}.get(code, f"the check of {self.cmd0} as {self.user} failed (exit {code})")

    def close(self) -> None:
        """Stop the check if it still runs (if the kernel holds it in a hung filesystem call,
        subprocess reaps it later, at a next Popen)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.rfd >= 0:
            os.close(self.rfd)
            self.rfd = -1
