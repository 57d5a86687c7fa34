"""Each rank's black box: its step progress and its last collectives, in a file the kernel keeps.

The one home of the format: written by the job's bootstrap (``collectors/stall_watch.py``, which
loads this file beside it: standard library only) and read by ``gpudiag profile``'s stall monitor
and by ``gpudiag hang-report`` (imported as ``gpudiag.collectors.blackbox``).

Why a shared memory map and not a file the rank writes: a rank that hangs with its interpreter
held (a C call that keeps the GIL), or that dies by a signal (gloo aborts the process on a size
mismatch: ``std::terminate``), can no longer write anything, and PyTorch's Flight Recorder lives
in its memory. Every write here is a store into a ``MAP_SHARED`` page of
``samples/blackbox-rank-<RANK>.bin``, which the kernel keeps and writes back whatever happens to
the process afterwards: the parent reads it at any moment, from outside, with no help from the
rank. A write is one ``struct.pack_into`` (about 1 us), so the rank pays nothing it would notice.

Layout (little-endian; ``VERSION`` 1):

    header  magic "GDBBOX01", version u32, rank i32, pid i64, step i64, last step end (unix s),
            start (unix s), phase name (24 bytes, "" when none), phase start (unix s),
            profiler window open u8, count of step durations ever written u32,
            the last ``DTS`` step durations (a ring, seconds)
    slots   ``SLOTS`` collectives (a ring, by ``order``): order u64 (0: empty), seq u64 (per
            process group, from 1), entered and done (unix s; done 0 while in flight), step at
            entry i64, numel of the first tensor argument i64, state u8, op (15 bytes), process
            group name (24), shape ("1000" or "16x64", 40), dtype (8)

A slot's ``seq`` counts the calls this rank made through ``torch.distributed``'s Python API on
that group: two ranks' slots with the same group and seq are the same collective, if the job is
in step. DDP's bucket all-reduces are issued from C++ and are not here (the Flight Recorder has
them, while the rank can answer).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"GDBBOX01"
VERSION = 1
DTS = 64
SLOTS = 64
_HEADER = struct.Struct(f"<8sIiqqdd24sdBI{DTS}d")
_SLOT = struct.Struct("<QQddqqB15s24s40s8s")
SIZE = _HEADER.size + SLOTS * _SLOT.size
ENTERED, DONE, ISSUED, RAISED = 1, 2, 3, 4   # a slot's state
STATES = {ENTERED: "in flight", DONE: "completed", ISSUED: "issued (async)", RAISED: "raised"}
# byte offsets of the header fields a step rewrites (the rest is written once)
_OFF_STEP = struct.calcsize("<8sIiq")
_OFF_PHASE = struct.calcsize("<8sIiqqdd")
_OFF_PROF = struct.calcsize("<8sIiqqdd24sd")
_OFF_NDTS = _OFF_PROF + 1
_OFF_DTS = _OFF_NDTS + 4


def path_for(run_dir: Path, rank: int) -> Path:
    return run_dir / "samples" / f"blackbox-rank-{rank}.bin"


def _text(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("ascii", "replace")


def _fit(text: str, n: int) -> bytes:
    return text.encode("ascii", "replace")[:n]


def encode(text: str) -> bytes:
    """A name as a slot holds it (``struct`` cuts it to its field)."""
    return text.encode("ascii", "replace")


class Writer:
    """The rank's side: created once per training process, written from its threads."""

    def __init__(self, path: Path, rank: int, pid: int, start: float) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self.mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _HEADER.pack_into(self.mm, 0, MAGIC, VERSION, rank, pid, 0, 0.0, start, b"", 0.0, 0, 0,
                          *([0.0] * DTS))
        self.order = 0
        self.ndts = 0
        self.seq: dict[bytes, int] = {}

    def step(self, step: int, t_end: float, dt: float, profiler: bool) -> None:
        struct.pack_into("<d", self.mm, _OFF_DTS + 8 * (self.ndts % DTS), dt)  # before its count
        self.ndts += 1
        struct.pack_into("<BI", self.mm, _OFF_PROF, 1 if profiler else 0, self.ndts)
        struct.pack_into("<qd", self.mm, _OFF_STEP, step, t_end)

    def phase(self, name: str, since: float) -> None:
        struct.pack_into("<24sd", self.mm, _OFF_PHASE, _fit(name, 24), since)

    def enter(self, pg: bytes, op: bytes, shape: bytes, dtype: bytes, numel: int, step: int, t: float,
              state: int = ENTERED) -> int:
        """Record a collective as entered; returns its slot for ``done``. The names come encoded
        (``encode``): a caller keeps them, so a call costs no string work."""
        seq = self.seq.get(pg, 0) + 1
        self.seq[pg] = seq
        self.order += 1
        slot = (self.order - 1) % SLOTS
        _SLOT.pack_into(self.mm, _HEADER.size + slot * _SLOT.size, self.order, seq, t, 0.0, step,
                        numel, state, op, pg, shape, dtype)
        return slot

    def done(self, slot: int, t: float, state: int = DONE) -> None:
        off = _HEADER.size + slot * _SLOT.size
        struct.pack_into("<d", self.mm, off + 24, t)
        struct.pack_into("<B", self.mm, off + 48, state)


@dataclass
class Slot:
    order: int
    seq: int
    entered: float
    done: float | None
    step: int
    numel: int
    state: str
    op: str
    pg: str
    shape: str
    dtype: str


@dataclass
class BlackBox:
    rank: int
    pid: int
    step: int
    last_step_t: float | None   # None: no step yet
    start: float
    phase: str | None
    phase_since: float | None
    profiler_open: bool
    dts: list[float]             # the recent step durations, oldest first
    slots: list[Slot] = field(default_factory=list)   # oldest first
    alive: bool = True           # its process still runs (the reader's business: set by it)


def read(path: Path) -> BlackBox | None:
    """A rank's black box, or None where there is none or it is not one (torn, foreign)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(SIZE)
    except OSError:
        return None
    if len(raw) < SIZE or raw[:8] != MAGIC:
        return None
    h = _HEADER.unpack_from(raw, 0)
    if h[1] != VERSION:
        return None
    _, _, rank, pid, step, last, start, phase, since, prof, ndts, *ring = h
    n = min(ndts, DTS)
    dts = [ring[(ndts - n + i) % DTS] for i in range(n)]
    slots = []
    for i in range(SLOTS):
        order, seq, entered, done, st, numel, state, op, pg, shape, dtype = _SLOT.unpack_from(
            raw, _HEADER.size + i * _SLOT.size)
        if order == 0 or state not in STATES:
            continue
        slots.append(Slot(order, seq, entered, done or None, st, numel, STATES[state], _text(op),
                          _text(pg), _text(shape), _text(dtype)))
    slots.sort(key=lambda s: s.order)
    name = _text(phase)
    return BlackBox(rank=rank, pid=pid, step=step, last_step_t=last if step > 0 else None,
                    start=start, phase=name or None, phase_since=since if name else None,
                    profiler_open=bool(prof), dts=dts, slots=slots)


def read_all(run_dir: Path) -> dict[int, BlackBox]:
    out = {}
    for f in sorted((run_dir / "samples").glob("blackbox-rank-*.bin")):
        box = read(f)
        if box is not None:
            out[box.rank] = box
    return out
