"""Blocked on a lock: a background "stats publisher" thread holds a ``threading.Lock`` for
``--hold-ms`` (14) of every ``--hold-ms`` + ``--gap-ms`` (14 + 2) while it pushes the shared
running statistics to a slow sink (a sleep: the sink's latency), and the training loop takes the
same lock once a step to add its loss to those statistics; the model is 3 x Linear(512, 512) + a
head, fp32, batch 96, SGD.

The loop arrives while the publisher holds the lock most of the time and sleeps in the lock's
``acquire`` until it is released (no CPU): lock contention, outside torch. Truth, by the job's own
clocks: the step (mean), the time in ``with lock:`` per step (wall and the thread's CPU) and the
rest. ``--async`` posts the update to a queue the publisher drains while it holds the lock (the
loop never takes it): the natural fix. ``--no-publisher``: no background thread at all.
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
    p.add_argument("--batch", type=int, default=96)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hold-ms", type=float, default=14.0, help="the publisher's time in the lock")
    p.add_argument("--gap-ms", type=float, default=2.0, help="the publisher's time out of it")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="post each update to a queue the publisher applies (no lock in the loop)")
    p.add_argument("--no-publisher", action="store_true", help="no background thread")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    lock = threading.Lock()
    stats = {"n": 0, "loss_sum": 0.0, "published": 0}
    posted: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def publisher() -> None:
        while not stop.is_set():
            with lock:
                while True:  # --async: the loop's posted updates, applied under the lock
                    try:
                        v = posted.get_nowait()
                    except queue.Empty:
                        break
                    stats["n"] += 1
                    stats["loss_sum"] += v
                time.sleep(args.hold_ms / 1e3)  # the slow sink, written under the lock
                stats["published"] += 1
            time.sleep(args.gap_ms / 1e3)

    bg = None
    if not args.no_publisher:
        bg = threading.Thread(target=publisher, daemon=True, name="stats-publisher")
        bg.start()
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = float(_blocked.train_step(model, fwd, opt, x, y))
            with _blocked.blocked(timer):
                if args.use_async:
                    posted.put(loss)
                else:
                    with lock:
                        stats["n"] += 1
                        stats["loss_sum"] += loss
    stop.set()
    if bg is not None:
        bg.join()
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "hold_ms": args.hold_ms, "gap_ms": args.gap_ms, "published": stats["published"],
             **_blocked.blocked_truth(args, timer, "threading.Lock acquire (held by a "
                                      "background thread)")}
    _zoo.finish("lock_wait", args, timer, truth,
                {"batch": args.batch, "async": args.use_async, "publisher": not args.no_publisher,
                 "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
