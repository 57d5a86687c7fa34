"""Decode a PyTorch profiler (Kineto) trace file into typed events, batch by batch.

Why not ``json.load``: a rank file of a large job is hundreds of MB of JSON, and a Python
object tree of it costs 5-10x that in memory (HTA's parser pays this). We decode with
msgspec into typed structs that name only the fields the analyses read (everything else in
the document is skipped by the decoder, never materialised), one batch of events at a time,
so the columns built from them (``trace_columns``) hold the only long-lived copy.

The only exception that leaves this module is ``gpudiag.errors.TraceError``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import msgspec

from gpudiag.errors import TraceError

# --- the typed view of a trace: only what we use ------------------------------------------

class EventArgs(msgspec.Struct, frozen=True):
    """The ``args`` of an event: ids that link kernels to ops, shapes, collective sizes."""

    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_dims_old: Any = msgspec.field(default=None, name="Input dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None


class _EventTyped(msgspec.Struct, frozen=True):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: EventArgs | None = None


class _DeviceProp(msgspec.Struct):
    name: Any = None
    totalGlobalMem: Any = None  # noqa: N815 (the trace's spelling)
    numSms: Any = None  # noqa: N815


class _DistInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None
    nccl_version: Any = None


class _TraceDoc(msgspec.Struct):
    traceEvents: Any = msgspec.UNSET  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815


_EVENT_LIST = msgspec.json.Decoder(list[_EventTyped])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
# Events are decoded this many at a time: the document is first split into raw (zero-copy)
# event slices, then each batch is decoded and folded into columns before the next, so the
# decoded Python objects of only one batch are alive at any time.
DECODE_BATCH = 50_000
_DOC = msgspec.json.Decoder(_TraceDoc)
_DOC_TYPED = msgspec.json.Decoder(
    msgspec.defstruct(
        "_TraceDocTyped",
        [
            ("traceEvents", Union[list[msgspec.Raw], None], None),
            ("deviceProperties", Union[list[_DeviceProp], None], None),
            ("distributedInfo", Union[_DistInfo, None], None),
            ("schemaVersion", Any, None),
        ],
    )
)

# --- reading --------------------------------------------------------------------------

def read_trace_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{path}: corrupt or truncated gzip ({e}); re-copy the file") from None
    return raw


def decode_trace(data: bytes, path: str) -> tuple[Iterator[Any], Any, Any]:
    """Decode to (events, deviceProperties, distributedInfo).

    ``events`` is an iterator that decodes batch by batch. A batch with an unexpectedly typed
    field is decoded loosely instead, so one odd event (a mutated or hand-edited file) is
    dropped or read field by field rather than failing the whole file.
    """
    stripped = data.lstrip()
    if not stripped:
        raise TraceError(f"{path}: file is empty")
    try:
        if stripped[:1] == b"[":
            return _batches(_RAW_LIST.decode(data), path), None, None
        doc = _DOC_TYPED.decode(data)
        if doc.traceEvents is None:
            raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
        return _batches(doc.traceEvents, path), doc.deviceProperties, doc.distributedInfo
    except msgspec.ValidationError:
        pass
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        salvaged = _salvage(data)
        if salvaged is None:
            raise TraceError(f"{path}: invalid or truncated JSON ({e})") from None
        return salvaged
    # Loose path: the document's own fields have odd types; decode everything as plain JSON.
    try:
        doc = _DOC.decode(data) if stripped[:1] == b"{" else None
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a PyTorch profiler trace ({e})") from None
    if doc is None or not isinstance(doc.traceEvents, list):
        raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else None
    props = [_DeviceProp(name=p.get("name"), totalGlobalMem=p.get("totalGlobalMem"))
             for p in (props or []) if isinstance(p, dict)]
    dist = doc.distributedInfo
    dist = _DistInfo(rank=dist.get("rank"), world_size=dist.get("world_size"),
                     backend=dist.get("backend")) if isinstance(dist, dict) else None
    return iter([_loose_event(e) for e in doc.traceEvents]), props, dist


# Phase of the one pseudo-event that ``_salvage`` appends: its name is the number of events
# it had to drop, so the folder can warn about them.
SALVAGE_MARKER = "gpudiag-salvage"
# Kineto writes one event per block starting with "  {" on its own line.
_EVENT_START = re.compile(rb"\n[ \t]*\{")


def _salvage(data: bytes) -> tuple[Iterator[Any], Any, Any] | None:
    """Events of a complete document that is not valid JSON, one block at a time.

    torch writes annotation names containing '"' unescaped (seen with torch 2.13 and
    record_function('"x')), which makes the whole file invalid JSON although every other
    event is fine. Only complete documents are salvaged: a truncated file stays an error.
    Dropped events are reported through the ``SALVAGE_MARKER`` pseudo-event.
    """
    body = data.rstrip()
    start = data.find(b'"traceEvents"')
    if start < 0 or not body.endswith(b"}"):
        return None
    open_bracket = data.find(b"[", start)
    end = data.rfind(b"]")
    if open_bracket < 0 or end <= open_bracket:
        return None
    try:
        head = _DOC_TYPED.decode(data[:start] + b'"traceEvents": []}')
        props, dist = head.deviceProperties, head.distributedInfo
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        props, dist = None, None
    section = data[open_bracket + 1:end]
    cuts = [m.start() for m in _EVENT_START.finditer(section)]
    if not cuts:
        return None
    events: list[Any] = []
    dropped = 0
    for a, b in zip(cuts, [*cuts[1:], len(section)], strict=True):
        chunk = section[a:b].strip().rstrip(b",").strip()
        if not chunk:
            continue
        try:
            events.append(msgspec.json.decode(chunk, type=_EventTyped))
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            try:
                events.append(_loose_event(msgspec.json.decode(chunk)))
            except (msgspec.DecodeError, UnicodeDecodeError):
                dropped += 1
    if not events:
        return None
    events.append(_EventTyped(ph=SALVAGE_MARKER, name=str(dropped)))
    return iter(events), props, dist


def _batches(raw: list[msgspec.Raw], path: str) -> Iterator[Any]:
    for i in range(0, len(raw), DECODE_BATCH):
        chunk = raw[i:i + DECODE_BATCH]
        blob = b"[" + b",".join(chunk) + b"]"
        try:
            try:
                events = _EVENT_LIST.decode(blob)
            except msgspec.ValidationError:
                events = [_loose_event(e) for e in msgspec.json.decode(blob)]
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}: invalid JSON inside traceEvents ({e})") from None
        del blob
        yield from events


def _loose_event(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return _EventTyped()
    args = raw.get("args")
    targs = None
    if isinstance(args, dict):
        targs = EventArgs(
            external_id=args.get("External id"), correlation=args.get("correlation"),
            stream=args.get("stream"), input_dims=args.get("Input Dims"),
            input_dims_old=args.get("Input dims"), input_type=args.get("Input type"),
            concrete=args.get("Concrete Inputs"),
            collective=args.get("Collective name"), in_nelems=args.get("In msg nelems"),
            out_nelems=args.get("Out msg nelems"), group_size=args.get("Group size"),
            dtype=args.get("dtype"),
        )
    return _EventTyped(ph=raw.get("ph"), cat=raw.get("cat"), name=raw.get("name"),
                       pid=raw.get("pid"), tid=raw.get("tid"), ts=raw.get("ts"),
                       dur=raw.get("dur"), args=targs)


# --- values of the decoded document ----------------------------------------------------

def as_int(v: Any) -> int | None:
    """An int that fits the int64 columns, from an int, integral float or numeric string."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v == v and abs(v) < 2**62:
        v = int(v)
    elif isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            return None
    if isinstance(v, int) and -(2**62) < v < 2**62:  # fits the int64 columns
        return v
    return None


_RANK_FROM_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_of(dist: Any, rank_hint: int | None, path: str) -> tuple[int, int | None, str | None]:
    """(rank, world size, backend): from distributedInfo, else a "rank-N" file name, else
    the caller's hint (the file's position in its folder)."""
    rank = world = None
    backend = None
    if dist is not None:
        rank = as_int(dist.rank)
        world = as_int(dist.world_size)
        backend = dist.backend if isinstance(dist.backend, str) else None
    if rank is None:
        m = _RANK_FROM_NAME.search(Path(path).name)
        rank = int(m.group(1)) if m else rank_hint
    return (0 if rank is None else rank), world, backend
