"""The C column reader (analyzers/_gather.c) gives what the Python expression it replaces
gives, for every kind of column, on the events of real traces and on objects of any type; and
it refuses, with Python's own error, what the expression would refuse. Every check runs on the
C reader and on its pure-Python fallback (analyzers/gather_py.py, used where gpudiag was
installed without a C compiler; tests/system/reports/test_packaging.py: a whole trace loads and is analysed
the same with either)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpudiag.analyzers import _gather, gather_py, trace_fold
from gpudiag.analyzers.trace_columns import CATEGORY_CODE
from gpudiag.analyzers.trace_decode import AnyCategoryEvent, Event, EventArgs
from gpudiag.analyzers.trace_fold import column
from gpudiag.analyzers.trace_stream import ByteSource, TraceStream
from tests.conftest import TRACES


def _events(path) -> list:
    out: list = []
    TraceStream(ByteSource(path)).run(out.extend)  # the batches the loader folds
    return out


# a GPU trace (kernels, runtime calls, collectives) and a CPU-only one with recorded shapes
EVENTS = _events(TRACES / "a100-nccl-2rank" / "rank-0.json.gz") + _events(TRACES / "mi250" / "rank-0.json.gz")


@pytest.fixture(autouse=True, params=["C", "python"])
def reader(request, monkeypatch):
    """The fold's ``gather``: the C extension, or the Python fallback in its place."""
    monkeypatch.setattr(trace_fold, "gather", _gather.gather if request.param == "C" else gather_py.gather)
    return request.param


def _get(e, attrs):
    for a in attrs:
        e = getattr(e, a)
    return e


class Ids(dict):
    def __missing__(self, key):
        i = self[key] = len(self)
        return i


@pytest.mark.parametrize(("attrs", "kind", "dtype", "expect"), [
    (("ts",), "d", np.float64, float),
    (("dur",), "d", np.float64, float),
    (("args", "external_id"), "q", np.int64, int),
    (("args", "correlation"), "q", np.int64, int),
    (("args", "collective"), "n", bool, lambda v: v is not None),
    (("ph",), "e", bool, lambda v: v == "X"),
    (("args", "input_dims"), "l", np.int64, len),
])
def test_every_kind_equals_the_python_expression_on_real_events(attrs, kind, dtype, expect):
    arg = "X" if kind == "e" else None
    got = column(EVENTS, None, attrs, kind, dtype, arg)
    want = np.array([expect(_get(e, attrs)) for e in EVENTS], dtype=dtype)
    assert np.array_equal(got, want, equal_nan=True)
    idx = np.arange(len(EVENTS) - 1, -1, -3)  # a subset, out of order
    assert np.array_equal(column(EVENTS, idx, attrs, kind, dtype, arg), want[idx], equal_nan=True)


def test_lookups_call_missing_in_first_seen_order_as_the_python_lookup_does():
    mine, theirs = Ids(), Ids()
    got = column(EVENTS, None, ("name",), "i", np.int32, mine)
    want = [theirs[e.name] for e in EVENTS]
    assert got.tolist() == want and list(mine) == list(theirs)
    codes = CATEGORY_CODE.copy()
    assert column(EVENTS, None, ("cat",), "b", np.int8, codes).tolist() == [
        CATEGORY_CODE.copy()[e.cat] for e in EVENTS]


def test_objects_of_other_types_are_read_by_getattr():
    """The slot offset cached for the first type is never used for another (a subclass, or an
    object that only has the same attribute names)."""
    seq = [Event(ts=1.0), AnyCategoryEvent(ts=2.0, cat="new"), SimpleNamespace(ts=3),
           Event(ts=4.5, args=EventArgs(external_id=7)), SimpleNamespace(ts=5.0)]
    assert column(seq, None, ("ts",), "d", np.float64).tolist() == [1.0, 2.0, 3.0, 4.5, 5.0]
    assert column(seq[:2] + seq[3:4], None, ("args", "external_id"), "q", np.int64).tolist() == [-1, -1, 7]


def test_what_the_expression_refuses_is_refused():
    with pytest.raises(TypeError):
        column([SimpleNamespace(x=1.5)], None, ("x",), "q", np.int64)  # not an int: no truncation
    with pytest.raises(TypeError):
        column([SimpleNamespace(x="1")], None, ("x",), "d", np.float64)
    with pytest.raises(AttributeError):
        column([Event(), SimpleNamespace()], None, ("ts",), "d", np.float64)
    with pytest.raises(KeyError):
        column([Event(cat="kernel")], None, ("cat",), "b", np.int8, {})
    with pytest.raises(OverflowError):
        column([SimpleNamespace(x=2**70)], None, ("x",), "q", np.int64)
    with pytest.raises(IndexError):
        column([Event()], np.array([1]), ("ts",), "d", np.float64)
    with pytest.raises(ValueError):  # a column of the wrong width for the kind
        column([Event()], None, ("ts",), "d", np.float32)
