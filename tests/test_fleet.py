"""``gpudiag fleet`` against a real Prometheus scraping a real agent that restarts mid-range.

The scene (about a minute of real time, scraped every second, so "several minutes" of a fleet
is compressed into ~60 one-second steps): one agent replays the real H200 recording on six GPUs;
dcgm-exporter's job-mapping folder puts a real profiled CPU job (``slurm:101``, Slurm account
``vision``) on GPUs 0-1, a job that reports by signal files (``slurm:103``, team ``nlp``, a low
MFU) on GPUs 2-3, a job with no signals at all (``slurm:102``) on GPU 4, and nothing on GPU 5.
Halfway, the agent is stopped and a new one started on the same port and state folder.

The hand sums: the raw samples Prometheus stored (``gpudiag_gpu_up[range]``), one per GPU per
scrape; a GPU-second is a sample times the 1 s scrape interval, and a useful GPU-second is a
GPU sample times the job's MFU sample of the same scrape (same timestamp). The page's Riemann
sum at a 1 s step must agree within one scrape interval per stretch of presence.
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

from gpudiag.collectors.users import UserNames
from gpudiag.jobsignal import write_signal
from gpudiag.live.fleet import size_class, summarise
from gpudiag.live.fleet_query import QUERIES, FleetData, Series, join, read_fleet, spans, step_for
from tests.browser import BrowserError, Chromium
from tests.harness import free_port, prometheus_server, wait_http

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"
JOB = ROOT / "tests" / "jobs" / "loop_job.py"
SCRAPE_S = 1.0
MAPPING = {0: "101", 1: "101", 2: "103", 3: "103", 4: "102"}


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


def gpudiag(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
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


def wait_for(base: str, expr: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        q = urllib.parse.urlencode({"query": expr})
        if http_json(f"{base}/api/v1/query?{q}")["data"]["result"]:
            return
        time.sleep(0.3)
    raise AssertionError(f"no {expr} in Prometheus within {timeout} s")


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("fleet")
    rows = [json.loads(line) for line in REPLAY.read_text().splitlines() if '"gpu"' in line]
    replay = tmp / "six-gpus.jsonl"   # the real recording, replayed on six GPUs
    replay.write_text("".join(json.dumps({**r, "gpu": g}) + "\n" for g in range(6) for r in rows))
    mapping = tmp / "mapping"
    mapping.mkdir()
    for gpu, job in MAPPING.items():
        (mapping / str(gpu)).write_text(job + "\n")
    state, port = tmp / "state", free_port()
    (tmp / "prom").mkdir()
    agent = start_agent(port, state, replay, mapping)
    job = None
    try:
        with prometheus_server(tmp / "prom", port) as base:
            wait_for(base, "gpudiag_gpu_up")
            t0 = time.time()
            # slurm:103 reports by signal file: low MFU, a recommendation, a team
            write_signal(state / "spool", {"job_id": "slurm:103", "ts": time.time(), "mfu_ratio": 0.0001,
                                           "bottleneck": "input-bound", "confidence": 0.9,
                                           "step_seconds": 0.5, "action": "dataloader-workers",
                                           "predicted_step_seconds": 0.2, "team": "nlp"})
            env = {**os.environ, "GPUDIAG_AGENT_DIR": str(state), "GPUDIAG_SIGNAL_INTERVAL": "1",
                   "SLURM_JOB_ID": "101", "SLURM_JOB_ACCOUNT": "vision"}
            env.pop("GPUDIAG_JOB", None)
            job = subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", "--out", str(tmp / "run"),
                                    "--skip", "2", "--steps", "3", "--", sys.executable, str(JOB),
                                    "--steps", "150", "--sleep", "0.05"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wait_for(base, 'gpudiag_job_mfu_ratio{job_id="slurm:101"}', timeout=120)
            time.sleep(5)
            stop(agent)                      # the restart: a gap, then the same table again
            time.sleep(3)
            agent = start_agent(port, state, replay, mapping)
            wait_for(base, 'gpudiag_job_mfu_ratio{job_id="slurm:103"}', timeout=30)
            assert job.wait(timeout=180) == 0, job.stderr.read() if job.stderr else ""
            time.sleep(4)
            t1 = time.time()
            time.sleep(2)                     # the last scrapes are in before the range is read
            yield {"base": base, "t0": t0, "t1": t1, "tmp": tmp, "run": tmp / "run"}
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        stop(agent)


def fleet_json(scene: dict) -> dict:
    p = gpudiag("fleet", "--prometheus", scene["base"], "--from", f"{scene['t0']:.3f}",
                "--to", f"{scene['t1']:.3f}", "--json")
    return json.loads(p.stdout)


def raw_samples(scene: dict, metric: str) -> list[dict]:
    """Every sample Prometheus stored for ``metric`` in [t0, t1]."""
    width = int(scene["t1"] - scene["t0"]) + 1
    q = urllib.parse.urlencode({"query": f"{metric}[{width}s]", "time": f"{scene['t1']:.3f}"})
    res = http_json(f"{scene['base']}/api/v1/query?{q}")["data"]["result"]
    return [{"labels": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]
                                                  if scene["t0"] <= float(t) <= scene["t1"]]} for r in res]


def stretches(times: list[float]) -> int:
    """Runs of samples without a gap of more than two scrapes (the restart splits one in two)."""
    return sum(1 for a, b in zip([None, *times], times, strict=False) if a is None or b - a > 2.5 * SCRAPE_S)


def test_gpu_hours_equal_the_hand_sums_of_the_scraped_samples_across_an_agent_restart(scene):
    doc = fleet_json(scene)
    assert doc["step_s"] == 1.0
    gpu = raw_samples(scene, "gpudiag_gpu_up")
    mfu = raw_samples(scene, "gpudiag_job_mfu_ratio")
    mfu_at = {(m["labels"].get("job_id", ""), t): v for m in mfu for t, v in m["values"]}
    hand_s, useful_s, tol_s = defaultdict(float), defaultdict(float), defaultdict(float)
    restarted = False
    for s in gpu:
        job = s["labels"].get("job_id", "")
        times = [t for t, _ in s["values"]]
        hand_s[job] += len(times) * SCRAPE_S
        useful_s[job] += sum(mfu_at.get((job, t), 0.0) for t in times) * SCRAPE_S
        n = stretches(times)
        restarted |= n > 1
        tol_s[job] += n * SCRAPE_S      # one scrape interval per stretch of presence
    assert restarted, "the agent restart left no gap in the GPU series"
    # the restart is a gap in the instants (a scrape that timed out on a busy machine may add one)
    assert doc["gaps"] and all(b - a < 60 for a, b in doc["gaps"])
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert set(jobs) == {"slurm:101", "slurm:102", "slurm:103"}
    for job, j in jobs.items():
        assert j["gpu_hours"] * 3600 == pytest.approx(hand_s[job], abs=tol_s[job]), job
        # useful: MFU < 1, so its error is within the GPU-seconds' own
        assert j["useful_gpu_hours"] * 3600 == pytest.approx(useful_s[job], abs=tol_s[job]), job
    assert doc["unallocated_gpu_hours"] * 3600 == pytest.approx(hand_s[""], abs=tol_s[""])
    assert doc["gpu_hours"] * 3600 == pytest.approx(sum(v for k, v in hand_s.items() if k),
                                                    abs=sum(v for k, v in tol_s.items() if k))
    # the restart is not counted twice: no job holds more GPU-time than its GPUs x the range
    span = scene["t1"] - scene["t0"]
    for job, gpus in (("slurm:101", 2), ("slurm:103", 2), ("slurm:102", 1)):
        assert jobs[job]["gpu_hours"] * 3600 <= gpus * (span + 2 * SCRAPE_S)
        assert jobs[job]["gpus"] == gpus


def test_a_range_read_in_spans_sums_as_one_query_over_the_whole_range(scene):
    """The spans (fleet_query.spans) cut series alive across their edges, the restart's gap
    among them: joined, every query's answer is the one the whole range in one query gives."""
    def keyed(series: list[Series]) -> dict:
        return {tuple(sorted(x.labels.items())): x.points for x in series}

    whole = read_fleet(scene["base"], scene["t0"], scene["t1"], span_points=10**6)
    cut = read_fleet(scene["base"], scene["t0"], scene["t1"], span_points=4)
    assert len(spans(scene["t0"], scene["t1"], cut.step, 4)) > 4
    for name in QUERIES:
        assert keyed(cut.series[name]) == keyed(whole.series[name]), name
    assert summarise(cut).to_json() == summarise(whole).to_json()


def test_a_job_without_signals_shows_its_gpu_hours_as_no_signal_never_a_guessed_mfu(scene):
    doc = fleet_json(scene)
    silent = next(j for j in doc["jobs"] if j["job_id"] == "slurm:102")
    assert silent["mfu"] is None and silent["useful_gpu_hours"] == 0
    assert silent["no_signal_gpu_hours"] == pytest.approx(silent["gpu_hours"])
    assert silent["owner"] == "(unknown)" and silent["team"] == "(unknown)"
    assert doc["no_signal_share"] >= silent["gpu_hours"] / doc["gpu_hours"] - 1e-9
    assert all(w["job_id"] != "slurm:102" for w in doc["wasters"])


def test_the_biggest_loser_carries_its_label_team_and_top_recommendation(scene):
    doc = fleet_json(scene)
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert jobs["slurm:101"]["team"] == "vision"   # from SLURM_JOB_ACCOUNT, through the signal
    diag = json.loads((scene["run"] / "diagnosis.json").read_text())
    assert jobs["slurm:101"]["label"] == diag["verdict"]["label"]
    # the agent named the uid that wrote the signals from the node's accounts
    assert jobs["slurm:101"]["owner"] == pwd.getpwuid(os.getuid()).pw_name
    # slurm:103 ran at MFU 0.0001 against its size class's median: it lost the most
    top = doc["wasters"][0]
    assert (top["job_id"], top["team"], top["label"], top["action"]) == \
        ("slurm:103", "nlp", "input-bound", "dataloader-workers")
    assert top["predicted_step_s"] == 0.2 and top["confidence"] == 0.9
    m = top["class_median_mfu"]
    assert top["lost_gpu_hours"] == pytest.approx(
        (top["gpu_hours"] - top["no_signal_gpu_hours"]) * (1 - top["mfu"] / m))
    teams = {t["name"]: t for t in doc["teams"]}
    assert teams["nlp"]["gpu_hours"] == pytest.approx(jobs["slurm:103"]["gpu_hours"])


def test_the_page_renders_in_chromium_and_agrees_with_json(scene):
    doc = fleet_json(scene)
    out = scene["tmp"] / "fleet.html"
    p = gpudiag("fleet", "--prometheus", scene["base"], "--from", f"{scene['t0']:.3f}",
                "--to", f"{scene['t1']:.3f}", "--out", str(out))
    assert all(len(line) <= 80 for line in p.stdout.splitlines()[:-1]), p.stdout
    assert "no signal" in p.stdout.splitlines()[2]
    try:
        browser = Chromium.launch(scene["tmp"] / "chromium")
    except BrowserError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        page = browser.open(out)
    finally:
        browser.close()
    assert page.page_errors == [] and page.dialogs == [] and page.foreign_requests == []
    assert page.scripts == [{"type": "application/json", "id": "gpudiag-data"}]
    assert page.data == doc
    assert {"summary", "wasters", "teams", "jobs", "mix", "scheduler", "queries"} <= set(page.sections)
    assert page.charts, "no label-mix chart"
    assert page.scroll_width <= page.client_width
    from gpudiag.reports.fmt import num, pct
    assert f"GPU-hours held by jobs\n{num(doc['gpu_hours'])}" in page.text \
        or f"GPU-hours held by jobs\t{num(doc['gpu_hours'])}" in page.text, page.text[:800]
    assert pct(doc["no_signal_share"]) in page.text
    assert "No scheduler exported its actions" in page.text
    assert doc["gaps"] and "No GPU series at all" in page.text   # the agent's restart


def test_a_range_with_no_data_is_one_line(scene):
    p = gpudiag("fleet", "--prometheus", scene["base"], "--from", f"{scene['t0'] - 7200:.0f}",
                "--to", f"{scene['t0'] - 3600:.0f}", check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "holds no gpudiag GPU series" in p.stderr


def test_a_prometheus_that_does_not_answer_is_one_line(tmp_path):
    port = free_port()
    p = gpudiag("fleet", "--prometheus", f"http://127.0.0.1:{port}", "--since", "1h",
                "--out", str(tmp_path / "f.html"), check=False)
    assert p.returncode == 1 and p.stdout == "" and not (tmp_path / "f.html").exists()
    assert p.stderr.count("\n") == 1 and "did not answer" in p.stderr


def test_bad_ranges_are_bad_input():
    assert gpudiag("fleet", "--prometheus", "x:1", "--since", "7 days", check=False).returncode == 2
    assert gpudiag("fleet", "--prometheus", "x:1", "--from", "2026-11-02", "--to", "2026-11-01",
                   check=False).returncode == 2


# -- the sums alone ---------------------------------------------------------------------------------

def test_the_step_keeps_a_month_under_a_thousand_points_a_series():
    assert step_for(0, 30 * 86400) == 2592 and step_for(0, 60) == 1.0
    assert size_class(1) == "1" and size_class(2) == "2" and size_class(3) == "3-4"
    assert size_class(8) == "5-8" and size_class(9) == "9-16"


def test_spans_hold_every_instant_of_the_range_once_on_its_grid():
    for start, end, step, points in ((0, 30 * 86400, 2592, 48), (5, 65, 1.0, 7), (0, 10, 3, 1), (0, 0, 1, 4)):
        got = [a + k * step for a, b in spans(start, end, step, points)
               for k in range(int(round((b - a) / step)) + 1)]
        want = [start + k * step for k in range(int((end - start) // step) + 1)]
        assert got == want, (start, end, step, points)
        assert all(round((b - a) / step) + 1 <= points for a, b in spans(start, end, step, points))
    with pytest.raises(ValueError):
        spans(0, 10, 1, 0)


def test_a_series_cut_by_a_spans_edge_is_one_series_again():
    a = Series({"job_id": "j", "instance": "n"}, [(0, 1.0), (1, 1.0)])
    b = Series({"instance": "n", "job_id": "j"}, [(2, 2.0)])
    other = Series({"instance": "n", "job_id": "k"}, [(2, 3.0)])
    joined = join([[a], [other, b]])
    assert sorted((tuple(sorted(s.labels.items())), s.points) for s in joined) == [
        ((("instance", "n"), ("job_id", "j")), [(0, 1.0), (1, 1.0), (2, 2.0)]),
        ((("instance", "n"), ("job_id", "k")), [(2, 3.0)])]


def test_a_scheduler_counter_reset_is_not_counted_twice():
    s = Series({"__name__": "gpudiag_scheduler_preemptions_total", "action": "preempt", "tier": "spot"},
               [(0, 5.0), (1, 7.0), (2, 1.0), (3, 4.0)])   # 5 -> 7, reset, 1 -> 4: 2 + 1 + 3
    data = FleetData("http://p", 0, 3, 1.0, {"gpus": [Series({"instance": "n", "job_id": "j"}, [(0, 1.0)])],
                                            "scheduler": [s]})
    assert summarise(data).scheduler[0]["count"] == 6.0


def test_a_signal_carries_a_bounded_action_and_team_or_is_refused():
    from gpudiag.agent.signals import BadSignal, parse_signal

    def sig(**kw: object) -> bytes:
        return json.dumps({"schema_version": 2, "job_id": "j", "ts": 1.0, **kw}).encode()

    ok = parse_signal(sig(action="dataloader-workers", predicted_step_seconds=0.2, team="nlp"))
    assert (ok.action, ok.predicted_step_seconds, ok.team) == ("dataloader-workers", 0.2, "nlp")
    for bad in ({"team": "a b"}, {"team": "x" * 65}, {"action": "<script>"}, {"action": 3},
                {"predicted_step_seconds": -1}):
        with pytest.raises(BadSignal) as e:
            parse_signal(sig(**bad))
        assert e.value.reason == "bad_value", bad


def test_instants_with_no_gpu_series_are_a_gap_counted_as_nothing():
    pts = [(t, 2.0) for t in (100, 101, 102, 105, 106)]   # the agent was down at 103 and 104
    mfu = Series({"instance": "n", "job_id": "j", "owner_uid": "7"}, [(100, 0.5), (101, 0.5)])
    data = FleetData("http://p", 100, 106, 1.0,
                     {"gpus": [Series({"instance": "n", "job_id": "j"}, pts)], "mfu": [mfu]})
    s = summarise(data)
    assert s.gaps == [(103, 104)]
    j = s.jobs[0]
    assert (j.gpu_hours * 3600, j.useful_gpu_hours * 3600, j.no_signal_gpu_hours * 3600) == \
        pytest.approx((10, 2, 6))   # 5 instants x 2 GPUs; 2 of them with MFU 0.5
    assert j.owner == "uid 7" and j.mfu == pytest.approx(0.5) and s.no_signal_share == pytest.approx(0.6)


def test_a_two_node_jobs_mfu_from_rank_0s_node_counts_for_its_gpus_on_both_nodes():
    gpus = [Series({"instance": node, "job_id": "slurm:9"}, [(0, 8.0), (1, 8.0)]) for node in ("a", "b")]
    mfu = [Series({"instance": "a", "job_id": "slurm:9", "owner_uid": "1"}, [(0, 0.4), (1, 0.4)])]
    label = [Series({"instance": "a", "job_id": "slurm:9", "owner_uid": "1", "label": "memory-bound"},
                    [(0, 1.0), (1, 1.0)])]
    s = summarise(FleetData("http://p", 0, 1, 1.0, {"gpus": gpus, "mfu": mfu, "label": label}))
    j = s.jobs[0]
    assert j.gpus == 16 and j.size_class == "9-16" and j.nodes == ["a", "b"]
    assert j.no_signal_gpu_hours == 0 and j.useful_gpu_hours * 3600 == pytest.approx(0.4 * 32)
    assert s.label_mix == {"memory-bound": [16.0, 16.0]} and j.label == "memory-bound"


def test_a_job_reads_as_its_owners_login_name_where_the_node_knew_it_else_as_its_uid():
    gpus = [Series({"instance": "a", "job_id": j}, [(0, 1.0)]) for j in ("named", "bare")]
    mfu = [Series({"instance": "a", "job_id": j, "owner_uid": uid}, [(0, 0.3)])
           for j, uid in (("named", "1001"), ("bare", "4000000"))]
    user = [Series({"instance": "a", "job_id": "named", "owner_uid": "1001", "user": "alice"}, [(0, 1.0)])]
    s = summarise(FleetData("http://p", 0, 0, 1.0, {"gpus": gpus, "mfu": mfu, "user": user}))
    owners = {j.job_id: j.owner for j in s.jobs}
    assert owners == {"named": "alice", "bare": "uid 4000000"}
    assert sorted(g.name for g in s.users) == ["alice", "uid 4000000"]


def test_user_names_come_from_the_nodes_accounts_are_kept_a_while_and_stay_bounded():
    calls = []
    now = [0.0]

    def lookup(uid: int) -> str:
        calls.append(uid)
        if uid == 7:
            raise KeyError(uid)   # pwd's answer for a uid with no account
        return f"user{uid}"

    names = UserNames(lookup, clock=lambda: now[0], keep_s=60, max_entries=3)
    assert (names(1), names(1), names(7), names(7)) == ("user1", "user1", None, None)
    assert calls == [1, 7]            # each answer, a missing name too, is kept
    now[0] = 61
    assert names(1) == "user1" and calls == [1, 7, 1]   # looked up again once it has aged
    for uid in range(10, 20):
        names(uid)
    assert len(names._cache) <= 3
    assert UserNames()(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name
