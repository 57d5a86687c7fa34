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
