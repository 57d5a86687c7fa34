"""The scheduling policy's settings as command-line options, each default read from ``Policy``.

Why: one default per knob, held by ``Policy`` (``scheduler/model.py``). ``gpudiag scheduler
serve`` and ``gpudiag sim`` take the same options, so a replay runs with the settings the
daemon runs with; ``--help`` prints the value ``Policy`` holds; the Settings table of
docs/scheduler.md is checked against both (tests/unit/test_scheduler_settings.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from gpudiag.durations import format_duration, parse_duration
from gpudiag.scheduler.model import Policy

# option -> (its Policy field, help)
OPTIONS: dict[str, tuple[str, str]] = {
    "--min-runtime": ("min_runtime_s", "No job is preempted before it has run this long (no thrashing)."),
    "--efficiency-delay": ("max_efficiency_delay_s",
                           "The most a low MFU may delay a job: its part of the aging bound."),
}


def _param(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


# Where the Slurm controller's default is another one (``scheduler serve --backend slurm``): said
# in that command's --help, so the default shown is true for each backend.
SLURM_DEFAULTS = {"--min-runtime": "the cluster's PreemptExemptTime (scontrol show config)"}


def policy_options(f: Callable[..., Any] | None = None, *, backends: bool = False) -> Callable[..., Any]:
    """Add the options of ``OPTIONS``, defaults formatted from ``Policy()``; ``backends``: the
    command also runs the Slurm controller (``SLURM_DEFAULTS`` named in the help)."""
    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        for option, (field, text) in reversed(OPTIONS.items()):
            slurm = f" Default with --backend slurm: {SLURM_DEFAULTS[option]}; without:" \
                if backends and option in SLURM_DEFAULTS else ""
            f = click.option(option, _param(option), default=format_duration(getattr(Policy(), field)),
                             show_default=True, metavar="DURATION",
                             help=f"{text} (Policy.{field}){slurm}")(f)
        return f
    return add(f) if f is not None else add


def with_options(policy: Policy, values: dict[str, str]) -> Policy:
    """``policy`` with the options' values (click's parameters by name) applied."""
    changes: dict[str, Any] = {field: parse_duration(values[_param(option)], option)
               for option, (field, _) in OPTIONS.items()}
    return dataclasses.replace(policy, **changes)
