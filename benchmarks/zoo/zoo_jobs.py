"""The zoo's jobs: how each runs, which variants measure its truth, and which knob applies each
of gpudiag's recommendations (the table a user would keep beside the advice).

A variant is the job run alone with extra arguments. Truth variants are decided here, before
gpudiag is asked anything; fix variants come from gpudiag's recommendations through ``fix_args``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# A recommendation's action -> (arguments for the job, note), or (None, why there is no knob).
FixMap = Callable[[dict], "tuple[list[str] | None, str]"]


@dataclass(frozen=True)
class Job:
    name: str
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()         # replaces the step count under --quick
    ranks: int = 1                      # >1: launched by torchrun --nproc_per_node
    stat: str = "median"                # the step statistic: "median", or "mean" (periodic steps)
    truth_variants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scaling: tuple[str, float] | None = None  # (variant, work factor) for the fixed-cost share
    rest: str = ""                      # the label the unexplained rest of the step counts to
    peak_threads: int = 2               # threads per process the peak is measured with
    # variant -> label: 1 - step(variant) / step is that label's share (the variant removes it)
    removes: dict[str, str] = field(default_factory=dict)
    # variants measured only by ``run_zoo.py --truth-only`` (what a fix not advised would do)
    probes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    knobs: dict[str, FixMap] = field(default_factory=dict)
    what: str = ""


def _flag(*args: str, note: str = "") -> FixMap:
    return lambda rec: (list(args), note or " ".join(args))


def _micro(rec: dict) -> tuple[list[str] | None, str]:
    """larger-micro-batches: the size the advice names ("N of Kx the size"), from --micro 4."""
    m = re.search(r"\((\d+) of ([\d.]+)x the size", rec.get("text", ""))
    k = float(m.group(2)) if m else 4.0
    size = max(1, round(4 * k))
    return ["--micro", str(size)], f"--micro {size} ({k:g}x the micro-batch of 4" + (
        ", as the advice says)" if m else "; the advice names no size: 4x taken)")


def _workers(rec: dict) -> tuple[list[str] | None, str]:
    """dataloader-workers: the number the advice names ("at least N"), as a user would."""
    m = re.search(r"at least (\d+)", rec.get("text", "") + " " + rec.get("why", ""))
    n = int(m.group(1)) if m else 4
    note = f"--workers {n}" + ("" if m else " (the advice names no number: 4 taken)")
    if n > 32:
        note = f"--workers 32 (advice: {n}; capped at 32)"
        n = 32
    return ["--workers", str(n)], note


def _threads(rec: dict) -> tuple[list[str] | None, str]:
    """fewer-intra-op-threads: the count its text names (torch.set_num_threads(N))."""
    m = re.search(r"set_num_threads\((\d+)\)", rec.get("text", ""))
    n = m.group(1) if m else "1"
    return ["--threads", n], f"--threads {n}" + ("" if m else " (the advice names no count: 1 taken)")


def _no_knob(why: str) -> FixMap:
    return lambda rec: (None, why)


def _comm(rec: dict) -> tuple[list[str] | None, str]:
    """overlap-communication on DDP: what the advice's text says to change."""
    text = (rec.get("text", "") + " " + rec.get("why", "")).lower()
    m = re.search(r"bucket_cap_mb\D{0,20}?(\d+(?:\.\d+)?)", text)
    if "accumulat" in text or "no_sync" in text:
        return ["--accumulate", "4"], "--accumulate 4 (the advice names accumulation)"
    if "compress" in text:
        return ["--compress", "fp16"], "--compress fp16 (the advice names compression)"
    if m:
        return ["--bucket-cap-mb", m.group(1)], f"--bucket-cap-mb {m.group(1)}"
    if "bucket" in text:
        return ["--bucket-cap-mb", "5"], "--bucket-cap-mb 5 (the advice names smaller buckets)"
    return None, "no knob read from the advice's text"


COMPILE = _flag("--compile")
FOREACH = _flag("--foreach")
COMMON: dict[str, FixMap] = {
    "fused-optimizer": FOREACH,
    "free-a-core": _flag("--threads", "1", note="--threads 1 (one intra-op thread: a core freed)"),
    "fewer-intra-op-threads": _threads,
    "fewer-flops": _no_knob("no knob: the model is the job"),
    "fix-straggler": _no_knob("no knob: one machine, no straggler to fix"),
    "cheaper-input": _no_knob("no knob: the batch's decoding is the job"),
}

JOBS: list[Job] = [
    Job("input_sleep", "input_sleep.py", quick=("--steps", "80"),
        knobs={"dataloader-workers": _workers, "compile-small-ops": COMPILE},
        rest="compute",
        what="slow __getitem__ that sleeps 3 ms a sample (storage), num_workers=0"),
    Job("input_decode", "input_decode.py", quick=("--steps", "80"),
        knobs={"dataloader-workers": _workers}, rest="compute",
        what="__getitem__ decompresses 1 MB of zlib a sample (CPU decoding), num_workers=0"),
    Job("tiny_ops", "tiny_ops.py", quick=("--steps", "300"),
        truth_variants={"batch64": ("--batch", "64")}, scaling=("batch64", 16.0),
        knobs={"compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "batch-small-ops": FOREACH},
        what="60 blocks of Linear(32,32)+LayerNorm+GELU+scale+add, batch 4, Adam"),
    Job("sync_heavy", "sync_heavy.py", quick=("--steps", "400"),
        truth_variants={"no_syncs": ("--no-syncs",), "batch512": ("--batch", "512")},
        scaling=("batch512", 16.0),
        knobs={"remove-host-syncs": _flag("--no-syncs"), "compile-small-ops": COMPILE,
               "fuse-memory-bound": COMPILE, "batch-small-ops": _flag("--no-syncs")},
        what="24-block MLP (256 wide, batch 32) with .item()/.cpu()/.tolist() after each block"),
    Job("gemm_mlp", "gemm_mlp.py", quick=("--steps", "30"), rest="compute",
        knobs={"lower-precision": _flag("--bf16"), "bf16-activations": _flag("--bf16"),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE},
        what="4 x Linear(2048,2048) fp32, batch 256, SGD"),
    Job("conv_net", "conv_net.py", quick=("--steps", "30"), rest="compute",
        knobs={"lower-precision": _flag("--bf16"), "bf16-activations": _flag("--bf16"),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE},
        what="5 x Conv2d 3x3 (64 ch) on 32x32, batch 32, fp32"),
    Job("mem_elementwise", "mem_elementwise.py", quick=("--steps", "40"), rest="memory",
        knobs={"fuse-memory-bound": COMPILE, "compile-small-ops": COMPILE,
               "bf16-activations": _flag("--bf16"), "lower-precision": _flag("--bf16")},
        what="per-element affine+SiLU+residual on 8M-element fp32 tensors (32 MB)"),
    Job("norm_heavy", "norm_heavy.py", quick=("--steps", "40"),
        truth_variants={"seq1024": ("--seq", "1024")}, scaling=("seq1024", 4.0), rest="memory",
        knobs={"fuse-memory-bound": COMPILE, "compile-small-ops": COMPILE,
               "bf16-activations": _flag("--bf16"), "lower-precision": _flag("--bf16")},
        what="6 blocks of LayerNorm, softmax, GELU, dropout, residual on (16,256,512), AdamW"),
    Job("ddp_comm", "ddp_comm.py", ranks=2, quick=("--steps", "40"), stat="mean",
        # rest: memory. Its Linears at batch 16 stream 96 MB of weights for ~8 FLOP/byte, below
        # this CPU's ridge (~11), and SGD with momentum is passes over 100 MB. Measured by the
        # batch (one process, no DDP, 1 thread, 2-core AMD EPYC VM, 2026-12-03): forward and
        # backward 91 ms at batch 16 and 165-170 ms at 64, so 66 ms of the 91 is fixed per step
        # (the weights' traffic), and the optimizer's 35 ms is memory: of the 126 ms without
        # communication, ~80% memory. (Set after the 2026-12-03 zoo run read "memory-bound" and
        # the truth said "compute": the truth had not measured it.)
        truth_variants={"no_sync_all": ("--no-sync-all",)}, rest="memory", peak_threads=1,
        # each zoo run measures it again: 4x the batch without communication, against no_sync_all
        probes={"batch64_no_sync": ("--no-sync-all", "--batch", "64")},
        knobs={"overlap-communication": _comm, "all-reduce-less-often": _comm,
               "compile-small-ops": COMPILE,
               "free-a-core": _no_knob("no knob: the ranks already run one thread each"),
               "fuse-memory-bound": _no_knob("no knob: no elementwise chain to fuse")},
        what="DDP, 2 ranks over gloo, 25M params (100 MB fp32 gradients), batch 16, 1 thread"),
    Job("compile_chain", "compile_chain.py", quick=("--steps", "100"),
        truth_variants={"batch1024": ("--batch", "1024"), "compiled": ("--compile",)},
        scaling=("batch1024", 4.0), rest="memory",
        knobs={"compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "lower-precision": _no_knob("no knob (fp32 only)"),
               "bf16-activations": _no_knob("no knob (fp32 only)")},
        what="8 x [Linear(512,512) + 14 fusable elementwise ops] on (256,512)"),
    Job("bf16_autocast", "bf16_autocast.py", quick=("--steps", "30"),
        truth_variants={"fp32": ("--no-bf16",)}, rest="compute",
        knobs={"compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "lower-precision": _no_knob("no knob: already bf16"),
               "bf16-activations": _no_knob("no knob: already bf16")},
        what="6 x Linear(1024,1024)+GELU under bf16 autocast, batch 256, AdamW"),
    Job("checkpoint", "checkpoint.py", quick=("--steps", "60"), stat="mean",
        truth_variants={"no_ckpt": ("--ckpt-every", "0")}, rest="compute",
        knobs={"lower-precision": _flag("--bf16"), "bf16-activations": _flag("--bf16"),
               "compile-small-ops": _no_knob("no knob: no torch.compile in this job")},
        what="3 x Linear(2048,2048), Adam, torch.save of ~150 MB every 4 steps"),
    Job("embedding_sparse", "embedding_sparse.py", quick=("--steps", "70"),
        truth_variants={"batch16k": ("--batch", "16384")}, scaling=("batch16k", 4.0),
        rest="memory",
        knobs={"compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE},
        what="EmbeddingBag 2M x 64 (sparse grad, SGD), 4096 bags of 32, small MLP"),
    Job("eval_phase", "eval_phase.py", quick=("--steps", "80"), rest="compute",
        truth_variants={"no_eval": ("--eval-every", "0")},
        knobs={"lower-precision": _flag("--bf16"), "compile-small-ops": COMPILE,
               "fuse-memory-bound": COMPILE},
        what="4 x Linear(1024,1024) fp32, batch 128, 40-batch eval every 25 steps"),
]


def fix_args(job: Job, rec: dict) -> tuple[list[str] | None, str]:
    """The job's knob for a recommendation, or None with the reason there is none."""
    action = rec.get("action", "")
    # "*": the job's reading of any other action (held_out_4: advice about the blocking, under
    # whatever name gpudiag gives it)
    fm = job.knobs.get(action) or COMMON.get(action) or job.knobs.get("*")
    text = (rec.get("text", "") + " " + rec.get("why", "")).lower()
    if fm is None and "--ckpt-every" in " ".join(a for f in job.truth_variants.values()
                                                for a in f) and (
            "checkpoint" in text or "torch.save" in text):
        fm = _ckpt
    if fm is None:
        return None, f"no knob in this job for `{action}`"
    return fm(rec)


def _ckpt(rec: dict) -> tuple[list[str] | None, str]:
    """Advice about checkpointing: save as many times less often as the advice says ("2x less
    often": the job's --ckpt-every 4 -> 8); 10x (-> 40) where it names no factor."""
    text = rec.get("text", "") + " " + rec.get("why", "")
    m = re.search(r"(\d+(?:\.\d+)?)x less often", text)
    k = float(m.group(1)) if m else 10.0
    n = max(int(round(4 * k)), 5)
    return ["--ckpt-every", str(n)], f"--ckpt-every {n} (saves {k:g}x less often" + (
        ", as the advice says)" if m else "; the advice names no factor)")


# The second held-out set (issue 37, item 1 again), written blind to gpudiag's implementation:
# other mechanisms or other mixes than the 14 above. Each runs one intra-op thread (--threads 1):
# on this 2-core VM shared at load 8-25, two threads made the same step 1.4-120x slower and the
# truth unreadable (measured: ckpt_often's training step 7 ms with 1 thread, ~850 ms with 2, at
# load 20).
HELD_OUT_2: list[Job] = [
    Job("attn_block", "attn_block.py", quick=("--steps", "20"),
        truth_variants={"batch8": ("--batch", "8")}, scaling=("batch8", 2.0), rest="compute",
        peak_threads=1, probes={"bf16": ("--bf16", "--steps", "7", "--warmup", "2")},
        knobs={"fused-attention": _flag("--sdpa"), "lower-precision": _flag("--bf16"),
               "bf16-activations": _flag("--bf16"), "compile-small-ops": COMPILE,
               "fuse-memory-bound": COMPILE, "free-a-core": _no_knob("already one thread")},
        what="2 transformer blocks (hand-written attention + 4x MLP), d 384, seq 128, batch 4"),
    Job("py_loss", "py_loss.py", quick=("--steps", "30"),
        truth_variants={"vectorised": ("--vectorised",)}, removes={"vectorised": "host-bound"},
        peak_threads=1,
        knobs={"compile-small-ops": COMPILE, "batch-small-ops": _flag("--vectorised"),
               "vectorise-sample-loop": _flag("--vectorised"),
               "remove-host-syncs": _flag("--vectorised", note="--vectorised (the one "
                                          ".tolist() is in the loss loop)"),
               "fuse-memory-bound": COMPILE, "free-a-core": _no_knob("already one thread")},
        what="per-sample Python loop in the loss (5 ops a sample, batch 128), small MLP"),
    Job("grad_accum", "grad_accum.py", quick=("--steps", "20"),
        truth_variants={"micro128": ("--micro", "128")}, removes={"micro128": "host-bound"},
        rest="compute", peak_threads=1,
        knobs={"batch-small-ops": _flag("--micro", "32"), "compile-small-ops": COMPILE,
               "larger-micro-batches": _micro,
               "fuse-memory-bound": COMPILE, "free-a-core": _no_knob("already one thread")},
        what="32 micro-batches of 4 accumulated per optimizer step, 4 x Linear(256)+LN+GELU"),
    Job("loader_enough", "loader_enough.py", quick=("--steps", "30"), rest="compute",
        peak_threads=1, probes={"workers4": ("--workers", "4")},
        knobs={"dataloader-workers": _workers, "compile-small-ops": COMPILE,
               "free-a-core": _no_knob("already one thread")},
        what="2 workers already enough (1.5 ms storage sleep a sample), 5-conv CNN, batch 16"),
    Job("augment_loader", "augment_loader.py", quick=("--steps", "30"), rest="compute",
        peak_threads=1, probes={"workers2": ("--workers", "2")},
        knobs={"dataloader-workers": _workers, "free-a-core": _no_knob("already one thread")},
        what="numpy crop/flip/jitter/7x7 blur in __getitem__, num_workers=0, tiny model"),
    Job("ddp_compute", "ddp_compute.py", ranks=2, quick=("--steps", "30"), stat="mean",
        truth_variants={"no_sync_all": ("--no-sync-all",)}, rest="compute", peak_threads=1,
        knobs={"overlap-communication": _comm, "all-reduce-less-often": _comm,
               "compile-small-ops": _no_knob("no knob: no torch.compile in this job"),
               "free-a-core": _no_knob("no knob: the ranks already run one thread each")},
        what="DDP 2 ranks gloo, 4-conv CNN, 0.1 MB of gradients, much compute a rank"),
    Job("ddp_bigrad", "ddp_bigrad.py", ranks=2, quick=("--steps", "30"), stat="mean",
        # rest: memory. At batch 1 every Linear is a GEMV (0.5 FLOP/byte), the weight gradient
        # an outer product and SGD a pass over 64 MB: far below this CPU's ridge (~7 FLOP/byte).
        # (Set after the first run, where it read "compute": the by-hand count says memory.)
        truth_variants={"no_sync_all": ("--no-sync-all",)}, rest="memory", peak_threads=1,
        probes={"acc4": ("--accumulate", "4")},
        knobs={"overlap-communication": _comm, "all-reduce-less-often": _comm,
               "compile-small-ops": _no_knob("no knob: no torch.compile in this job"),
               "free-a-core": _no_knob("no knob: the ranks already run one thread each")},
        what="DDP 2 ranks gloo, 16 x Linear(1024) (64 MB of gradients), batch 1 a rank"),
    Job("ckpt_often", "ckpt_often.py", quick=("--steps", "40"), stat="mean",
        truth_variants={"no_ckpt": ("--ckpt-every", "0")}, peak_threads=1,
        knobs={"checkpoint-less-often": _ckpt, "save-less-often": _ckpt,
               "async-checkpoint": _flag("--ckpt-thread"),
               "free-a-core": _no_knob("already one thread")},
        what="sparse 400k x 64 embedding (100 MB), torch.save every 4 steps, SGD"),
]


def _comm_manual(rec: dict) -> tuple[list[str] | None, str]:
    """Communication advice on a loop that all-reduces by hand (no DDP, no buckets): accumulation
    and compression as their flags; smaller or fewer buckets read as one flat all-reduce (the
    nearest thing the loop has to a bucket)."""
    text = (rec.get("text", "") + " " + rec.get("why", "")).lower()
    if "accumulat" in text or "no_sync" in text or "less often" in text:
        return ["--accumulate", "4"], "--accumulate 4 (the advice names accumulation)"
    if "compress" in text:
        return ["--compress", "fp16"], "--compress fp16 (the advice names compression)"
    if "bucket" in text:
        return ["--flat"], "--flat (the advice names buckets: the loop's one coalesced buffer)"
    return None, "no knob read from the advice's text"


def _precision(rec: dict) -> tuple[list[str] | None, str]:
    """lower-precision on the fp64 job: the dtype the advice names (fp32 the default)."""
    text = (rec.get("text", "") + " " + rec.get("why", "")).lower()
    if "bf16" in text or "bfloat16" in text or "autocast" in text:
        if "fp32" not in text and "float32" not in text:
            return ["--bf16"], "--bf16 (the advice names bf16/autocast)"
    return ["--fp32"], "--fp32 (the advice names fp32, or no dtype)"


# The third held-out set (issue 37 again), as blind as the first two (README, docs/, --help and
# gpudiag's output only): mechanisms neither set has. One intra-op thread each, as held_out_2.
ONE = _no_knob("already one thread")
HELD_OUT_3: list[Job] = [
    Job("rnn_loop", "rnn_loop.py", quick=("--steps", "40"),
        truth_variants={"batch128": ("--batch", "128")}, scaling=("batch128", 16.0),
        rest="compute", peak_threads=1,
        probes={"fused": ("--fused",), "seq12": ("--seq", "12")},
        # compile: the whole module, as gpudiag's prediction models it (2 graphs); the 2026-11-29
        # palindromes applied --compile (the cell's step): 1.17-1.23x slower
        knobs={"compile-small-ops": _flag("--compile-model"),
               "fuse-memory-bound": _flag("--compile-model"),
               "batch-small-ops": _flag("--fused"), "free-a-core": ONE},
        what="hand-written GRU cell in a Python loop over 48 time steps, batch 8, hidden 64"),
    Job("py_optimizer", "py_optimizer.py", quick=("--steps", "60"),
        truth_variants={"batch1024": ("--batch", "1024")}, scaling=("batch1024", 16.0),
        rest="compute", peak_threads=1,
        probes={"builtin": ("--builtin",), "fused": ("--fused",)},
        # compile: the model and the hand-written optimizer's step, as gpudiag's prediction counts
        # them (the 2026-11-29 palindromes applied --compile, the model only: 0.82-0.85x)
        knobs={"fused-optimizer": _flag("--fused"), "compile-small-ops": _flag("--compile-opt"),
               "fuse-memory-bound": _flag("--compile-opt"), "batch-small-ops": _flag("--fused"),
               "free-a-core": ONE},
        what="Adam by hand in Python, per parameter, over 48 x (Linear(64)+LayerNorm), batch 64"),
    Job("metrics_log", "metrics_log.py", quick=("--steps", "40"), stat="mean",
        truth_variants={"no_log": ("--log-every", "0")}, removes={"no_log": "host-bound"},
        rest="compute", peak_threads=1, probes={"log10": ("--log-every", "10")},
        knobs={"remove-host-syncs": _flag("--log-every", "0",
                                          note="--log-every 0 (the syncs are the logging)"),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "lower-precision": _no_knob("no knob (fp32 only)"),
               "bf16-activations": _no_knob("no knob (fp32 only)"), "free-a-core": ONE},
        what="per-step logging: .item() norms and .tolist() histograms of 14 tensors, fsync"),
    Job("tokenize_loader", "tokenize_loader.py", quick=("--steps", "40"), rest="compute",
        peak_threads=1, probes={"workers2": ("--workers", "2")},
        knobs={"dataloader-workers": _workers, "free-a-core": ONE},
        what="pure-Python tokenising in __getitem__ (regex, dict, trigrams), num_workers=0"),
    Job("rpc_wait", "rpc_wait.py", quick=("--steps", "60"), stat="mean",
        truth_variants={"no_rpc": ("--rpc-every", "0")}, removes={"no_rpc": "host-bound"},
        rest="compute", peak_threads=1, probes={"async": ("--rpc-async",)},
        knobs={"compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "remove-host-syncs": _no_knob("no knob: the one float(loss) a step is the "
                                             "report's payload"),
               "lower-precision": _no_knob("no knob (fp32 only)"), "free-a-core": ONE},
        what="a blocking 20 ms TCP round trip to a local 'parameter server' every step"),
    Job("fp64_mlp", "fp64_mlp.py", quick=("--steps", "20"), rest="compute", peak_threads=1,
        probes={"fp32": ("--fp32",), "bf16": ("--bf16", "--steps", "6", "--warmup", "2")},
        knobs={"lower-precision": _precision, "bf16-activations": _flag("--bf16"),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE, "free-a-core": ONE},
        what="4 x Linear(1024) in float64 by accident (numpy data), batch 128"),
    Job("allreduce_manual", "allreduce_manual.py", ranks=2, quick=("--steps", "20"),
        stat="mean", truth_variants={"no_sync_all": ("--no-sync-all",)}, rest="memory",
        peak_threads=1, probes={"flat": ("--flat",), "acc4": ("--accumulate", "4")},
        knobs={"overlap-communication": _comm_manual, "all-reduce-less-often": _comm_manual,
               "compile-small-ops": _no_knob("no knob: no torch.compile in this job"),
               "free-a-core": _no_knob("no knob: the ranks already run one thread each")},
        what="2 ranks gloo, no DDP: 98 blocking dist.all_reduce a step (27 MB), batch 2"),
    Job("gnn_scatter", "gnn_scatter.py", quick=("--steps", "12"), rest="memory",
        peak_threads=1, probes={"sorted": ("--sorted",)},
        knobs={"fuse-memory-bound": COMPILE, "compile-small-ops": COMPILE,
               "free-a-core": ONE},
        what="2 rounds of message passing by index_select/index_add_, 50k nodes, 200k edges"),
]


# The fourth held-out set (2026-11-29), as blind as the others: six jobs whose training thread is
# blocked (asleep, not computing) for part of every step outside torch's operators, the DataLoader
# and collectives, and two controls that must not be read that way. Each blocking job times the
# blocking call itself (the in-job truth ``blocked_share``, counted as host time) and has the
# natural fix as a knob: the wait moved off the training thread (``--async``; more producers for
# queue_feed; the limiter out for rate_limit).
_BLOCK_WORDS = ("block", "sleep", "asleep", "wait", "thread", "async", "background", "overlap",
                "lock", "fsync", "disk", "socket", "recv", "subprocess", "child", "queue",
                "producer", "prefetch", "rate", "i/o")


def _unblock(*args: str, note: str) -> FixMap:
    """Advice about the blocking (any action whose text names the wait or moving it off the
    thread): the job's natural fix; anything else has no knob here."""
    def fm(rec: dict) -> tuple[list[str] | None, str]:
        text = (rec.get("text", "") + " " + rec.get("why", "")).lower()
        if any(w in text for w in _BLOCK_WORDS):
            return list(args), note
        return None, f"no knob in this job for `{rec.get('action')}` (its text names no wait)"
    return fm


def _unblock_knobs(fm: FixMap) -> dict[str, FixMap]:
    """The job's natural fix under the action gpudiag gives it (``unblock-training-thread``, its
    output's name) and under any other action whose text names the wait (``"*"``)."""
    return {"unblock-training-thread": fm, "*": fm}


def _producers(rec: dict) -> tuple[list[str] | None, str]:
    """queue_feed: more producer threads; as many as the advice names ("at least N"), else 3."""
    m = re.search(r"at least (\d+)", rec.get("text", "") + " " + rec.get("why", ""))
    n = min(int(m.group(1)), 16) if m else 3
    return ["--producers", str(n)], f"--producers {n}" + ("" if m else " (no number named: 3)")


_SYNC_PAYLOAD = _no_knob("no knob: the one float(loss) a step is what the loop sends or keeps")
_FP32 = {"lower-precision": _no_knob("no knob (fp32 only)"),
         "bf16-activations": _no_knob("no knob (fp32 only)")}
HELD_OUT_4: list[Job] = [
    Job("tcp_reply", "tcp_reply.py", quick=("--steps", "60"), stat="mean", rest="compute",
        peak_threads=1, probes={"prefetch": ("--prefetch",), "async": ("--async",),
                                "no_rpc": ("--rpc-every", "0")},
        # the advice's first shape ("a background thread that fetches a step ahead") and what its
        # prediction models (one call a step ahead); --async (never waiting, stale) is a probe
        knobs={**_unblock_knobs(_unblock(
                   "--prefetch", note="--prefetch (the next step's round trip on a background "
                                      "thread, a step ahead)")),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "remove-host-syncs": _SYNC_PAYLOAD, "free-a-core": ONE, **_FP32},
        what="a blocking TCP round trip (8-14 ms reply) to a local server process every step"),
    Job("fsync_log", "fsync_log.py", quick=("--steps", "50"), stat="mean", rest="compute",
        peak_threads=1, probes={"async": ("--async",), "no_log": ("--log-layers", "0")},
        knobs={**_unblock_knobs(_unblock(
                   "--async", note="--async (write and fsync on a logger thread)")),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "remove-host-syncs": _SYNC_PAYLOAD, "free-a-core": ONE, **_FP32},
        what="a 4 MB weight snapshot written and os.fsync-ed to a log file every step"),
    Job("lock_wait", "lock_wait.py", quick=("--steps", "60"), stat="mean", rest="compute",
        peak_threads=1, probes={"async": ("--async",), "no_publisher": ("--no-publisher",)},
        knobs={**_unblock_knobs(_unblock(
                   "--async", note="--async (the update posted to a queue, no lock)")),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "remove-host-syncs": _SYNC_PAYLOAD, "free-a-core": ONE, **_FP32},
        what="a threading.Lock a background thread holds 14 ms of every 16, taken once a step"),
    Job("subprocess_step", "subprocess_step.py", quick=("--steps", "40"), stat="mean",
        rest="compute", peak_threads=1,
        probes={"async": ("--async",), "no_cmd": ("--every", "0")},
        knobs={**_unblock_knobs(_unblock(
                   "--async", note="--async (the child run from a background thread)")),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "free-a-core": ONE, **_FP32},
        what="subprocess.run of a tiny python -S -c every step (fork/exec, waitpid)"),
    Job("rate_limit", "rate_limit.py", quick=("--steps", "60"), stat="mean", rest="compute",
        peak_threads=1, probes={"no_limit": ("--rate", "0")},
        knobs={**_unblock_knobs(_unblock(
                   "--rate", "0", note="--rate 0 (the limiter out)")),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE,
               "free-a-core": ONE, **_FP32},
        what="time.sleep to hold 60 steps/s (a 16.7 ms period) over ~9 ms of work"),
    Job("queue_feed", "queue_feed.py", quick=("--steps", "50"), stat="mean", rest="compute",
        peak_threads=1, probes={"async": ("--async",), "no_latency": ("--fetch-ms", "0")},
        knobs={**_unblock_knobs(_unblock(
                   "--async", note="--async (3 producer threads)")),
               "dataloader-workers": _producers, "compile-small-ops": COMPILE,
               "fuse-memory-bound": COMPILE, "free-a-core": ONE, **_FP32},
        what="Queue.get from one hand-written producer thread (24 ms a batch), no DataLoader"),
    Job("pure_mlp", "pure_mlp.py", quick=("--steps", "30"), rest="compute", peak_threads=1,
        knobs={"lower-precision": _flag("--bf16"), "bf16-activations": _flag("--bf16"),
               "compile-small-ops": COMPILE, "fuse-memory-bound": COMPILE, "free-a-core": ONE},
        what="control: 3 x Linear(1024) fp32, batch 128, nothing blocks"),
    Job("loader_sleep", "loader_sleep.py", quick=("--steps", "50"), stat="mean", rest="compute",
        peak_threads=1, probes={"workers2": ("--workers", "2")},
        knobs={"dataloader-workers": _workers, "compile-small-ops": COMPILE,
               "fuse-memory-bound": COMPILE, "free-a-core": ONE},
        what="control: DataLoader num_workers=0, __getitem__ sleeps 0.4 ms a sample, MLP"),
]

SETS: dict[str, list[Job]] = {"held_out_1": JOBS, "held_out_2": HELD_OUT_2,
                              "held_out_3": HELD_OUT_3, "held_out_4": HELD_OUT_4}
ALL_JOBS: list[Job] = JOBS + HELD_OUT_2 + HELD_OUT_3 + HELD_OUT_4
