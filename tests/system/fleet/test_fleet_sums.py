"""``gpudiag fleet``'s sums, windows, credentials handling and page, without a Prometheus: the
pure parts (``live/fleet*.py``, ``live/prom_client.py``, ``reports/fleet_*.py``) on answers
shaped as Prometheus gives them. tests/system/fleet/test_fleet.py runs the same against real servers."""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.errors import BadInput
from gpudiag.live.fleet import SlurmJob, size_class, summarise
from gpudiag.live.fleet_model import UNATTRIBUTED
from gpudiag.live.fleet_query import (
    QUERIES,
    FleetData,
    Grid,
    Series,
    _matrix,
    grid_for,
    join,
    left_open,
    spans,
)
from gpudiag.live.fleet_read import UnknownInterval, _regex, fill, resolve_intervals
from gpudiag.live.fleet_stalls import stall_spans
from gpudiag.live.prom_client import PromAuth, read_secret, resolve_auth, split_url
from gpudiag.reports.fleet_page import render_page
from gpudiag.reports.fleet_text import gpu_h, jobs_csv, share
from tests.paths import REPO

ROOT = REPO


# -- windows ----------------------------------------------------------------------------------------

def test_windows_tile_the_range_at_most_a_thousand_and_start_within_a_second_of_it():
    for start, end in ((0, 60), (100.25, 1100.5), (0, 7 * 86400), (1.7e9, 1.7e9 + 30 * 86400 + 0.123),
                       (5, 5.5), (0, 999_999.9)):
        g = grid_for(start, end)
        assert g.n <= 1000 and g.step_ms >= 1000 and g.end == pytest.approx(end, abs=1e-3)
        assert g.start <= start + 1e-3
        assert start - g.start < (1.0 if end - start > 1000 else g.step)
        ends = [g.first + k * g.step for k in range(g.n)]
        assert [g.index(t) for t in ends] == list(range(g.n))
    assert grid_for(0, 7 * 86400).step == 604.8 and grid_for(0, 60).step == 1.0
    # Prometheus 2.x selects [t - w, t], 3.x (t - w, t]: each millisecond in one window either way
    assert Grid(10_000, 1000, 10).window == "999ms" and Grid(10_000, 1000, 10, True).window == "1000ms"
    assert left_open("3.1.0") and not left_open("2.42.0+ds") and not left_open("")
    assert Grid(10_000, 1000, 10).previous().end_ms == 0


def test_spans_hold_every_window_of_the_range_once_on_its_grid():
    for grid, points in ((grid_for(0, 30 * 86400), 48), (grid_for(5, 65), 7), (grid_for(0, 10), 1)):
        got = [a + k * grid.step for a, b in spans(grid, points)
               for k in range(round((b - a) / grid.step) + 1)]
        assert got == pytest.approx([grid.first + k * grid.step for k in range(grid.n)])
        assert all(round((b - a) / grid.step) + 1 <= points for a, b in spans(grid, points))
    with pytest.raises(ValueError):
        spans(grid_for(0, 10), 0)


def test_a_series_cut_by_a_spans_edge_is_one_series_again():
    # labels in name order, as _matrix gives them whatever order an answer had
    ((a,),) = [_matrix({"resultType": "matrix", "result": [
        {"metric": {"job_id": "j", "instance": "n"}, "values": [[0, "1"], [1, "1"]]}]}, "http://p")]
    b = Series({"instance": "n", "job_id": "j"}, [(2, 2.0)])
    other = Series({"instance": "n", "job_id": "k"}, [(2, 3.0)])
    joined = join([[a], [other, b]])
    assert sorted((tuple(sorted(s.labels.items())), s.points) for s in joined) == [
        ((("instance", "n"), ("job_id", "j")), [(0, 1.0), (1, 1.0), (2, 2.0)]),
        ((("instance", "n"), ("job_id", "k")), [(2, 3.0)])]


def test_each_instance_counts_at_its_scrape_interval_and_a_removed_one_is_named():
    ivl, notes = resolve_intervals({"a:1", "b:1", "gone:1"}, {"a:1": 15.0, "b:1": 15.0, "c:1": 30.0}, None)
    assert ivl == {"a:1": 15.0, "b:1": 15.0, "gone:1": 15.0} and "gone:1" in notes[0]
    assert resolve_intervals({"a:1"}, {}, 60.0)[0] == {"a:1": 60.0}
    with pytest.raises(UnknownInterval, match="--scrape-interval"):
        resolve_intervals({"a:1"}, {}, None)


def test_an_older_agents_per_gpu_counts_fill_only_the_windows_its_node_has_no_job_series_for():
    new = [Series({"instance": "a", "job_id": "j"}, [(2.0, 8.0), (3.0, 4.0)])]
    old = [Series({"instance": "a", "job_id": "j"}, [(1.0, 8.0), (2.0, 99.0)]),
           Series({"instance": "b", "job_id": "k"}, [(1.0, 2.0)])]
    got, added = fill(new, old)
    assert added == 2 and sorted((s.labels["instance"], s.points) for s in got) == [
        ("a", [(1.0, 8.0), (2.0, 8.0), (3.0, 4.0)]), ("b", [(1.0, 2.0)])]
    # a regex of exactly these instances, inside a PromQL string
    assert _regex(["10.0.0.1:9835", 'x"y']) == '^(?:10\\\\.0\\\\.0\\\\.1:9835|x\\"y)$'


# -- the sums -------------------------------------------------------------------------------------

def data(series: dict[str, list[Series]], n: int = 10, interval: float = 1.0) -> FleetData:
    g = Grid(n * 1000, 1000, n)
    return FleetData("http://p", g, series, {"a": interval, "b": interval}, requested=(g.start, g.end))


def at(k: int) -> float:
    return float(k + 1)   # the end of window k of data()'s grid


def pts(ks, v: float = 1.0) -> list[tuple[float, float]]:
    return [(at(k), v) for k in ks]


def job(name: str, node: str = "a", gpus: int = 1, ks=range(10), owner: str = "7") -> dict:
    lab = {"instance": node, "job_id": name}
    return {"gpu_samples": [Series(lab, pts(ks, gpus))], "gpu_presence": [Series(lab, pts(ks))],
            "signal_samples": [Series({**lab, "owner_uid": owner}, pts(ks))]}


def merge(*parts: dict) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, []).extend(v)
    return out


def test_a_job_under_gpudiag_without_an_mfu_is_signalled_and_a_silent_one_is_no_signal():
    lab = {"instance": "a", "job_id": "mem", "owner_uid": "7"}
    silent = job("quiet")
    del silent["signal_samples"]
    s = summarise(data(merge(job("mem", gpus=2), silent, {
        "label_samples": [Series({**lab, "label": "memory-bound"}, pts(range(3, 10)))]})))
    rows = {r.job_id: r for r in s.jobs}
    mem, quiet = rows["mem"], rows["quiet"]
    assert mem.signalled and mem.mfu is None and mem.no_signal_gpu_hours == 0
    assert mem.no_mfu_gpu_hours * 3600 == pytest.approx(20) and mem.label == "memory-bound"
    assert not quiet.signalled and quiet.no_signal_gpu_hours * 3600 == pytest.approx(10)
    assert s.totals.no_signal_share == pytest.approx(10 / 30) and s.totals.signalled_jobs == 1
    # the label mix: memory-bound from its first label on, "no label" before, "no signal" for the silent
    assert sum(s.label_mix.labels["memory-bound"]) * 3600 == pytest.approx(14)
    assert sum(s.label_mix.labels["no label"]) * 3600 == pytest.approx(6)
    assert sum(s.label_mix.labels["no signal"]) * 3600 == pytest.approx(10)


def test_useful_hours_count_the_mfu_where_and_as_long_as_the_job_had_one():
    lab = {"instance": "a", "job_id": "j", "owner_uid": "7"}
    # 4 GPUs, 2 samples a window at a 0.5 s interval; an MFU of 0.5 in windows 5-9, half of window 4
    g = Grid(10_000, 1000, 10)
    d = FleetData("http://p", g, merge(
        {"gpu_samples": [Series({"instance": "a", "job_id": "j"}, pts(range(10), 8))],
         "gpu_presence": [Series({"instance": "a", "job_id": "j"}, pts(range(10), 2))],
         "mfu_mean": [Series(lab, pts(range(4, 10), 0.5))],
         "mfu_samples": [Series(lab, [(at(4), 1.0)] + pts(range(5, 10), 2))]}), {"a": 0.5})
    r = summarise(d).jobs[0]
    assert r.gpus == 4 and r.gpu_hours * 3600 == pytest.approx(40)
    assert r.mfu_gpu_hours * 3600 == pytest.approx(22) and r.useful_gpu_hours * 3600 == pytest.approx(11)
    assert r.mfu == pytest.approx(0.5) and r.no_mfu_gpu_hours * 3600 == pytest.approx(18)


def test_a_two_node_jobs_mfu_counts_for_its_gpus_on_both_nodes_and_a_forged_owner_never_raises_it():
    gpus = merge(job("slurm:9", "a", 8), job("slurm:9", "b", 8))
    lab = {"instance": "a", "job_id": "slurm:9"}
    mfu = {"mfu_mean": [Series({**lab, "owner_uid": "1"}, pts(range(10), 0.4)),
                        Series({**lab, "owner_uid": "666"}, pts(range(10), 0.9))],
           "mfu_samples": [Series({"instance": "a", "job_id": "slurm:9", "owner_uid": o}, pts(range(10)))
                           for o in ("1", "666")]}
    s = summarise(data(merge(gpus, mfu)))
    j = s.jobs[0]
    assert j.gpus == 16 and j.size_class == "9-16" and j.nodes == ["a", "b"] and s.totals.gpus_max == 16
    assert j.useful_gpu_hours * 3600 == pytest.approx(0.4 * 160)
    assert [n.instance for n in s.nodes] == ["a", "b"] and s.nodes[0].useful_gpu_hours == pytest.approx(
        j.useful_gpu_hours / 2)


def test_instants_with_no_gpu_sample_are_a_gap_and_the_coverage_says_how_much_was_held():
    s = summarise(data(job("j", ks=[2, 3, 4, 7, 8])))
    assert s.coverage.gaps == [(at(5), at(6))]
    assert (s.coverage.windows_with_data, s.coverage.windows) == (5, 10) and s.coverage.share == 0.5
    assert s.coverage.first_sample == at(2) and s.coverage.last_sample == at(8)


def test_users_and_teams_come_from_signals_then_slurm_then_the_node_and_unattributed_is_no_team():
    lab = {"instance": "a", "owner_uid": "1001"}
    named = job("slurm:1", owner="1001")
    silent_slurm, silent_node, nobody = job("slurm:2"), job("slurm:3"), job("k8s:pod")
    for j in (silent_slurm, silent_node, nobody):
        del j["signal_samples"]
    series = merge(named, silent_slurm, silent_node, nobody, {
        "user": [Series({**lab, "job_id": "slurm:1", "user": "alice"}, pts([9]))],
        "team": [Series({**lab, "job_id": "slurm:1", "team": "nlp"}, pts([9]))],
        "holder": [Series({"instance": "a", "job_id": "slurm:3", "owner_uid": "4000", "user": ""}, pts([9])),
                   Series({"instance": "a", "job_id": "slurm:2", "owner_uid": "5", "user": "ops"},
                          pts([9]))]})
    s = summarise(data(series), slurm={"2": SlurmJob("bob", "physics"), "1": SlurmJob("mallory", "x")})
    who = {r.job_id: (r.user, r.user_source, r.team, r.team_source) for r in s.jobs}
    assert who == {"slurm:1": ("alice", "signal", "nlp", "signal"),
                   "slurm:2": ("bob", "slurm", "physics", "slurm"),
                   "slurm:3": ("uid 4000", "node", UNATTRIBUTED, ""),
                   "k8s:pod": (UNATTRIBUTED, "", UNATTRIBUTED, "")}
    assert s.totals.teams == 2 and s.totals.users == 3
    assert s.attribution == {"slurm": 1, "node": 1, "none": 1}


def test_a_stall_is_dated_back_to_the_last_step_counted_at_mfu_0_and_lost_with_its_cause():
    """Windows 0-9 of 1 s, 2 GPUs; MFU 0.5 exported throughout (the agent keeps the last one until
    it finds the stall); from window 6 on the stall series says 2, 3, 4, 5 s since the last step:
    the job last stepped at the end of window 4 (t = 5), so windows 5-9 are stalled."""
    lab = {"instance": "a", "job_id": "j", "owner_uid": "7"}
    series = merge(job("j", gpus=2), {
        "mfu_mean": [Series(lab, pts(range(10), 0.5))], "mfu_samples": [Series(lab, pts(range(10)))],
        "stalled": [Series({**lab, "cause": "idle"}, [(at(k), float(k - 4)) for k in (6, 7, 8, 9)])]})
    s = summarise(data(series))
    r = s.jobs[0]
    assert r.stalled_gpu_hours * 3600 == pytest.approx(10) and r.stall_cause == "idle"
    assert r.useful_gpu_hours * 3600 == pytest.approx(0.5 * 10) and r.mfu == pytest.approx(0.5)
    assert r.losses["stalled"] == pytest.approx(10 / 3600) and r.lost_cause == "stalled"
    assert s.totals.stalled_gpu_hours == pytest.approx(r.stalled_gpu_hours)
    assert sum(s.label_mix.labels["stalled"]) * 3600 == pytest.approx(10)
    # each stalled sample was taken 0.4 s before its window's end: with the job's last step (at
    # 4.6) the stretch is dated exactly, (4.6, 9.6], not from the windows' ends, (5, 10]
    stalled = [Series({**lab, "cause": "idle"}, [(at(k), k - 4.0) for k in (6, 7, 8, 9)])]
    steps = [Series(lab, [(at(k), 4.6) for k in range(5, 10)])]
    assert stall_spans(stalled) == {"j": [(5.0, 10.0, "idle")]}
    assert stall_spans(stalled, steps) == {"j": [(4.6, 9.6, "idle")]}


def test_a_jobs_loss_is_its_largest_cause_and_its_fix_wins_its_hours_times_the_step_it_saves():
    lab = {"instance": "a", "owner_uid": "7"}
    series = merge(job("slow", gpus=2), job("fast", gpus=2), {
        "idle_samples": [Series({"instance": "a", "job_id": "slow"}, pts(range(4), 2))],
        "mfu_mean": [Series({**lab, "job_id": j}, pts(range(10), v))
                     for j, v in (("slow", 0.1), ("fast", 0.5))],
        "mfu_samples": [Series({**lab, "job_id": j}, pts(range(10))) for j in ("slow", "fast")],
        "step": [Series({**lab, "job_id": "fast"}, pts([9], 0.4))],
        "predicted": [Series({**lab, "job_id": "fast"}, pts([9], 0.3))],
        "action": [Series({**lab, "job_id": "fast", "action": "cuda-graphs"}, pts([9]))]})
    s = summarise(data(series))
    rows = {r.job_id: r for r in s.jobs}
    slow, fast = rows["slow"], rows["fast"]
    median = (0.1 + 0.5) / 2
    assert slow.losses == pytest.approx({"idle": 8 / 3600, "below_peers": 20 / 3600 * (1 - 0.1 / median)})
    assert slow.lost_cause == "below_peers"
    assert slow.lost_gpu_hours == pytest.approx(20 / 3600 * (1 - 0.1 / median))
    assert fast.fix_gpu_hours == pytest.approx(20 / 3600 * 0.25) and fast.lost_cause == "fixable"
    (fix,) = s.fixes
    weeks = 10 / (7 * 86400)
    assert (fix.job_id, fix.action) == ("fast", "cuda-graphs")
    assert fix.win_gpu_hours_per_week == pytest.approx(fix.win_gpu_hours / weeks)
    assert [m["job_id"] for m in s.most_lost] == ["slow", "fast"]


# -- credentials --------------------------------------------------------------------------------------

def test_credentials_in_a_url_are_taken_out_of_it_and_never_shown():
    base, user, pw = split_url("https://lead:p%40ss@mon.example.org:9443/prometheus/")
    assert (base, user, pw) == ("https://mon.example.org:9443/prometheus", "lead", "p@ss")
    assert split_url("prom:9090") == ("http://prom:9090", None, None)
    for bad in ("ftp://x", "http://x:9090/?token=abc", "http://", "http://x:notaport"):
        with pytest.raises(BadInput):
            split_url(bad)
    auth = PromAuth("lead", "p@ss")
    assert "p@ss" not in repr(auth) and auth.header() == "Basic bGVhZDpwQHNz"
    assert PromAuth(token="t0k").header() == "Bearer t0k" and "t0k" not in repr(PromAuth(token="t0k"))


def test_a_secret_file_is_read_as_prometheus_reads_one_and_errors_never_quote_it(tmp_path):
    f = tmp_path / "pw"
    f.write_text("hunter2\n")
    assert read_secret(f, "--prometheus-password-file") == "hunter2"
    f.write_text("hunter2\nsecond line\n")
    with pytest.raises(BadInput) as e:
        read_secret(f, "--prometheus-password-file")
    assert "hunter2" not in str(e.value) and "several lines" in str(e.value)
    with pytest.raises(BadInput, match="cannot read"):
        read_secret(tmp_path / "missing", "--bearer-token-file")
    with pytest.raises(BadInput, match="go together"):
        resolve_auth("http://h:1", "u", None, None, None, False)


# -- numbers and the page ----------------------------------------------------------------------------

def test_numbers_read_as_people_write_them():
    for v in (8.12e-06, 0.000999, 0.0123, 0.5, 3.14159, 42.42, 512.4, 12345.6, 2e9):
        assert "e" not in gpu_h(v), v
    assert (gpu_h(0), gpu_h(8.12e-06), gpu_h(0.0625), gpu_h(12345.6)) == ("0", "< 0.001", "0.062", "12,346")
    assert (share(0.0), share(0.00001), share(0.1234)) == ("0%", "< 0.1%", "12.3%")


def test_the_csv_holds_every_job_and_quotes_what_a_spreadsheet_would_run(tmp_path):
    s = summarise(data(merge(job("=cmd|' /C calc'!A0"), job("slurm:2"))))
    rows = jobs_csv(s).splitlines()
    assert len(rows) == 3 and rows[0].startswith("job_id,user,user_source,team")
    assert any(r.startswith("\"'=cmd") or r.startswith("'=cmd") for r in rows[1:]), rows


def test_size_classes_compare_jobs_with_jobs_of_their_power_of_two():
    assert [size_class(n) for n in (1, 2, 3, 8, 9, 16, 17)] == \
        ["1", "2", "3-4", "5-8", "9-16", "9-16", "17-32"]


# -- 10,000 jobs ---------------------------------------------------------------------------------------

def big_answers(jobs: int = 10_000, nodes: int = 125, seed: int = 3) -> tuple[Grid, dict[str, str]]:
    """Prometheus' JSON answers (one per query, as the spans join them) for ``jobs`` jobs of 1-12 h
    holding whole 8-GPU nodes over a month, 80% of them under gpudiag."""
    rng = random.Random(seed)
    grid = grid_for(0, 30 * 86400)
    res: dict[str, list] = {name: [] for name in QUERIES}
    per_node = jobs // nodes
    for n in range(nodes):
        inst = f"node{n:04d}:9835"
        k = 0
        for i in range(per_node):
            width = rng.randint(1, 8)
            ks = [x for x in range(k, min(grid.n, k + width))]
            k += width
            if not ks:
                break
            jid = f"slurm:{n * per_node + i}"
            ts = [grid.first + x * grid.step for x in ks]

            def add(name: str, v: float, inst: str = inst, jid: str = jid, ts: list = ts,
                    **extra: str) -> None:
                res[name].append({"metric": {"instance": inst, "job_id": jid, **extra},
                                  "values": [[t, f"{v:g}"] for t in ts]})
            add("gpu_samples", 8 * 2592 / 15)
            add("gpu_presence", 2592 / 15)
            add("idle_samples", rng.choice((0, 40, 400)))
            if rng.random() < 0.8:
                own = {"owner_uid": str(1000 + n % 40)}
                add("signal_samples", 2592 / 15, **own)
                add("mfu_mean", rng.uniform(0.05, 0.6), **own)
                add("mfu_samples", 2592 / 15, **own)
                add("label_samples", 2592 / 15, label=rng.choice(["compute-bound", "input-bound"]), **own)
                add("step", 0.5, **own)
                add("predicted", rng.uniform(0.2, 0.5), **own)
                add("action", 1, action="dataloader-workers", **own)
                add("team", 1, team=f"team{n % 7}", **own)
                add("user", 1, user=f"user{n % 40}", **own)
    return grid, {name: json.dumps({"resultType": "matrix", "result": r}) for name, r in res.items()}


def big_run(out: str) -> None:
    """In a fresh process: parse the answers, sum, render the page and the CSV; write the
    timings, the page's size and the peak RSS to ``out``."""
    grid, answers = big_answers()
    t = time.perf_counter()
    series = {name: _matrix(json.loads(text), "http://p") for name, text in answers.items()}
    del answers
    d = FleetData("http://p", grid, series, {f"node{n:04d}:9835": 15.0 for n in range(125)},
                  requested=(grid.start, grid.end))
    s = summarise(d, previous=summarise(d))
    sum_s = time.perf_counter() - t
    page = render_page(s)
    csv = jobs_csv(s)
    Path(out).write_text(json.dumps({
        "jobs": len(s.jobs), "sum_s": sum_s, "page_s": time.perf_counter() - t - sum_s,
        "page_bytes": len(page.encode()), "csv_rows": csv.count("\n") - 1,
        "rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's own peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux keeps
    in it the memory of the process image that exec replaced, so a child forked from a grown
    pytest worker read 746 MB (the worker's) against its own ~230 MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_ten_thousand_jobs_make_a_page_under_3_mb_in_under_500_mb(tmp_path):
    """The bounds of size (the time is a benchmark: benchmarks/fleet_range.py); this process
    parses a month of 10,000 jobs as Prometheus answers it, sums it twice (this period and the
    previous one) and renders the page and CSV."""
    out = tmp_path / "big.json"
    code = f"from tests.system.fleet.test_fleet_sums import big_run; big_run({str(out)!r})"
    subprocess.run([sys.executable, "-c", code],
                   check=True, cwd=ROOT, timeout=600)
    got = json.loads(out.read_text())
    print(f"10,000 jobs: {got}")
    assert got["jobs"] == 10_000 and got["csv_rows"] == 10_000
    assert got["page_bytes"] <= 3 * 2**20, got
    assert got["rss_mb"] <= 500, got
