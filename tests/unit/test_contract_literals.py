"""Each contract is spelled once: metric names, the agent's address, environment variables and
scrape limits in ``gpudiag/contract.py``, the run directory's file names in ``gpudiag/rundir.py``,
the version in ``pyproject.toml``.

Read from the source (string constants, f-string parts and assignments; docstrings and comments
are prose and do not count): a second spelling elsewhere in the six code folders fails, naming
the file and line. Tests are not scanned: asserting on an exposition's text is how they check it.

Two kinds of file spell names themselves, by design or for now:
- the job-side modules run in the job's Python without gpudiag (docs/layout.md): the names they
  spell must be names the contract defines;
- PENDING: files being rewritten on other branches when the contract came in; each must still
  hold a second spelling (so the list shrinks as they are cleaned) and is checked once its line
  here is removed.
"""

from __future__ import annotations

import ast
import re
from importlib.metadata import version
from pathlib import Path

import gpudiag
from gpudiag import contract, rundir
from tests.conftest import REPO
from tests.unit.test_layering import JOB_SIDE, source_modules

CONTRACT = REPO / "gpudiag" / "contract.py"
RUNDIR = REPO / "gpudiag" / "rundir.py"
JOB_SIDE_FILES = {str(REPO / "collectors" / (s.replace(".", "/") + ".py")) for s in JOB_SIDE}
# file -> why it still spells contract names (the fleet rewrite, i42; the scheduler rewrite, i44)
PENDING = {
}

_NAMES = {v: k for k, v in vars(contract).items()
          if k.isupper() and isinstance(v, str) and k not in ("GPU_PREFIX", "JOB_PREFIX", "METRICS_PATH",
                                                              "AGENT_HOST")}
# limits whose value is a number: a second definition under the same name is the duplicate
_REDEFINED = {"MAX_SCRAPE_BYTES", "SCRAPE_TIMEOUT_S", "AGENT_PORT", "AGENT_LISTEN", "AGENT_URL"}
# any metric or variable of ours, known or not: a new one belongs in the contract
_OURS = re.compile(r"\bgpudiag_(?:gpu|job|agent|host|nvml)_\w+|\bGPUDIAG_[A-Z0-9_]+"
                   + rf"|:{contract.AGENT_PORT}\b")
_LAYOUT_FILES = {rundir.RUN_JSON, rundir.DIAGNOSIS_JSON, rundir.REPORT_HTML, rundir.GPU_SAMPLES,
                 rundir.HOST_SAMPLES, rundir.TRACE_GLOB}
_LAYOUT_DIRS = {rundir.SAMPLES, rundir.TRACES, rundir.STACKS}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spellings(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every contract literal, unknown name of ours, or contract constant
    redefined, in one source file."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docs:
            if isinstance(node.value, str):
                found += [(node.lineno, m) for m in _OURS.findall(node.value)]
                if node.value in _LAYOUT_FILES:
                    found.append((node.lineno, node.value))
            elif node.value == contract.AGENT_PORT and not isinstance(node.value, bool):
                found.append((node.lineno, str(node.value)))
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              and isinstance(node.right, ast.Constant) and node.right.value in _LAYOUT_DIRS):
            found.append((node.lineno, f'/ "{node.right.value}"'))
        elif isinstance(node, ast.Assign):
            found += [(node.lineno, f"{t.id} = ...") for t in node.targets
                      if isinstance(t, ast.Name) and t.id in _REDEFINED]
    return found


def _source_files() -> list[Path]:
    return sorted(p for p in source_modules().values() if p not in (CONTRACT, RUNDIR))


def test_each_contract_literal_appears_once():
    wrong, still_pending = [], set()
    for path in _source_files():
        rel = str(path.relative_to(REPO))
        found = spellings(path)
        if str(path) in JOB_SIDE_FILES:
            # the job side spells names itself, but only names the contract defines
            found = [(n, w) for n, w in found if w.startswith("GPUDIAG_") and w not in _NAMES]
        if rel in PENDING:
            if found:
                still_pending.add(rel)
            continue
        wrong += [f"{rel}:{n}: {w}" for n, w in found]
    assert wrong == []
    assert sorted(set(PENDING) - still_pending) == [], "cleaned: remove these from PENDING"


def test_the_literal_check_finds_a_planted_second_spelling(tmp_path):
    """A metric name in a query, an environment variable, the agent's port and a run-dir path,
    each spelled again, are all found; the same words in a docstring are not."""
    src = tmp_path / "planted.py"
    src.write_text('"""Reads gpudiag_job_mfu_ratio from GPUDIAG_RUN_DIR."""\n'
                   'Q = "max(gpudiag_job_mfu_ratio)"\n'
                   'import os\nD = os.environ.get("GPUDIAG_RUN_DIR")\n'
                   'URL = f"http://{host}:9835/metrics"\n'
                   'def p(run_dir):\n    return run_dir / "samples" / "gpu.jsonl"\n')
    assert sorted(w for _, w in spellings(src)) == sorted(
        ['gpudiag_job_mfu_ratio', 'GPUDIAG_RUN_DIR', ':9835', '/ "samples"', 'gpu.jsonl'])


def test_the_contract_defines_each_value_once():
    values = [v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values))


def test_the_version_comes_from_pyproject_only():
    # the [project] table's version line (tomllib is 3.11+; the project supports 3.10)
    pyproject = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert gpudiag.__version__ == version("gpudiag") == pyproject
    assigned = [f"{p.relative_to(REPO)}" for p in source_modules().values()
                if re.search(r"^__version__\s*=", p.read_text(), re.M)]
    assert assigned == []
