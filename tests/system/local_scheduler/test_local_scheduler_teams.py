"""Teams, limits and a team lead's tools on a real root daemon with real second users (issue 30).

Teams are an administrator's fact (Unix groups, or a root-owned teams file), so a user cannot
spend another team's quota; one user cannot queue without bound; ``queue --user/--mine`` and
``cancel`` of several ids or of one user's jobs; errors in the words of the options typed.
Every user here is a real account (``tests.harness.unix_users``) whose processes talk to the
daemon through the real CLI or socket, so the daemon learns who they are from the kernel.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from gpudiag.commands.queue import render
from gpudiag.errors import BadInput
from gpudiag.scheduler.local.protocol import call
from gpudiag.scheduler.local.teams import parse_teams_file
from tests.system.local_scheduler.test_local_scheduler import (
    WAIT_S,
    cli_as,
    flat,
    job_block,
    one_line_refusal,
    run_as,
    state_of,
)
from tests.system.local_scheduler.test_local_scheduler_trust import PATH_ENV, gate_job, user_submit


@contextlib.contextmanager
def unix_group(members: list[str]) -> Iterator[str]:
    """A real Unix group (unique name) with ``members`` as supplementary members, removed after."""
    name = f"gpt{uuid.uuid4().hex[:8]}"
    for _ in range(20):   # /etc/group may be locked by another groupadd for a moment
        r = subprocess.run(["groupadd", name], capture_output=True, text=True)
        if r.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"groupadd {name}: {r.stderr}")
    try:
        for m in members:
            subprocess.run(["usermod", "-a", "-G", name, m], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def submit_as(user, s, *args: str) -> subprocess.CompletedProcess:
    return cli_as(user.pw_uid, user.pw_gid, ["submit", "--state-dir", str(s.state), *args])


def test_a_user_naming_a_team_they_are_not_in_is_refused_and_a_group_member_is_accepted(
        open_base, users, sched_factory):
    alice, bob = users
    with unix_group([alice.pw_name]) as vision:
        assert alice.pw_name in grp.getgrnam(vision).gr_mem
        s = sched_factory("--slots", "2", "--no-monitor", "--quota", f"{vision}=1", base=open_base)
        r = submit_as(bob, s, "--gpus", "1", "--team", vision, "--", "true")
        primary = grp.getgrgid(bob.pw_gid).gr_name   # useradd -N: a shared group, e.g. "users"
        one_line_refusal(r, f"--team {vision}: {bob.pw_name} is not in team {vision} (teams come from the "
                            f"Unix groups); your teams: {bob.pw_name} (default), {primary}")
        assert s.db() == []
        ok = submit_as(alice, s, "--gpus", "1", "--team", vision, "--", "true")
        assert ok.returncode == 0, ok.stderr
        mine = submit_as(alice, s, "--gpus", "1", "--", "true")   # no --team: her default, her name
        jobs = s.wait("both done", lambda j: all(x["state"] == "done" for x in j.values()) and len(j) == 2)
        assert {jobs[int(ok.stdout)]["team"], jobs[int(mine.stdout)]["team"]} == {vision, alice.pw_name}
        # root (the daemon's own user, the administrator) may name any team
        assert s.submit("--gpus", "1", "--team", "anyteam", "--", "true") > 0


def test_a_teams_file_decides_and_one_not_roots_or_writable_by_others_is_refused(
        open_base, users, sched_factory, tmp_path):
    alice, bob = users
    teams = open_base / "teams"
    teams.write_text(f"# user: team [team ...]\n{alice.pw_name}: vision nlp\n{bob.pw_name}: nlp\n")
    os.chmod(teams, 0o644)
    serve = [sys.executable, "-m", "gpudiag", "scheduler", "serve", "--state-dir", str(open_base / "refused"),
             "--slots", "1", "--teams", str(teams)]
    os.chmod(teams, 0o666)
    r = subprocess.run(serve, capture_output=True, text=True, timeout=WAIT_S)
    one_line_refusal(r, f"the teams file {teams} is writable by group or others (mode 666): chmod go-w")
    os.chmod(teams, 0o644)
    os.chown(teams, alice.pw_uid, alice.pw_gid)   # alice could then give herself any team
    r = subprocess.run(serve, capture_output=True, text=True, timeout=WAIT_S)
    one_line_refusal(r, f"the teams file {teams} is owned by uid {alice.pw_uid}: it must be root's")
    os.chown(teams, 0, 0)
    # the case: vision=1, nlp=1; bob may no longer take vision's quota
    s = sched_factory("--slots", "2", "--no-monitor", "--min-runtime", "0", "--quota", "vision=1",
                      "--quota", "nlp=1", "--teams", str(teams), base=open_base)
    one_line_refusal(submit_as(bob, s, "--gpus", "1", "--team", "vision", "--", "true"),
                     f"your teams: nlp (default), {bob.pw_name}")
    gate = open_base / "gate"
    hold = ["--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    first = int(submit_as(alice, s, "--gpus", "1", *hold).stdout)   # her default team: vision
    nlp = int(submit_as(bob, s, "--gpus", "1", *hold).stdout)       # his: nlp
    s.wait("both running", lambda j: state_of(j, first) == state_of(j, nlp) == "running")
    second = int(submit_as(alice, s, "--gpus", "1", "--", "true").stdout)
    jobs = s.wait("a pass explained it", lambda j: "reclaim" in j[second]["why"])
    assert (jobs[first]["team"], jobs[nlp]["team"]) == ("vision", "nlp")
    why = jobs[second]["why"]
    assert f"no quota reclaim: team vision holds 1 of its 1-slot quota (job {first} of {alice.pw_name})" \
        in why, why
    q = s.cli("queue").stdout
    assert " TEAM " in q, q
    assert "team vision holds 1 of its 1-slot quota" in job_block(q, second), q
    listed = json.loads(s.cli("queue", "--json").stdout)
    assert (listed["teams"], listed["quota"]) == (f"teams file {teams}", {"vision": 1, "nlp": 1})
    # the file is read again when it changes: bob joins vision, no restart
    teams.write_text(f"{alice.pw_name}: vision nlp\n{bob.pw_name}: nlp vision\n")
    r = submit_as(bob, s, "--gpus", "1", "--team", "vision", "--", "true")
    assert r.returncode == 0, r.stderr
    gate.touch()
    s.wait("all done", lambda j: all(x["state"] == "done" for x in j.values()))


def test_one_user_past_the_pending_limit_is_refused_in_a_line_and_a_team_lead_lists_and_cancels(
        open_base, users, sched_factory):
    alice, bob = users
    limit = 5
    s = sched_factory("--slots", "1", "--no-monitor", "--max-pending", str(limit), base=open_base)
    gate = open_base / "gate"
    gate_job(s, gate)   # nothing of alice's starts: all of hers stay pending
    sock = s.state / "sock"
    req = {"op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV, "cwd": "/",
           "cmd": ["sh", "-c", "echo " + "x" * 200]}

    def flood() -> dict:   # 2,000 submits, one connection each, as alice
        answers, slowest = [], 0.0
        t0 = time.monotonic()
        for _ in range(2000):
            t = time.monotonic()
            answers.append(call(sock, req, timeout=WAIT_S))
            slowest = max(slowest, time.monotonic() - t)
        return {"answers": answers, "total_s": time.monotonic() - t0, "slowest_s": slowest}

    out = run_as(alice.pw_uid, alice.pw_gid, flood)
    accepted = [a["id"] for a in out["answers"] if a["ok"]]
    refused = {a["error"] for a in out["answers"] if not a["ok"]}
    assert len(accepted) == limit, out["answers"][:limit + 1]
    assert refused == {f"{alice.pw_name} has {limit} jobs waiting, the most one user may queue here "
                       f"(--max-pending {limit}): wait for some to start, or cancel some "
                       f"(gpudiag cancel --user {alice.pw_name})"}, refused
    # bounded: a refusal costs no check and no process (measured here: about 1-2 ms each)
    assert out["total_s"] < 120 and out["slowest_s"] < 10, (out["total_s"], out["slowest_s"])
    print(f"2000 submits past a limit of {limit}: {out['total_s']:.1f} s, slowest {out['slowest_s']:.2f} s")
    assert user_submit(bob, sock, ["true"])["ok"]   # another user is not held by alice's limit

    mine = cli_as(alice.pw_uid, alice.pw_gid, ["queue", "--state-dir", str(s.state), "--mine", "--json"])
    assert sorted(j["id"] for j in json.loads(mine.stdout)["jobs"]) == sorted(accepted), mine.stderr
    theirs = json.loads(s.cli("queue", "--user", alice.pw_name, "--json").stdout)["jobs"]
    assert sorted(j["id"] for j in theirs) == sorted(accepted)   # not root's blocker, not bob's job
    listed = s.cli("queue", "--user", alice.pw_name).stdout
    assert all(("waits for job" in job_block(listed, i)) != ("behind job" in job_block(listed, i))
               for i in accepted), listed
    assert all(len(line) <= 80 for line in listed.splitlines()), listed
    # bob may not cancel alice's jobs; alice may cancel all of hers in one request
    r = cli_as(bob.pw_uid, bob.pw_gid, ["cancel", "--state-dir", str(s.state), "--user", alice.pw_name])
    one_line_refusal(r, f"only {alice.pw_name} or root may cancel all of {alice.pw_name}'s jobs")
    r = cli_as(alice.pw_uid, alice.pw_gid, ["cancel", "--state-dir", str(s.state), "--user", alice.pw_name])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{alice.pw_name}: {limit} jobs cancelled ({limit} cancelled)"
    jobs = s.jobs()
    assert all(state_of(jobs, i) == "cancelled" for i in accepted)
    assert all(f"cancelled by {alice.pw_name} while pending" == jobs[i]["why"] for i in accepted)
    # now she may queue again; root cancels several ids at once, one refused alone
    again = [user_submit(alice, sock, ["true"])["id"] for _ in range(2)]
    r = s.cli("cancel", str(again[0]), "99999", str(again[1]), str(accepted[0]), check=False)
    assert r.returncode == 2, r
    assert r.stdout.splitlines() == [f"job {again[0]}: cancelled", f"job {again[1]}: cancelled"], r.stdout
    assert sorted(r.stderr.splitlines()) == sorted([
        "gpudiag: error: no job 99999", f"gpudiag: error: job {accepted[0]} has already ended (cancelled)"])
    assert flat(s.cli("queue", "--user", alice.pw_name).stdout).count("cancelled by root while pending") == 2
    gate.touch()


@pytest.mark.parametrize(("args", "words"), [
    (["--time-limit", "0.5s"], "--time-limit must be between 1s and 365d (0 = none)"),
    (["--grace", "2h"], "--grace must be between 0s and 1h"),
    (["--team", "a/b"], "--team must be at most 64 characters of letters, digits, '_', '.', '-'"),
    (["--tier", "gold"], "unknown tier 'gold': --tier is one of spot, reserved, on-demand"),
    (["--gpus", "0"], "--gpus must be a positive whole number"),
    (["--grace", "2x"], "Invalid value for --grace: '2x': use e.g. 10m, 600s, 2h, 1d or 0"),
])
def test_submit_errors_name_the_option_and_its_units_at_the_client_and_the_daemon(
        sched_factory, args, words):
    s = sched_factory("--slots", "1", "--no-monitor")
    opts = ["--gpus", "1", *args] if "--gpus" not in args else args
    one_line_refusal(s.cli("submit", *opts, "--", "true", check=False), words)
    if args[1] == "2x":   # a duration the client cannot read never reaches the daemon
        return
    raw = {"op": "submit", "cmd": ["true"], "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV,
           "cwd": "/"}
    field = {"--time-limit": ("time_limit_s", 0.5), "--grace": ("grace_s", 7200), "--team": ("team", "a/b"),
             "--tier": ("tier", "gold"), "--gpus": ("gpus", 0)}[args[0]]
    answer = s.ask({**raw, field[0]: field[1]})   # another client, bypassing the CLI: the same words
    assert not answer["ok"] and answer["error"] == words, answer
    assert s.db() == []
    ok = s.submit("--gpus", "1", "--time-limit", "0", "--", "true")   # 0: no limit, as the hint says
    assert s.jobs()[ok]["time_limit_s"] is None


def test_queue_fits_80_columns_with_team_and_a_long_reason():
    now = time.time()
    job = {"id": 123456, "user": "a-very-long-user-name", "team": "a-very-long-team", "tier": 2, "gpus": 8,
           "state": "pending", "started_t": None, "submit_t": now - 7300, "ended_t": None, "exit_code": None,
           "attempt": 0, "slot_ids": [], "cmd": ["python", "train.py", "--lr", "3e-4", "--epochs", "90"],
           "why": "next to start: needs 8 GPUs, 2 free; waits for jobs 1, 2, 3 to end (no time limit: no "
                  "start time to estimate); no quota reclaim: team vision holds 4 of its 4-GPU quota "
                  "(job 9 of bob, job 10 of bob, job 11 of bob, ...)"}
    answer = {"jobs": [job], "unit": "GPUs", "total": 8, "free": 2,
              "signals": {"available": False, "why": "no agent job table at /var/lib/gpudiag/jobs.json (is "
                          "`gpudiag agent` running on this machine?)", "jobs": 0}}
    lines = render(answer, now, 80)
    assert all(len(x) <= 80 for x in lines), "\n".join(lines)
    user, team = lines[-5].split()[1:3]   # narrowed to leave the command room: cut, and marked
    assert user.endswith("…") and job["user"].startswith(user[:-1]), lines
    assert team.endswith("…") and job["team"].startswith(team[:-1]), lines
    wide = next(x for x in render(answer, now, 160) if x.lstrip().startswith("123456 "))   # room: in full
    assert wide.split()[:3] == ["123456", "a-very-long-user-name", "a-very-long-team"], wide
    assert flat("\n".join(lines)).endswith(job["why"])   # the whole reason, wrapped, none cut
    assert "TEAM" in lines[-6] and "GPUS" in lines[-6]
    assert not any("--epochs 90" in x for x in lines)   # the command is cut to fit ...
    assert any("python train.py --lr 3e-4 --epochs 90" in x for x in render(answer, now, 120))  # ... or not


@pytest.mark.parametrize(("text", "words"), [
    ("alice vision\n", "line 1: write `user: team [team ...]`"),
    ("alice:\n", "line 1: write `user: team [team ...]`"),
    ("# ok\nalice: vision\nalice: nlp\n", "line 3: alice is listed twice"),
    ("bob: vis/ion\n", "line 1: team 'vis/ion': --team must be at most 64 characters"),
])
def test_a_malformed_teams_file_is_one_line_naming_its_line(text, words):
    with pytest.raises(BadInput) as e:
        parse_teams_file(text, "/etc/gpudiag/teams")
    msg = str(e.value)
    assert msg.startswith("/etc/gpudiag/teams ") and words in msg and "\n" not in msg, msg
    assert parse_teams_file("alice: vision nlp vision  # comment\n\nbob:nlp\n", "t") == {
        "alice": ("vision", "nlp"), "bob": ("nlp",)}


@pytest.mark.parametrize(("args", "says"), [
    (("--teams", "/etc/gpudiag/teams"), "--teams does not apply to --backend slurm: Slurm's associations"),
    (("--max-pending", "10"), "--max-pending does not apply to --backend slurm: Slurm's own limit: "
                              "sacctmgr modify user NAME set MaxSubmitJobs=N"),
])
def test_the_slurm_backend_refuses_the_local_teams_and_limit_options_naming_slurms_own(args, says):
    p = subprocess.run([sys.executable, "-m", "gpudiag", "scheduler", "serve", "--backend", "slurm", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
