"""Property: whatever a damaged trace looks like, the loader raises TraceError or succeeds.

Mutations start from a real trace so they reach deep into the event structure, the way a
truncated copy, a hand edit or a buggy exporter would.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.analyzers.diagnose import analyze_rank
from gpudiag.analyzers.trace_decode import AnyCategoryEvent
from gpudiag.analyzers.trace_loader import load_bytes, load_rank
from gpudiag.analyzers.trace_stream import BATCH_BYTES, ByteSource, TraceStream
from gpudiag.errors import TraceError
from tests.conftest import TRACES

# no fallback: without the real trace this module fails to import, loudly
TRACE = TRACES / "mi250" / "rank-0.json.gz"
RAW = gzip.decompress(TRACE.read_bytes())
DOC = json.loads(RAW)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
FIELDS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "args"]
ARG_FIELDS = ["External id", "correlation", "stream", "Input Dims", "Input type", "Collective name",
              "In msg nelems", "dtype", "Group size"]


def _check(data: bytes, tmp: Path) -> None:
    p = tmp / "rank-0.json"
    p.write_bytes(data)
    try:
        rt = load_rank(p)
    except TraceError:
        return
    analyze_rank(rt, None)  # the analyses must take whatever the loader accepted


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(RAW)))
def test_truncated_bytes_never_escape_as_other_errors(tmp_path, cut):
    _check(RAW[:cut], tmp_path)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, max(len(RAW) - 1, 0)), byte=st.integers(0, 255))
def test_flipped_bytes_never_escape_as_other_errors(tmp_path, pos, byte):
    data = bytearray(RAW)
    data[pos] = byte
    _check(bytes(data), tmp_path)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_event_fields_never_escape_as_other_errors(tmp_path, data):
    doc = json.loads(RAW)
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 5))):
        ev = events[data.draw(st.integers(0, len(events) - 1))]
        if not isinstance(ev, dict):
            continue
        if data.draw(st.booleans()) and isinstance(ev.get("args"), dict):
            ev["args"][data.draw(st.sampled_from(ARG_FIELDS))] = data.draw(json_values)
        else:
            key = data.draw(st.sampled_from(FIELDS))
            if data.draw(st.booleans()):
                ev.pop(key, None)
            else:
                ev[key] = data.draw(json_values)
    if data.draw(st.booleans()):
        doc[data.draw(st.sampled_from(["deviceProperties", "distributedInfo", "schemaVersion"]))] = \
            data.draw(json_values)
    _check(json.dumps(doc).encode(), tmp_path)


def test_invalid_utf8_inside_recorded_shapes_costs_nothing_and_loses_nothing(tmp_path):
    """Shapes and types are kept raw until an op is costed; a byte that is not UTF-8 inside
    them (a flipped bit) leaves that op uncosted instead of failing the file."""
    at = RAW.index(b'"Input type": ["') + len(b'"Input type": ["')
    bad = RAW[:at] + b"\x80" + RAW[at:]
    _check(bad, tmp_path)
    assert load_bytes(bad).kept_events == load_bytes(RAW).kept_events


def test_decode_of_a_real_trace_keeps_every_complete_event():
    rt = load_bytes(RAW, "mi250")
    timed = [e for e in DOC["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    assert rt.kept_events + rt.dropped_events + len(rt.steps) + len(rt.dataloader) > 0
    assert rt.device_name == DOC["deviceProperties"][0]["name"]
    assert rt.kept_gpu_events == sum(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in timed)


def test_a_category_the_decoder_does_not_know_is_still_read_typed_and_changes_nothing():
    """Categories decode as a Literal of the known ones (shared strings, the fast path); a
    profiler that writes a new one must cost a second typed decode, not the loose one, and
    give the same columns (an unknown category is not analysed, like a flow event)."""
    raw = gzip.decompress((TRACES / "a100-nccl-2rank" / "rank-0.json.gz").read_bytes())
    assert b'"cat": "fwdbwd"' in raw
    renamed = raw.replace(b'"cat": "fwdbwd"', b'"cat": "a_category_from_2030"')
    before, after = load_bytes(raw), load_bytes(renamed)
    assert after.kept_events == before.kept_events > 0
    assert after.names == before.names
    for col in ("gpu_ts", "gpu_name", "cpu_ts", "cpu_dur", "cpu_name", "cpu_tid", "cpu_ext"):
        assert np.array_equal(getattr(after, col), getattr(before, col)), col
    events: list = []
    TraceStream(ByteSource(data=renamed)).run(events.extend)  # several batches, then the tail
    assert len(renamed) > 2 * BATCH_BYTES
    assert all(type(e) is AnyCategoryEvent for e in events)
    assert "a_category_from_2030" in {e.cat for e in events}
