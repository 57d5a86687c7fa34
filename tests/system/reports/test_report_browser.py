"""HTML reports opened in a real headless Chromium: they draw, stay offline, and run no one's script.

Every report here is made by the real CLI (``gpudiag report`` / ``gpudiag diff``) from real
traces in ../shared/traces or from a ``gpudiag profile`` run made in the test, then loaded from
file:// in Chromium (tests/browser.py). Chromium is required: CI installs it (.ci/run), and a
machine without it fails here with the command that installs it.

Set GPUDIAG_SCREENSHOT_DIR to keep a full-page screenshot of every report for a person to see.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import BrowserError, Chromium, Page, pixel_stats
from tests.conftest import TRACES
from tests.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "h200"

SECTIONS = ["verdict", "breakdown", "timeline", "roofline", "tables", "missing"]
REAL_TRACES = ["a100-nccl-2rank", "v100-ddp-2rank", "a100-8rank-diff"]

# Each would run script, or load something, if a report put it into the page unescaped.
PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</script>"]


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    try:
        chromium = Chromium.launch(tmp_path_factory.mktemp("chromium"))
    except BrowserError as e:
        problem = str(e)
    else:
        problem = ""
    if problem:  # a failure, not a skip: CI installs Chromium, and so must a developer
        pytest.fail(problem, pytrace=False)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def gpudiag(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "gpudiag", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"gpudiag {' '.join(map(str, args))}: exit {proc.returncode}\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def report(target: Path, out: Path) -> Path:
    gpudiag("report", target, "-o", out)
    assert out.is_file() and out.stat().st_size > 0, f"gpudiag report wrote no {out}"
    return out


def profile_run(out: Path, *command: str | Path, backend: str | None = None) -> Path:
    args: list[str | Path] = ["profile", "--out", out]
    if backend:
        args += ["--backend", backend, "--interval", "50ms"]
    gpudiag(*args, "--skip", "2", "--steps", "3", "--", *command)
    return out


def keep_screenshot(page: Page, shots: Path, name: str) -> Path:
    path = page.save_screenshot(shots / f"{name}.png")
    if os.environ.get("GPUDIAG_SCREENSHOT_DIR"):
        keep = Path(os.environ["GPUDIAG_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, keep / path.name)
    return path


# -- what every report must do in a browser ----------------------------------------------------
def assert_quiet_and_offline(page: Page) -> None:
    """No dialog, no error, no request but the file itself, no popup, no navigation, no script."""
    assert page.dialogs == [], f"the page opened dialogs: {page.dialogs}"
    assert page.page_errors == [], f"uncaught errors: {page.page_errors}"
    assert page.console_errors == [], f"console errors: {page.console_errors}"
    assert page.foreign_requests == [], f"the page requested more than itself: {page.foreign_requests}"
    assert page.popups == [], f"the page opened windows: {page.popups}"
    assert page.final_url == page.url, f"the page navigated away to {page.final_url}"
    assert page.data_error is None and page.data is not None, \
        f"the embedded #gpudiag-data does not parse: {page.data_error}"
    # the only <script> is the embedded data; no element carries an on* handler
    assert page.scripts == [{"type": "application/json", "id": "gpudiag-data"}], page.scripts
    assert page.event_handler_attrs == [], f"event handler attributes: {page.event_handler_attrs}"


def assert_drawn(page: Page, shots: Path, name: str) -> None:
    """Every section is there, the page is not blank and every chart has size and paints marks."""
    shot = keep_screenshot(page, shots, name)
    missing = [s for s in SECTIONS if s not in page.sections]
    assert not missing, f"sections missing: {missing} (page has {page.sections})"
    whole = pixel_stats(page.screenshot)
    assert whole.width >= 600 and whole.height >= 400, f"screenshot {shot}: {whole}"
    assert whole.colours >= 16 and whole.ink >= 0.02, f"screenshot looks blank: {shot}: {whole}"
    assert page.charts, f"no svg.chart in the report ({shot})"
    for c in page.charts:
        what = f"chart {c['title']!r} in #{c['section']} ({shot})"
        assert c["title"], f"{what} has no <title>"
        assert c["width"] > 0 and c["height"] > 0, f"{what} has no size: {c['width']}x{c['height']}"
        assert c["marks"] > 0 and c["visible_marks"] > 0, f"{what} draws nothing: {c}"
        px = pixel_stats(page.screenshot, (c["x"], c["y"], c["width"], c["height"]))
        assert px.colours >= 2 and px.ink > 0, f"{what} is blank on screen: {px}"
    # the page fits the 1280 px window: nothing sticks out sideways
    assert page.scroll_width <= page.client_width, \
        f"page is {page.scroll_width}px wide in a {page.client_width}px window ({shot})"


# -- reports of real jobs ----------------------------------------------------------------------
@pytest.mark.parametrize("trace", REAL_TRACES)
def test_report_of_real_trace_draws_every_chart_and_stays_offline(trace, browser, shots, tmp_path):
    if not (TRACES / trace).is_dir():
        pytest.fail(f"test data missing: {TRACES / trace} (CI lays ../shared beside the repository)")
    page = browser.open(report(TRACES / trace, tmp_path / f"{trace}.html"))
    assert_quiet_and_offline(page)
    assert_drawn(page, shots, f"trace-{trace}")


def test_diff_report_of_two_real_traces_draws_and_stays_offline(browser, shots, tmp_path):
    before, after = TRACES / "a100-8rank-diff", TRACES / "v100-16gb-diff"
    out = tmp_path / "diff.html"
    gpudiag("diff", before, after, "-o", out)
    page = browser.open(out)
    assert_quiet_and_offline(page)
    keep_screenshot(page, shots, "diff-a100-8rank-vs-v100-16gb")
    whole = pixel_stats(page.screenshot)
    assert whole.colours >= 16 and whole.ink >= 0.02, f"diff report looks blank: {whole}"
    for c in page.charts:
        assert c["width"] > 0 and c["height"] > 0 and c["visible_marks"] > 0, f"empty chart: {c}"


def test_report_of_profile_run_with_gpu_counters_draws_every_chart(browser, shots, tmp_path, replayed_run):
    page = browser.open(report(replayed_run, tmp_path / "profile.html"))
    assert_quiet_and_offline(page)
    assert_drawn(page, shots, "profile-replayed-h200-counters")


# -- hostile names ---------------------------------------------------------------------------
def hostile_trace(dest: Path) -> Path:
    """The H200 GEMM trace with kernels, operators and annotations named after PAYLOADS."""
    trace = json.loads(gzip.decompress((FIXTURES / "gemm_bf16" / "rank-0.json.gz").read_bytes()))
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert kernels and ops
    for i, e in enumerate(kernels):
        e["name"] = PAYLOADS[i % len(PAYLOADS)]
    for i, e in enumerate(ops):
        e["name"] = PAYLOADS[(i + 1) % len(PAYLOADS)]
    # an annotation around the first traced op, on the CPU and on the GPU side
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    first_op = min((e for e in ops if e["ts"] >= steps[0]["ts"]), key=lambda e: e["ts"])
    first_kernel = min(kernels, key=lambda e: e["ts"])
    for cat, like in (("user_annotation", first_op), ("gpu_user_annotation", first_kernel)):
        events.append({"ph": "X", "cat": cat, "name": PAYLOADS[0] + PAYLOADS[1], "pid": like["pid"],
                       "tid": like["tid"], "ts": like["ts"] - 1, "dur": like["dur"] + 2, "args": {}})
    dest.mkdir(parents=True)
    (dest / "rank-0.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    return dest


HOSTILE_JOB = """\
import sys
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for step in range(8):
    with torch.profiler.record_function({name!r}):
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("argv", sys.argv[1:])
"""


def assert_payloads_are_text(page: Page) -> None:
    assert page.dialogs == [], f"a payload ran: dialogs {page.dialogs}"
    assert_quiet_and_offline(page)
    shown = [p for p in PAYLOADS if p in page.text]
    assert shown, f"no payload is shown as text; page text starts {page.text[:500]!r}"
    data = json.dumps(page.data, ensure_ascii=False)
    assert all(p in data for p in PAYLOADS), "the embedded data lost or changed a payload"


def test_hostile_names_in_a_trace_stay_text(browser, shots, tmp_path):
    # the trace's folder name is hostile too: reports show where their data came from
    trace = hostile_trace(tmp_path / 'x"><img src=x onerror=alert(2)>')
    page = browser.open(report(trace, tmp_path / "hostile-trace.html"))
    keep_screenshot(page, shots, "xss-trace")
    assert_payloads_are_text(page)
    assert all(p in page.text for p in PAYLOADS), \
        f"kernel/op names are not all shown verbatim: {[p for p in PAYLOADS if p not in page.text]}"


def test_hostile_command_line_of_a_profiled_job_stays_text(browser, shots, tmp_path):
    script = tmp_path / 'job"><img src=x onerror=alert(3)>.py'
    # no '"' in the annotation: torch's trace writer does not escape it (the trace is then not
    # JSON and the run cannot be diagnosed at all), so only the command line carries PAYLOADS[1]
    script.write_text(HOSTILE_JOB.format(name=PAYLOADS[0] + PAYLOADS[2]))
    run = profile_run(tmp_path / "run", sys.executable, script, *PAYLOADS)
    page = browser.open(report(run, tmp_path / "hostile-profile.html"))
    keep_screenshot(page, shots, "xss-profile")
    assert_payloads_are_text(page)
    assert all(p in page.text for p in PAYLOADS), \
        f"the job's command line is not shown verbatim: {[p for p in PAYLOADS if p not in page.text]}"


# -- the harness itself can see what these tests look for --------------------------------------
def test_harness_sees_dialogs_errors_requests_and_injected_script(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("""<!doctype html><title>bad</title><section id="verdict">v</section>
<svg class="chart" width="300" height="100"><title>t</title><rect width="50" height="50"/></svg>
<img src=x onerror="console.log('img failed')"><script>alert(1); console.error('oops'); nope();</script>
<script type="application/json" id="gpudiag-data">{"a": 1}</script>""")
    page = browser.open(bad)
    assert page.dialogs == ["alert: 1"]
    assert "oops" in page.console_errors
    assert any("nope is not defined" in e for e in page.page_errors)
    assert page.foreign_requests == [(tmp_path / "x").as_uri()]
    assert page.event_handler_attrs == ["IMG@onerror"]
    assert page.data == {"a": 1}
    [chart] = page.charts
    assert (chart["width"], chart["height"], chart["visible_marks"]) == (300, 100, 1)
    assert pixel_stats(page.screenshot, (chart["x"], chart["y"], 50, 50)).ink == 1.0
    with pytest.raises(AssertionError, match="dialogs"):
        assert_quiet_and_offline(page)


# -- both views of a profiled run ----------------------------------------------------------------
def test_real_h100_run_report_draws_both_views_and_the_dilation(browser, shots, tmp_path):
    """The real H100 GPT run directory: as traced beside unprofiled (estimated), the dilation line
    and the basis, all drawn inside the window; its diff with itself reads no significant change."""
    run = TRACES.parent / "runs" / "h100-gpt-small"
    if not run.is_dir():
        pytest.fail(f"test data missing: {run} (CI lays ../shared beside the repository)")
    page = browser.open(report(run, tmp_path / "h100-gpt-small.html"))
    assert_quiet_and_offline(page)
    assert_drawn(page, shots, "run-h100-gpt-small")
    text = " ".join(page.text.split())
    for shown in ("Unprofiled estimate.", "The profiler slowed traced steps",
                  "as traced | unprofiled (estimated)", "unprofiled (estimated)"):
        assert shown in text, f"{shown!r} is not on the page"
    views_chart = [c for c in page.charts if c["title"] == "Mean step as traced and unprofiled (estimated)"]
    assert len(views_chart) == 1 and views_chart[0]["section"] == "breakdown"
    assert page.clipped_boxes == [], f"content cut off or scrolled sideways: {page.clipped_boxes}"
    out = tmp_path / "self-diff.html"
    gpudiag("diff", run, run, "-o", out)
    diff = browser.open(out)
    assert_quiet_and_offline(diff)
    keep_screenshot(diff, shots, "diff-h100-gpt-small-itself")
    assert "no significant change" in diff.text and "Unprofiled estimates." in diff.text
    assert diff.scroll_width <= diff.client_width, "the diff page sticks out sideways"
    assert diff.clipped_boxes == [], f"content cut off or scrolled sideways: {diff.clipped_boxes}"


def test_trace_only_report_says_it_shows_profiled_steps(browser, tmp_path):
    page = browser.open(report(TRACES / "a100-nccl-2rank", tmp_path / "trace-only.html"))
    assert_quiet_and_offline(page)
    text = " ".join(page.text.split())
    assert "This breakdown is of the profiled steps as they ran under the profiler" in text
