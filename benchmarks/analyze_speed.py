"""Speed and memory of ``gpudiag analyze`` against HTA and against the decoder's own speed.

Why this benchmark: the reason gpudiag streams traces through msgspec into numpy columns,
instead of ``json.load``-ing them into a pandas DataFrame as HTA does, is that real jobs
produce rank files of hundreds of MB to GBs, where HTA's load takes minutes and many GB. Our
targets (issue 18) on the 8-rank, ~650 MB set: at least 20x HTA's speed (load + temporal
breakdown) at most a quarter of its peak memory, with the same temporal breakdown; and the
whole analysis within 2x of what msgspec alone needs to decode the same bytes into the same
typed events on one core (the limit: nothing that reads every event can be faster). The
published sample traces are 1-50 MB, so we build a large job from one of them: the events are
repeated back to back in time (ids and step numbers shifted so correlations stay unique) into
``--world`` rank files of plain JSON (8 by default).

What is measured, and why so:
  * wall time of each tool as a user runs it, in a fresh subprocess: interpreter start,
    imports, parsing and the breakdown. For gpudiag that is ``python -m gpudiag analyze DIR
    --json``; for HTA ``TraceAnalysis(trace_dir=DIR).get_temporal_breakdown()``, the load
    plus the same breakdown our ``ranks[i].gpu_span`` reproduces.
  * peak memory as the largest sum of resident set sizes over the tool's whole process
    tree, sampled every 20 ms from /proc: both tools parse ranks in worker processes, so
    the parent's own peak (``ru_maxrss``) would miss most of it. ``ru_maxrss`` from wait4,
    the largest single process, is printed as a cross-check.
  * CPU seconds of each tree (user + system, its reaped children included, from wait4), and
    the limit: msgspec decoding every file's events into gpudiag's typed event structs in one
    process on one core (``LIMIT_SCRIPT``, timing the decode calls only). gpudiag's CPU
    seconds over the limit's is the "x of the decode" figure: it includes interpreter start,
    imports, reading, columns, every analysis and the workers' own start.
  * agreement: gpudiag's per-rank idle / compute / non-compute percentages of the GPU span
    against HTA's, as the largest difference in percentage points. A fast tool that gives
    other numbers would be no replacement.
  * with ``--check-prefix-gb X``: the verdict on an X GiB set built the same way (the first
    copies of the same job) must equal the verdict on this one.

Generated traces go to the repository's git-ignored ``.bench/`` folder (or ``--workdir``) and
are reused when their parameters match. Usage::

    python benchmarks/analyze_speed.py --size-gb 0.6125       # the issue's 8-rank ~650 MB set
    python benchmarks/analyze_speed.py --size-gb 8 --skip-hta --check-prefix-gb 0.6125 \
        --workdir "$TMPDIR/big"                                # 8 ranks x 1 GiB
    python benchmarks/analyze_speed.py --world 128 --size-gb 2.5 --skip-hta   # 128 x 20 MB
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
DEFAULT_SOURCE = "a100-nccl-2rank/rank-0.json.gz"
DEFAULT_WORKDIR = REPO / ".bench" / "analyze_speed"

WORLD_SIZE = 8
GIB = 2**30
MIB = 2**20
# Bump when the generated files change, so stale trace sets are rebuilt, not reused.
GENERATOR_VERSION = 1
# Integer ids that link events (launch -> kernel, op -> kernel, fwd -> bwd): shifted per copy.
ID_ARGS = ("correlation", "External id", "Record function id", "Sequence number",
           "Python id", "Python parent id", "Ev Idx")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

POLL_S = 0.02
SPEEDUP_TARGET = 20.0
MEMORY_RATIO_TARGET = 1 / 4
DECODE_RATIO_TARGET = 2.0

# Runs in a fresh interpreter: argv[1] = trace folder, argv[2] = where to write the result.
HTA_SCRIPT = """
import json, logging, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
logging.getLogger("hta").setLevel(logging.ERROR)
t1 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
df = analysis.get_temporal_breakdown(visualize=False)
t3 = time.perf_counter()
with open(sys.argv[2], "w") as f:
    json.dump({"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2,
               "rows": json.loads(df.to_json(orient="records"))}, f)
"""


# Runs in a fresh interpreter: argv[1] = trace folder, argv[2] = where to write the result.
# Each file's events array is decoded whole into gpudiag's typed events (the decoder's best
# case: one call, no batching); only the decode calls are timed, in CPU seconds.
LIMIT_SCRIPT = """
import json, sys, time
from pathlib import Path
import msgspec
from gpudiag.analyzers.trace_decode import AnyCategoryEvent, Event
# gpudiag's own choice: its known categories, else any category (trace_decode.TypedDecoder)
docs = [msgspec.json.Decoder(msgspec.defstruct("Doc", [("traceEvents", list[e])]))
        for e in (Event, AnyCategoryEvent)]
total = 0.0
n = 0
size = 0
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    data = f.read_bytes()
    size += len(data)
    for doc in docs:
        t0 = time.process_time()
        try:
            events = doc.decode(data).traceEvents
        except msgspec.ValidationError:
            continue
        finally:
            total += time.process_time() - t0
        break
    else:
        raise SystemExit(f"{f.name}: values of unexpected types; the limit needs typed events")
    n += len(events)
    del data, events
with open(sys.argv[2], "w") as out:
    json.dump({"decode_cpu_s": total, "events": n, "bytes": size}, out)
"""


# --- building the trace set ----------------------------------------------------------------

@dataclass
class TraceSet:
    folder: Path
    files: list[Path]
    total_bytes: int
    copies: int
    events_per_rank: int
    reused: bool


@dataclass
class _Replicator:
    """Serialises copy k of the source events, shifted so copy k follows copy k-1."""

    events: list[dict[str, Any]]
    ts_shift: float  # us between copies: the source's span, rounded up
    id_shift: int  # added to ids per copy: a power of ten above the largest id
    step_shift: int  # added to ProfilerStep numbers per copy

    @classmethod
    def from_events(cls, events: list[dict[str, Any]]) -> _Replicator:
        lo, hi, max_id = math.inf, -math.inf, 0
        steps: list[int] = []
        for e in events:
            ts = e.get("ts")
            if _is_num(ts):
                dur = e.get("dur")
                lo = min(lo, ts)
                hi = max(hi, ts + (dur if _is_num(dur) else 0))
            if _is_int(e.get("id")):
                max_id = max(max_id, e["id"])
            args = e.get("args")
            if isinstance(args, dict):
                for key in ID_ARGS:
                    if _is_int(args.get(key)):
                        max_id = max(max_id, args[key])
            m = STEP_RE.match(str(e.get("name", "")))
            if m:
                steps.append(int(m.group(1)))
        if lo > hi:
            raise SystemExit("the source trace has no timed events")
        return cls(events=events, ts_shift=float(math.ceil(hi - lo)),
                   id_shift=10 ** len(str(max_id)),
                   step_shift=max(steps) - min(steps) + 1 if steps else 0)

    def copy(self, k: int) -> bytes:
        """Copy ``k`` as comma-separated JSON objects (no brackets)."""
        dt, did, dstep = k * self.ts_shift, k * self.id_shift, k * self.step_shift
        out: list[dict[str, Any]] = []
        for e in self.events:
            c = dict(e)
            if _is_num(c.get("ts")):
                c["ts"] += dt
            if _is_int(c.get("id")) and c["id"] > 0:
                c["id"] += did
            args = c.get("args")
            if isinstance(args, dict):
                a = dict(args)
                for key in ID_ARGS:
                    if _is_int(a.get(key)) and a[key] > 0:
                        a[key] += did
                c["args"] = a
            if dstep and isinstance(c.get("name"), str):
                m = STEP_RE.match(c["name"])
                if m:
                    c["name"] = f"ProfilerStep#{int(m.group(1)) + dstep}"
            out.append(c)
        return orjson.dumps(out)[1:-1]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _header(doc: dict[str, Any], rank: int, world: int) -> bytes:
    """The document up to ``"traceEvents": [``.

    ``distributedInfo`` comes first and is written with a space after each colon: HTA finds
    a file's rank with the regex ``"rank":\\s+(\\d+)`` on the first line that matches.
    """
    src = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    dist: dict[str, Any] = {"backend": src.get("backend", "nccl"), "rank": rank,
                            "world_size": world}
    if "nccl_version" in src:
        dist["nccl_version"] = src["nccl_version"]
    lines = [f'  "distributedInfo": {json.dumps(dist)}']
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items()
              if k not in ("traceEvents", "distributedInfo")]
    return ("{\n" + ",\n".join(lines) + ',\n  "traceEvents": [\n').encode()


def _copies(rep: _Replicator, written: int, target_bytes: int) -> Iterator[bytes]:
    """Copies 0, 1, ... (one per line) until ``target_bytes`` are written, at least one."""
    k = 0
    while k == 0 or written < target_bytes:
        chunk = (b",\n" if written else b"") + rep.copy(k)
        yield chunk
        written += len(chunk)
        k += 1


def build_trace_set(source: Path, size_gb: float, workdir: Path, world: int = WORLD_SIZE) -> TraceSet:
    folder = workdir / "traces"
    manifest_path = workdir / "manifest.json"
    params = {"generator": GENERATOR_VERSION, "source": _display(source),
              "source_bytes": source.stat().st_size, "size_gb": size_gb, "world_size": world}
    try:
        manifest = json.loads(manifest_path.read_text())
        files = [folder / name for name in manifest["files"]]
        if manifest["params"] == params and all(
                f.is_file() and f.stat().st_size == size
                for f, size in zip(files, manifest["sizes"], strict=True)):
            return TraceSet(folder, files, sum(manifest["sizes"]), manifest["copies"],
                            manifest["events_per_rank"], reused=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass

    shutil.rmtree(folder, ignore_errors=True)
    manifest_path.unlink(missing_ok=True)
    folder.mkdir(parents=True)
    raw = source.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    del raw
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    rep = _Replicator.from_events([e for e in events if e.get("ph") != "M"])

    headers = [_header(doc, r, world) for r in range(world)]
    footer = b"\n]}\n"
    per_rank = size_gb * GIB / world - len(headers[0]) - len(footer)
    files = [folder / f"rank-{r}.json" for r in range(world)]
    partial = [f.with_suffix(".partial") for f in files]  # not *.json: no tool picks them up
    first = orjson.dumps(meta)[1:-1]  # process/thread names: once per file
    copies = 0
    with ExitStack() as stack:
        outs = [stack.enter_context(p.open("wb")) for p in partial]
        for out, head in zip(outs, headers, strict=True):
            out.write(head + first)
        for chunk in _copies(rep, len(first), math.ceil(per_rank)):
            for out in outs:  # every rank gets the same events
                out.write(chunk)
            copies += 1
        for out in outs:
            out.write(footer)
    for p, f in zip(partial, files, strict=True):
        p.replace(f)
    sizes = [f.stat().st_size for f in files]
    events_per_rank = len(meta) + copies * len(rep.events)
    manifest_path.write_text(json.dumps({
        "params": params, "files": [f.name for f in files], "sizes": sizes, "copies": copies,
        "events_per_rank": events_per_rank}, indent=2))
    return TraceSet(folder, files, sum(sizes), copies, events_per_rank, reused=False)


# --- measuring a process tree ----------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process is gone
        return None


class TreeMonitor(threading.Thread):
    """Samples the summed RSS of a process and all its descendants; keeps the maximum."""

    def __init__(self, root: int, interval: float = POLL_S) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.peak_bytes = 0
        self.max_procs = 0
        self.samples = 0
        self._parent: dict[int, int] = {}  # pid -> ppid, read once per pid
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def _tree(self) -> list[int]:
        alive = {int(d) for d in os.listdir("/proc") if d.isdigit()}
        for pid in list(self._parent):
            if pid not in alive:
                del self._parent[pid]
        for pid in alive - self._parent.keys():
            stat = _read(f"/proc/{pid}/stat")
            if stat is not None:  # "pid (comm) state ppid ...", comm may hold spaces
                self._parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        children: dict[int, list[int]] = {}
        for pid, ppid in self._parent.items():
            children.setdefault(ppid, []).append(pid)
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        return tree

    def sample(self) -> None:
        total, n = 0, 0
        for pid in self._tree():
            statm = _read(f"/proc/{pid}/statm")
            if statm:
                total += int(statm.split()[1]) * _PAGE
                n += 1
        self.samples += 1
        self.peak_bytes = max(self.peak_bytes, total)
        self.max_procs = max(self.max_procs, n)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)


@dataclass
class RunStats:
    wall_s: float
    peak_bytes: int  # summed RSS of the process tree
    max_procs: int
    largest_process_bytes: int  # ru_maxrss: the largest single process of the tree
    cpu_s: float = 0.0  # user + system of the tree (the root and every child it reaped)


def measure(cmd: list[str], log_dir: Path, name: str) -> RunStats:
    """Run ``cmd`` to completion; stdout and stderr go to ``log_dir/name.{out,err}``."""
    with (log_dir / f"{name}.out").open("wb") as out, (log_dir / f"{name}.err").open("wb") as err:
        t0 = time.perf_counter()
        # Popen returns once the child has exec'd, so sampling never sees our own memory.
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=RUN_ENV,
                                start_new_session=True)
        monitor = TreeMonitor(proc.pid)
        monitor.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            monitor.stop()
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (log_dir / f"{name}.err").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{name} failed with exit code {proc.returncode}:\n{tail}")
    return RunStats(wall, monitor.peak_bytes, monitor.max_procs, usage.ru_maxrss * 1024,
                    usage.ru_utime + usage.ru_stime)


def best_of(runs: list[RunStats]) -> RunStats:
    """Fastest wall time, largest memory: noise only ever adds time, and memory is a limit."""
    return RunStats(min(r.wall_s for r in runs), max(r.peak_bytes for r in runs),
                    max(r.max_procs for r in runs), max(r.largest_process_bytes for r in runs),
                    min(r.cpu_s for r in runs))


# --- agreement of the breakdowns ------------------------------------------------------------

BREAKDOWN_COLUMNS = (("idle_time_pctg", "idle_time"), ("compute_time_pctg", "compute_time"),
                     ("non_compute_time_pctg", "non_compute_time"))


def breakdown_diffs(diagnosis: dict[str, Any], hta_rows: list[dict[str, Any]]
                    ) -> list[tuple[float, int, str, float, float]]:
    """(|difference| in pp, rank, field, gpudiag %, HTA %) for every rank and field."""
    ours = {r["rank"]: r.get("gpu_span") for r in diagnosis["ranks"]}
    out = []
    for row in hta_rows:
        rank = int(row["rank"])
        span = ours.get(rank)
        if not span or not span["kernel_time"]:
            raise SystemExit(f"gpudiag has no GPU span for rank {rank}")
        for col, field in BREAKDOWN_COLUMNS:
            pct = 100.0 * span[field] / span["kernel_time"]
            out.append((abs(pct - row[col]), rank, field, pct, float(row[col])))
    if set(ours) != {int(r["rank"]) for r in hta_rows}:
        raise SystemExit(f"ranks differ: gpudiag {sorted(ours)}, HTA {[r['rank'] for r in hta_rows]}")
    return out


# --- main --------------------------------------------------------------------------------------

def _display(path: Path) -> str:
    """A path relative to the repository (or its parent) for printing: no machine paths."""
    for base, prefix in ((REPO, ""), (REPO.parent, "../")):
        try:
            return prefix + str(path.resolve().relative_to(base))
        except ValueError:
            continue
    return str(path)


# The tools run as installed packages do: with their compiled bytecode. pip compiles HTA's
# modules into site-packages at install; an editable checkout of gpudiag writes its own on the
# first run, which a PYTHONDONTWRITEBYTECODE=1 in the caller's environment (set on the test
# machines) would forbid, making every timed run compile gpudiag's ~100 modules again (0.1 s
# of CPU measured here) while HTA's stay compiled.
RUN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _warm_bytecode(py: str) -> None:
    """One untimed gpudiag analysis of a small trace, so the timed ones import compiled modules."""
    subprocess.run([py, "-m", "gpudiag", "analyze", str(TRACES / "a100-simple-add"), "--json", "--quiet"],
                   cwd=REPO, env=RUN_ENV, stdout=subprocess.DEVNULL, check=True)


def _warm_cache(files: list[Path]) -> None:
    """Read every file once so neither tool pays for the disk and both see the page cache."""
    for f in files:
        with f.open("rb") as fh:
            while fh.read(64 * MIB):
                pass


def _line(label: str, s: RunStats, total_bytes: int) -> str:
    return (f"{label:<16} {s.wall_s:>9.2f} {s.cpu_s:>8.2f} {s.peak_bytes / MIB:>15,.0f} "
            f"{s.largest_process_bytes / MIB:>19,.0f} {s.max_procs:>6} "
            f"{total_bytes / 1e6 / s.wall_s:>8,.0f}")


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def _verdict(out: Path) -> tuple[str, float, str | None, str]:
    v = json.loads(out.read_text())["verdict"]
    return v["label"], v["confidence"], v["secondary"], v["summary"]


def prepare_trace_set(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[TraceSet, str]:
    """Check --size-gb/--repeats/--source/--workdir, then build or reuse the trace set.

    Shared with report_speed.py, which measures on the same set."""
    if args.size_gb <= 0 or args.repeats < 1:
        parser.error("--size-gb must be positive and --repeats at least 1")
    source = TRACES / args.source
    if not source.is_file():
        parser.error(f"no source trace {_display(source)} (../shared/traces beside the repository)")
    world = getattr(args, "world", WORLD_SIZE)
    workdir = args.workdir or DEFAULT_WORKDIR / f"{Path(args.source).parent.name}-{args.size_gb:g}gb"
    if world != WORLD_SIZE:
        workdir = workdir.with_name(f"{workdir.name}-{world}ranks")
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ts = build_trace_set(source, args.size_gb, workdir, world)
    return ts, "reused" if ts.reused else f"built in {time.perf_counter() - t0:.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-gb", type=float, default=1.0,
                        help="total uncompressed JSON over all rank files, in GiB (default 1.0)")
    parser.add_argument("--world", type=int, default=WORLD_SIZE,
                        help=f"number of rank files (default {WORLD_SIZE})")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where traces and logs go (default: .bench/analyze_speed/<size> "
                             "in the repository)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per tool; the fastest time and the largest peak are kept")
    parser.add_argument("--skip-hta", action="store_true", help="measure gpudiag only")
    parser.add_argument("--jobs", type=int, default=None,
                        help="gpudiag analyze --jobs (default: its own, one per core)")
    parser.add_argument("--check-prefix-gb", type=float, default=None, metavar="X",
                        help="also analyse an X GiB set of the same job (its first copies) and "
                             "check that its verdict equals this one's")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help=f"trace to replicate, relative to ../shared/traces "
                             f"(default {DEFAULT_SOURCE})")
    args = parser.parse_args(argv)
    if args.world < 1:
        parser.error("--world must be at least 1")
    ts, how = prepare_trace_set(parser, args)
    workdir = ts.folder.parent
    print(f"trace set: {_display(ts.folder)} ({how})")
    print(f"  {args.world} ranks x {ts.copies} back-to-back copies of {args.source}: "
          f"{ts.total_bytes / GIB:.3f} GiB ({ts.total_bytes:,} bytes) of JSON, "
          f"{ts.events_per_rank:,} events per rank ({ts.files[0].stat().st_size / MIB:,.0f} MiB)")
    print(f"  machine: {os.cpu_count()} CPUs; load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    _warm_cache(ts.files)
    py = sys.executable
    _warm_bytecode(py)
    gpudiag_cmd = [py, "-m", "gpudiag", "analyze", str(ts.folder), "--json", "--quiet"]
    if args.jobs:
        gpudiag_cmd += ["--jobs", str(args.jobs)]
    limit_out = workdir / "limit.json"
    tools: dict[str, list[str]] = {
        "gpudiag": gpudiag_cmd,
        "msgspec decode": [py, "-c", LIMIT_SCRIPT, str(ts.folder), str(limit_out)],
    }
    hta_out = workdir / "hta_breakdown.json"
    if not args.skip_hta:
        tools["hta"] = [py, "-c", HTA_SCRIPT, str(ts.folder), str(hta_out)]
    results: dict[str, RunStats] = {}
    for name, cmd in tools.items():
        runs = []
        for i in range(args.repeats):
            s = measure(cmd, workdir, name.replace(" ", "_"))
            runs.append(s)
            print(f"  {name} run {i + 1}/{args.repeats}: {s.wall_s:.2f} s, {s.cpu_s:.2f} s CPU, "
                  f"peak {s.peak_bytes / MIB:,.0f} MiB over {s.max_procs} processes", flush=True)
        results[name] = best_of(runs)
    print(f"  load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    g = results["gpudiag"]
    limit = json.loads(limit_out.read_text())
    print()
    print(f"{'':<16} {'wall (s)':>9} {'CPU (s)':>8} {'peak RSS (MiB)':>15} {'largest proc (MiB)':>19} "
          f"{'procs':>6} {'MB/s':>8}")
    print(_line("gpudiag analyze", g, ts.total_bytes))
    if "hta" in results:
        print(_line("HTA breakdown", results["hta"], ts.total_bytes))
    print(f"{'msgspec decode':<16} {'':>9} {limit['decode_cpu_s']:>8.2f} {'':>15} {'':>19} {'1':>6} "
          f"{ts.total_bytes / 1e6 / limit['decode_cpu_s']:>8,.0f}   (the limit: typed decode "
          "alone, one core)")
    decode_ratio = g.cpu_s / limit["decode_cpu_s"]
    print()
    print(f"decode ratio gpudiag CPU / msgspec decode CPU = {decode_ratio:6.2f}x  "
          f"target <= {DECODE_RATIO_TARGET:g}x: {_met(decode_ratio <= DECODE_RATIO_TARGET)}")
    print(f"             (gpudiag wall on {g.max_procs - 1 or 1} workers / decode on one core = "
          f"{g.wall_s / limit['decode_cpu_s']:.2f}x)")
    print(f"throughput   {ts.total_bytes / 1e6 / g.wall_s:,.0f} MB/s wall, "
          f"{ts.total_bytes / 1e6 / g.cpu_s:,.0f} MB/s per CPU second")
    if args.check_prefix_gb:
        _check_prefix(args, workdir)
    if "hta" not in results:
        print("HTA skipped (--skip-hta): no ratios against it")
        return 0
    h = results["hta"]
    hta = json.loads(hta_out.read_text())
    print(f"  (HTA inside its process: import {hta['import_s']:.1f} s, load {hta['load_s']:.1f} s, "
          f"temporal breakdown {hta['breakdown_s']:.1f} s)")
    speedup = h.wall_s / g.wall_s
    mem_ratio = g.peak_bytes / h.peak_bytes
    print(f"speedup      HTA time / gpudiag time  = {speedup:6.2f}x  "
          f"target >= {SPEEDUP_TARGET:g}x: {_met(speedup >= SPEEDUP_TARGET)}")
    print(f"memory ratio gpudiag peak / HTA peak = {mem_ratio:6.3f}   "
          f"target <= 1/4:  {_met(mem_ratio <= MEMORY_RATIO_TARGET)}")

    diagnosis = json.loads((workdir / "gpudiag.out").read_text())
    diffs = breakdown_diffs(diagnosis, hta["rows"])
    worst = max(diffs, key=lambda d: (d[0], -d[1]))  # ties: the lowest rank
    print(f"breakdown    max |gpudiag - HTA| = {worst[0]:.2f} pp over {len(hta['rows'])} ranks "
          f"(worst: rank {worst[1]} {worst[2]}: gpudiag {worst[3]:.2f}% vs HTA {worst[4]:.2f}%)")
    for _, field in BREAKDOWN_COLUMNS:
        col = [d for d in diffs if d[2] == field and d[1] == worst[1]][0]
        print(f"  rank {worst[1]} {field + ' %':<20} gpudiag {col[3]:6.2f}   HTA {col[4]:6.2f}")
    return 0


def _check_prefix(args: argparse.Namespace, workdir: Path) -> None:
    """The verdict on the first X GiB of the same job must be this one's."""
    prefix_dir = workdir.with_name(workdir.name + f"-prefix-{args.check_prefix_gb:g}gb")
    prefix_dir.mkdir(parents=True, exist_ok=True)
    ts = build_trace_set(TRACES / args.source, args.check_prefix_gb, prefix_dir, args.world)
    s = measure([sys.executable, "-m", "gpudiag", "analyze", str(ts.folder), "--json", "--quiet"],
                prefix_dir, "gpudiag")
    ours, theirs = _verdict(workdir / "gpudiag.out"), _verdict(prefix_dir / "gpudiag.out")
    same = ours[:3] == theirs[:3]  # label, confidence, secondary label
    print(f"prefix       {ts.total_bytes / GIB:.3f} GiB of the same job ({ts.copies} copies per "
          f"rank): {s.wall_s:.2f} s; verdict {theirs[0]} {theirs[1]:.2f} vs {ours[0]} {ours[1]:.2f} "
          f"here: {'EQUAL' if same else 'DIFFERENT'}")
    print(f"  here:   {ours[3]}\n  prefix: {theirs[3]}")


if __name__ == "__main__":
    sys.exit(main())
