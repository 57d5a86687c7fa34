"""Flight Recorder dumps that PyTorch wrote on its own, read as an incident's evidence.

What is read: one file per rank, named ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE`` is the
prefix; torch's own reader, ``torch.distributed.flight_recorder``, finds ranks the same way), each
holding what ``torch._C._distributed_c10d._dump_fr_trace()`` returns: a pickled dict with
``version``, ``pg_config``, ``pg_status`` (per process group id, its last enqueued/started/
completed collective) and ``entries`` (per collective: ``process_group`` (name, description),
``collective_seq_id``/``p2p_seq_id``, ``profiling_name`` such as ``nccl:all_reduce``,
``input_sizes``, ``input_dtypes``, ``state``, ``retired``, ``time_created_ns``, ``frames``); or
the same dict as JSON (``_dump_fr_trace_json``). NCCL writes these on a watchdog timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``) or on demand; torch 2.13's gloo records the same entries but
writes no file by itself, so a job or a tool calls the dump.

A pickle can run code when loaded, and a dump is a file anyone may have written: it is read with
an unpickler that refuses every class and function (a Flight Recorder dump holds only dicts,
lists, tuples, strings and numbers), and never above ``MAX_DUMP_BYTES``.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import time
from pathlib import Path
from typing import Any

from gpudiag.collectors.stall_collect import fr_collectives
from gpudiag.errors import BadInput
from gpudiag.incident import Evidence, RankState

MAX_DUMP_BYTES = 256 * 1024 * 1024
MAX_FILES = 100_000
_RANK = re.compile(r"^(.*?)(\d+)(\.json|\.pkl)?$")


class _PlainValues(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: ANN401
        raise pickle.UnpicklingError(f"refers to {module}.{name}: a Flight Recorder dump holds plain values "
                                     "only, so this file is not one (not loaded)")


def load_dump(path: Path) -> dict[str, Any]:
    """One dump file as its dict; BadInput with the cause on anything else."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise BadInput(f"{path}: {size} bytes, more than a Flight Recorder dump "
                           f"({MAX_DUMP_BYTES} at most)")
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        doc = json.loads(raw) if raw[:1] in (b"{", b" ", b"\n") else _PlainValues(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, ValueError, EOFError, UnicodeDecodeError, TypeError, IndexError,
            KeyError, AttributeError) as e:
        raise BadInput(f"{path}: not a Flight Recorder dump ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise BadInput(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    return doc


def find_dumps(folder: Path, prefix: str | None = None) -> dict[int, Path]:
    """rank -> its dump file in ``folder`` (and below), by the ``<prefix><rank>`` naming."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())[:MAX_FILES]
    by_prefix: dict[str, dict[int, Path]] = {}
    for p in files:
        m = _RANK.match(p.name)
        if m and (prefix is None or m.group(1) == prefix):
            by_prefix.setdefault(m.group(1), {})[int(m.group(2))] = p
    if not by_prefix:
        want = f" named {prefix}<rank>" if prefix else " named <prefix><rank> (e.g. nccl_trace_rank_0)"
        raise BadInput(f"{folder}: no Flight Recorder dump{want}; give the folder TORCH_FR_DUMP_TEMP_FILE "
                       "pointed into (or --prefix)")
    if len(by_prefix) > 1:
        raise BadInput(f"{folder}: dumps with several prefixes ({', '.join(sorted(by_prefix))}): "
                       "choose one with --prefix")
    return next(iter(by_prefix.values()))


def dump_evidence(folder: Path, prefix: str | None = None, now: float | None = None) -> Evidence:
    """The ranks' dumps as one incident's evidence (collectives only: no stacks, no steps)."""
    dumps = find_dumps(folder, prefix)
    ev = Evidence(id="dumps", source="dumps", detected_at=now if now is not None else time.time())
    newest = 0.0
    for rank, path in sorted(dumps.items()):
        doc = load_dump(path)
        colls, status = fr_collectives(doc)
        rs = RankState(rank=rank, collectives=colls, fr_status=status, alive=True)
        if not colls:
            rs.fr_note = "its dump holds no collective"
        newest = max([newest, *(c.entered or 0.0 for c in colls)])
        ev.ranks.append(rs)
        ev.notes.append(f"rank {rank}: {path.name}, Flight Recorder version {doc.get('version', '?')}, "
                        f"{len(doc['entries'])} entries")
    if now is None and newest > 0:
        # a dump says when each collective began, not when it was written: the last entry's
        # time stands for "now", so waits read as at least that long
        ev.detected_at = max(newest, max((p.stat().st_mtime for p in dumps.values()), default=newest))
    return ev
