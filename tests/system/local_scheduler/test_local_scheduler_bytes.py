"""Arguments, environment and output are POSIX bytes: they reach the job, and come back from it,
byte for byte, through the real CLI, the socket's JSON, the SQLite store and ``execve``.

Before, ``gpudiag submit -- echo $'\\xff\\xfe'`` was an internal error of the daemon (or, as
the issue saw it, ran with other bytes), and ``gpudiag logs`` replaced bytes that were not
UTF-8 with U+FFFD.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gpudiag.scheduler.local.protocol import to_wire
from tests.system.local_scheduler.test_local_scheduler import WAIT_S, state_of

ARG = b"\xff\xfe caf\xc3\xa9 \x80"        # not UTF-8, then UTF-8 (must not be re-encoded), then a lone byte
VALUE = b"a\xffb=\xc3\xa9\xed\xa0\x80"    # in a value, with a UTF-8-encoded surrogate (not UTF-8 either)


def test_non_utf8_bytes_in_an_argument_and_an_environment_value_reach_the_job_unchanged(sched_factory):
    s = sched_factory("--slots", "1", "--no-monitor")
    env = {os.fsencode(k): os.fsencode(v) for k, v in s.env.items()}
    env[b"GPUDIAG_TEST_V"] = VALUE
    env[b"GPUDIAG_TEST_\xff"] = b"name"
    show = ("import os, sys; e = os.environb; sys.stdout.buffer.write(b'|'.join("
            "[os.fsencode(sys.argv[1]), e[b'GPUDIAG_TEST_V'], e.get(b'GPUDIAG_TEST_\\xff', b'missing')]))")
    r = subprocess.run([sys.executable, "-m", "gpudiag", "submit", "--state-dir", os.fsencode(str(s.state)),
                        "--gpus", "1", "--", sys.executable, "-c", show, ARG], capture_output=True, env=env,
                       timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout)
    s.wait("the job done", lambda j: state_of(j, job) == "done")
    want = ARG + b"|" + VALUE + b"|name"   # the last: a name /bin/sh would not pass on
    assert (s.state / "jobs" / str(job) / "stdout").read_bytes() == want   # what the job wrote
    logs = subprocess.run([sys.executable, "-m", "gpudiag", "logs", "--state-dir", str(s.state), str(job)],
                          capture_output=True, env={**s.env, "PYTHONIOENCODING": "utf-8:strict"},
                          timeout=WAIT_S)
    assert logs.returncode == 0 and logs.stdout == want, logs   # and what `gpudiag logs` prints
    stored = s.db()[-1]["cmd"]
    assert stored.isascii() and "\\udcff\\udcfe" in stored   # JSON escapes, kept as text in SQLite
    # a terminal whose encoding is strict still gets a line: bytes that are not UTF-8 as \xNN
    short = s.ask({"op": "submit", "gpus": 1, "tier": "spot", "grace_s": 1, "env": {"PATH": "/usr/bin:/bin"},
                   "cwd": "/", "cmd": ["true", to_wire(ARG)]})
    assert short["ok"], short
    # (120 columns: at 80 the COMMAND column, beside TEAM, is 22 wide and would cut the last \x80)
    q = subprocess.run([sys.executable, "-m", "gpudiag", "queue", "--state-dir", str(s.state)],
                       capture_output=True, text=True, timeout=WAIT_S,
                       env={**s.env, "PYTHONIOENCODING": "utf-8:strict", "COLUMNS": "120"})
    assert q.returncode == 0 and "true '\\xff\\xfe café \\x80'" in q.stdout, q


def test_a_string_that_stands_for_no_bytes_is_refused_in_one_line_not_rewritten(sched_factory):
    s = sched_factory("--slots", "1", "--no-monitor")
    base = {"op": "submit", "gpus": 1, "tier": "spot", "grace_s": 1, "env": {"PATH": "/usr/bin:/bin"},
            "cwd": "/", "cmd": ["echo", "ok"]}
    for bad, words in [({"cmd": ["echo", "\ud800"]}, "argument 1 holds '\\ud800', which stands for no bytes"),
                       ({"env": {"V": "x\udc41"}}, "environment variable V holds '\\udc41'"),
                       ({"cwd": "/\udfff"}, "cwd holds '\\udfff'")]:
        answer = s.ask({**base, **bad})
        assert not answer["ok"] and words in answer["error"] and "internal" not in answer, (bad, answer)
        assert "\n" not in answer["error"]
    assert s.db() == []


def test_queue_shows_a_user_team_and_reason_that_are_not_utf8_as_escapes_on_a_strict_terminal():
    """sched-b's TEAM column and wrapped reasons meet sched-a's bytes: a user name from passwd, and
    a reason quoting a job's cwd (``could not start: cannot enter its working folder ...``), may
    hold bytes that are not UTF-8; a strict stdout must get \\xNN, not a UnicodeEncodeError."""
    import time

    from gpudiag.commands.queue import render

    now = time.time()
    odd = to_wire(b"d\xffr")
    job = {"id": 7, "user": to_wire(b"u\xfe"), "team": to_wire(b"t\xfd"), "tier": 1, "gpus": 1,
           "state": "failed", "started_t": None, "submit_t": now - 5, "ended_t": now, "exit_code": 126,
           "attempt": 1, "slot_ids": [], "cmd": ["true"],
           "why": f"could not start: cannot enter its working folder /{odd} (as u)"}
    answer = {"jobs": [job], "unit": "slots", "total": 1, "free": 1,
              "signals": {"available": False, "why": "none", "jobs": 0}}
    text = "\n".join(render(answer, now, 120))
    text.encode("utf-8")   # strict: no lone surrogate is left
    assert "u\\xfe" in text and "t\\xfd" in text and "/d\\xffr" in text, text
