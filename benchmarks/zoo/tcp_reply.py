"""Blocked on a request/reply: before every step the loop asks a "hyper-parameter server" (a
separate local process, over TCP) for the step's learning-rate scale and waits for the answer,
which the server sends after a delay drawn per request from ``--server-ms-min``..``--server-ms-max``
(8-14 ms); the model is small: 2 x Linear(512, 512) + a head, fp32, batch 64, SGD.

While it waits the training thread is asleep in ``recv`` (no operator, no CPU): the step's time
is neither compute, memory, input (no DataLoader) nor communication by collectives. Truth, by the
job's own clocks: the step (mean), the time inside the round trip per step (wall and the thread's
CPU) and the rest. ``--prefetch`` asks for the next step's answer on a background thread while
this step computes and waits for it at the next step (one call a step ahead: the step becomes the
longer of the call and the rest); ``--async`` never waits: a background thread keeps asking and
the loop uses the latest answer it has (one or more steps stale). Both move the wait off the
training thread. ``--rpc-every 0``: no server at all.
"""

from __future__ import annotations

import queue
import socket
import struct
import subprocess
import sys
import threading

import _blocked
import _zoo
import torch

_SERVER = r"""
import random, socket, struct, sys, time
lo, hi, seed = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, int(sys.argv[3])
rng = random.Random(seed)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    msg = c.recv(8)
    if len(msg) < 8:
        break
    step, loss = struct.unpack("<if", msg)
    time.sleep(rng.uniform(lo, hi))
    c.sendall(struct.pack("<f", 1.0 / (1.0 + 1e-4 * step)))
"""


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--server-ms-min", type=float, default=8.0)
    p.add_argument("--server-ms-max", type=float, default=14.0)
    p.add_argument("--rpc-every", type=int, default=1, help="ask every N steps; 0: never")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="ask from a background thread; the loop takes the latest answer")
    p.add_argument("--prefetch", action="store_true",
                   help="ask for the next step's answer a step ahead, on a background thread")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    server = conn = None
    if args.rpc_every:
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(args.server_ms_min),
                                   str(args.server_ms_max), str(args.seed)],
                                  stdout=subprocess.PIPE, text=True)
        port = int(server.stdout.readline())
        conn = socket.create_connection(("127.0.0.1", port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ask(step: int, loss: float) -> float:
        conn.sendall(struct.pack("<if", step, loss))
        buf = b""
        while len(buf) < 4:
            buf += conn.recv(4 - len(buf))
        return struct.unpack("<f", buf)[0]

    latest = [1.0]
    asks: queue.SimpleQueue = queue.SimpleQueue()

    def asker() -> None:  # --async: the round trips on their own thread
        while True:
            item = asks.get()
            if item is None:
                return
            while True:  # only the newest request matters
                try:
                    nxt = asks.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    return
                item = nxt
            latest[0] = ask(*item)

    ahead: list = []  # --prefetch: the request in flight for the next step

    def fetch_ahead(step: int, loss: float) -> None:
        box: list[float] = []
        th = threading.Thread(target=lambda: box.append(ask(step, loss)), daemon=True,
                              name="lr-prefetch")
        th.start()
        ahead[:] = [th, box]

    bg = None
    if args.use_async and conn is not None:
        bg = threading.Thread(target=asker, daemon=True, name="lr-asker")
        bg.start()
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    loss_v = 0.0
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            if args.rpc_every and i % args.rpc_every == 0:
                with _blocked.blocked(timer):
                    if bg is not None:
                        asks.put((i, loss_v))
                        scale = latest[0]
                    elif args.prefetch:
                        if not ahead:  # the first step asks for itself
                            fetch_ahead(i, loss_v)
                        th, box = ahead
                        th.join()
                        scale = box[0]
                        fetch_ahead(i + args.rpc_every, loss_v)  # the next one, beside this step
                    else:
                        scale = ask(i, loss_v)
                for g in opt.param_groups:
                    g["lr"] = 1e-3 * scale
            loss_v = float(_blocked.train_step(model, fwd, opt, x, y))
    if bg is not None:
        asks.put(None)
        bg.join()
    if ahead:
        ahead[0].join()
    if conn is not None:
        conn.close()
        server.wait(timeout=10)
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "server_ms": [args.server_ms_min, args.server_ms_max],
             **_blocked.blocked_truth(args, timer, "socket recv (TCP round trip to a local "
                                      "server process)")}
    _zoo.finish("tcp_reply", args, timer, truth,
                {"batch": args.batch, "rpc_every": args.rpc_every, "async": args.use_async,
                 "prefetch": args.prefetch, "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
