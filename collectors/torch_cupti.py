"""CUPTI teardown after each trace window, so the job runs after the window as it ran before it.

Kineto, torch's profiler backend, leaves CUPTI attached when a trace stops unless the
environment variable ``TEARDOWN_CUPTI`` is ``"1"`` when it stops (libkineto reads it with
``getenv`` at teardown, and decides at start-up from it whether CUPTI may be re-initialised
lazily for the next trace). Left attached, CUPTI keeps instrumenting every launch: the job stays
10-20% slower for the rest of its life (pytorch/pytorch#144455, #146604); on an H200 the steps
after gpudiag's window ran 23-36% slower than those before it. Under ``--monitor``, which is
meant to stay on, that cost would never end.

Teardown was held back by torch for jobs that use CUDA graphs: re-initialising CUPTI after a
teardown crashed them (CUDA 11 and 12 before 12.6; torch itself still sets ``TEARDOWN_CUPTI=0``
for ``torch.compile`` with CUDA graphs on those versions). So:

- ``gpudiag profile`` puts ``TEARDOWN_CUPTI=1`` in the job's environment before it starts
  (``job_env``), unless the user set ``TEARDOWN_CUPTI`` themselves (their value stands) or
  asked ``--cupti-teardown off``;
- in ``auto`` mode the bootstrap sets it back to ``"0"`` just before a window opens if the job
  has captured a CUDA graph (``CUDAGraph.capture_begin`` is watched from ``import torch`` on)
  or compiles with inductor's CUDA graphs; ``on`` tears down whatever the job does;
- what was done, and why, is recorded per rank in ``bootstrap-rank-N.json`` and in run.json.

Only the standard library is used here: the bootstrap loads this file into the job's Python.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV = "TEARDOWN_CUPTI"  # what libkineto reads
MODE_ENV = "GPUDIAG_CUPTI_TEARDOWN"  # what gpudiag asked: auto | on | off | user
MODES = ("auto", "on", "off")

_graphs_seen: list[str] = []  # why the job counts as using CUDA graphs (first reason)


def job_env_settings(environ: dict[str, str], mode: str) -> dict[str, str]:
    """The variables ``gpudiag profile`` adds to the job's environment for ``mode``.

    A ``TEARDOWN_CUPTI`` the user set is theirs: gpudiag records it and never changes it."""
    if mode not in MODES:
        raise ValueError(f"--cupti-teardown {mode!r}: use one of {', '.join(MODES)}")
    if ENV in environ:
        return {MODE_ENV: "user"}
    if mode == "off":
        return {MODE_ENV: "off"}
    return {MODE_ENV: mode, ENV: "1"}


def watch_graphs(torch: Any) -> None:  # the job's torch
    """Note the first CUDA graph the job captures (torch.cuda.graph, cudagraph trees, by hand)."""
    try:
        cls = torch.cuda.graphs.CUDAGraph
    except AttributeError:
        return
    orig = cls.capture_begin
    if getattr(orig, "_gpudiag_watch", False):
        return

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _graphs_seen:
            _graphs_seen.append("the job captured a CUDA graph")
        return orig(self, *args, **kwargs)

    capture_begin._gpudiag_watch = True  # type: ignore[attr-defined]  # the mark that it is wrapped
    cls.capture_begin = capture_begin


def _uses_graphs() -> str | None:
    if _graphs_seen:
        return _graphs_seen[0]
    cfg = sys.modules.get("torch._inductor.config")
    try:
        if cfg is not None and cfg.triton.cudagraphs:
            return "torch.compile runs with CUDA graphs (inductor's triton.cudagraphs)"
    except AttributeError:
        pass
    return None


def before_window() -> dict[str, Any]:
    """Just before a trace window opens: decide teardown for this window; returns the record.

    ``mode`` is what gpudiag was asked, ``value`` what ``TEARDOWN_CUPTI`` is now (what Kineto
    will read when this window stops, unless torch changes it itself: ``after_window``)."""
    mode = os.environ.get(MODE_ENV, "")
    rec: dict[str, Any] = {"mode": mode or "not set by gpudiag"}
    if mode == "auto" and os.environ.get(ENV) == "1":
        why = _uses_graphs()
        if why:
            os.environ[ENV] = "0"
            rec["skipped"] = (f"{why}: CUPTI teardown crashed such jobs on re-initialisation "
                              "(CUDA < 12.6), so CUPTI stays attached and the steps after the "
                              "window may run slower; --cupti-teardown on forces it")
    rec["value"] = os.environ.get(ENV)
    return rec


def after_window(rec: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """After the window stopped: what Kineto read (torch may have set it itself, for graphs).

    ``teardown`` is whether CUPTI was released; without CUDA activity there was no CUPTI to
    release (a CPU job), which ``cuda`` says."""
    out = dict(rec)
    value = os.environ.get(ENV)
    out["value"] = value
    out["cuda"] = cuda
    out["teardown"] = value == "1" and cuda
    if value != rec.get("value"):
        out["changed_by_torch"] = f"{rec.get('value')} -> {value}"
    return out
