"""A job's own files and a user's hand-made requests against the root daemon, under ``--monitor``.

A job's folder is its user's, so everything the daemon reads there is a claim: once a run.json
of 200,000 ``[`` killed the daemon for good (``RecursionError`` in its loop, again at every
restart while the job lived), and a run.json that said "exit 0" ended a job that kept running
on its GPUs while they went to the next one. Here: a real root daemon running each job under
``gpudiag profile --monitor``, real second users (their gpudiag and torch from
tests/user_env.py), hostile bytes in every file the daemon reads from a job's folder and on its
socket, and another user answered throughout.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
import time
from pathlib import Path

import pytest

from gpudiag.rundir import RUN_SCHEMA_VERSION
from gpudiag.scheduler.local.protocol import OPS, call, connect
from tests import user_env
from tests.harness import unix_users
from tests.system.local_scheduler.test_local_scheduler import WAIT_S, Sched, state_of
from tests.user_env import PATH_ENV, child_report, fork_as, user_job

# a folder every user can reach for the module, and a venv in it every user can run
module_base, user_python = user_env.module_base, user_env.user_python

SEED_VAR = "GPUDIAG_FUZZ_SEED"
FUZZ_ROUNDS = 2   # times the socket fuzzer sends its whole list as fast as it can


@pytest.fixture
def users():
    with unix_users("gphs") as made:
        yield made


@pytest.fixture
def base(module_base, users):
    """This test's folder, and in it ``mine``: a folder the first user (the job's) may write."""
    d = Path(tempfile.mkdtemp(dir=module_base))
    os.chmod(d, 0o755)
    (d / "mine").mkdir(mode=0o755)
    os.chown(d / "mine", users[0].pw_uid, users[0].pw_gid)
    return d


def daemon(base: Path, user_python: Path, *args: str) -> Sched:
    """Root's daemon under --monitor, run by an interpreter every user can run (it starts jobs
    with its own), outside the checkout (whose gpudiag/ would shadow the environment's)."""
    return Sched(base, "--slots", "1", "--min-runtime", "0", "--agent-dir", str(base / "no-agent"), *args,
                 python=str(user_python), cwd=Path("/"))


def script(base: Path, name: str, body: str) -> list[str]:
    """A job's shell script, where its user can read it. In it: J, the job's folder; R, its
    run folder under --monitor; M, the user's own folder of the test."""
    path = base / name
    path.write_text('J="$(dirname "$GPUDIAG_CHECKPOINT_DIR")"; R="$J/run-1"; M="' + str(base / "mine")
                    + '"\n' + body)
    path.chmod(0o755)
    return ["sh", str(path)]


def until(what: str, pred, timeout: float = WAIT_S) -> None:  # any callable
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def next_pass(s: Sched) -> None:
    """Until a scheduling pass that began after this call has run (it read every job's files)."""
    seen = s.ask({"op": "ping"})["passes"]
    until("a scheduling pass", lambda: s.ask({"op": "ping"})["passes"] >= seen + 1)


def answering(user, sock: Path, stop: Path) -> tuple[int, int]:
    """A process of ``user`` asking ``queue`` and ``ping`` until ``stop`` exists: (pid, the fd of
    its report: how many it asked, what failed, the slowest answer)."""
    def ask() -> dict:
        out: dict = {"asked": 0, "failed": [], "worst_s": 0.0}
        while not stop.exists():
            for op in ("queue", "ping"):
                t0 = time.monotonic()
                try:
                    a = call(sock, {"op": op})
                    if not a.get("ok"):
                        out["failed"].append(a)
                except OSError as e:
                    out["failed"].append(f"{op}: {e}")
                out["asked"] += 1
                out["worst_s"] = max(out["worst_s"], time.monotonic() - t0)
            time.sleep(0.02)
        return out

    return fork_as(user.pw_uid, user.pw_gid, ask, alarm_s=WAIT_S * 6)


def report(child: tuple[int, int]) -> dict:
    out = child_report(child)
    assert isinstance(out, dict), out
    return out


def claim(**fields: object) -> bytes:
    return json.dumps({"kind": "gpudiag-run", "schema_version": RUN_SCHEMA_VERSION, "end": time.time(),
                       "exit_code": 0, **fields}).encode()


# --- the issue's two run.json holes -------------------------------------------------------------

def test_a_run_json_nested_200000_deep_fails_its_job_alone_while_another_user_is_answered(
        base, user_python, users):
    alice, bob = users
    s = daemon(base, user_python)
    stop = base / "stop"
    try:
        sock = s.state / "sock"
        asker = answering(bob, sock, stop)
        job = user_job(alice, sock, script(base, "nested.sh", (
            'while :; do head -c 200000 /dev/zero | tr "\\0" "[" > "$R/.x" && mv -f "$R/.x" "$R/run.json"; '
            'touch "$M/wrote"; sleep 0.2; done\n')))
        after = user_job(bob, sock, ["true"])
        jobs = s.wait("the job failed", lambda j: state_of(j, job) == "failed", timeout=WAIT_S * 2)
        assert (base / "mine" / "wrote").exists()
        assert jobs[job]["why"].startswith("run-1/run.json is nested deeper than 32 levels: stopped"), \
            jobs[job]
        jobs = s.wait("the next job done", lambda j: state_of(j, after) == "done")
        rows = {r["id"]: r for r in s.db()}
        assert rows[after]["started_t"] >= rows[job]["ended_t"]
        stop.touch()
        got = report(asker)
        assert got.get("failed") == [] and got["asked"] > 0, got
        assert s.proc.poll() is None
        log = s.log.read_text()
        assert "Traceback" not in log and "run-1/run.json is nested deeper than 32 levels" in log, log
    finally:
        stop.touch()
        s.stop()


def test_a_forged_exit_in_run_json_keeps_the_gpu_until_the_jobs_processes_end(base, user_python, users):
    alice, bob = users
    s = daemon(base, user_python)
    gate = base / "gate"
    try:
        sock = s.state / "sock"
        forged = claim().decode().replace('"', '\\"')
        job = user_job(alice, sock, script(base, "forger.sh", (
            f'echo $$ > "$M/pid"\nwhile [ ! -e {gate} ]; do printf "%s" "{forged}" > "$R/.x" && '
            'mv -f "$R/.x" "$R/run.json"; sleep 0.2; done\nexit 7\n')))
        pid = base / "mine" / "pid"
        probe = user_job(bob, sock, ["sh", "-c", f'case "$(ps -o stat= -p $(cat {pid}))" in '
                                                 '""|Z*) echo gone;; *) echo alive;; esac'])
        jobs = s.wait("the forger finishing", lambda j: state_of(j, job) == "finishing", timeout=WAIT_S * 2)
        assert jobs[job]["why"].startswith("finishing: its command ended (exit 0, says run-1/run.json)"), jobs
        assert state_of(jobs, probe) == "pending" and jobs[job]["slot_ids"] == ["0"], jobs
        next_pass(s)   # the next pass too: the claim gives nobody its slot
        jobs = s.jobs()
        assert (state_of(jobs, job), state_of(jobs, probe)) == ("finishing", "pending"), jobs
        # its owner could still cancel it; the queue says what it is
        assert "finishing" in s.cli("queue").stdout
        gate.touch()
        jobs = s.wait("both ended", lambda j: state_of(j, job) == "failed" and state_of(j, probe) == "done",
                      timeout=WAIT_S * 2)
        # the kernel's exit code, not the claim's 0
        assert jobs[job]["exit_code"] == 7 and jobs[job]["why"] == "exit code 7", jobs[job]
        assert s.cli("logs", str(probe)).stdout.split() == ["gone"]   # none of its processes left
        rows = {r["id"]: r for r in s.db()}
        assert rows[probe]["started_t"] >= rows[job]["ended_t"]
        assert s.proc.poll() is None and "Traceback" not in s.log.read_text()
    finally:
        gate.touch()
        s.stop()


# --- the fuzz test ----------------------------------------------------------------------------------

HOSTILE_VALUES = [None, True, False, 0, -1, 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 0.5, "", "x" * 5000,
                  "\udfff", [], {}, [[[[]]]], {"a": {"b": {}}}, [1, 2, 3]]
VALID = {"ping": {}, "queue": {"all": True}, "cancel": {"ids": [1]}, "logs": {"id": 1, "stream": "stdout"},
         # a folder nobody can enter: a submit that gets past every hostile field queues nothing
         "submit": {"cmd": ["true"], "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV,
                    "cwd": "/nonexistent-gpudiag-fuzz"}}


def hostile_requests(rng: random.Random) -> list[bytes]:
    """Request lines no client sends: nested, huge numbers, NaN, wrong types field by field,
    truncated, binary, too large."""
    lines = [b"[" * 100_000, b'{"op":"queue","all":' + b"[" * 100_000, b'{"op":' * 50_000,
             b'{"op":"logs","id":' + b"9" * 5000 + b"}", b'{"op":"logs","id":1e999}',
             b'{"op":"cancel","ids":[NaN]}', b'{"op":"queue","all":Infinity}',
             b'{"op":"submit","gpus":-Infinity}', b'{"op":"logs","id":1,"offset":' + b"1" * 30 + b"}",
             b"\xff\xfe\x00\x01", b"null", b"[]", b'"op"',
             b"{}", b'{"op":"queue"' + b" " * ((1 << 20) + 10) + b"}", "{\"op\":\"queue\"}".encode("utf-16")]
    for op in OPS:
        whole = json.dumps({"op": op, **VALID[op]}).encode()
        lines += [whole[:k] for k in sorted(rng.sample(range(1, len(whole)), min(4, len(whole) - 1)))]
        for name in [*VALID[op], "op"]:
            for v in rng.sample(HOSTILE_VALUES, 6):
                lines.append(json.dumps({"op": op, **VALID[op], name: v}).encode())
    lines += [rng.randbytes(rng.choice((1, 7, 100, 4096, 70_000))) for _ in range(30)]
    rng.shuffle(lines)
    return lines


def send_raw(sock: Path, line: bytes) -> dict | str:
    """One raw line (no client-side checks), the daemon's answer parsed, or why there was none."""
    with connect(sock, time.monotonic() + 30) as s:
        s.settimeout(30)
        try:
            s.sendall(line + b"\n")
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass   # answered (too large) before it read all: the answer is there to read
        data = b""
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            data += b
    try:
        return json.loads(data)
    except ValueError:
        return f"not one JSON answer: {data[:200]!r}"


def socket_fuzzer(user, sock: Path, seed: int, stop: Path) -> tuple[int, int]:
    """A process of ``user`` sending ``hostile_requests`` over and over until ``stop`` exists;
    its report: how many, and every answer that was not a one-line refusal or a plain answer."""
    def fuzz() -> dict:
        lines = hostile_requests(random.Random(seed))
        out: dict = {"sent": 0, "bad": []}
        while not stop.exists() or out["sent"] < len(lines):
            if out["sent"] >= FUZZ_ROUNDS * len(lines):
                time.sleep(0.02)   # then gently: the suite's other lanes share the machine
            line = lines[out["sent"] % len(lines)]
            a = send_raw(sock, line)
            out["sent"] += 1
            if not isinstance(a, dict) or a.get("internal") or (not a.get("ok") and (
                    not isinstance(a.get("error"), str) or "\n" in a["error"])):
                out["bad"].append({"line": line[:80].decode("latin-1"), "answer": str(a)[:300]})
        return out

    return fork_as(user.pw_uid, user.pw_gid, fuzz, alarm_s=WAIT_S * 6)


def file_payloads(rng: random.Random) -> list[list[tuple[str, str, bytes]]]:
    """Rounds of (file in the job's folder, how it is put there, its bytes), one file at most
    once a round, for what the daemon reads while a job runs: its output (``logs``), its
    checkpoint folder (every pass), its exit file (at its end)."""
    return [[("stdout", "data", rng.randbytes(300 * 1024)), ("stderr", "data", b"\xff\xfe" * 1000),
             ("checkpoint", "data", rng.randbytes(1000)), ("exit-1", "data", b"9" * 40)],
            [("stdout", "fifo", b""), ("stderr", "fifo", b""), ("checkpoint", "link", b"/root"),
             ("exit-1", "fifo", b"")],
            [("stdout", "link", b"/etc/shadow"), ("stderr", "link", b"/root"), ("checkpoint", "fifo", b""),
             ("exit-1", "dir", b"")],
            [("stdout", "hard", b""), ("stderr", "dir", b""), ("checkpoint", "future", b"4102444800")],
            [("stdout", "dir", b""), ("stderr", "data", b""), ("checkpoint", "future", b"0")],
            [("stdout", "data", b"ok\n")]]


def run_json_payloads(rng: random.Random) -> list[tuple[bytes, bool]]:
    """(a run.json, whether it is one gpudiag could have written: then the job runs on, finishing)."""
    v = RUN_SCHEMA_VERSION
    return [(b"[" * 200_000, False), (b'{"a":' * 100_000, False),
            (b'{"kind":"gpudiag-run","schema_version":%d,"end":NaN,"exit_code":0}' % v, False),
            (b'{"kind":"gpudiag-run","schema_version":%d,"end":1e999,"exit_code":0}' % v, False),
            (b'{"kind":"gpudiag-run","schema_version":%d,"end":1,"exit_code":%s}' % (v, b"9" * 5000), False),
            (claim(kind=["gpudiag-run"]), False), (claim(end="soon"), False), (claim()[:37], False),
            (rng.randbytes(4096), False), (b" " * (2 << 20) + claim(), False),
            (claim(exit_code=-5), True), (claim().decode().encode("utf-16"), True)]


# the jobs of the fuzz test: P, the test's payload folder
FILES_JOB = """i=0
while [ -e "$P/$i.how" ]; do
  while [ ! -e "$P/go-$i" ]; do sleep 0.02; done
  while read t k d; do
    rm -rf "$J/$t"
    case $k in
      data) cp "$P/$d" "$J/$t";;
      fifo) mkfifo "$J/$t";;
      link) ln -s "$(cat "$P/$d")" "$J/$t";;
      hard) echo x > "$M/h$i"; ln "$M/h$i" "$J/$t";;
      dir) mkdir "$J/$t";;
      future) mkdir "$J/$t"; touch -d "@$(cat "$P/$d")" "$J/$t";;
    esac
  done < "$P/$i.how"
  touch "$M/did-$i"
  i=$((i+1))
done
while [ ! -e "$P/end" ]; do sleep 0.05; done
"""
RUN_JSON_JOB = """while [ ! -e "$P/gate-$K" ]; do
  cp "$P/run-$K" "$R/.x" && mv -f "$R/.x" "$R/run.json"; touch "$M/wrote-$K"; sleep 0.2
done
exit 3
"""
# kills its own wrapper (its session's leader) so that no exit file is written for it, then writes one
EXIT_FILE_JOB = """echo $$ > "$M/exit-pid-$K"
while [ ! -e "$P/exit-gate-$K" ]; do sleep 0.05; done
kill -9 "$(ps -o sid= -p $$ | tr -d ' ')"
if [ "$K" = 0 ]; then printf '99999 \\377' > "$J/exit-1"; else rm -f "$J/exit-1"; mkfifo "$J/exit-1"; fi
touch "$M/exited-$K"
"""


def fuzz_files(s: Sched, alice, base: Path, rng: random.Random) -> dict:
    """Every file the daemon reads from a running job's folder, replaced payload by payload by
    the job itself, read by root's ``logs`` and by a scheduling pass after each."""
    pay, mine, sock = base / "payloads", base / "mine", s.state / "sock"
    rounds = file_payloads(rng)
    for i, payloads in enumerate(rounds):
        for n, (_, _, data) in enumerate(payloads):
            (pay / f"{i}-{n}.data").write_bytes(data)
        how = [f"{t} {k} {i}-{n}.data\n" for n, (t, k, _) in enumerate(payloads)]
        (pay / f"{i}.how").write_text("".join(how))
    job = user_job(alice, sock, script(base, "files.sh", f"P={pay}\n{FILES_JOB}"))
    # pending, so that every pass reads the running job's checkpoint; root's (the fuzzer, as bob,
    # cancels any id it may), from "/" (the checkout's gpudiag/ would shadow the job's profile)
    behind = s.ask({"op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV, "cwd": "/",
                    "cmd": ["true"]})["id"]
    s.wait("the file job running", lambda j: state_of(j, job) == "running", timeout=WAIT_S * 2)
    reads = 0
    for i, payloads in enumerate(rounds):
        (pay / f"go-{i}").touch()
        until(f"payloads {i} in place", (mine / f"did-{i}").exists)
        for stream in ("stdout", "stderr"):
            a = s.ask({"op": "logs", "id": job, "stream": stream})
            reads += 1
            assert a.get("ok") or ("\n" not in a["error"] and "internal" not in a), (payloads, a)
        next_pass(s)
        assert state_of(s.jobs(), job) == "running"
    (pay / "end").touch()
    jobs = s.wait("the file job ended", lambda j: state_of(j, job) == state_of(j, behind) == "done")
    assert jobs[job]["exit_code"] == 0, jobs[job]   # waitpid's, whatever its folder holds
    return {"file payloads": sum(map(len, rounds)), "logs reads": reads}


def fuzz_run_json(s: Sched, alice, base: Path, rng: random.Random) -> int:
    """run.json, one job each: refused in one line that names it, or a claim that changes
    nothing but words (the job runs on, finishing, and ends with its own exit code)."""
    pay, mine, sock = base / "payloads", base / "mine", s.state / "sock"
    payloads = run_json_payloads(rng)
    for k, (raw, plausible) in enumerate(payloads):
        (pay / f"run-{k}").write_bytes(raw)
        job = user_job(alice, sock, script(base, f"run{k}.sh", f"P={pay}\nK={k}\n{RUN_JSON_JOB}"))
        # its start waits for the previous job's last process to go (a slot) and for the
        # user's interpreter to start gpudiag profile: a job that ended instead fails at once
        until(f"run.json {k} written", lambda job=job, k=k: (mine / f"wrote-{k}").exists() or state_of(
            s.jobs(), job) not in ("pending", "running"), timeout=WAIT_S * 4)
        assert (mine / f"wrote-{k}").exists(), (k, s.jobs()[job])
        next_pass(s)

        def read(j: dict, job: int = job) -> bool:
            return state_of(j, job) in ("failed", "finishing")

        jobs = s.wait(f"run.json {k} read", read)
        if plausible:
            assert state_of(jobs, job) == "finishing", jobs[job]
        else:
            assert jobs[job]["why"].startswith("run-1/run.json"), (k, jobs[job])
            assert "stopped (gpudiag profile writes that file" in jobs[job]["why"], jobs[job]
        (pay / f"gate-{k}").touch()
        jobs = s.wait(f"job {job} ended", lambda j, job=job: state_of(j, job) == "failed")
        if plausible:
            assert (jobs[job]["exit_code"], jobs[job]["why"]) == (3, "exit code 3"), jobs[job]
    return len(payloads)


def fuzz_exit_files(s: Sched, alice, base: Path) -> int:
    """An exit file read after a restart, when the daemon is no longer the job's parent: a job
    whose file is not its wrapper's fails, with the line that names the file."""
    pay, mine, sock = base / "payloads", base / "mine", s.state / "sock"
    for k, want in enumerate(("exit-1 holds b'99999 \\xff', not what the job's wrapper writes",
                              "exit-1 is a FIFO, not a regular file")):
        job = user_job(alice, sock, script(base, f"exit{k}.sh", f"P={pay}\nK={k}\n{EXIT_FILE_JOB}"))
        s.wait("the job running", lambda j, job=job: state_of(j, job) == "running", timeout=WAIT_S * 2)
        until("its pid", (mine / f"exit-pid-{k}").exists)
        pid = int((mine / f"exit-pid-{k}").read_text())
        s.kill()
        (pay / f"exit-gate-{k}").touch()
        until("its exit file written", (mine / f"exited-{k}").exists)
        until("it ended", lambda pid=pid: (runner_state(pid) or "Z") == "Z")
        s.start()
        jobs = s.wait("it settled", lambda j, job=job: state_of(j, job) == "failed")
        assert jobs[job]["exit_code"] is None and "exit code unknown" in jobs[job]["why"], jobs[job]
        assert want in jobs[job]["why"], jobs[job]
    return 2


def runner_state(pid: int) -> str | None:
    from gpudiag.scheduler.local.runner import proc_info

    p = proc_info(pid)
    return None if p is None else p.state


def what_the_daemon_saw(s: Sched) -> str:
    """For a failure's report: the daemon's queue and the end of its log (a wait that timed out
    says only what it waited for)."""
    try:
        queue = "\n".join(f"  {j['id']} {j.get('user')} {j.get('state')}: {j.get('why')}"
                          for j in s.ask({"op": "queue", "all": True})["jobs"])
    except (OSError, KeyError, ValueError) as e:
        queue = f"  (no answer: {e})"
    alive = "running" if s.proc.poll() is None else f"exited {s.proc.returncode}"
    try:
        log = s.log.read_text(errors="replace")[-4000:]
    except OSError as e:   # the report must not hide the failure it reports on
        log = f"(unreadable: {e})"
    return f"daemon {alive}; its queue:\n{queue}\nits log's end:\n{log}"


def test_fuzz_every_job_file_and_the_socket_and_another_user_is_answered_throughout(base, user_python, users):
    seed = int(os.environ.get(SEED_VAR) or random.SystemRandom().randrange(2**32))
    print(f"seed {seed} ({SEED_VAR}={seed} replays it)")
    rng = random.Random(seed)
    alice, bob = users
    s = daemon(base, user_python)
    sock, stop = s.state / "sock", base / "stop"
    (base / "payloads").mkdir(mode=0o755)
    try:
        asker = answering(bob, sock, stop)
        fuzzer = socket_fuzzer(bob, sock, rng.randrange(2**32), stop)
        counts = fuzz_files(s, alice, base, rng)
        counts["run.json payloads"] = fuzz_run_json(s, alice, base, rng)
        stop.touch()
        asked, fuzzed = report(asker), report(fuzzer)
        assert asked.get("failed") == [] and asked["asked"] > 0, asked
        assert fuzzed.get("bad") == [] and fuzzed["sent"] > 0, fuzzed
        counts["restarts with a bad exit file"] = fuzz_exit_files(s, alice, base)
        assert s.proc.poll() is None
        log = s.log.read_text()
        assert "Traceback" not in log and "internal error" not in log, log
        print(f"{counts}; socket: {fuzzed['sent']} hostile requests; bob: {asked['asked']} answered, "
              f"worst {asked['worst_s'] * 1e3:.0f} ms")
    except BaseException:
        print(what_the_daemon_saw(s))
        raise
    finally:
        stop.touch()
        (base / "payloads" / "end").touch()
        s.stop()
