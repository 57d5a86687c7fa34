"""The distribution installs one top-level module, ``gpudiag``, with everything it reads at run
time: the user's top-level folders (collectors/, agent/, ...) map under it, so a generic name
never lands on a user's sys.path."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_the_wheel_holds_only_gpudiag_and_its_run_time_files(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    [wheel] = tmp_path.glob("gpudiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"gpudiag", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for needed in ("gpudiag/collectors/torch_bootstrap.py", "gpudiag/collectors/bootstrap/sitecustomize.py",
                   "gpudiag/analyzers/diagnose.py", "gpudiag/reports/templates/report.html.j2",
                   "gpudiag/agent/deploy/grafana-dashboard.json", "gpudiag/scheduler/policy.py"):
        assert needed in names, needed
