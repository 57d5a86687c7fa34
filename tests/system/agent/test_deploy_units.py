"""The systemd units gpudiag ships (agent and scheduler), and those its docs show, say what they mean.

systemd ignores, with a warning, a key it does not know and a value it cannot parse, so a unit
with ``Delegate=yes  # why`` starts, and runs without delegation; ``KillMode=process  # why``
left the default, and ``systemctl restart`` killed every job. Each unit is checked by
``systemd-analyze verify`` where systemd is installed, and always by ``tests.systemd_units``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.systemd_units import parse, problems, units_in_markdown

ROOT = REPO
INSTALLED_EXE = "/opt/gpudiag/venv/bin/gpudiag"   # the units' ExecStart: where the docs install it
# the issue's unit, from docs/scheduler-daemon.md before it was fixed
ISSUE_UNIT = """[Service]
ExecStart=/usr/local/bin/gpudiag scheduler serve
Delegate=yes          # the jobs' cgroups are children of the service's cgroup
KillMode=process      # stopping the daemon stops the daemon: jobs keep running, and are re-adopted
Restart=on-failure
"""


def shipped_units() -> dict[str, Path]:
    """The unit files as the installed package holds them (package data), by name."""
    agent = resources.files("gpudiag.agent") / "deploy" / "gpudiag-agent.service"
    sched = resources.files("gpudiag.scheduler.local") / "deploy" / "gpudiag-scheduler.service"
    return {p.name: Path(str(p)) for p in (agent, sched)}


def test_both_shipped_units_have_no_comment_after_a_value_and_only_known_keys():
    units = shipped_units()
    assert set(units) == {"gpudiag-agent.service", "gpudiag-scheduler.service"}
    for name, path in units.items():
        assert problems(path.read_text(), name) == []


def test_the_scheduler_unit_delegates_its_cgroup_and_a_restart_keeps_the_jobs():
    unit = parse(shipped_units()["gpudiag-scheduler.service"].read_text())
    service = unit["Service"]
    assert service["Delegate"] == ["yes"] and service["KillMode"] == ["process"]
    assert service["ExecStart"][0].startswith(f"{INSTALLED_EXE} scheduler serve ")
    assert service["User"] == ["root"] and int(service["LimitNOFILE"][0]) > 1024
    for sandbox in ("ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges"):   # jobs inherit them
        assert sandbox not in service
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_units_shown_in_the_docs_are_well_formed():
    shown = {d.name: units_in_markdown(d.read_text()) for d in sorted((ROOT / "docs").glob("*.md"))}
    assert shown["scheduler-daemon.md"], "docs/scheduler-daemon.md shows the scheduler's unit"
    for page, units in shown.items():
        for i, text in enumerate(units):
            assert problems(text, f"docs/{page} unit {i + 1}") == []


def test_the_reader_finds_what_systemd_would_ignore():
    found = problems(ISSUE_UNIT + "FooBar=1\n[Servce]\nType=simple\n", "issue")
    assert [f.split(": ", 1)[1].split(" (")[0].split(":")[0] for f in found] == [
        "a comment after a value", "a comment after a value", "unknown key 'FooBar' in [Service]",
        "unknown section [Servce]"], found
    assert problems("Type=simple\n[Service]\nExecStart=/bin/true \\\n  --flag # not a comment\n", "x") == [
        "x:1: a line outside any section: Type=simple",
        "x:4: a comment after a value (systemd reads it as part of ExecStart's value): "
        "ExecStart=/bin/true    --flag # not a comment"]


def _verify(tmp_path: Path, name: str, text: str) -> list[str]:
    """``systemd-analyze verify``'s complaints about the unit, with its ExecStart pointed at this
    gpudiag (verify checks that the command exists)."""
    exe = Path(sys.executable).with_name("gpudiag")
    assert exe.exists(), exe
    path = tmp_path / name
    path.write_text(text.replace(INSTALLED_EXE, str(exe)).replace("/usr/local/bin/gpudiag", str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                       timeout=60)
    return [line for line in (r.stdout + r.stderr).splitlines() if name in line]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed here: the "
                    "reader (tests.systemd_units) checks the same things")
def test_systemd_analyze_verify_accepts_both_units_and_rejects_the_issues(tmp_path):
    for name, path in shipped_units().items():
        assert _verify(tmp_path, name, path.read_text()) == []
    said = _verify(tmp_path, "issue.service", ISSUE_UNIT)
    assert any("Invalid controller name 'yes'" in line for line in said), said
    assert any("Failed to parse kill mode" in line for line in said), said
