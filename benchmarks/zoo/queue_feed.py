"""Blocked on a hand-written producer: a background thread fetches each batch from a slow
"feature store" (a ``--fetch-ms`` 24 ms sleep: the store's latency, then the batch's tensors)
and puts it in a ``queue.Queue(maxsize=4)``; the loop takes its batch with ``Queue.get()`` (no
DataLoader anywhere), and its own work is ~5-6 ms a step here on a quiet machine; the model is
3 x Linear(512, 512) + a head, fp32, batch 64, SGD.

The producer is slower than the step, so the training thread sleeps in ``Queue.get`` for the
difference every step. Truth, by the job's own clocks: the step (mean), the time in
``Queue.get`` per step (wall and the thread's CPU) and the rest. The natural fix: more producer
threads fetching ahead (``--producers N``; ``--async`` = 3 producers), the waits overlapped with
each other and with the step. ``--fetch-ms 0``: a store with no latency.
"""

from __future__ import annotations

import queue
import threading
import time

import _blocked
import _zoo
import torch


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--fetch-ms", type=float, default=24.0, help="the store's latency a batch")
    p.add_argument("--producers", type=int, default=1, help="producer threads")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="3 producer threads (the same as --producers 3)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    producers = 3 if args.use_async else max(args.producers, 1)
    batches: queue.Queue = queue.Queue(maxsize=4)
    stop = threading.Event()
    counter = iter(range(10**9))
    take = threading.Lock()

    def produce() -> None:
        while not stop.is_set():
            with take:
                k = next(counter)
            time.sleep(args.fetch_ms / 1e3)  # the store's latency
            g = torch.Generator().manual_seed(k)
            item = (torch.randn(args.batch, args.width, generator=g),
                    torch.randint(0, 10, (args.batch,), generator=g))
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    pool = [threading.Thread(target=produce, daemon=True, name=f"producer-{k}")
            for k in range(producers)]
    for t in pool:
        t.start()
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with _blocked.blocked(timer):
                x, y = batches.get()
            _blocked.train_step(model, fwd, opt, x, y)
    stop.set()
    for t in pool:
        t.join()
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "fetch_ms": args.fetch_ms, "producers": producers,
             **_blocked.blocked_truth(args, timer, "queue.Queue.get (a hand-written producer "
                                      "thread, no DataLoader)")}
    _zoo.finish("queue_feed", args, timer, truth,
                {"batch": args.batch, "producers": producers, "fetch_ms": args.fetch_ms,
                 "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
