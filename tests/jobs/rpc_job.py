"""A CPU training job whose training thread asks another process for something each step and
sleeps in ``recv`` until it answers (a parameter server, a feature store, a reward model).

    python rpc_job.py --steps 60 --delay-ms 15 --report own.json [--ahead]

The server (a child process on a socket pair) answers each request ``--delay-ms`` after it
came. ``--ahead`` applies the fix: a background thread asks one step ahead, so the training
thread waits only for what is left of the reply. The report holds the job's own step times
(``_timer.OwnTimer``) and the time the training thread spent waiting for the reply each step.
"""

import argparse
import multiprocessing as mp
import queue
import socket
import threading
import time

import torch
from _timer import OwnTimer


def serve(sock: socket.socket, delay: float) -> None:
    while sock.recv(1):
        time.sleep(delay)
        sock.sendall(b"r")


def ask(sock: socket.socket) -> bytes:
    sock.sendall(b"q")
    return sock.recv(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--delay-ms", type=float, default=15.0)
    ap.add_argument("--ahead", action="store_true")
    ap.add_argument("--report", required=True)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ours, theirs = socket.socketpair()
    server = mp.get_context("fork").Process(target=serve, args=(theirs, args.delay_ms / 1e3), daemon=True)
    server.start()
    replies: queue.Queue[bytes] = queue.Queue(maxsize=1)
    if args.ahead:
        threading.Thread(target=lambda: [replies.put(ask(ours)) for _ in range(args.steps)],
                         daemon=True).start()
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    timer, waited = OwnTimer(), []
    for _ in range(args.steps):
        t = time.perf_counter()
        replies.get() if args.ahead else ask(ours)
        waited.append(time.perf_counter() - t)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        timer.lap()
    timer.write(args.report, waited_seconds=waited)
    ours.close()
    server.join(timeout=5)


if __name__ == "__main__":
    main()
