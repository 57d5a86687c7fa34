"""The scheduler's commands refuse a bad argument in one line, as they refuse everything else.

click answers a value it cannot convert (``gpudiag submit --gpus abc``) or an option it does not
know (``gpudiag cancel -5``: ``-5`` reads as an option) with three lines (usage, a hint, the
error), where every other refusal of these commands is one line and exit 2 (``BadInput``),
which is what a script parses. ``OneLine`` turns click's usage errors into that line, and the
job-id and GPU-count parsers below word the usual mistakes themselves.
"""

from __future__ import annotations

import re

import click

from gpudiag.errors import BadInput

_NUMBER = re.compile(r"[+-]?\d+")


class OneLine(click.Command):
    """A click command whose usage errors are one ``BadInput`` line naming the command's help."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: object) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:   # BadParameter, NoSuchOption, MissingParameter, ...
            names, p = [info_name or self.name or ""], parent
            while p is not None and p.parent is not None:   # the groups under gpudiag itself
                names.insert(0, p.info_name or "")
                p = p.parent
            raise BadInput(f"{e.format_message()} (see gpudiag {' '.join(names)} --help)") from None


def job_ids(args: tuple[str, ...], command: str) -> list[int]:
    """Job ids as typed (``cancel 12 13``); ``-5``, ``abc`` or an unknown ``--option``, one line each."""
    out = []
    for a in args:
        if _NUMBER.fullmatch(a):
            if int(a) < 1:
                raise BadInput(f"{command} {a}: job ids are positive whole numbers (gpudiag queue lists "
                               "them)")
            out.append(int(a))
        elif a.startswith("-"):
            raise BadInput(f"{command}: no such option {a} (see gpudiag {command} --help)")
        else:
            raise BadInput(f"{command} {a}: not a job id (a positive whole number; gpudiag queue lists them)")
    return out


def gpu_count(text: str) -> int:
    """``--gpus N`` as typed, as a number (``fields.gpus_error`` then says whether it is a count
    of GPUs): ``--gpus abc`` in one line, in the words the daemon uses."""
    from gpudiag.scheduler.local.fields import gpus_error

    if not _NUMBER.fullmatch(text.strip()):
        raise BadInput(f"{gpus_error(None)}, not {text!r} (e.g. gpudiag submit --gpus 2 -- python train.py)")
    return int(text)
