"""What every client command does: find the daemon, check it may be trusted, ask, and turn a
refusal into the one-line error and exit code scripts rely on (2: the request was refused)."""

from __future__ import annotations

from pathlib import Path

from gpudiag.errors import BadInput, GpudiagError
from gpudiag.scheduler.local.config import check_client_dir, default_state_dir
from gpudiag.scheduler.local.protocol import Refused, call


def ask(state_dir: Path | None, req: dict) -> dict:
    sock = check_client_dir(state_dir or default_state_dir(for_client=True))
    try:
        answer = call(sock, req)
    except Refused as e:
        raise BadInput(str(e)) from None
    except (OSError, ValueError) as e:
        raise GpudiagError(f"cannot reach the scheduler at {sock}: {e}") from None
    if not answer.get("ok"):
        err = str(answer.get("error", "refused"))
        raise GpudiagError(err) if answer.get("internal") else BadInput(err)
    return answer
