"""The typed view of a PyTorch profiler (Kineto) trace: what msgspec decodes, and how.

Why not ``json.load``: a rank file of a large job is hundreds of MB to GB of JSON, and a
Python object tree of it costs 5-10x that in memory (HTA's parser pays this). msgspec decodes
into typed structs that name only the fields the analyses read (everything else in the
document is skipped by the decoder, never materialised); ``trace_stream`` feeds it one batch of
events at a time.

The structs are typed strictly (floats for times, ints in the int64 columns' range, strings)
and untracked by the garbage collector (``gc=False``): decoding them is ~2.5x faster than
decoding the same fields as ``Any`` (265 vs 110 MB/s on a Kineto trace here), and the column
builder needs no per-value type checks. A batch with any value of another type is decoded
loosely instead (``decode_batch_loose``) and each value checked, so one odd event (a mutated
or hand-edited file) is dropped or read field by field rather than failing the whole file.
Shapes (``Input Dims`` ...) are kept as raw JSON: they are parsed only for an operator whose
cost is not cached yet (``trace_columns``), and most repeat every step.

The only exception that leaves this module is ``gpudiag.errors.TraceError``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union, cast

import msgspec
from msgspec import Meta, Raw, field

from gpudiag.errors import TraceError

# Ids and sizes as the int64 columns hold them; -1 is "not recorded".
Id = Annotated[int, Meta(gt=-(2**62), lt=2**62)]
NO_ID = -1
_NO_RAW = Raw(b"")


class EventArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of an event: ids that link kernels to ops, shapes, collective sizes."""

    external_id: Id = field(default=NO_ID, name="External id")
    correlation: Id = NO_ID
    stream: Id = NO_ID
    input_dims: Raw = field(default=_NO_RAW, name="Input Dims")
    input_dims_old: Raw = field(default=_NO_RAW, name="Input dims")
    input_type: Raw = field(default=_NO_RAW, name="Input type")
    concrete: Raw = field(default=_NO_RAW, name="Concrete Inputs")
    collective: Union[str, None] = field(default=None, name="Collective name")
    in_nelems: Union[Id, None] = field(default=None, name="In msg nelems")
    out_nelems: Union[Id, None] = field(default=None, name="Out msg nelems")
    group_size: Union[Id, None] = field(default=None, name="Group size")
    dtype: Union[str, None] = None

    def dims_raw(self) -> Raw:
        """The recorded input shapes (``Input Dims``, or PyTorch 1.8's ``Input dims``)."""
        return self.input_dims if len(self.input_dims) else self.input_dims_old


NO_ARGS = EventArgs()


# The phases of Google's Trace Event Format, a closed set: decoded as a Literal, msgspec
# returns the one shared string of each phase instead of a new string per event (3% of the
# decode and of freeing the events, measured on the 8-rank benchmark). An event with any
# other phase sends its batch to the loose decoder, which keeps any string.
Phase = Literal["B", "E", "X", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f",
                "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"]


# The categories PyTorch's profiler writes (Kineto's activity types, PyTorch 1.8-1.9's
# spellings, flows, and those seen in the traces we test on). As a Literal, each decodes to
# one shared string whose hash is cached, so classifying events by category is a cheap
# lookup; a trace with a category not listed is decoded with ``AnyCategoryEvent``.
Category = Literal[
    "cpu_op", "user_annotation", "gpu_user_annotation", "gpu_memcpy", "gpu_memset", "kernel",
    "external_correlation", "cuda_runtime", "cuda_driver", "cpu_instant_event",
    "python_function", "overhead", "cuda_sync", "cuda_profiler_range", "collective_comm",
    "gpu_pm_counter", "glow_runtime", "mtia_runtime", "mtia_ccp_events", "hpu_op",
    "xpu_runtime", "xpu_driver", "privateuse1_runtime", "privateuse1_driver",
    "ac2g", "fwdbwd", "async_cpu_to_gpu", "Trace",
    "Operator", "Kernel", "Runtime", "Memcpy", "Memset", "Python", "Overhead",
]


class Event(msgspec.Struct, frozen=True, gc=False):
    ph: Union[Phase, None] = None
    cat: Union[Category, None] = None
    name: Union[str, None] = None
    tid: Union[int, str, None] = None
    ts: float = math.nan  # NaN: not recorded (JSON has no NaN, so none is ever read)
    dur: float = math.nan
    args: EventArgs = NO_ARGS


class AnyCategoryEvent(Event, frozen=True, gc=False):
    """An event whose category may be any string (a profiler newer than ``Category``)."""

    # widened on purpose: msgspec decodes by the annotation, and this class exists to take any
    cat: Union[str, None] = None  # type: ignore[assignment]


class _DeviceProp(msgspec.Struct):
    name: Any = None
    totalGlobalMem: Any = None  # noqa: N815 (the trace's spelling)
    numSms: Any = None  # noqa: N815


class _DistInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None
    nccl_version: Any = None


class _LooseDoc(msgspec.Struct):
    traceEvents: Any = msgspec.UNSET  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815


class _TailDoc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []  # noqa: N815 (msgspec copies defaults)
    deviceProperties: Union[list[_DeviceProp], None] = None  # noqa: N815
    distributedInfo: Union[_DistInfo, None] = None  # noqa: N815


class _AnyCategoryTailDoc(_TailDoc, gc=False):
    traceEvents: list[AnyCategoryEvent] = []  # type: ignore[assignment]  # noqa: N815 (widened, as above)


EVENT_LIST = msgspec.json.Decoder(list[Event])
TAIL_DOC = msgspec.json.Decoder(_TailDoc)
_EVENT_LISTS = (EVENT_LIST, msgspec.json.Decoder(list[AnyCategoryEvent]))
_TAIL_DOCS = (TAIL_DOC, msgspec.json.Decoder(_AnyCategoryTailDoc))


class TypedDecoder:
    """The typed decoding of one trace's batches: known categories first, then any category
    (and from then on for this trace: its profiler writes one we do not know), then loosely,
    value by value (``decode_batch_loose``). Every way gives the same events; the first is
    the cheapest. msgspec.DecodeError (not JSON) is the caller's to handle."""

    def __init__(self) -> None:
        self._first = 0

    def _typed(self, decoders: tuple[msgspec.json.Decoder[Any], ...], blob: bytes | memoryview) -> Any:
        """The first of ``decoders``, from the one that worked last, that reads ``blob``; the
        last one's ValidationError when none does."""
        last = len(decoders) - 1
        for i in range(self._first, last):
            try:
                out = decoders[i].decode(blob)
            except msgspec.ValidationError:
                continue
            self._first = i
            return out
        out = decoders[last].decode(blob)
        self._first = last
        return out

    def events(self, blob: bytes | memoryview) -> list[Event]:
        """A JSON array of events."""
        try:
            events: list[Event] = self._typed(_EVENT_LISTS, blob)
        except msgspec.ValidationError:
            return decode_batch_loose(blob)
        return events

    def tail(self, blob: bytes) -> _TailDoc:
        """The document's end (its last events and later keys); ValidationError when a value
        has an odd type (``decode_tail_loose`` reads it then)."""
        doc: _TailDoc = self._typed(_TAIL_DOCS, blob)
        return doc

    def strict_events(self, blob: bytes) -> list[Event]:
        """A JSON array of events, typed; ValidationError when a value has an odd type."""
        events: list[Event] = self._typed(_EVENT_LISTS, blob)
        return events
_LOOSE = msgspec.json.Decoder(_LooseDoc)
_ANY_LIST = msgspec.json.Decoder(list)


def decode_head(head: bytes, path: str) -> tuple[Any, Any]:
    """(deviceProperties, distributedInfo) from the document up to ``"traceEvents"``."""
    doc = head + b'"traceEvents": []}'
    try:
        try:
            d = TAIL_DOC.decode(doc)
            return d.deviceProperties, d.distributedInfo
        except msgspec.ValidationError:
            loose = _LOOSE.decode(doc)
            return _loose_props(loose.deviceProperties), _loose_dist(loose.distributedInfo)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: invalid or truncated JSON ({e})") from None


def decode_batch_loose(blob: bytes | memoryview) -> list[Event]:
    """A JSON array of events whose values do not all have the expected types."""
    return [loose_event(e) for e in _ANY_LIST.decode(blob)]


def decode_tail_loose(blob: bytes, wrapped: bool, path: str) -> tuple[list[Event], Any, Any]:
    """The last events (and the keys after them) when some value has an odd type."""
    if not wrapped:
        return decode_batch_loose(blob), None, None
    d = _LOOSE.decode(blob)
    if not isinstance(d.traceEvents, list):
        raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    return ([loose_event(e) for e in d.traceEvents], _loose_props(d.deviceProperties),
            _loose_dist(d.distributedInfo))


def _loose_props(props: Any) -> list[_DeviceProp] | None:
    if not isinstance(props, list):
        return None
    return [_DeviceProp(name=p.get("name"), totalGlobalMem=p.get("totalGlobalMem"))
            for p in props if isinstance(p, dict)]


def _loose_dist(dist: Any) -> _DistInfo | None:
    if not isinstance(dist, dict):
        return None
    return _DistInfo(rank=dist.get("rank"), world_size=dist.get("world_size"),
                     backend=dist.get("backend"))


# Kineto writes one event per block starting with "  {" on its own line.
_EVENT_START = re.compile(rb"\n[ \t]*\{")


def salvage_block(block: bytes, final: bool) -> tuple[list[Event], int, int]:
    """Events of a stretch of ``traceEvents`` that is not valid JSON, one block at a time.

    torch writes annotation names containing '"' unescaped (seen with torch 2.13 and
    record_function('"x')), which makes the whole file invalid JSON although every other
    event is fine. Returns (events, dropped, rest): with ``final`` False the block after the
    last event start is left undecoded, ``rest`` bytes of it, for the next batch.
    """
    cuts = [0] + [m.start() for m in _EVENT_START.finditer(block) if m.start() > 0]
    rest = 0
    if not final:
        rest = len(block) - cuts[-1]
        cuts = cuts[:-1]
    events: list[Event] = []
    dropped = 0
    for a, b in zip(cuts, [*cuts[1:], len(block) - rest], strict=True):
        chunk = block[a:b].strip().rstrip(b",").strip()
        if not chunk:
            continue
        try:
            events.append(msgspec.json.decode(chunk, type=Event))
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            try:
                events.append(loose_event(msgspec.json.decode(chunk)))
            except (msgspec.DecodeError, UnicodeDecodeError):
                dropped += 1
    return events, dropped, rest


def _float(v: Any) -> float:
    """A finite number, else NaN ("not recorded")."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    try:
        f = float(v)
    except OverflowError:
        return math.nan
    return f if f - f == 0.0 else math.nan


def _raw(v: Any) -> Raw:
    return _NO_RAW if v is None else Raw(msgspec.json.encode(v))


def loose_event(raw: Any) -> Event:
    """An event from plain JSON, each value checked: what the typed decoder would have
    given for a well-formed event, and "not recorded" for each value that is not."""
    if not isinstance(raw, dict):
        return Event()
    args = raw.get("args")
    targs = NO_ARGS
    if isinstance(args, dict):
        def ident(key: str) -> int:
            v = as_int(args.get(key))
            return NO_ID if v is None else v

        coll = args.get("Collective name")
        dtype = args.get("dtype")
        targs = EventArgs(
            external_id=ident("External id"), correlation=ident("correlation"),
            stream=ident("stream"), input_dims=_raw(args.get("Input Dims")),
            input_dims_old=_raw(args.get("Input dims")), input_type=_raw(args.get("Input type")),
            concrete=_raw(args.get("Concrete Inputs")),
            collective=None if coll is None else str(coll),
            in_nelems=as_int(args.get("In msg nelems")),
            out_nelems=as_int(args.get("Out msg nelems")),
            group_size=as_int(args.get("Group size")),
            dtype=dtype if isinstance(dtype, str) else None,
        )
    tid = raw.get("tid")
    if not (tid is None or isinstance(tid, str) or (isinstance(tid, int) and not isinstance(tid, bool))):
        tid = repr(tid)
    elif isinstance(tid, bool):
        tid = repr(tid)

    def text(key: str) -> str | None:
        v = raw.get(key)
        return v if isinstance(v, str) else None

    # a loose event keeps the phase and category it names, whatever string (Event does not check)
    return Event(ph=cast(Any, text("ph")), cat=cast(Any, text("cat")), name=text("name"), tid=tid,
                 ts=_float(raw.get("ts")), dur=_float(raw.get("dur")), args=targs)


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
