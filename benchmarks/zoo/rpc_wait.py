"""Host-bound by a blocking round trip every step: after each optimizer step the loop reports
to a "parameter server" (a separate local process over TCP) and waits for its reply, which
takes ``--server-ms`` (20) to come; the model is 3 x Linear(512, 512) fp32, batch 128, SGD.

While it waits the training process runs nothing (no operator, no CPU): the step's time is
neither compute, memory, input nor communication by collectives. Truth: the step with the
round trip every ``--rpc-every`` steps (0: never), alternated; the wait's share is
1 - (step without it) / step (mean step). ``--rpc-async`` sends from a background thread
and never waits (the fix a user would make).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import _zoo
import torch
import torch.nn as nn

_SERVER = r"""
import socket, sys, time
delay = float(sys.argv[1]) / 1e3
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    msg = c.recv(4096)
    if not msg:
        break
    time.sleep(delay)
    c.sendall(b"ok")
"""


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--server-ms", type=float, default=20.0, help="the server's reply delay")
    p.add_argument("--rpc-every", type=int, default=1, help="report every N steps; 0: never")
    p.add_argument("--rpc-async", action="store_true",
                   help="report from a background thread, never waiting for the reply")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(args.server_ms)],
                              stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lock = threading.Lock()

    def report(payload: bytes) -> None:
        with lock:
            conn.sendall(payload)
            conn.recv(16)

    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, w)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    pending: list[threading.Thread] = []
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = nn.functional.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if args.rpc_every and i % args.rpc_every == 0:
                payload = f"step {i} loss {float(loss.detach()):.4f}".encode()
                with timer.part("rpc"):
                    if args.rpc_async:
                        pending = [t for t in pending if t.is_alive()]
                        th = threading.Thread(target=report, args=(payload,), daemon=True)
                        th.start()
                        pending.append(th)
                    else:
                        report(payload)
    for th in pending:
        th.join()
    conn.close()
    server.wait(timeout=10)
    n = len(timer.steps_ms)
    flops = 6 * args.batch * (2 * w * w + w * 10)
    truth = {"flops_per_step": flops, "server_ms": args.server_ms,
             "rpc_ms_mean": sum(timer.parts.get("rpc", [0.0])[args.warmup:])
             / max(n - args.warmup, 1)}
    _zoo.finish("rpc_wait", args, timer, truth,
                {"batch": args.batch, "rpc_every": args.rpc_every, "rpc_async": args.rpc_async,
                 "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
