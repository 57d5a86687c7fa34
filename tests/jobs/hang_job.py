"""A small gloo training job (under torchrun) that stalls, at step ``--at`` on rank ``--rank``,
the way ``--mode`` says; the stall watch's tests check its verdict against what was arranged.

Each step: a little compute, the backward pass, ``all_reduce`` of a gradient bucket, then
``broadcast`` of a small state tensor, then the optimizer step (which gpudiag counts).

    --mode sleep      rank R sleeps before the step's all_reduce (never enters it)
    --mode loader     rank R's DataLoader worker blocks reading a pipe nobody writes
    --mode skip       rank R skips the step's all_reduce (calls the broadcast instead: a desync)
    --mode mismatch   rank R all-reduces a tensor of another size (gloo aborts that rank)
    --mode deadlock   rank R's two threads take two locks in opposite orders; its main thread joins them
    --mode idle       every rank finishes --steps steps, then sleeps (holding its resources)
    --mode straggler  rank R sleeps as long again as the others' step, every step
    --mode pauses     pauses --pause-s unmarked at step --at, then as long again inside
                      ``gpudiag.phase("eval")`` at step 2 x --at, and trains on to --steps
    --mode none       trains --steps steps and exits

Without torchrun it runs as a world of one. ``--fr-dump DIR``: two seconds after the stall is
arranged, every rank writes what ``torch._C._distributed_c10d._dump_fr_trace()`` returns to
``DIR/nccl_trace_rank_<RANK>``, the file PyTorch's own dump writer would write (torch 2.13's gloo
records the Flight Recorder's entries but writes no file by itself).
"""

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mode", default="none")
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--at", type=int, default=6)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--step-s", type=float, default=0.05, help="seconds of sleep per step (its input wait)")
ap.add_argument("--seconds", type=float, default=0.0, help="train for this long instead of --steps")
ap.add_argument("--numel", type=int, default=4096)
ap.add_argument("--fr-dump", default=None, help="folder for Flight Recorder dumps, written at the stall")
ap.add_argument("--backend", default="gloo", help="nccl: the collectives' tensors on the rank's GPU")
ap.add_argument("--pause-s", type=float, default=6.0)
args = ap.parse_args()

dev = torch.device("cpu")
if args.backend == "nccl":
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
if "RANK" in os.environ:
    dist.init_process_group(args.backend)
else:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
me = dist.get_rank()
culprit = me == args.rank
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
bucket = torch.ones(args.numel, device=dev)
state = torch.zeros(16, device=dev)


class Reads(torch.utils.data.Dataset):
    """Item i is a batch; on the culprit rank, item --at blocks on a read (a stuck storage read)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        if culprit and i == args.at - 1:
            os.read(self.fd, 1)  # nobody ever writes: blocks forever
        return torch.randn(16, 64)


def deadlock() -> None:
    a, b = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)

    def first() -> None:
        with a:
            both.wait()
            with b:
                pass

    def second() -> None:
        with b:
            both.wait()
            with a:
                pass

    ts = [threading.Thread(target=first, name="holds-a"), threading.Thread(target=second, name="holds-b")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def dump_flight_recorder_soon() -> None:
    def dump() -> None:
        time.sleep(2)
        c10d = torch._C._distributed_c10d
        dump_fn = getattr(c10d, "_dump_fr_trace", None) or c10d._dump_nccl_trace  # older torch: NCCL's
        raw = dump_fn(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        tmp = os.path.join(args.fr_dump, f".nccl_trace_rank_{me}")
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, os.path.join(args.fr_dump, f"nccl_trace_rank_{me}"))

    threading.Thread(target=dump, daemon=True).start()


loader = None
if args.mode == "loader":
    r, w = os.pipe()  # the write end stays open here, so the worker's read blocks
    loader = iter(torch.utils.data.DataLoader(Reads(r), batch_size=None, num_workers=1))

step = 0
t0 = time.time()
while (time.time() - t0 < args.seconds) if args.seconds else step < args.steps:
    step += 1
    x = next(loader) if loader is not None else torch.randn(16, 64)
    time.sleep(args.step_s)
    if args.mode == "straggler" and culprit:
        time.sleep(args.step_s)
    model(x).sum().backward()
    at = culprit and step == args.at
    if step == args.at and args.fr_dump:
        dump_flight_recorder_soon()
    if at and args.mode == "sleep":
        time.sleep(3600)
    if at and args.mode == "deadlock":
        deadlock()
    if args.mode == "pauses" and step == args.at:
        time.sleep(args.pause_s)                 # every rank: an unmarked eval
    if args.mode == "pauses" and step == 2 * args.at:
        import gpudiag

        with gpudiag.phase("eval"):              # the same, marked
            time.sleep(args.pause_s)
    if not (at and args.mode == "skip"):
        dist.all_reduce(torch.ones(args.numel // 2, device=dev) if at and args.mode == "mismatch" else bucket)
    dist.broadcast(state, 0)
    opt.step()
    opt.zero_grad()
if args.mode == "idle":
    time.sleep(3600)
dist.barrier()
dist.destroy_process_group()
print(f"rank {me} done after {step} steps", flush=True)
