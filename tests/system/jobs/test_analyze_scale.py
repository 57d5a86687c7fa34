"""gpudiag analyze at the size of real jobs: streaming in bounded memory, the same answer
whatever the batch size or the number of workers, parts of a job, many ranks, progress."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analyzers import trace_stream
from gpudiag.analyzers.diagnose import diagnose
from gpudiag.analyzers.trace_loader import load_bytes, load_rank
from gpudiag.reports.html import render_report
from gpudiag.reports.terminal import render_terminal
from tests.conftest import TRACES
from tests.many_ranks import make_job


def _same_columns(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("trace", ["a100-nccl-2rank/rank-0.json.gz", "mi250/rank-0.json.gz"])
def test_batches_cut_anywhere_fold_to_the_same_columns(monkeypatch, trace):
    path = TRACES / trace
    whole = load_rank(path)
    monkeypatch.setattr(trace_stream, "BATCH_BYTES", 3000)
    monkeypatch.setattr(trace_stream, "READ_BYTES", 777)
    monkeypatch.setattr(trace_stream, "GZ_READ_BYTES", 333)
    monkeypatch.setattr(trace_stream, "INFLATE_BYTES", 1000)
    _same_columns(whole, load_rank(path))


def test_invalid_json_mid_file_is_salvaged_in_any_batch(monkeypatch):
    """torch writes names with an unescaped '"': the file is invalid JSON, every other event
    is fine. Streamed in small batches, the bad event is dropped and counted, nothing else."""
    text = gzip.decompress((TRACES / "mi250" / "rank-0.json.gz").read_bytes())
    doc = json.loads(text)
    n = len(doc["traceEvents"])
    doc["traceEvents"].insert(n // 2, {"ph": "X", "cat": "user_annotation", "name": "BAD",
                                       "ts": 1, "dur": 1, "pid": 1, "tid": 1})
    lines = json.dumps(doc, indent=1).replace('"name": "BAD"', '"name": "B"A"D"').encode()
    clean = load_bytes(text)
    monkeypatch.setattr(trace_stream, "BATCH_BYTES", 2000)
    got = load_bytes(lines)
    assert any("not valid JSON" in w and "dropped 1 unreadable" in w for w in got.warnings)
    assert got.kept_events == clean.kept_events
    assert np.array_equal(got.gpu_ts, clean.gpu_ts) and np.array_equal(got.cpu_ts, clean.cpu_ts)


def test_a_truncated_document_stays_an_error_even_when_salvageable(monkeypatch):
    text = gzip.decompress((TRACES / "mi250" / "rank-0.json.gz").read_bytes())
    monkeypatch.setattr(trace_stream, "BATCH_BYTES", 2000)
    with pytest.raises(Exception, match="invalid or truncated JSON"):
        load_bytes(text[: len(text) * 2 // 3])


@pytest.fixture(scope="module")
def job16(tmp_path_factory) -> Path:
    """16 ranks of the real sampled 128-rank job, ranks 5 and 11 slowed down."""
    return make_job(tmp_path_factory.mktemp("job16"), world=16, slow={5: 1.25, 11: 1.15})


@pytest.mark.parametrize("target", ["shared:a100-sampled-128rank", "job16"])
def test_jobs_1_and_2_give_identical_diagnoses(request, target):
    path = TRACES / target.split(":")[1] if target.startswith("shared:") else request.getfixturevalue(target)
    assert diagnose(path, jobs=1).to_json() == diagnose(path, jobs=2).to_json()


def test_ranks_subset_equals_those_ranks_analysed_alone(job16, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    for r in (0, 5, 6, 7):
        shutil.copy(job16 / f"rank-{r}.json.gz", alone)
    sub = diagnose(job16, ranks=[0, 5, 6, 7], jobs=2).to_json().replace(str(job16), "DIR")
    ref = diagnose(alone, jobs=1).to_json().replace(str(alone), "DIR")
    assert sub == ref


def test_a_rank_that_is_not_there_is_a_one_line_error(job16):
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(job16), "--ranks", "3,40-41"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rank 40-41 not in the traces (ranks present: 0-15)" in proc.stderr


def test_steps_keep_only_those_steps_and_their_work(traces):
    full = diagnose(traces / "a100-8rank-diff", jobs=1)
    part = diagnose(traces / "a100-8rank-diff", steps=(1010, 1011), jobs=1)
    assert [s.step for s in part.ranks[0].steps] == [1010, 1011]
    by_step = {s.step: s.breakdown for s in full.ranks[0].steps}
    # a step that is followed by a kept step has the same window, so the same breakdown
    assert part.ranks[0].steps[0].breakdown == by_step[1010]
    assert sum(t.calls for t in part.top_kernels) < sum(t.calls for t in full.top_kernels)
    none = diagnose(traces / "a100-8rank-diff", steps=(1, 2), jobs=1)
    assert any("no step in 1-2 was traced (traced steps: 1009-1014)" in w for w in none.warnings)


def test_many_ranks_read_as_distribution_and_worst_ranks(tmp_path):
    job = make_job(tmp_path / "job", world=128, slow={17: 1.3, 90: 1.2})
    d = diagnose(job)
    spread = {s.metric: s for s in d.rank_spread}
    assert spread["step_time"].ranks == 128
    assert [v.rank for v in spread["step_time"].highest[:2]] == [17, 90]
    text = render_terminal(d)
    assert "over 128 ranks" in text and "17 (" in text
    # a line per rank would add 120 lines: the report of 128 ranks is as long as that of 8
    few = render_terminal(diagnose(make_job(tmp_path / "few", world=8, slow={3: 1.3, 6: 1.2})))
    assert len(text.splitlines()) <= len(few.splitlines()) + 10  # wording differs, not rows
    html = render_report(d)
    assert len(html.encode()) < 2_000_000
    assert "of 128 ranks are drawn and listed" in html and html.count('class="straggler"') <= 16


def _cli_stderr(args: list[str], tty: bool) -> bytes:
    env = {**os.environ, "GPUDIAG_PROGRESS_AFTER_S": "0", "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "gpudiag", "analyze", *args]
    if not tty:
        return subprocess.run(cmd, capture_output=True, env=env, timeout=300, check=True).stderr
    parent, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=child,
                            env=env)
    os.close(child)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([parent], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(parent, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        proc.wait(timeout=300)
        os.close(parent)
    assert proc.returncode == 0, out
    return out


def test_progress_is_drawn_on_a_terminal_and_never_into_a_pipe(job16):
    args = [str(job16), "--json", "--jobs", "2"]
    on_tty = _cli_stderr(args, tty=True)
    assert b"ranks" in on_tty and b"MB" in on_tty and b"\x1b[" in on_tty
    assert _cli_stderr(args, tty=False) == b""
    assert _cli_stderr([*args, "--quiet"], tty=True) == b""


# --- memory ---------------------------------------------------------------------------------

# Address space a process may map in the memory test. The interpreter with gpudiag imported
# maps ~150 MB; a streamed analysis stays far below this, while reading the file whole (or
# json.load-ing it, as HTA does) needs at least its 1.2 GB at once.
AS_LIMIT = 512 * 2**20
BIG_BYTES = 1_200_000_000

_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
{body}
"""


def _big_rank(path: Path) -> tuple[Path, int]:
    """A ~1.2 GB rank file in seconds: the real trace's events, each carrying 4 KB of args no
    analysis reads (as Kineto's stacks and shapes do), repeated. Returns (path, steps in it)."""
    doc = json.loads(gzip.decompress((TRACES / "a100-nccl-2rank" / "rank-0.json.gz").read_bytes()))
    pad = "x" * 4000
    events = [dict(e, args={**e.get("args", {}), "pad": pad}) for e in doc["traceEvents"]]
    block = json.dumps(events)[1:-1].encode()
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    head = json.dumps({k: v for k, v in doc.items() if k != "traceEvents"})[:-1].encode()
    copies = 1
    with path.open("wb") as f:
        f.write(head + b', "traceEvents": [' + block)
        written = len(block)
        while written < BIG_BYTES:
            f.write(b",\n" + block)
            written += len(block) + 2
            copies += 1
        f.write(b"]}")
    return path, steps * copies


def _run_limited(body: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", _UNDER_LIMIT.format(limit=AS_LIMIT, body=body)],
                          capture_output=True, text=True, timeout=900, env=env)


def test_a_rank_larger_than_the_memory_limit_is_analysed_in_bounded_memory(tmp_path):
    big, steps = _big_rank(tmp_path / "rank-0.json")
    assert big.stat().st_size > 2 * AS_LIMIT
    # the bound bites: reading the file whole, or json.load-ing it, cannot run under it
    for whole in (f"open({str(big)!r}, 'rb').read()", f"import json; json.load(open({str(big)!r}))"):
        proc = _run_limited(whole)
        assert proc.returncode != 0 and "MemoryError" in proc.stderr, proc.stderr[-500:]
    proc = _run_limited(
        "from gpudiag.analyzers.diagnose import diagnose\n"
        f"d = diagnose({str(big)!r}, jobs=1)\n"
        "print(d.ranks[0].total.step_time > 0, len(d.ranks[0].steps))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", str(steps)]  # every copy's steps were read
