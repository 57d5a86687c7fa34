"""Blocked on the disk: after every step the loop appends a record to a log file (the loss and a
copy of the hidden layers' weights, 4 MB: a "debug snapshot" logger) and calls
``flush()`` and ``os.fsync()``, so the training thread waits for the disk each step; the model
is 4 x Linear(512, 512) + a head, fp32, batch 128, SGD with momentum.

The write lands in the page cache (a memory copy, host work) and ``fsync`` waits for the device
(the thread asleep in the kernel). Truth, by the job's own clocks: the step (mean), the time in
the write + flush + fsync per step (wall and the thread's CPU) and the rest. ``--async`` hands
each record to a logger thread (a queue of 2: the loop copies the bytes and goes on, and waits
only when the logger is two records behind): the natural fix, the disk wait off the training
thread. ``--log-layers 0``: no logging at all.
"""

from __future__ import annotations

import os
import queue
import struct
import tempfile
import threading

import _blocked
import _zoo
import torch


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--log-layers", type=int, default=4,
                   help="hidden layers' weights per record (1 MB each); 0: no log")
    p.add_argument("--log-dir", default="", help="where the log goes (default: a temp dir)")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="write and fsync on a logger thread (a queue), not in the loop")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    d = args.log_dir or tempfile.mkdtemp(prefix="fsync_log-")
    path = os.path.join(d, f"snapshots-{os.getpid()}.bin")
    f = open(path, "wb")
    weights = [model[2 * k].weight for k in range(min(args.log_layers, args.layers))]

    def write(rec: list) -> None:
        for part in rec:
            f.write(part)
        f.flush()
        os.fsync(f.fileno())

    records: queue.Queue = queue.Queue(maxsize=2)

    def logger() -> None:  # --async: the disk on its own thread
        while (rec := records.get()) is not None:
            write(rec)

    bg = None
    if args.use_async:
        bg = threading.Thread(target=logger, daemon=True, name="snapshot-logger")
        bg.start()
    timer = _zoo.Timer()
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = _blocked.train_step(model, fwd, opt, x, y)
            if weights:  # the same copy either way: the logger thread needs its own
                rec = [struct.pack("<if", i, float(loss))] + [
                    memoryview(w.detach().clone().numpy()).cast("B") for w in weights]
                with _blocked.blocked(timer):
                    if bg is not None:
                        records.put(rec)
                    else:
                        write(rec)
    if bg is not None:
        records.put(None)
        bg.join()
    f.close()
    os.unlink(path)
    if not args.log_dir:
        os.rmdir(d)
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "log_mb": sum(w.numel() * 4 for w in weights) / 2**20,
             **_blocked.blocked_truth(args, timer, "file write + flush + os.fsync")}
    _zoo.finish("fsync_log", args, timer, truth,
                {"batch": args.batch, "log_layers": args.log_layers, "async": args.use_async,
                 "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
