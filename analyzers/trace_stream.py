"""Stream a trace file as batches of typed events, in memory that does not grow with the file.

Why: a rank file of a real job is 1-5 GB of JSON. Reading it whole (and gzip-decompressing it
whole) costs that much memory before a single event is decoded, per worker. Here the file is
read (and decompressed) a chunk at a time, and the ``traceEvents`` array is cut at event
boundaries into batches of about ``BATCH_BYTES`` that msgspec decodes one at a time, so a
worker holds one batch of bytes and its decoded events, never the document.

Finding a boundary without a JSON tokenizer in Python: the last ``}`` ``,`` ``{`` in the
buffer (whitespace allowed between) is a candidate. The batch up to it is decoded as a JSON
array; a candidate inside a string or inside a nested object leaves that array unterminated
or unbalanced, so the decode fails and an earlier candidate is tried. Only a true event
boundary decodes, so no event is ever split. A batch that will not decode at any candidate is
invalid JSON (torch writes names with an unescaped '"'): it is read event by event instead
(``trace_decode.salvage_block``), and only if the document turns out to be complete.

gzip: decompressed with ISA-L (``isal``), 2.3x zlib's speed on a Kineto trace here (794 vs
349 MB/s of output, 2-core VM, see docs/analyze.md); members are followed, as gzip does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
from isal import isal_zlib

from gpudiag.analyzers.trace_decode import (
    Event,
    TypedDecoder,
    decode_head,
    decode_tail_loose,
    salvage_block,
)
from gpudiag.errors import TraceError

# isal's stub declares ``error`` an instance of Exception; it is the class its inflater raises
_GZIP_ERROR = cast("type[Exception]", isal_zlib.error)

# Bytes read from disk per call (compressed bytes for .gz files). Small reads keep every
# allocation under glibc's mmap threshold, so buffers are reused instead of faulted in anew
# (a fresh 16 MB allocation cost 37-54 ms of page faults on this VM, a fifth of its decode).
READ_BYTES = 1 * 2**20
GZ_READ_BYTES = 256 * 2**10
# Decompressed bytes per decompressor call: bounds what one call can return even for a
# pathological compression ratio.
INFLATE_BYTES = 1 * 2**20
# JSON bytes decoded per batch. A batch's decoded events take about 2x its bytes (structs
# and strings). Measured on an 83 MB rank: peak RSS 118 MB with 16 MiB batches, 83 MB with
# 4 MiB (32 MB of it the interpreter and numpy), the same CPU time; 2 MiB saved nothing more.
BATCH_BYTES = 4 * 2**20
# Earlier boundary candidates tried before a batch is read event by event.
CUT_RETRIES = 4
# The tail of the buffer searched first for a boundary (events are ~200-600 bytes, so it
# holds dozens), then windows 4x larger each time. Every match in a window is collected
# before the last is tried: a 256 KiB first window cost 17 ms per 83 MiB rank here.
_CUT_WINDOW = 16 * 2**10

_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*')
_WS = b" \t\r\n"
_OPEN, _CLOSE = ord("["), ord("]")


class ByteSource:
    """Decompressed bytes of a file (or of bytes in memory), a chunk at a time.

    ``on_bytes`` is called with the number of *file* bytes consumed since the last call, so
    progress is measured against the size on disk.
    """

    def __init__(self, path: Path | None = None, data: bytes | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        self.name = str(path) if path is not None else "<bytes>"
        self._on_bytes = on_bytes
        self._data = data
        self._pos = 0
        self._f = None
        if path is not None:
            try:
                self._f = open(path, "rb")  # closed in close()
            except OSError as e:
                raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
        head = self._raw(2)
        self._pending = head
        self._gz = isal_zlib.decompressobj(31) if head == b"\x1f\x8b" else None
        self._tail = b""  # compressed input not yet consumed by the decompressor
        self.eof = False

    def _raw(self, n: int) -> bytes:
        if self._f is not None:
            try:
                b = self._f.read(n)
            except OSError as e:
                raise TraceError(f"{self.name}: cannot read: {e.strerror or e}") from None
        else:
            assert self._data is not None
            b = self._data[self._pos:self._pos + n]
            self._pos += len(b)
        if b and self._on_bytes is not None:
            self._on_bytes(len(b))
        return b

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def read(self) -> bytes:
        """The next chunk; b"" only at the end of the file."""
        if self.eof:
            return b""
        if self._gz is None:
            b = self._pending + self._raw(READ_BYTES)
            self._pending = b""
            if not b:
                self.eof = True
            return b
        while True:
            if not self._tail:
                self._tail = self._pending + self._raw(GZ_READ_BYTES)
                self._pending = b""
                if not self._tail:
                    if not self._gz.eof:
                        raise TraceError(f"{self.name}: corrupt or truncated gzip (the compressed "
                                         "stream ends early); re-copy the file")
                    self.eof = True
                    return b""
            try:
                if self._gz.eof:  # a concatenated gzip member follows
                    self._gz = isal_zlib.decompressobj(31)
                out = self._gz.decompress(self._tail, INFLATE_BYTES)
            except _GZIP_ERROR as e:
                raise TraceError(f"{self.name}: corrupt or truncated gzip ({e}); re-copy the "
                                 "file") from None
            self._tail = self._gz.unconsumed_tail or self._gz.unused_data
            if out:
                return out


class TraceStream:
    """The events of one trace, batch by batch (``run(on_batch)``), and its header fields.

    ``props``/``dist`` (deviceProperties, distributedInfo) are known once ``run`` returns (a
    writer may put them after the events). ``salvage_dropped`` is the number of unreadable
    events dropped when the document was read event by event, None if it was not.

    Batches are decoded in place from the read buffer, without a copy: their raw fields
    (shapes) point into it. ``on_batch`` is called with each batch and should not keep the
    events; if it does, the buffer is not reused for the next batch but copied.
    """

    def __init__(self, source: ByteSource) -> None:
        self.src = source
        self.path = source.name
        self.props: Any = None
        self.dist: Any = None
        self.salvage_dropped: int | None = None
        self._buf = bytearray()
        self._pos = 0
        self._typed = TypedDecoder()

    def _more(self) -> bool:
        chunk = self.src.read()
        if not chunk:
            return False
        try:
            if self._pos > 0:
                del self._buf[:self._pos]
            self._buf += chunk
        except BufferError:  # events of the last batch still point into the buffer
            self._buf = bytearray(memoryview(self._buf)[self._pos:]) + chunk
        self._pos = 0
        return True

    def _fill(self, n: int) -> bool:
        """Read until n bytes are buffered past ``_pos``; False at the end of the file."""
        while len(self._buf) - self._pos < n:
            if not self._more():
                return False
        return True

    def _error(self, why: str) -> TraceError:
        return TraceError(f"{self.path}: {why}")

    # --- the document around the events ---------------------------------------------------

    def open_header(self) -> None:
        """Read up to the event array: ``props``/``dist`` as the header gives them."""
        self._open_array()

    def close(self) -> None:
        self.src.close()

    def _open_array(self) -> bool:
        """Position on the '[' of the event array (of a document, or a bare array document
        ``[ev, ...]``, which has no header); TraceError for a document without one."""
        while True:
            stripped = self._buf.lstrip(_WS)
            if stripped or not self._more():
                break
        if not stripped:
            raise self._error("file is empty")
        skip = len(self._buf) - len(stripped)
        if stripped[:1] == b"[":
            self._pos = skip
            self._bare = True
            return True
        self._bare = False
        if stripped[:1] != b"{":
            raise self._error("invalid or truncated JSON (not a JSON object or array)")
        while True:
            m = _KEY.search(self._buf)
            if m is not None and m.end() < len(self._buf):
                break
            if not self._more():
                self._no_events()
        head = bytes(self._buf[:m.start()])
        self.props, self.dist = decode_head(head, self.path)
        if self._buf[m.end()] != _OPEN:
            raise self._error("not a PyTorch profiler trace (no 'traceEvents' list)")
        self._pos = m.end()
        return True

    def _no_events(self) -> None:
        try:
            msgspec.json.decode(bytes(self._buf))
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise self._error(f"invalid or truncated JSON ({e})") from None
        raise self._error("not a PyTorch profiler trace (no 'traceEvents' list)")

    # --- the events ---------------------------------------------------------------------------

    def run(self, on_batch: Callable[[list[Event]], None]) -> None:
        try:
            self._open_array()
            want = BATCH_BYTES
            while True:
                if not self._fill(want):
                    on_batch(self._finish())
                    return
                batch = self._cut()
                if batch is None:  # no boundary in the buffer yet (one very long event)
                    want *= 2
                    continue
                want = BATCH_BYTES
                if batch:
                    on_batch(batch)
                del batch
        finally:
            self.src.close()

    def _candidates(self) -> Iterator[re.Match[bytes]]:
        """Boundary candidates from the end of the buffer backwards."""
        end = len(self._buf)
        window = _CUT_WINDOW
        lo = max(self._pos + 1, end - window)
        below = end + 1  # matches start below this (a window's overlap is not matched twice)
        while True:
            found = [m for m in _BOUNDARY.finditer(self._buf, lo, end) if m.start() < below]
            yield from reversed(found)
            if lo <= self._pos + 1:
                return
            below = lo
            end = lo + 64  # overlap: a match straddling the window edge
            window *= 4
            lo = max(self._pos + 1, lo - window)

    def _cut(self) -> list[Event] | None:
        """The events up to the last boundary that decodes; None when there is none yet."""
        buf = self._buf
        tried = 0
        for m in self._candidates():
            if tried >= CUT_RETRIES:
                break
            tried += 1
            brace = m.start()
            comma = buf.index(b",", brace)
            saved = buf[brace + 1]
            buf[brace + 1] = _CLOSE
            try:
                with memoryview(buf) as mv:
                    events = self._typed.events(mv[self._pos:brace + 2])
            except (msgspec.DecodeError, UnicodeDecodeError):
                continue
            finally:
                buf[brace + 1] = saved
            buf[comma] = _OPEN
            self._pos = comma
            return events
        return self._salvage_mid() if tried else None

    def _salvage_mid(self) -> list[Event] | None:
        """A batch that is not valid JSON at any boundary: read it event by event, up to the
        last event start (Kineto writes one event per block starting on its own line)."""
        block = bytes(self._buf[self._pos + 1:])
        events, dropped, rest = salvage_block(block, final=False)
        if rest == len(block):
            return None  # at most one event start in the buffer: read on
        self.salvage_dropped = (self.salvage_dropped or 0) + dropped
        start = len(self._buf) - rest
        self._buf[start - 1] = _OPEN  # the byte before an event start is whitespace
        self._pos = start - 1
        return events

    def _finish(self) -> list[Event]:
        """The last events and whatever follows the array (its closing, later keys)."""
        rest = bytes(memoryview(self._buf)[self._pos:])
        self._buf = bytearray()
        if self._bare:
            blob, wrap = rest, None
        else:
            blob, wrap = b'{"traceEvents":' + rest, True
        try:
            try:
                if wrap:
                    doc = self._typed.tail(blob)
                    events = doc.traceEvents
                    props, dist = doc.deviceProperties, doc.distributedInfo
                else:
                    events, props, dist = self._typed.strict_events(blob), None, None
            except msgspec.ValidationError:
                events, props, dist = decode_tail_loose(blob, bool(wrap), self.path)
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            salvaged = self._salvage_end(rest)
            if salvaged is None:
                raise self._error(f"invalid or truncated JSON ({e})") from None
            return salvaged
        if props is not None:
            self.props = props
        if dist is not None:
            self.dist = dist
        return events

    def _complete(self, rest: bytes) -> bool:
        body = rest.rstrip(_WS)
        return body.endswith(b"]" if self._bare else b"}") and b"]" in body

    def _salvage_end(self, rest: bytes) -> list[Event] | None:
        """The last batch of a document that is not valid JSON: salvaged event by event when
        the document is complete (a truncated file stays an error)."""
        if self._bare or not self._complete(rest):
            return None
        end = rest.rfind(b"]")
        events, dropped, _ = salvage_block(rest[1:end], final=True)
        if not events and self.salvage_dropped is None:
            return None
        self.salvage_dropped = (self.salvage_dropped or 0) + dropped
        return events

