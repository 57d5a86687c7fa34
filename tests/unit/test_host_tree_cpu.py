"""The job's process tree's CPU, as the host sampler reads it (collectors.host): children born
and reaped between two samples are the job's, not the machine's.

Blind check 17 saw a one-worker DataLoader job on a machine it had to itself told "other
processes took 17.8 ms of each traced step": the worker started within the sample that covered
the traced window, and its CPU until the sampler first saw it was read as another process's.
A worker joined at an epoch's end (``persistent_workers=False``) lost its last second the same
way. The root here spawns children that each burn a fixed amount of CPU (their own
``process_time``, so a busy machine changes nothing but how long it takes) and are reaped within
one sample interval, and one that is born in one interval and reaped in a later one; the test
waits on the sampler's rows, never on time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from gpudiag.collectors.host import HostSampler

ROOT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    rows, report = sys.argv[1:3]

    def rows_now():
        try:
            with open(rows) as f:
                return f.read().count("\\n")
        except OSError:
            return 0

    def wait_rows(n):
        while rows_now() < n:
            time.sleep(0.01)

    burn = ("import time\\nt = time.process_time()\\n"
            "while time.process_time() - t < float(__import__('sys').argv[1]): pass\\n")
    wait_rows(1)                       # the sampler's first row: its baseline
    t0 = os.times()
    for _ in range(4):                 # short-lived: born and reaped between two rows
        subprocess.run([sys.executable, "-c", burn, "0.15"], check=True)
    n = rows_now()
    long = subprocess.Popen([sys.executable, "-c", burn + "import time\\ntime.sleep(60)\\n", "0.2"])
    wait_rows(n + 2)                   # seen alive in at least one row
    long.kill(); long.wait()           # then reaped: its CPU moves to this process's cutime
    t1 = os.times()
    with open(report, "w") as f:
        json.dump({"own": (t1.user + t1.system) - (t0.user + t0.system),
                   "children": (t1.children_user + t1.children_system)
                   - (t0.children_user + t0.children_system)}, f)
    wait_rows(rows_now() + 2)          # the rows that cover the reaping
""")


def test_children_born_and_reaped_between_samples_are_counted_as_the_jobs_cpu(tmp_path: Path):
    rows, report = tmp_path / "host.jsonl", tmp_path / "report.json"
    root = subprocess.Popen([sys.executable, "-c", ROOT, str(rows), str(report)])
    sampler = HostSampler(root.pid, rows, interval=0.5).start()
    try:
        assert root.wait(timeout=300) == 0
    finally:
        sampler.stop()
    truth = json.loads(report.read_text())
    work = truth["own"] + truth["children"]
    assert truth["children"] >= 4 * 0.15 + 0.2   # the children did burn what they were told
    samples = [json.loads(x) for x in rows.read_text().splitlines()]
    # CPU the sampler counted for the tree after its baseline row: cores x the interval
    counted = sum(s["cpu_cores"] * (s["t"] - p["t"]) for p, s in zip(samples, samples[1:], strict=False))
    # the root's own waiting on the rows (a poll every 10 ms) and its interpreter's exit add a
    # little beyond ``work``; what must not happen is the children's CPU going missing
    assert 0.9 * work <= counted <= work + 0.3, (counted, truth, samples)
