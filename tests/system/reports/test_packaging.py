"""The distribution installs one top-level module, ``gpudiag``, with everything it reads at run
time: the user's top-level folders (collectors/, agent/, ...) map under it, so a generic name
never lands on a user's sys.path. Its one C extension (analyzers/_gather.c) is built where a
compiler is; where none is, the wheel still builds and installs, and the installed gpudiag
warns once and gives the same diagnosis through the pure-Python fold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analyzers import _gather, gather_py, trace_fold
from gpudiag.analyzers.trace_loader import load_rank
from tests.conftest import REPO, TRACES


def build_wheel(sdist: Path, out: Path, env: dict[str, str] | None = None) -> Path:
    """A wheel built from ``sdist`` as pip builds it (unpacked into a folder of its own, so
    nothing of an earlier build is reused), with this venv's setuptools."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(sdist)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    [wheel] = out.glob("gpudiag-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist as `make wheel` builds it, and wheels built from it: with the C extension, and
    as on a machine without a C compiler (``CC=false``: every compile fails)."""
    root = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           "b.build_sdist(sys.argv[1])", str(root)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [sdist] = root.glob("gpudiag-*.tar.gz")
    return {"C": build_wheel(sdist, root / "c"),
            "no-compiler": build_wheel(sdist, root / "no-cc", {"CC": "false"})}


def installed(wheel: Path, folder: Path) -> Path:
    """The wheel installed into a fresh venv at ``folder`` that borrows this venv's packages
    (numpy, msgspec, ...) through a .pth line, so that this venv's editable gpudiag (a finder
    run by its own .pth, which a borrowed folder's .pth files are not) cannot answer an import
    the wheel fails: its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    borrowed = sysconfig.get_path("purelib")
    (site / "borrowed.pth").write_text(borrowed + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    return python


def test_the_wheel_holds_only_gpudiag_and_its_run_time_files(wheels):
    names = zipfile.ZipFile(wheels["C"]).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"gpudiag", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for needed in ("gpudiag/collectors/torch_bootstrap.py", "gpudiag/collectors/bootstrap/sitecustomize.py",
                   "gpudiag/analyzers/diagnose.py", "gpudiag/reports/templates/report.html.j2",
                   "gpudiag/agent/deploy/grafana-dashboard.json", "gpudiag/scheduler/policy.py"):
        assert needed in names, needed
    assert any(n.startswith("gpudiag/analyzers/_gather.") and n.endswith(".so") for n in names), names


def test_without_a_compiler_the_wheel_installs_and_analyses_alike_with_one_warning(wheels, tmp_path):
    assert not [n for n in zipfile.ZipFile(wheels["no-compiler"]).namelist() if n.endswith(".so")]
    trace = TRACES / "a100-nccl-2rank"
    out = {}
    for kind, wheel in wheels.items():
        python = installed(wheel, tmp_path / kind)
        proc = subprocess.run([str(python), "-m", "gpudiag", "analyze", "--json", str(trace)],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        where = subprocess.run([str(python), "-c", "import gpudiag.analyzers.trace_fold as t; "
                                "print(t.__file__, t.gather.__module__)"],
                               capture_output=True, text=True, cwd=tmp_path).stdout.split()
        # the installed wheel ran, not the checkout, with the reader it was built with
        assert where[0].startswith(str(tmp_path / kind)), where
        assert where[1].endswith({"C": "_gather", "no-compiler": "gather_py"}[kind]), where
        out[kind] = proc
    warned = [ln for ln in out["no-compiler"].stderr.splitlines() if "C column reader" in ln]
    assert len(warned) == 1 and "warning" in warned[0], out["no-compiler"].stderr
    assert "C column reader" not in out["C"].stderr
    assert json.loads(out["no-compiler"].stdout) == json.loads(out["C"].stdout)


@pytest.mark.parametrize("trace", ["a100-nccl-2rank", "mi250"])
def test_a_trace_folds_to_the_same_columns_with_the_python_fallback(trace, monkeypatch):
    path = TRACES / trace / "rank-0.json.gz"
    c = load_rank(path)
    monkeypatch.setattr(trace_fold, "gather", gather_py.gather)
    fallback = load_rank(path)
    assert trace_fold.gather is not _gather.gather and fallback.names == c.names
    arrays = {k: v for k, v in vars(c).items() if isinstance(v, np.ndarray)}
    assert len(arrays) > 10, sorted(arrays)
    for name, col in arrays.items():
        assert np.array_equal(getattr(fallback, name), col, equal_nan=col.dtype.kind == "f"), name
