"""Settings in one place: docs/scheduler.md's Settings table, ``Policy`` and the CLI agree.

Every ``Policy`` field has one row; each row's default is the field's default; each option the
row names has that default and shows it in ``--help``; the README's synopses quote the same
values. A default changed in one place and not the others fails here.
"""

from __future__ import annotations

import dataclasses
import re

import click
from click.testing import CliRunner

from gpudiag.cli import main
from gpudiag.commands.policy_options import OPTIONS
from gpudiag.durations import parse_duration
from gpudiag.scheduler.model import Policy
from tests.conftest import REPO

NOT_SETTINGS = {"name"}   # a policy's label in results, not a knob
OTHER_OPTIONS = {("submit", "--grace"): "default_grace_s", ("serve", "--max-pending"): "max_pending_per_user",
                 ("serve", "--stalled"): "stalled_action", ("serve", "--stalled-after"): "stalled_after_s"}


def _table() -> dict[str, tuple[str, list[str]]]:
    """field -> (default as written, [option references]) from the Settings section."""
    text = (REPO / "docs" / "scheduler.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, list[str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(\w+)`", cells[1]) if len(cells) == 5 else None
        if m is None:
            continue
        assert m.group(1) not in rows, f"{m.group(1)}: two rows"
        rows[m.group(1)] = (cells[2], re.findall(r"`gpudiag ([^`]+)`", cells[3]))
    return rows


def _value(written: str, field: str):
    if written in ("on", "off"):
        return written == "on"
    if written.startswith("`"):
        return written.strip("`")
    if field.endswith("_s"):
        return parse_duration(written, field)
    return float(written)


def _option(ref: str) -> tuple[click.Parameter, str]:
    *words, flag = ref.split()
    cmd: click.Command = main
    for w in words:
        cmd = cmd.get_command(click.Context(cmd), w)
    [param] = [p for p in cmd.params if flag in p.opts]
    return param, " ".join(words)


def test_every_policy_field_has_one_row_with_its_default():
    rows = _table()
    fields = {f.name: f.default for f in dataclasses.fields(Policy)}
    assert set(rows) == set(fields) - NOT_SETTINGS
    for field, (written, _) in rows.items():
        assert _value(written, field) == fields[field], f"{field}: table {written}, Policy {fields[field]}"


def test_every_option_a_row_names_defaults_to_policy_and_says_so_in_help():
    named = set()
    for field, (_, refs) in _table().items():
        for ref in refs:
            param, cmd = _option(ref)
            assert param.show_default, ref
            default = parse_duration(param.default, ref) if field.endswith("_s") else param.default
            assert default == getattr(Policy(), field), ref
            out = CliRunner().invoke(main, [*cmd.split(), "--help"]).output
            assert f"[default: {param.default}]" in " ".join(out.split()), ref
            named.add((cmd.split()[-1], ref.split()[-1], field))
    # and every option whose default comes from Policy is in the table
    want = {(c, o, f) for (c, o), f in OTHER_OPTIONS.items()}
    want |= {(c, o, f) for o, (f, _) in OPTIONS.items() for c in ("serve", "sim")}
    assert named == want


def test_the_readme_synopses_quote_the_same_defaults():
    readme = (REPO / "README.md").read_text()
    fields = {**{o: f for o, (f, _) in OPTIONS.items()}, "--grace": "default_grace_s"}
    quoted = 0
    for option, field in fields.items():
        for value in re.findall(rf"\[{option} ([^\]\s]+)\]", readme):
            assert parse_duration(value, option) == getattr(Policy(), field), (option, value)
            quoted += 1
    assert quoted >= len(fields)
