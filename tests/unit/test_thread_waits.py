"""The job's other threads, found where they start (collectors.thread_waits): a thread started
within a step is read from that step's end, with its whole time since it started."""

from __future__ import annotations

import threading
import time

from gpudiag.collectors.thread_waits import PeerWaits


def test_a_thread_started_within_a_step_is_found_at_its_end_with_its_time_since_it_started():
    peers = PeerWaits()
    me = threading.get_native_id()
    peers.discover(me)
    # the baseline read of the threads found at step 1; a long step, so that the read-cost budget
    # (0.5% of the step) reads every step even where a busy machine slows the read
    peers.on_step(1.0)
    assert not peers.threads_changed()
    started, stop = threading.Event(), threading.Event()
    spun: list[float] = []

    def spin() -> None:
        t0 = time.thread_time()
        started.set()
        while time.thread_time() - t0 < 0.05:  # 50 ms on a core, then idle until told to end
            pass
        spun.append(time.thread_time() - t0)
        stop.wait()

    th = threading.Thread(target=spin)
    th.start()
    started.wait()
    while not spun:
        time.sleep(0.001)
    # the step ends: the thread count moved, so the thread is found now, not at the next flush
    assert peers.threads_changed()
    peers.discover(me, fresh=True)
    assert not peers.threads_changed()
    key = next(k for k in peers.fds if k[1] == th.native_id)
    assert peers.last[key] == (0, 0)         # counted from its start, not from this read
    peers.on_step(1.0)
    stop.set()
    th.join()
    assert peers.last[key][0] / 1e9 >= 0.9 * spun[0], (peers.last[key], spun)


def test_a_thread_found_by_the_flush_has_no_start_of_its_own_and_is_read_from_then():
    """At the once-a-second discovery the thread may be older than the step: its time before
    is not the step's, so its first read is its baseline."""
    peers = PeerWaits()
    stop = threading.Event()
    th = threading.Thread(target=stop.wait)
    th.start()
    peers.discover(threading.get_native_id())
    assert all(k not in peers.last for k in peers.fds if k[1] == th.native_id)
    stop.set()
    th.join()


_WORKER = r'''
import sys, threading, time
def sched():
    with open("/proc/thread-self/schedstat") as f:
        run, wait = f.read().split()[:2]
    return int(run), int(wait)
def spin(out, go, done, end=None):
    go.wait()
    r0, w0 = sched()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.06:
        pass
    r1, w1 = sched()
    out.append((r1 - r0, w1 - w0))
    done.set()
    if end is not None:
        end.wait()  # alive until the parent has read it: a thread's counters end with it
main_go, second_go, main_done, second_done, end = (threading.Event() for _ in range(5))
spans = []
th = threading.Thread(target=spin, args=(spans, second_go, second_done, end))
th.start()
print("ready", flush=True)
sys.stdin.readline()
main_go.set()
spin(spans, main_go, main_done)
second_go.set()     # the second thread spins after the first: one at a time, as a worker's
second_done.wait()  # main thread and its queue's feeder thread take turns on a batch
print(" ".join(f"{r} {w}" for r, w in spans), flush=True)
sys.stdin.readline()
end.set()
th.join()
'''


def test_a_dataloader_workers_pace_is_its_busiest_thread_and_its_cpu_all_of_its_threads():
    """A worker process whose two threads each spin 60 ms, one after the other (a worker's main
    thread and its queue's feeder thread): its CPU over the read is both threads' (~120 ms), its
    pace the busier thread's time on a core or waiting for one (~60 ms), not their sum. Blind
    check 37's FFT loader's worker threads ran 8.2 ms of CPU a 7.7 ms step."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        peers = PeerWaits()
        peers.add_workers([child.pid])
        peers.discover(threading.get_native_id())
        first = peers.on_step(1.0)  # the baseline read: nothing of the worker's yet
        assert "workers_busy_s" not in first
        child.stdin.write("go\n")
        child.stdin.flush()
        spans = [int(x) for x in child.stdout.readline().split()]
        row = peers.on_step(1.0)
        read = sum(1 for pid, _ in peers.fds if pid == child.pid)
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=30)
    runs, waits = spans[0::2], spans[1::2]
    busiest = max(r + w for r, w in zip(runs, waits, strict=True)) / 1e9
    # the threads' own reads lie inside the read of the step; the rest is a few ms of Python
    # around them (more where a busy machine makes them wait for a core)
    assert read == 2  # both of the worker's threads (the test process's own are read too)
    assert busiest <= row["workers_busy_s"] <= busiest + 0.04, (row, spans)
    assert sum(runs) / 1e9 <= row["workers_run_s"] <= sum(runs) / 1e9 + 0.04, (row, spans)
    # one thread's, not the two's: the other thread's 60 ms is left out
    assert row["workers_busy_s"] < sum(r + w for r, w in zip(runs, waits, strict=True)) / 1e9 - 0.03
