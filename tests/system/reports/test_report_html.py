"""HTML reports: every real trace renders, nothing escapes its escaping, files stay small and offline.

The reports are parsed here with the standard library's HTML parser (what a browser sees as
tags and attributes, not string matching), and the embedded JSON is read back and compared
with the Diagnosis it came from. tests/system/reports/test_report_browser.py opens the same files in Chromium.
"""

from __future__ import annotations

import copy
import gzip
import html as htmllib
import json
import random
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analyzers.compare import compare
from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
from gpudiag.collectors.cpu_peak import cpu_peak
from gpudiag.diagnosis import Diagnosis, Recommendation, RunSummary, Series, Stragglers, Timeline
from gpudiag.reports.html import render_diff, render_report
from tests.conftest import SHARED, TRACES
from tests.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "h200"
SECTIONS = ["verdict", "breakdown", "timeline", "roofline", "tables", "missing"]
TRACE_DIRS = sorted(p.name for p in TRACES.iterdir() if p.is_dir() and p.name != "negative") \
    if TRACES.is_dir() else []
PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</script>"]
MAX_BYTES = 2_000_000


# --- reading a report back --------------------------------------------------------------------

class Page(HTMLParser):
    """Tags, attributes, sections, charts and the data block of a report, as a browser parses it."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.sections: list[str] = []
        self.charts = 0
        self.chart_titles: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.data_text = ""
        self._in: list[str] = []
        self._want_title = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section" and a.get("id"):
            self.sections.append(a["id"] or "")
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.charts += 1
            self._want_title = True
        elif tag == "title" and self._want_title:
            self.chart_titles.append("")
        else:
            self._want_title = False
        if tag == "script":
            self.scripts.append(a)
        self._in.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self._want_title = False
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in and self._in[-1] == "script":
            self.data_text += data
        elif self._in and self._in[-1] == "title" and self.chart_titles and self._want_title:
            self.chart_titles[-1] += data


def embedded(text: str) -> Any:
    blocks = re.findall(r'<script type="application/json" id="gpudiag-data">(.*?)</script>', text, re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def assert_self_contained(text: str) -> Page:
    """One file: no script but the data block, no handlers, nothing loaded, every chart titled."""
    page = Page(text)
    assert page.scripts == [{"type": "application/json", "id": "gpudiag-data"}]
    assert text.lower().count("<script") == 1
    for tag, attrs in page.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed", "base", "image", "use"), tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "href", "xlink:href", "action", "srcset"):
                assert (value or "").startswith("#"), (tag, name, value)
    css = "".join(re.findall(r"<style>(.*?)</style>", text, re.S))
    assert "url(" not in css and "@import" not in css and "@font-face" not in css
    assert page.charts == len(page.chart_titles) and all(t.strip() for t in page.chart_titles), \
        "every svg.chart starts with a non-empty <title>"
    return page


@pytest.fixture(scope="module")
def gemm() -> Diagnosis:
    return diagnose(FIXTURES / "gemm_bf16", jobs=1)


def test_shared_traces_are_present():
    assert TRACE_DIRS, f"test data missing: {TRACES} (CI lays ../shared beside the repository)"


@pytest.mark.parametrize("folder", TRACE_DIRS)
def test_every_real_trace_renders_all_sections_three_charts_and_round_tripping_data(folder):
    d = diagnose(TRACES / folder, DeviceChoice(cpu_peak=cpu_peak), jobs=1)
    text = render_report(d)
    page = assert_self_contained(text)
    assert page.sections == SECTIONS
    assert page.charts >= 3
    assert Diagnosis.from_dict(embedded(text)).to_dict() == d.to_dict()


def test_report_without_a_timeline_says_why(gemm):
    text = render_report(gemm)
    section = text.split('<section id="timeline">', 1)[1].split("</section>", 1)[0]
    assert "profiler traces alone" in section and "gpudiag profile" in section


def test_the_time_the_os_ran_other_work_is_its_own_grey_part_of_each_bar(gemm):
    """A reader of an incident review must see a busy machine's share at a glance: the mean
    step's bar draws it apart from the job's own host overhead, and the legend names it only
    where there is one."""
    quiet = render_report(gemm)
    assert "OS ran other work" not in quiet
    busy = copy.deepcopy(gemm)
    b = busy.breakdown
    b.host_stalled = 0.5 * b.host_overhead
    text = render_report(busy)
    assert_self_contained(text)
    assert text.count("OS ran other work (of host overhead)") >= 2  # the legend and the mean bar
    assert "of the host overhead, the OS running other work" in text  # the mean-step table


# --- escaping -------------------------------------------------------------------------------

def hostile_trace(dest: Path) -> Path:
    """The H200 GEMM trace with kernel and operator names (and an annotation) set to PAYLOADS."""
    trace = json.loads(gzip.decompress((FIXTURES / "gemm_bf16" / "rank-0.json.gz").read_bytes()))
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    for i, e in enumerate(kernels):
        e["name"] = PAYLOADS[i % len(PAYLOADS)]
    for i, e in enumerate(ops):
        e["name"] = PAYLOADS[(i + 1) % len(PAYLOADS)]
    step = min((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    first = min((e for e in ops if e["ts"] >= step["ts"]), key=lambda e: e["ts"])
    events.append({"ph": "X", "cat": "user_annotation", "name": PAYLOADS[0] + PAYLOADS[1],
                   "pid": first["pid"], "tid": first["tid"], "ts": first["ts"] - 1, "dur": first["dur"] + 2,
                   "args": {}})
    dest.mkdir(parents=True)
    (dest / "rank-0.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    return dest


def assert_payloads_inert(text: str) -> None:
    assert "<script>alert" not in text and "<img src=x" not in text and "<img" not in text.lower()
    assert text.lower().count("<script") == 1
    assert_self_contained(text)


def test_hostile_names_are_escaped_and_the_data_block_stays_closed(tmp_path):
    d = diagnose(hostile_trace(tmp_path / 'x"><img src=x onerror=alert(2)>'), jobs=1)
    names = {t.name for t in d.top_kernels} | {t.name for t in d.top_ops}
    assert set(PAYLOADS) <= names, names  # the payloads really reach the report
    d.run = RunSummary(command=["python", *PAYLOADS], host=PAYLOADS[1], start=1.7e9, end=1.7e9 + 60,
                       status="killed", exit_code=None, signal="SIGKILL", last_step=3,
                       gpus=[{"name": PAYLOADS[0], "driver": PAYLOADS[1]}], gpu_counters="nvml",
                       versions={"torch": PAYLOADS[2]}, notes=[PAYLOADS[0]])
    d.warnings.append(PAYLOADS[1])
    d.verdict.recommendations.append(Recommendation(action=PAYLOADS[1], text=PAYLOADS[0],
                                                    predicted_step_s=None, why=PAYLOADS[2]))
    text = render_report(d)
    assert_payloads_inert(text)
    page = Page(text)
    # shown as text (escaped), in tables and in title attributes
    assert htmllib.escape(PAYLOADS[0]) in text
    assert any(a.get("title") == PAYLOADS[1] for _, a in page.tags)
    data = embedded(text)
    assert Diagnosis.from_dict(data).to_dict() == d.to_dict()
    assert "</script>" in json.dumps(data)  # the data kept the payload, as text
    diff_text = render_diff(compare(d, d), d, d)
    assert_payloads_inert(diff_text)
    both = embedded(diff_text)
    assert set(both) == {"before", "after", "diff"}
    assert Diagnosis.from_dict(both["after"]).to_dict() == d.to_dict()


def test_json_block_escapes_every_character_that_could_end_it():
    from gpudiag.reports.html import embed_json

    value = {"k": "</script><!-- & \u2028\u2029 <b>"}
    text = str(embed_json(value))
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(text) == value


# --- size -----------------------------------------------------------------------------------

def eight_rank_diagnosis(base: Diagnosis) -> Diagnosis:
    """A real diagnosis grown to 8 ranks with a full counter timeline (the most a report draws)."""
    d = copy.deepcopy(base)
    proto = d.ranks[0]
    d.ranks = []
    for r in range(8):
        rr = copy.deepcopy(proto)
        rr.rank, rr.trace = r, f"/data/run/traces/rank-{r}.json.gz"
        d.ranks.append(rr)
    d.world_size = 8
    d.stragglers = Stragglers(median_step_us=proto.mean_step_time, ranks=[5], imbalance=0.31,
                              per_rank_step_us={str(r): proto.mean_step_time for r in range(8)})
    rnd = random.Random(4)
    n = 400  # analyzers.timeline.MAX_POINTS
    t = [round(i * 36.0 / n, 3) for i in range(n)]
    series = []
    for gpu in range(8):
        for name, unit, hi in [("SM activity", "%", 100), ("tensor activity", "%", 100),
                               ("DRAM bandwidth", "%", 100), ("GPU utilisation (legacy)", "%", 100),
                               ("power", "W", 700)]:
            series.append(Series(name, unit, gpu, None, t, [round(rnd.uniform(0, hi), 3) for _ in t]))
    for rank in range(8):
        series.append(Series("step time", "ms", None, rank, t, [round(rnd.uniform(70, 90), 3) for _ in t]))
        series.append(Series("collective time per step", "ms", None, rank, t,
                             [round(rnd.uniform(5, 20), 3) for _ in t]))
    d.timeline = Timeline(start=1.7e9, duration=36.0, series=series, traced=[[20.5, 21.2]])
    d.run = RunSummary(command=["torchrun", "--nproc_per_node", "8", "train.py"], host="node-17",
                       start=1.7e9, end=1.7e9 + 36, status="completed", exit_code=0, signal=None,
                       last_step=400, gpus=[{"name": "NVIDIA H200", "driver": "570.86"}] * 8,
                       gpu_counters="nvml", versions={"gpudiag": "0.1.0", "python": "3.11.7"})
    return d


def test_eight_rank_report_with_full_timeline_stays_under_2_mb():
    d = eight_rank_diagnosis(diagnose(TRACES / "a100-8rank-diff", jobs=1))
    assert sum(len(s.t) for s in d.timeline.series) >= 8 * 5 * 400
    text = render_report(d)
    assert len(text.encode()) <= MAX_BYTES
    page = assert_self_contained(text)
    assert page.charts >= 3 + 7  # breakdown, roofline, tables + one per timeline metric
    assert "rank 5 (straggler)" in text
    assert Diagnosis.from_dict(embedded(text)).to_dict() == d.to_dict()


# --- run directories and the CLI ------------------------------------------------------------

def gpudiag(*args: str | Path, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd or REPO)


@pytest.fixture(scope="module")
def run_dir(replayed_run: Path) -> Path:
    """A real ``gpudiag profile`` run with replayed H200 counters (so it has a timeline): the
    session's, read only."""
    return replayed_run


def test_profile_writes_report_html_with_command_status_and_timeline(run_dir):
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    d = Diagnosis.from_json((run_dir / "diagnosis.json").read_text())
    assert d.run is not None and d.timeline is not None
    assert htmllib.escape(shlex.join(d.run.command)) in text
    assert "completed (exit code 0), last step 12" in text
    page = assert_self_contained(text)
    assert page.sections == SECTIONS
    assert "SM activity (%)" in page.chart_titles[0] or any("SM activity" in t for t in page.chart_titles)
    assert Diagnosis.from_dict(embedded(text)).to_dict() == d.to_dict()


def test_killed_run_reads_killed_by_signal_at_step(run_dir):
    d = Diagnosis.from_json((run_dir / "diagnosis.json").read_text())
    d.run.status, d.run.signal, d.run.exit_code, d.run.last_step = "killed", "SIGKILL", 137, 17
    assert "killed by SIGKILL at step 17" in render_report(d)


def test_report_of_run_dir_uses_its_diagnosis_json_unless_stale(replayed_run_copy, tmp_path):
    run_dir = replayed_run_copy
    diag = run_dir / "diagnosis.json"
    original = diag.read_text()
    data = json.loads(original)
    data["verdict"]["summary"] = "MARKER-FROM-DIAGNOSIS-JSON"
    try:
        diag.write_text(json.dumps(data))
        (run_dir / "report.html").unlink()
        proc = gpudiag("report", run_dir)  # default output: inside the run directory
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(run_dir / "report.html")
        assert "MARKER-FROM-DIAGNOSIS-JSON" in (run_dir / "report.html").read_text()
        # 99: unreadable; 1: readable, but without the unprofiled view a fresh analysis adds
        for version in (99, 1):
            data["schema_version"] = version
            diag.write_text(json.dumps(data))
            proc = gpudiag("report", run_dir, "-o", tmp_path / "again.html")
            assert proc.returncode == 0, proc.stderr
            text = (tmp_path / "again.html").read_text()
            assert "MARKER-FROM-DIAGNOSIS-JSON" not in text, version  # re-analysed from the traces
            assert embedded(text)["run"]["status"] == "completed"
    finally:
        diag.write_text(original)


def test_cli_report_of_trace_folder_writes_default_file_and_json(tmp_path):
    proc = gpudiag("report", TRACES / "a100-nccl-2rank", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "gpudiag-report.html"
    assert proc.stdout.strip() == "gpudiag-report.html" and out.is_file()
    assert Page(out.read_text()).sections == SECTIONS
    proc = gpudiag("report", TRACES / "a100-nccl-2rank", "--json")
    assert proc.returncode == 0, proc.stderr
    assert Diagnosis.from_json(proc.stdout).verdict.label.value == "host-bound"


def test_cli_diff_of_two_real_trace_sets_writes_html_and_json(tmp_path):
    before, after = TRACES / "a100-8rank-diff", TRACES / "v100-16gb-diff"
    out = tmp_path / "diff.html"
    proc = gpudiag("diff", before, after, "-o", out)
    assert proc.returncode == 0, proc.stderr
    # the verdict on the terminal, the page's path last
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == f"Report: {out}" and lines[0].startswith("Step time: ")
    assert any(ln.startswith("Label (") for ln in lines) and "cannot tell noise from change" in proc.stdout
    text = out.read_text()
    assert_self_contained(text)
    data = embedded(text)
    assert set(data) == {"before", "after", "diff"}
    assert data["diff"]["step_time_change"] is not None and data["diff"]["kernels"]
    assert 'id="kernels"' in text and data["diff"]["kernels"][0]["name"][:20] in htmllib.unescape(text)
    proc = gpudiag("diff", before, after, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["label_before"] == data["diff"]["label_before"]
    assert not (tmp_path / "gpudiag-diff.html").exists()  # --json writes no file


@pytest.mark.parametrize("args", [
    ("report", "{tmp}/missing"),
    ("report", "{traces}/a100-triton", "-o", "{tmp}/no/such/dir/r.html"),
    ("diff", "{tmp}/missing", "{traces}/a100-triton"),
    ("diff", "{traces}/a100-triton", "{tmp}/missing"),
])
def test_bad_input_exits_2_with_one_line(args, tmp_path):
    proc = gpudiag(*(a.format(tmp=tmp_path, traces=TRACES) for a in args))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudiag: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_failure_in_profile_is_one_line(tmp_path, capsys):
    from gpudiag.commands.profile import _write_report

    _write_report(tmp_path, object())  # not a Diagnosis: rendering fails
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpudiag: report.html not written:"), err
    assert not (tmp_path / "report.html").exists()


def test_a_diagnosis_with_nothing_in_it_still_renders_every_section(gemm):
    from gpudiag.diagnosis import Bottleneck, Mfu, Roofline, TimeBreakdown, Verdict

    d = copy.deepcopy(gemm)
    d.ranks, d.breakdown, d.top_kernels, d.top_ops, d.communication = [], TimeBreakdown(), [], [], []
    d.verdict = Verdict(Bottleneck.UNKNOWN, 0.0, "none", "nothing to analyse", {}, None, [])
    d.mfu = Mfu(None, "not available: no steps", None, "none", None, None, None)
    d.roofline = Roofline("none", 0.0, 0.0, 0.0, "", 0.0, 0.0, 0.0)
    d.stragglers = None
    text = render_report(d)
    assert assert_self_contained(text).sections == SECTIONS
    assert Diagnosis.from_dict(embedded(text)).to_dict() == d.to_dict()


# --- both views: as traced and unprofiled (estimated) ------------------------------------------

def text_of(html: str) -> str:
    """The page's text as a reader sees it (tags dropped, entities decoded, spaces collapsed)."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html.split("<script", 1)[0])).split())


def test_trace_only_report_says_its_breakdown_is_of_profiled_steps(gemm):
    from gpudiag.reports.terminal import render_terminal

    assert gemm.basis == "profiled-steps" and gemm.dilation is None
    text = text_of(render_report(gemm))
    assert "This breakdown is of the profiled steps as they ran under the profiler" in text
    assert "unprofiled (estimated)" not in text  # no second view to show
    term = render_terminal(gemm)
    assert "Basis: profiled steps. This breakdown is of the profiled steps" in term


def test_run_dir_report_shows_both_views_the_dilation_and_the_traced_verdict():
    """The real H100 GPT run: the profiler dilated its traced steps; the report shows the step
    as traced and as estimated unprofiled, the factor, and that traced steps alone read otherwise."""
    from gpudiag.reports.terminal import render_terminal

    run = SHARED / "runs" / "h100-gpt-small"
    d = diagnose(run, jobs=1)
    assert d.basis == "unprofiled-estimate" and d.dilation is not None and d.unprofiled is not None
    html = render_report(d)
    assert_self_contained(html)
    text = text_of(html)
    dil = d.dilation
    factor = f"{dil.factor:.2g}\u00d7"
    assert (f"The profiler slowed traced steps {factor} ({dil.traced_step_us / 1e3:.3g} ms vs "
            f"{dil.untraced_step_us / 1e3:.3g} ms untraced, {dil.untraced_steps} untraced steps "
            f"around the window: {dil.before_step_us / 1e3:.3g} ms before, "
            f"{dil.after_step_us / 1e3:.3g} ms after; noise \u00b1") in text
    assert "Mean step, all ranks: as traced | unprofiled (estimated)" in text
    assert f"{d.unprofiled.step_time / 1e3:.3g} ms 100.0%" in text  # the unprofiled step time column
    assert "Mean step as traced and unprofiled (estimated)" in Page(html).chart_titles
    if d.traced_verdict is not None and d.traced_verdict.label != d.verdict.label:
        assert f"traced steps alone would read {d.traced_verdict.label.value}" in text
    assert "step time from untraced steps" in text  # the MFU's basis
    term = render_terminal(d)
    assert "unprofiled (est.)" in term and f"slowed traced steps {factor}" in term
    assert Diagnosis.from_dict(embedded(html)).to_dict() == d.to_dict()


def test_caveats_and_a_differing_traced_verdict_are_shown(gemm):
    from gpudiag.diagnosis import Bottleneck, Dilation, TimeBreakdown

    d = copy.deepcopy(gemm)
    b = d.breakdown
    d.basis = "unprofiled-estimate"
    d.unprofiled = TimeBreakdown(**{**b.__dict__, "step_time": b.step_time / 2})
    d.dilation = Dilation(b.step_time, b.step_time / 2, 2.0, 5, 412, 0.024, "a model sentence",
                          caveats=["CAVEAT-ONE <b>", "CAVEAT-TWO"])
    d.traced_verdict = copy.deepcopy(d.verdict)
    d.traced_verdict.label = Bottleneck.HOST
    d.traced_verdict.evidence["host-bound share"] = 0.47
    text = text_of(render_report(d))
    assert "412 untraced steps around the window; noise \u00b11.2%" in text
    assert "Caveat: CAVEAT-ONE <b>" in text and "Caveat: CAVEAT-TWO" in text
    assert "traced steps alone would read host-bound (47%)" in text
    assert "How the unprofiled step was estimated: a model sentence" in text


def test_a_prediction_stating_a_range_shows_both_ends_in_the_terminal_and_the_report(gemm):
    """compile on a CPU states its other end (``Recommendation.best_step_s``): the user sees it
    beside the prediction in both views, and the JSON keeps it."""
    from gpudiag.reports.terminal import render_terminal as render

    d = copy.deepcopy(gemm)
    d.verdict.recommendations = [Recommendation("compile-small-ops", "Compile the model.", 5.65e-3,
                                                "calls become kernels", step_s=10e-3, gain=0.435,
                                                best_step_s=4.66e-3)]
    line = "step 10 ms \u2192 \u2248 5.65 ms (-44%; \u2248 4.66 ms (-53%) at its other end)"
    assert line in render(d, width=400), render(d, width=400)
    text = render_report(d)
    both = r"5\.65.{0,40}ms \(.{1,12}44%; \u2248 4\.66.{0,40}ms \(.{1,12}53%\) at its other end"
    assert re.search(both, text)
    assert Diagnosis.from_json(d.to_json()).verdict.recommendations[0].best_step_s == 4.66e-3
