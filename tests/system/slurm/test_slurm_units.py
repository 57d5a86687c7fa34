"""The Slurm controller's systemd units (agent/deploy/gpudiag-slurm*.service) load cleanly and
run commands gpudiag accepts: ``systemd-analyze verify`` with no complaint where systemd is
installed (else: every key one systemd knows, no comment after a value), and each Exec line's
options parsed by the real ``gpudiag scheduler serve``."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.commands.scheduler_cmd import serve
from tests.paths import REPO

ROOT = REPO
UNITS = [ROOT / "agent" / "deploy" / f"{n}.service" for n in ("gpudiag-slurm", "gpudiag-slurm-watchdog")]
INSTALLED = "/opt/gpudiag/venv/bin/gpudiag"      # the path the units name; the test's venv stands in
# the keys these units may use (systemd.unit(5), systemd.service(5), systemd.exec(5))
KNOWN = {"Unit": {"Description", "After", "Wants", "Requires", "Before", "Documentation"},
         "Service": {"Type", "User", "Group", "StateDirectory", "Environment", "ExecStart", "ExecStopPost",
                     "Restart", "RestartSec", "RestartPreventExitStatus", "TimeoutStopSec", "NoNewPrivileges",
                     "ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths"},
         "Install": {"WantedBy"}}


def _sections(unit: Path) -> list[tuple[str, str, str]]:
    out, section = [], ""
    for line in unit.read_text().splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{unit.name}: {line!r} is not Key=Value"
        out.append((section, key, value))
    return out


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_the_unit_has_only_keys_systemd_knows_and_no_comment_after_a_value(unit):
    for section, key, value in _sections(unit):
        assert key in KNOWN.get(section, set()), f"{unit.name}: [{section}] {key}"
        assert "#" not in value, f"{unit.name}: {key}={value} (systemd takes no comment after a value)"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path):
    gpudiag = Path(sys.executable).parent / "gpudiag"
    for unit in UNITS:
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, str(gpudiag)))
    p = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in UNITS)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_each_exec_line_is_a_command_gpudiag_accepts(unit):
    execs = [v for s, k, v in _sections(unit) if k.startswith("Exec")]
    assert execs
    for line in execs:
        argv = shlex.split(line)
        assert argv[0] == INSTALLED and argv[1:3] == ["scheduler", "serve"], line
        ctx = serve.make_context("serve", argv[3:])
        assert ctx.params["backend"] == "slurm", line
    env = [v for s, k, v in _sections(unit) if k == "Environment"]
    # the controller, its ExecStopPost and the watchdog: one ledger
    assert env == ["GPUDIAG_SLURM_STATE=/var/lib/gpudiag-slurm/controller.json"]
