"""Shared test fixtures: real test data lives in ../shared beside the repository.

``GPUDIAG_SHARED`` names another folder for it. Without that data the run fails at start
(``pytest_configure``), for every selection of tests: a test whose data is missing must not
pass by having nothing to check (an empty parameter list, a fallback input).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from gpudiag.diagnosis import Bottleneck, Diagnosis, Verdict

# The suite's verdict must not depend on the draw: by default every property test runs the same
# examples (derandomized), so CI and a developer see the same result, and a fixed budget of them
# (PROPERTY_EXAMPLES), so the suite's time does not grow with each property test's own choice
# (they had asked for 150-300: 1.5-3x the time for the same kinds of input). A property test sets
# no max_examples of its own. HYPOTHESIS_PROFILE=explore draws new examples each run, many more,
# to look for bugs (known: docs/scheduler.md, "Known gaps").
PROPERTY_EXAMPLES = 100
# Neither profile times the examples (no deadline, no too_slow health check): the suite must pass
# beside a busy process (a property test of the policy failed once at load 14 and passed at once
# when rerun: too_slow is the one check hypothesis makes on the wall clock besides the deadline).
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("fixed", derandomize=True, max_examples=PROPERTY_EXAMPLES, **_UNTIMED)
settings.register_profile("explore", derandomize=False, max_examples=10 * PROPERTY_EXAMPLES, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))

REPO = Path(__file__).resolve().parents[1]
SHARED_ENV = "GPUDIAG_SHARED"
SHARED = Path(os.environ.get(SHARED_ENV) or REPO.parent / "shared").resolve()
TRACES = SHARED / "traces"

# Every folder of ../shared/traces whose trace has GPU kernels (negative/ has none).
GPU_TRACE_DIRS = sorted(
    p.name for p in TRACES.iterdir() if p.is_dir() and p.name != "negative"
) if TRACES.is_dir() else []


def benchmark_module(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they are scripts, not a package), loaded once under
    a name of its own so it cannot shadow or be shadowed by an installed module."""
    key = f"gpudiag_benchmark_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def labels_of(v: Verdict) -> set[Bottleneck]:
    """A verdict's label, and its tie partner where its margin was within the step-time noise:
    two runs of one job agree where these sets meet (the issue's rule for a tie)."""
    return {v.label, v.tie_with} - {None}


def view_steps(d: Diagnosis, run: Path) -> set[int]:
    """Job step numbers behind the step time of the diagnosis' view: the reference steps it
    names (around the window, or before it alone where the steps after it were left out), or
    the traced steps (the traced view)."""
    from gpudiag.steps import window_steps

    if d.basis == "unprofiled-estimate":
        return set(d.dilation.reference_steps)
    [w] = [w for w in window_steps(run) if w.rank == 0]
    return {r.step for r in w.traced_rows}


def view_mfu(d: Diagnosis, own: dict, run: Path) -> float:
    """The job's own MFU over the steps behind the diagnosis' view (``view_steps``), at the peak
    the diagnosis used, by the view's statistic: the median of the reference steps, or the mean
    of the traced ones (the breakdown's) less the last, whose own timing includes the trace
    export done inside the job's step. ``own``: the job's own timer (tests/jobs/_timer.py), each
    step less the share other processes took of it by gpudiag's step timer (``gpudiag.pace``): the
    job's own pace, as ``Mfu.value`` (issue 38; on a machine other tests load, a wall-clock truth
    holds their noise: reference steps of 12-54 ms, medians 16% apart with one step's change)."""
    from gpudiag.pace import at_own_pace
    from gpudiag.rundir import read_bootstrap, read_host_cpu, read_steps
    from gpudiag.steps import window_steps

    steps = sorted(view_steps(d, run))
    statistic = statistics.median
    if d.basis != "unprofiled-estimate":
        steps, statistic = steps[:-1], statistics.mean
    else:
        # the job's own timing of the last step before each window holds the profiler's start
        # (done in gpudiag's step-end hook, inside the job's step; the step timer puts it in the
        # warm-up step): a small ops job's 5.2 ms step read 12.4 ms there, and with 8 reference
        # steps it moved the truth's median 8% here and 19% on a loaded CI clone (2026-11-29)
        started = {max(r.step for r in w.before_rows) for w in window_steps(run) if w.before_rows}
        steps = [s for s in steps if s not in started] or steps
    boot = read_bootstrap(run)
    # each step's own share (own step over wall step, by gpudiag's step timer), not its seconds:
    # the two timers' steps do not end at the same instant, and at the first traced step of a
    # CI run the step timer's held 8.7 ms the job's did not (28.0 ms against 19.3), of which
    # other processes took 20.0: less the seconds, the job's step read -0.7 ms and its MFU 0.77x
    own_share = {r.step: r.dt / (r.dt + r.machine_s)
                 for r in at_own_pace(read_steps(run, boot), read_host_cpu(run), boot)[0]
                 if r.dt + r.machine_s > 0}
    times = [own["step_seconds"][s - 1] * own_share.get(s, 1.0) for s in steps]
    return own["flops_per_step"] / statistic(times) / d.mfu.peak_flops


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a CI's timeout, `kill`) as Ctrl-C: pytest then tears the fixtures down, so the
    Slurm, munge, Prometheus and agent daemons they started are stopped, not left running."""
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    if not TRACES.is_dir():
        raise pytest.UsageError(
            f"test data missing: {TRACES} (lay the shared test data at {REPO.parent / 'shared'} "
            f"or name its folder in ${SHARED_ENV})")
    if not GPU_TRACE_DIRS:
        raise pytest.UsageError(f"test data incomplete: no GPU trace folders in {TRACES}")


# -- lanes: the folders under tests/ -----------------------------------------------------------

# tests/unit holds the pure tests (no daemon, no job started: the whole folder runs in about a
# minute, `make test-unit`); tests/system/<lane>/ the tests that drive real Slurm, Prometheus,
# Chromium, MLflow, root daemons and CPU training jobs, one folder a lane. Most of the system
# tests' time is spent waiting on those daemons (Slurm's GraceTime and KillWait, a controller's
# round, a Prometheus scrape), which leaves the CPU idle, so `make test` runs the lanes in
# several pytest-xdist workers at once. A lane stays whole on one worker, in file order, so its
# module fixtures are made once (an sdist built twice at once in the checkout broke one run when
# xdist split a module) and its tests run in the order they were written; a worker that finishes
# its lane takes the next. tests/system/alone holds the tests that make their own competitor and
# compare with their own quiet run (another lane's load would be a competitor they did not make):
# they are marked ``solo`` from their folder, and `make test` runs them afterwards, alone.
TESTS = Path(__file__).resolve().parent
SOLO_LANE = "system/alone"
UNIT = "unit"
# Folders each of whose modules is a lane of its own: tests/unit (pure: nothing shared to keep on
# one worker, so `make test-unit` spreads them over its workers) and system/jobs (CPU training jobs
# under `gpudiag profile`, each module with its own fixtures, no daemon shared between modules):
# as one lane, system/jobs was 681 of the first pass's 984 s in the project's CI clone at load
# 3-10 (its lanes' tests 3,299 s over four workers: 825 s), the pass's critical path.
PER_MODULE = (UNIT, "system/jobs", "system/reports", "system/agent")
# Lanes start longest first (by a full run's per-folder seconds: `benchmarks/suite_lanes.py` on
# the CI clone's JUnit files, 2-core AMD EPYC at load 3-10, 2026-11-29: local_scheduler 456 s,
# agent 431, slurm 402, slurm_faults 340, reports 305, distributed 242, jobs' modules 6-211, fleet
# 164, labels 84, unit's 195 in all), so that the last lane to start is a short one; a folder not
# named here starts after these.
LONGEST_FIRST = ("system/local_scheduler", "system/agent", "system/slurm", "system/slurm_faults",
                 "system/reports", "system/distributed", "system/jobs", "system/fleet",
                 "system/labels", "unit")


def lane_of(nodeid: str) -> str:
    """The test's folder under tests/ (``system/slurm``, ...); a module directly in tests/ is its
    own lane, and so is each module of the folders in PER_MODULE."""
    path = nodeid.split("::")[0]
    parts = Path(path).parts
    if "tests" in parts:
        parts = parts[parts.index("tests") + 1:]
    folder = "/".join(parts[:-1])
    if folder in PER_MODULE:
        return "/".join(parts)
    return folder or parts[-1]


def _folder(lane: str) -> str:
    return next((f for f in PER_MODULE if lane.startswith(f + "/")), lane)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the solo mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder is the test's lane and, under system/alone, its ``solo`` mark; items are put in
    lane order (LONGEST_FIRST) so that every xdist worker collects the same order to hand out."""
    rank = {lane: i for i, lane in enumerate(LONGEST_FIRST)}
    # `make test`'s solo pass collects tests/system/alone alone (collecting the whole tree to
    # deselect it cost that pass ~6.5 CPU-s, as long on 2 cores): a test marked solo elsewhere
    # would run in neither pass, so the mark is the folder's only
    stray = [item.nodeid for item in items
             if lane_of(item.nodeid) != SOLO_LANE and item.get_closest_marker("solo")]
    if stray:
        raise pytest.UsageError(f"marked solo outside tests/{SOLO_LANE} (move them there): {stray}")
    for item in items:
        if lane_of(item.nodeid) == SOLO_LANE:
            item.add_marker(pytest.mark.solo)
    items.sort(key=lambda item: rank.get(_folder(lane_of(item.nodeid)), len(rank)))  # stable: file order kept


CPU_AT_START = pytest.StashKey[float]()


def _cpu_used() -> float:
    """This process's CPU seconds and its reaped children's (the jobs and gpudiag processes a test
    ran, a daemon once its fixture stops it)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[CPU_AT_START] = _cpu_used()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each test's CPU seconds, setup to teardown, as the JUnit property ``cpu_s``: beside each
    lane's wall time, what it spent computing and what waiting (`benchmarks/suite_lanes.py` sums
    both per lane; a clean clone's first pass, 2026-11-30: 906 CPU-s over 602 s, the Slurm lanes
    628 s of it for 50 CPU-s)."""
    outcome = yield
    if call.when == "teardown" and CPU_AT_START in item.stash:
        outcome.get_result().user_properties.append(
            ("cpu_s", round(_cpu_used() - item.stash[CPU_AT_START], 3)))


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # xdist's types
    """xdist's scope scheduling with a lane as the scope, handed out in collection order (the
    order above), not xdist's own by number of tests. (Its ``xdist_group`` marks do not group
    under pytest 9, whose node ids no longer read the ``_nodeid`` that xdist 3.8 rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return LaneScheduling(config, log)


@pytest.fixture(scope="session")
def traces() -> Path:
    return TRACES


@pytest.fixture(autouse=True, scope="session")
def _cpu_peak_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the measured-CPU-peak cache out of the home directory, one for the whole run: the
    xdist workers share the folder above their own, so the peak is measured once (its lock
    makes the others wait) where each worker measured it, ~10-20 s of CPU apiece."""
    shared = run_wide(tmp_path_factory) / "gpudiag-cache"
    shared.mkdir(exist_ok=True)
    os.environ.setdefault("GPUDIAG_CACHE_DIR", str(shared))


def run_wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the whole pytest run: the one above each xdist worker's own,
    which every worker of the run shares; without xdist, the session's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


# -- one recorded run, shared by the tests that only read it -----------------------------------

# recorded by gpudiag profile's own sampler on an H200 (holds GPM NaNs, as NVML returns them)
H200_REPLAY = REPO / "tests" / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"
LOOP_JOB = REPO / "tests" / "jobs" / "loop_job.py"


@pytest.fixture(scope="session")
def replayed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``gpudiag profile`` run of the loop job (12 steps, 50 ms of input wait each, steps
    3-5 traced) with an H200's recorded counters replayed through the sampler every 50 ms, so it
    has a GPU timeline. Profiled once for the session: the HTML report's, the browser's and the
    sampler's tests only read it (each had profiled the same job again). A test that changes a
    run directory works on ``replayed_run_copy``. Once for the whole run, not per xdist worker
    (the sampler's lane and the reports' ran it one each, ~4 CPU-s apiece): the first worker to
    need it profiles it under a lock the others wait on, then all read the one run."""
    import fcntl

    shared = run_wide(tmp_path_factory) / "replayed"
    shared.mkdir(exist_ok=True)
    run, done = shared / "run", shared / "done"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released as the file closes
        if not done.exists():
            shutil.rmtree(run, ignore_errors=True)   # a worker's failed attempt: profile afresh
            proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run),
                                   "--backend", f"replay:{H200_REPLAY}", "--interval", "50ms", "--skip", "2",
                                   "--steps", "3", "--", sys.executable, str(LOOP_JOB), "--steps", "12",
                                   "--sleep", "0.05"], capture_output=True, text=True, timeout=300, cwd=REPO)
            assert proc.returncode == 0, proc.stderr
            done.touch()
    return run


@pytest.fixture
def replayed_run_copy(replayed_run: Path, tmp_path: Path) -> Path:
    """A copy of ``replayed_run`` the test may change."""
    return Path(shutil.copytree(replayed_run, tmp_path / "replayed-run"))


# -- one Slurm cluster for the session ------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The default cluster of tests/slurm_cluster.py (one node, 4 GPUs, root as SlurmUser),
    started once for the session and shared by the modules that use that configuration (each
    module's ``cluster`` fixture hands it on after ``reset()``); stopped by pid at the end. A
    module with another configuration (nodes, SlurmUser) starts its own."""
    from tests.slurm_cluster import slurm_running

    with slurm_running(tmp_path_factory.mktemp("slurm")) as c:
        yield c


# -- the local scheduler's tests (tests/test_local_scheduler*.py) ------------------------------

@pytest.fixture
def sched_factory(tmp_path):
    """Start daemons (``Sched`` of tests/system/local_scheduler/test_local_scheduler.py) on
    demand; each is stopped, and the jobs it left running killed, whatever the test did."""
    from tests.system.local_scheduler.test_local_scheduler import Sched

    made: list[Sched] = []

    def make(*args: str, base: Path | None = None, env: dict | None = None) -> Sched:
        s = Sched(base or tmp_path, *args, env=env)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def open_base():
    """A folder other users can reach (pytest's tmp_path is private to root)."""
    from tests.user_env import open_folder

    with open_folder("gpudiag-sched-") as d:
        yield d


@pytest.fixture
def users():
    """Two real unprivileged users (unique names), removed afterwards."""
    from tests.harness import unix_users

    with unix_users("gpsu") as made:
        yield made
