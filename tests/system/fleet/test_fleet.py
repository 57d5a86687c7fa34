"""``gpudiag fleet`` against a real Prometheus scraping a real agent that restarts mid-range,
a second Prometheus behind TLS and basic auth, an auth proxy that wants a bearer token under a
route prefix, two exporters of one scheduler counter (one resets), and a real Slurm.

The scene (about a minute, scraped every second): one agent replays the recorded H200 GPUs on
eight GPUs; dcgm-exporter's job-mapping folder puts on them

- GPUs 0-1: a real profiled CPU job (``slurm:9000101``, account ``vision``: MFU and label);
- GPUs 2-3: a job reporting by signal file (``slurm:9000103``, team ``nlp``, MFU 0.0001,
  input-bound, ``dataloader-workers`` predicting 0.5 s -> 0.2 s a step);
- GPU 4: a real Slurm job (sbatch, account ``physics``) that sends no signal;
- GPU 5: a real profiled job under ``--monitor`` with no matmul (no MFU: still signalled);
- GPU 6: a job Slurm does not know, its mapping file owned by ``nobody``; GPU 7: no job.

Halfway the agent is stopped and started again. The hand sums are the raw samples Prometheus
stored (``gpudiag_gpu_up[range]``): a GPU-second is a sample times the 1 s scrape interval.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from gpudiag.jobsignal import write_signal
from gpudiag.live.fleet import summarise
from gpudiag.live.fleet_query import QUERIES, grid_for, read_series, spans
from gpudiag.live.fleet_read import OLD_AGENT_QUERIES, _regex, read_fleet
from gpudiag.live.prom_client import Prometheus
from tests.browser import BrowserError, Chromium
from tests.fleet_scene import BearerProxy, CounterExporter, web_config
from tests.harness import free_port, prometheus_server, wait_http
from tests.paths import REPO

ROOT = REPO
REPLAY = ROOT / "tests" / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"
LOOP_JOB = ROOT / "tests" / "jobs" / "loop_job.py"
ELEMENTWISE_JOB = ROOT / "tests" / "jobs" / "elementwise_job.py"
SCRAPE_S = 1.0
GPUS = 8
PASSWORD = "pw-9f2c-never-shown"
TOKEN = "tok-5e1a-never-shown"
COUNTER = "gpudiag_scheduler_preemptions_total"


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def instant(base: str, expr: str) -> list[dict]:
    return http_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["data"]["result"]


def wait_for(base: str, expr: str, timeout: float = 120.0) -> list[dict]:
    """Until ``expr`` has a result in Prometheus: an event, whatever the machine's pace."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        res = instant(base, expr)
        if res:
            return res
        time.sleep(0.3)
    raise AssertionError(f"no {expr} in Prometheus within {timeout} s")


def wait_scraped(base: str, instance: str, after: float, up: int | None = None) -> None:
    """Until Prometheus has scraped ``instance`` at a time after ``after`` (with ``up`` as given)."""
    cond = f" == {up}" if up is not None else ""
    wait_for(base, f'timestamp(up{{instance="{instance}"}}{cond}) > {after:.3f}')


def gpudiag(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    if check:
        assert p.returncode == 0, f"gpudiag {args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def start_agent(port: int, state: Path, replay: Path, mapping: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "gpudiag", "agent", "--listen", f"127.0.0.1:{port}",
                             "--backend", f"replay:{replay}", "--state-dir", str(state),
                             "--hpc-job-mapping-dir", str(mapping)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/metrics")
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def profiled(tmp: Path, name: str, job_id: str, account: str, state: Path, *cmd: str,
             monitor: bool = False) -> subprocess.Popen:
    env = {**os.environ, "GPUDIAG_AGENT_DIR": str(state), "GPUDIAG_SIGNAL_INTERVAL": "1",
           "SLURM_JOB_ID": job_id, "SLURM_JOB_ACCOUNT": account}
    env.pop("GPUDIAG_JOB", None)
    opts = ["--monitor"] if monitor else ["--skip", "2", "--steps", "3"]
    return subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", "--out", str(tmp / name), *opts,
                             "--", sys.executable, *cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, slurm_cluster):
    tmp = tmp_path_factory.mktemp("fleet")
    rows = [json.loads(line) for line in REPLAY.read_text().splitlines() if '"gpu"' in line]
    replay = tmp / "gpus.jsonl"   # the real recording, replayed on eight GPUs
    replay.write_text("".join(json.dumps({**r, "gpu": g}) + "\n" for g in range(GPUS) for r in rows))
    silent = slurm_cluster.sbatch("fleet-silent", "reserved", 1, "-A", "physics", script="sleep 900")
    mapping = tmp / "mapping"
    mapping.mkdir()
    jobs = {0: "9000101", 1: "9000101", 2: "9000103", 3: "9000103", 4: str(silent), 5: "9000104",
            6: "9000106"}
    for gpu, job in jobs.items():
        (mapping / str(gpu)).write_text(job + "\n")
    os.chown(mapping / "6", pwd.getpwnam("nobody").pw_uid, -1)   # a prolog that wrote it as the user
    state, port, stop_file = tmp / "state", free_port(), tmp / "stop-elementwise"
    for d in ("prom", "secure", "secure-prom"):
        (tmp / d).mkdir()
    web, ca = web_config(tmp / "secure", "lead", PASSWORD)
    a, b = (CounterExporter(COUNTER, 'action="preempt",tier="spot"') for _ in range(2))
    a.value, b.value = 1000, 100
    t0 = time.time()   # before Prometheus holds any sample: every read below covers all of them
    agent = start_agent(port, state, replay, mapping)
    inst = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    try:
        with prometheus_server(tmp / "prom", [port, a.port, b.port]) as base, \
                prometheus_server(tmp / "secure-prom", port, web, scheme="https") as secure:
            wait_for(base, f'gpudiag_gpu_up{{instance="{inst}"}}')
            write_signal(state / "spool", {"job_id": "slurm:9000103", "ts": time.time(), "mfu_ratio": 0.0001,
                                           "bottleneck": "input-bound", "confidence": 0.9,
                                           "step_seconds": 0.5, "action": "dataloader-workers",
                                           "predicted_step_seconds": 0.2, "team": "nlp"})
            procs.append(profiled(tmp, "run", "9000101", "vision", state, str(LOOP_JOB),
                                  "--steps", "150", "--sleep", "0.05"))
            procs.append(profiled(tmp, "run-elementwise", "9000104", "speech", state, str(ELEMENTWISE_JOB),
                                  "--numel", "300000", "--sleep", "0.05", "--until", str(stop_file),
                                  monitor=True))
            wait_for(base, 'gpudiag_job_mfu_ratio{job_id="slurm:9000101"}', timeout=240)
            wait_for(base, 'gpudiag_job_bottleneck{job_id="slurm:9000104"}', timeout=240)
            # the scheduler's counter: a 1000 -> 1003, b 100 -> 130, then b restarts: 0 -> 4
            for exp, value in ((a, 1003), (b, 130), (b, 0), (b, 4)):
                exp.value = value
                wait_for(base, f'{COUNTER}{{instance="127.0.0.1:{exp.port}"}} == {value}')
            stop(agent)                      # the restart: a gap, then the same table again
            down = time.time()
            wait_scraped(base, inst, down + 2 * SCRAPE_S, up=0)
            agent = start_agent(port, state, replay, mapping)
            wait_for(base, 'gpudiag_job_mfu_ratio{job_id="slurm:9000103"}', timeout=60)
            assert procs[0].wait(timeout=300) == 0, procs[0].stderr.read() if procs[0].stderr else ""
            stop_file.touch()
            assert procs[1].wait(timeout=300) == 0, procs[1].stderr.read() if procs[1].stderr else ""
            wait_scraped(base, inst, time.time() + 2 * SCRAPE_S, up=1)
            stop(agent)
            a.close()
            b.close()
            t_stop = time.time()
            wait_scraped(base, inst, t_stop, up=0)   # the last scrapes are in before the range is read
            t1 = time.time()
            yield {"base": base, "secure": secure, "ca": ca, "t0": t0, "t1": t1, "tmp": tmp, "silent": silent,
                   "env": slurm_cluster.env, "inst": inst, "runs": (tmp / "run", tmp / "run-elementwise")}
    finally:
        stop_file.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop(agent)
        a.close()
        b.close()
        slurm_cluster.run("scancel", str(silent), check=False)


# -- the scene's numbers ----------------------------------------------------------------------------

def run_fleet(scene: dict, *extra: str, base: str | None = None, start: float | None = None,
              end: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return gpudiag("fleet", "--prometheus", base or scene["base"], "--from", f"{start or scene['t0']:.3f}",
                   "--to", f"{end or scene['t1']:.3f}", *extra, env=scene["env"], check=check)


def fleet_json(scene: dict, *extra: str, **kw: object) -> dict:
    return json.loads(run_fleet(scene, "--json", *extra, **kw).stdout)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def doc(scene: dict) -> dict:
    return fleet_json(scene)


def raw_samples(scene: dict, metric: str) -> list[dict]:
    """Every sample Prometheus stored for ``metric`` in [t0, t1]."""
    width = int(scene["t1"] - scene["t0"]) + 1
    q = urllib.parse.urlencode({"query": f"{metric}[{width}s]", "time": f"{scene['t1']:.3f}"})
    res = http_json(f"{scene['base']}/api/v1/query?{q}")["data"]["result"]
    return [{"labels": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]
                                                  if scene["t0"] <= float(t) <= scene["t1"]]} for r in res]


def stalled_times(scene: dict) -> dict[str, list[tuple[float, float]]]:
    """job -> the stretches (since, until] it was stalled: each raw sample s at t of the agent's
    stalled series says no step since t - s (docs/stall.md). A job whose last step is long past
    (gpudiag profile's own analysis after the job's last step, on a loaded machine) stalls."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in raw_samples(scene, "gpudiag_job_stalled_seconds"):
        out[s["labels"].get("job_id", "")] += [(t - v, t) for t, v in s["values"]]
    return out


def hand_sums(scene: dict) -> tuple[dict, dict, bool]:
    """(job -> GPU-seconds, job -> useful GPU-seconds, whether the restart left a gap), from the
    raw samples: a sample is one scrape interval; a useful one is a GPU sample x the job's MFU
    sample of the same scrape, where the job was not stalled (its MFU describes steps that
    happened: the agent keeps the last one until it finds the stall, dated back to the last step)."""
    gpu = raw_samples(scene, "gpudiag_gpu_up")
    mfu = raw_samples(scene, "gpudiag_job_mfu_ratio")
    stalls = stalled_times(scene)
    mfu_at = {(m["labels"].get("job_id", ""), t): v for m in mfu for t, v in m["values"]
              if not any(a < t <= b for a, b in stalls.get(m["labels"].get("job_id", ""), []))}
    held, useful = defaultdict(float), defaultdict(float)
    gap = False
    for s in gpu:
        job = s["labels"].get("job_id", "")
        times = [t for t, _ in s["values"]]
        held[job] += len(times) * SCRAPE_S
        useful[job] += sum(mfu_at.get((job, t), 0.0) for t in times) * SCRAPE_S
        gap |= any(b - a > 2.5 * SCRAPE_S for a, b in zip(times, times[1:], strict=False))
    return held, useful, gap


def test_gpu_hours_are_the_samples_prometheus_stored_across_an_agent_restart(scene, doc):
    held, useful, gap = hand_sums(scene)
    assert gap, "the agent restart left no gap in the GPU series"
    assert doc["schema_version"] == 1 and doc["step_s"] == 1.0
    assert doc["coverage"]["gaps"] and all(b - a < 60 for a, b in doc["coverage"]["gaps"])
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert set(jobs) == {f"slurm:{j}" for j in ("9000101", "9000103", "9000104", "9000106", scene["silent"])}
    for job, j in jobs.items():
        assert j["gpu_hours"] * 3600 == pytest.approx(held[job], rel=1e-9), job   # every sample, once
        # useful: the job's mean MFU in each 1 s window x its samples there (one of each a window);
        # a stall is dated from its series' largest value in a window, at most a window late
        tol = 0.05 + 2 * SCRAPE_S * j["gpus"] * max(j["mfu"] or 0.0, 0.0)
        assert j["useful_gpu_hours"] * 3600 == pytest.approx(useful[job], rel=0.02, abs=tol), job
    assert doc["totals"]["unallocated_gpu_hours"] * 3600 == pytest.approx(held[""], rel=1e-9)
    assert doc["totals"]["gpu_hours"] * 3600 == pytest.approx(sum(v for k, v in held.items() if k), rel=1e-9)
    assert jobs["slurm:9000101"]["gpus"] == 2 and jobs["slurm:9000103"]["gpus"] == 2
    assert jobs[f"slurm:{scene['silent']}"]["gpus"] == 1
    assert doc["scrape_intervals"] == {scene["inst"]: 1.0}   # from Prometheus' targets API


def test_a_range_read_in_spans_sums_as_one_query_over_the_whole_range(scene):
    """The spans cut series alive across their edges, the restart's gap among them: joined,
    every query's answer is the one the whole range in one query gives."""
    def keyed(series: list) -> dict:
        return {tuple(sorted(x.labels.items())): x.points for x in series}

    prom = Prometheus(scene["base"])
    grid = grid_for(scene["t0"], scene["t1"])
    targets = prom.scrape_intervals(10)
    whole, _ = read_fleet(prom, grid, targets, span_points=10**6)
    cut, _ = read_fleet(prom, grid, targets, span_points=4)
    assert len(spans(grid, 4)) > 4
    for name in QUERIES:
        assert keyed(cut.series[name]) == keyed(whole.series[name]), name
    assert summarise(cut).to_json() == summarise(whole).to_json()


def test_an_older_agents_per_gpu_series_count_the_same_gpu_time_as_the_per_job_ones(scene):
    """A node whose agent predates gpudiag_gpus_held is read from gpudiag_gpu_up: on the
    scene's real scrapes (restart included) both give the same samples, window by window."""
    def keyed(series: list) -> dict:
        return {tuple(sorted(x.labels.items())): x.points for x in series}

    prom, grid = Prometheus(scene["base"]), grid_for(scene["t0"], scene["t1"])
    new = read_series(prom, grid, names=list(OLD_AGENT_QUERIES))
    old = read_series(prom, grid, exprs={n: q.replace("{i}", _regex([scene["inst"]]))
                                         for n, q in OLD_AGENT_QUERIES.items()})
    for name in OLD_AGENT_QUERIES:
        assert keyed(old[name]) == keyed(new[name]) and new[name], name


def test_a_one_minute_job_in_a_seven_day_range_is_counted_within_two_percent(scene):
    held, _, _ = hand_sums(scene)
    week = fleet_json(scene, start=scene["t1"] - 7 * 86400, end=scene["t1"])
    assert week["step_s"] > 600        # 1,000 windows of 605 s: each job falls inside one or two
    for j in week["jobs"]:
        assert j["gpu_hours"] * 3600 == pytest.approx(held[j["job_id"]], rel=0.02), j["job_id"]
    assert week["coverage"]["share"] < 0.01   # Prometheus held a few minutes of the week: said so


def test_a_range_that_ends_in_the_future_reads_as_the_range_to_now(scene, doc):
    later = fleet_json(scene, end=time.time() + 3600)
    assert later["clipped_to_now"] and later["end"] <= time.time() and not doc["clipped_to_now"]
    # the same samples: GPU-hours exact; the useful/no-MFU split may move by a sample at most,
    # as the windows tile the later range on another grid (the bug added ~5 minutes' lookback)
    assert later["totals"]["gpu_hours"] == pytest.approx(doc["totals"]["gpu_hours"], rel=1e-9)
    assert later["totals"] == pytest.approx(doc["totals"], abs=1e-3)
    assert {j["job_id"]: j["gpu_hours"] for j in later["jobs"]} == \
        pytest.approx({j["job_id"]: j["gpu_hours"] for j in doc["jobs"]}, rel=1e-9)


def test_a_range_wholly_in_the_future_is_one_line(scene):
    p = run_fleet(scene, start=time.time() + 3600, end=time.time() + 7200, check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "after now" in p.stderr and "nothing has run" in p.stderr


def test_a_counter_reset_on_one_of_two_instances_is_that_series_reset(doc):
    """a: 1000 -> 1003; b: 100 -> 130, restarts, 0 -> 4: 37 in all. Summed first, the drop of b
    would read as 1,003 new counts (the old page said 1,040)."""
    (row,) = [r for r in doc["scheduler"] if r["metric"] == COUNTER]
    assert (row["action"], row["tier"]) == ("preempt", "spot")
    # increase() extrapolates to the range's edges: within a few counts of the truth
    assert 37 <= row["count"] <= 45, row


def test_jobs_without_a_signal_are_attributed_by_slurm_else_by_their_node(scene, doc):
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    silent = jobs[f"slurm:{scene['silent']}"]
    assert not silent["signalled"] and silent["mfu"] is None
    assert silent["no_signal_gpu_hours"] == pytest.approx(silent["gpu_hours"])
    assert (silent["user"], silent["user_source"], silent["team"], silent["team_source"]) == \
        (pwd.getpwuid(os.getuid()).pw_name, "slurm", "physics", "slurm")
    unknown = jobs["slurm:9000106"]   # not Slurm's: the uid that owns its job-mapping file
    assert (unknown["user"], unknown["user_source"], unknown["team"]) == ("nobody", "node", "(unattributed)")
    assert doc["totals"]["teams"] == 4 and {t["name"] for t in doc["teams"]} == \
        {"vision", "nlp", "physics", "speech", "(unattributed)"}
    bare = {j["job_id"]: j for j in fleet_json(scene, "--no-slurm")["jobs"]}
    assert bare[f"slurm:{scene['silent']}"]["user"] == "(unattributed)"   # Slurm named it, nothing else


def test_a_profiled_job_without_an_mfu_is_signalled_not_no_signal(scene, doc):
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    elem = jobs["slurm:9000104"]
    diag = json.loads((scene["runs"][1] / "diagnosis.json").read_text())
    assert diag["mfu"]["value"] is None, diag["mfu"]   # no matmul: no FLOPs to base an MFU on
    assert elem["signalled"] and elem["mfu"] is None and elem["no_signal_gpu_hours"] == 0
    # all its hours without an MFU, or stalled (a trace export past its limit on a loaded machine)
    assert elem["no_mfu_gpu_hours"] + elem["stalled_gpu_hours"] == pytest.approx(elem["gpu_hours"])
    assert elem["label"] == diag["verdict"]["label"] and elem["team"] == "speech"
    silent = sum(j["gpu_hours"] for j in doc["jobs"] if not j["signalled"])
    assert doc["totals"]["no_signal_gpu_hours"] == pytest.approx(silent)
    assert doc["totals"]["signalled_jobs"] == 3


def test_the_fixes_that_win_most_head_the_page_in_gpu_hours_a_week(scene, doc):
    """Each job's fix wins its GPU-hours x the share of its step it predicts saving; the three
    largest lead, per week at the range's rate. (Which of the profiled jobs wins most is their
    diagnoses' say; slurm:9000103's fix is known: 0.5 s -> 0.2 s.)"""
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    weeks = (doc["end"] - doc["start"]) / (7 * 86400)
    wins = {j["job_id"]: j["gpu_hours"] * (1 - j["predicted_step_s"] / j["step_s"]) for j in doc["jobs"]
            if j["action"] and j["step_s"] and j["predicted_step_s"] is not None}
    wins = {j: w for j, w in wins.items() if w > 0}   # a prediction no faster than the step wins nothing
    assert [f["job_id"] for f in doc["fixes"]] == sorted(wins, key=lambda j: -wins[j])[:3]
    for f in doc["fixes"]:
        assert f["win_gpu_hours"] == pytest.approx(wins[f["job_id"]])
        assert f["win_gpu_hours_per_week"] == pytest.approx(f["win_gpu_hours"] / weeks)
    slow = next(f for f in doc["fixes"] if f["job_id"] == "slurm:9000103")
    assert (slow["team"], slow["action"], slow["label"], slow["step_s"], slow["predicted_step_s"]) == \
        ("nlp", "dataloader-workers", "input-bound", 0.5, 0.2)
    assert slow["win_gpu_hours"] == pytest.approx(jobs["slurm:9000103"]["gpu_hours"] * (1 - 0.2 / 0.5))
    # MFU 0.0001 against its class' median: nearly all the hours it ran lost to its peers; its
    # loss is that (with any stalled hours) or, where larger, its idle hours or its fix's win
    low = jobs["slurm:9000103"]
    below = low["mfu_gpu_hours"] * (1 - low["mfu"] / low["class_median_mfu"])
    assert low["losses"]["below_peers"] == pytest.approx(below)
    (lost,) = [m for m in doc["most_lost"] if m["job_id"] == "slurm:9000103"]
    assert lost["lost_gpu_hours"] == pytest.approx(
        max(below + low["stalled_gpu_hours"], low["idle_gpu_hours"], low["fix_gpu_hours"]))
    assert [m["lost_gpu_hours"] for m in doc["most_lost"]] == \
        sorted((m["lost_gpu_hours"] for m in doc["most_lost"]), reverse=True)
    assert jobs["slurm:9000101"]["team"] == "vision"             # SLURM_JOB_ACCOUNT, through its signal
    diag = json.loads((scene["runs"][0] / "diagnosis.json").read_text())
    assert jobs["slurm:9000101"]["label"] == diag["verdict"]["label"]
    assert jobs["slurm:9000101"]["user"] == pwd.getpwuid(os.getuid()).pw_name


def test_the_page_reads_at_1400_px_in_chromium_and_holds_the_json(scene, doc):
    out = scene["tmp"] / "page" / "fleet.html"
    out.parent.mkdir()
    p = run_fleet(scene, "--out", str(out))
    assert all(len(line) <= 80 for line in p.stdout.splitlines()[:-1]), p.stdout
    assert "Fix first" in p.stdout and "no signal" in p.stdout
    csv_rows = (out.parent / "fleet.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(doc["jobs"]) and csv_rows[0].startswith("job_id,user,")
    try:
        browser = Chromium.launch(scene["tmp"] / "chromium", width=1400)
    except BrowserError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        page = browser.open(out)
    finally:
        browser.close()
    shot = page.save_screenshot(Path(os.environ.get("GPUDIAG_FLEET_SCREENSHOT", scene["tmp"] / "fleet.png")))
    assert page.page_errors == [] and page.dialogs == [] and page.foreign_requests == []
    assert page.scripts == [{"type": "application/json", "id": "gpudiag-data"}]
    assert page.data == {**doc, "jobs_omitted": 0}
    assert {"fixes", "summary", "teams", "mix", "lost", "jobs", "nodes", "scheduler",
            "method"} <= set(page.sections)
    titles = [c["title"] for c in page.charts]
    assert any("per team" in t for t in titles) and any("per user" in t for t in titles)
    assert any("bottleneck label" in t for t in titles) and all(c["visible_marks"] > 0 for c in page.charts)
    assert page.scroll_width <= page.client_width and page.clipped_boxes == [], (page.clipped_boxes, shot)
    import re

    assert not re.search(r"\de[-+]\d", page.text), "a number in exponent notation"
    fixes = page.text.split("Fix these first", 1)[1].split("\nSummary\n", 1)[0]
    assert "GPU-hours a week" in fixes and "slurm:9000103" in fixes
    assert "of this range" in page.text and "Every job as CSV" in page.text


def test_a_range_with_no_data_is_one_line(scene):
    p = run_fleet(scene, start=scene["t0"] - 7200, end=scene["t0"] - 3600, check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "holds no gpudiag GPU series" in p.stderr


def test_a_prometheus_that_does_not_answer_is_one_line(tmp_path):
    p = gpudiag("fleet", "--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "1h",
                "--out", str(tmp_path / "f.html"), check=False)
    assert p.returncode == 1 and p.stdout == "" and not (tmp_path / "f.html").exists()
    assert p.stderr.count("\n") == 1 and "did not answer" in p.stderr


def test_bad_ranges_are_bad_input():
    assert gpudiag("fleet", "--prometheus", "x:1", "--since", "7 days", check=False).returncode == 2
    assert gpudiag("fleet", "--prometheus", "x:1", "--from", "2026-11-02", "--to", "2026-11-01",
                   check=False).returncode == 2


# -- Prometheus behind credentials ------------------------------------------------------------------

def secret_file(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def shown_nowhere(secret: str, p: subprocess.CompletedProcess, *files: Path) -> None:
    assert secret not in p.stdout and secret not in p.stderr
    for f in files:
        assert secret not in f.read_text(), f


def same_sums(a: dict, b: dict) -> None:
    assert a["totals"] == pytest.approx(b["totals"], rel=1e-6)


def test_basic_auth_over_https_with_the_password_in_no_output_page_or_json(scene, doc, tmp_path):
    secure, ca = scene["secure"], str(scene["ca"])
    pw = secret_file(tmp_path, "pw", PASSWORD)
    wrong = secret_file(tmp_path, "wrong", "not-it")
    p = run_fleet(scene, "--json", "--ca-file", ca, base=secure, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "asks for credentials (HTTP 401)" in p.stderr and "--prometheus-password-file" in p.stderr
    p = run_fleet(scene, "--json", "--ca-file", ca, "--prometheus-user", "lead", "--prometheus-password-file",
                  str(wrong), base=secure, check=False)
    assert p.returncode == 1 and "refused the credentials given (HTTP 401)" in p.stderr
    p = run_fleet(scene, "--json", "--prometheus-user", "lead", "--prometheus-password-file", str(pw),
                  base=secure, check=False)
    assert p.returncode == 1 and "not trusted" in p.stderr and "--ca-file" in p.stderr
    out = tmp_path / "secure.html"
    p = run_fleet(scene, "--out", str(out), "--ca-file", ca, "--prometheus-user", "lead",
                  "--prometheus-password-file", str(pw), base=secure)
    shown_nowhere(PASSWORD, p, out, out.with_suffix(".csv"))
    p = run_fleet(scene, "--json", "--insecure", "--prometheus-user", "lead", "--prometheus-password-file",
                  str(pw), base=secure)
    got = json.loads(p.stdout)
    shown_nowhere(PASSWORD, p)
    assert got["prometheus"] == secure and got["totals"]["gpu_hours"] > 0
    # the same through the environment, and as user:password@ in the URL (parsed, then hidden)
    env = {**scene["env"], "GPUDIAG_PROMETHEUS": secure, "GPUDIAG_PROMETHEUS_USER": "lead",
           "GPUDIAG_PROMETHEUS_PASSWORD_FILE": str(pw), "GPUDIAG_PROMETHEUS_CA_FILE": ca}
    p = gpudiag("fleet", "--from", f"{scene['t0']:.3f}", "--to", f"{scene['t1']:.3f}", "--json", env=env)
    same_sums(json.loads(p.stdout), got)
    in_url = secure.replace("https://", f"https://lead:{PASSWORD}@")
    out = tmp_path / "url.html"
    p = run_fleet(scene, "--out", str(out), "--ca-file", ca, base=in_url)
    shown_nowhere(PASSWORD, p, out, out.with_suffix(".csv"))
    p = run_fleet(scene, "--json", "--ca-file", ca, base=in_url)
    shown_nowhere(PASSWORD, p)
    assert json.loads(p.stdout)["prometheus"] == secure


def test_a_bearer_token_behind_a_route_prefix_and_hints_that_match_the_error(scene, doc, tmp_path):
    proxy = BearerProxy(scene["base"], TOKEN)
    try:
        token = secret_file(tmp_path, "token", TOKEN)
        out = tmp_path / "proxied.html"
        p = run_fleet(scene, "--out", str(out), "--bearer-token-file", str(token), base=f"{proxy.base}/prom")
        shown_nowhere(TOKEN, p, out, out.with_suffix(".csv"))
        p = run_fleet(scene, "--json", "--bearer-token-file", str(token), base=f"{proxy.base}/prom")
        shown_nowhere(TOKEN, p)
        same_sums(json.loads(p.stdout), doc)    # the same Prometheus, through the proxy
        assert all(a == f"Bearer {TOKEN}" for a in proxy.seen_auth)
        p = run_fleet(scene, "--json", base=f"{proxy.base}/prom", check=False)
        assert p.returncode == 1 and "asks for credentials (HTTP 401)" in p.stderr
        assert "--bearer-token-file" in p.stderr
        p = run_fleet(scene, "--json", "--bearer-token-file", str(token), base=proxy.base, check=False)
        assert p.returncode == 1 and p.stderr.count("\n") == 1
        assert "HTTP 404" in p.stderr and "route prefix" in p.stderr
    finally:
        proxy.close()


def test_credentials_given_two_ways_or_half_are_bad_input(scene, tmp_path):
    pw = secret_file(tmp_path, "pw", PASSWORD)
    for extra in (("--prometheus-user", "lead"), ("--prometheus-password-file", str(pw)),
                  ("--prometheus-user", "lead", "--prometheus-password-file", str(pw),
                   "--bearer-token-file", str(pw))):
        p = run_fleet(scene, "--json", *extra, check=False)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (extra, p.stderr)
    p = run_fleet(scene, "--json", "--prometheus-user", "x", "--prometheus-password-file", str(pw),
                  base=scene["base"].replace("http://", "http://u:p@"), check=False)
    assert p.returncode == 2 and "one way" in p.stderr
