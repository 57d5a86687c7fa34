"""Blocked on a child process: every step the loop runs a short command with ``subprocess.run``
(by default a tiny ``python -S -c`` that prints the host's load, as a loop that shells out to a
monitoring tool each step would) and waits for it to exit; the model is 4 x Linear(768, 768) + a
head, fp32, batch 64, SGD.

The training thread forks/execs the child and sleeps in ``waitpid`` while the child starts and
runs on another core: outside torch, no DataLoader, no collective. Truth, by the job's own clocks:
the step (mean), the time inside ``subprocess.run`` per step (wall and the thread's CPU: the
spawn's share is the parent's) and the rest. ``--async`` runs the command on a background
thread (the loop reads the last result it has): the natural fix, the wait off the training
thread (the child still needs a core). ``--every 0``: no command at all; ``--cmd true``: the
cheapest child.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading

import _blocked
import _zoo
import torch

PY_PROBE = "import os; print(os.getloadavg()[0])"


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--cmd", choices=("python", "true"), default="python",
                   help="the child: a tiny python -S -c, or /bin/true")
    p.add_argument("--every", type=int, default=1, help="run it every N steps; 0: never")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="run the command on a background thread; the loop reads its last output")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    cmd = [sys.executable, "-S", "-c", PY_PROBE] if args.cmd == "python" else ["true"]

    def probe() -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()

    last = [""]
    asks: queue.SimpleQueue = queue.SimpleQueue()

    def runner() -> None:  # --async: the child on its own thread, one at a time
        while True:
            item = asks.get()
            if item is None:
                return
            while True:
                try:
                    nxt = asks.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    return
            last[0] = probe()

    bg = None
    if args.use_async and args.every:
        bg = threading.Thread(target=runner, daemon=True, name="probe-runner")
        bg.start()
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    runs = 0
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            _blocked.train_step(model, fwd, opt, x, y)
            if args.every and i % args.every == 0:
                with _blocked.blocked(timer):
                    if bg is not None:
                        asks.put(i)
                    else:
                        last[0] = probe()
                runs += 1
    if bg is not None:
        asks.put(None)
        bg.join()
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "cmd": " ".join(cmd[:3]), "runs": runs, "last_output": last[0],
             **_blocked.blocked_truth(args, timer, "subprocess.run (fork/exec and waitpid)")}
    _zoo.finish("subprocess_step", args, timer, truth,
                {"batch": args.batch, "cmd": args.cmd, "every": args.every,
                 "async": args.use_async, "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
