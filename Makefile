# The two commands the README promises:
#   make demo   builds .venv, installs gpudiag (+ torch==2.13.0), runs the bundled CPU training
#               script (a small CNN behind a slow DataLoader) under `gpudiag profile` and prints
#               the verdict. No GPU needed.
#   make test   builds .venv with the test extras, installs the system packages the tests
#               drive (Debian's chromium and prometheus, when missing) and runs ruff, then
#               pytest with mypy (make typecheck) and the wheel check below beside its first
#               pass (pytest's solo pass last, so its summaries close the output).
#   make wheel  builds the sdist and, from it, a wheel with the C extension into dist/.
#   make wheel-check  installs that wheel into a clean venv (dependencies from the index) and
#               runs `gpudiag analyze` on a shared trace: what a user's `pip install` gets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch comes from the extras of pyproject.toml, where it is pinned once (the CPU wheel of
# the test machines; an unpinned torch pulls a multi-GB CUDA build): the demo
# installs the `torch` extra, the tests the `test` extra, which includes it.

.PHONY: test-unit test-timing demo test lint typecheck clean system-deps wheel wheel-check wheel-run

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip compiles what it installs one file at a time (18.8k files with the test extras: 53 of the
# 118 s the install took on the 2-core AMD EPYC VM); compileall on every core does it in 30 s.
# Files this Python cannot compile (torch ships a 3.12-syntax test helper) are left as pip
# leaves them, uncompiled; compileall's list of them is kept in the venv. The installed
# packages' own test suites (folders test/ and tests/: 3,694 of the 18.8k files, 10 of 37 MB:
# pandas, sympy, scipy...) are not what gpudiag or its tests import, and are left out
# (VENV_COMPILE); a file left out that is imported is compiled then, as without compileall.
COMPILE := $(BIN)/python -m compileall -q -j 0
VENV_COMPILE := $(COMPILE) -x '/tests?/'

$(VENV)/.installed-core: $(BIN)/python pyproject.toml analyzers/_gather.c
	$(BIN)/pip install -q --no-compile -e '.[torch]'
	$(VENV_COMPILE) $(VENV)/lib > $(VENV)/compileall.log 2>&1 || true
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml analyzers/_gather.c
	$(BIN)/pip install -q --no-compile -e '.[test]'
	$(VENV_COMPILE) $(VENV)/lib > $(VENV)/compileall.log 2>&1 || true
	touch $@ $(VENV)/.installed-core

demo: $(VENV)/.installed-core
	rm -rf runs/demo
	$(BIN)/gpudiag profile --out runs/demo -- $(BIN)/python benchmarks/workloads/demo_train.py

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

system-deps:
	bash .ci/install-test-deps.sh

# mypy --strict ([tool.mypy] in pyproject.toml) on the core (with its commands and live views), the
# analyzers, collectors, agent and reports; scheduler/ is read for its types, not yet checked. mypy cannot follow
# setuptools' package-dir (analyzers/ installs as gpudiag.analyzers), so it reads a tree of links
# laid out as the package installs, rebuilt each run so a new module is never missed.
TYPECHECKED := -p gpudiag.analyzers -p gpudiag.commands -p gpudiag.live -p gpudiag.collectors -p gpudiag.agent \
	-p gpudiag.reports -m gpudiag \
	$(patsubst gpudiag/%.py,-m gpudiag.%,$(filter-out gpudiag/__init__.py,$(wildcard gpudiag/*.py)))
typecheck: $(VENV)/.installed-test
	rm -rf .typecheck && mkdir -p .typecheck/gpudiag
	for f in gpudiag/*; do ln -s ../../$$f .typecheck/gpudiag/; done
	for d in collectors analyzers reports agent scheduler; do ln -s ../../$$d .typecheck/gpudiag/$$d; done
	$(BIN)/mypy $(TYPECHECKED)

# pytest in two passes: the lanes (tests/unit and each folder of tests/system, tests/conftest.py)
# in five workers at once, many of them waiting on real daemons, then tests/system/alone (marked
# `solo` by its folder, and collected alone: the whole tree's collection, to deselect it, was ~6.5
# CPU-s of that pass) with nothing beside it. Five, not four: the Slurm lanes (a third of the
# pass's test time) wait on Slurm's own delays with almost no CPU (54 CPU-s over their 688 s in a
# clean clone's pass), and with four workers the pytest tree used 1.5 of the 2 cores; with five,
# the same tests' pass took 708 s where four took 813-885 s beside the same niced process (the
# 2-core AMD EPYC VM, 2026-12-01). The type check and
# the wheel check run beside the first pass (its lanes mostly wait: load 2-3 on 2 cores), their
# output printed after it; every step runs whatever the others gave, and make fails if any did.
# Seven workers (five before): the first pass is bound by its lanes' waits, not the CPU (a clean
# clone at five, 2-core EPYC VM family 23, 2026-12-03: 653 s wall, 3,005 s of tests over five
# workers, a bound of 601 s, and 900 CPU-s, 1.38 of the 2 cores); reports' and the agent's
# modules are lanes of their own (tests/conftest.py PER_MODULE) so the longest lanes split too.
# Measured at seven, the same VM and day: 603, 645 and 677 s (3,658 s of tests, 984 CPU-s,
# 1.63 cores): the waits now overlap and the CPU is the bound, so the gain over five is within
# the runs' spread; what shortens the pass now is less CPU, not more workers.
PASS1_WORKERS ?= 7
# The tests' modules as pytest imports them, their asserts rewritten: pytest caches that beside
# each module but writes no cache where PYTHONDONTWRITEBYTECODE is set (it still reads one), so
# each of the first pass's workers rewrote the whole tree as it collected it (seven workers' start,
# 2-core AMD EPYC VM, 2026-12-03: 41.8 CPU-s, 16.3 from the cache). `make test` fills the cache
# first with a collection that may write (8.5 CPU-s), beside ruff, the compiling and the wheel's
# build (~14 s together, from a clean tree); what it finds wrong the passes report, as they
# collect again.
test: $(VENV)/.installed-test system-deps
	@rm -rf .checks && mkdir -p .checks
	@( env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -p no:cacheprovider --collect-only tests \
	  > .checks/collect.log 2>&1; touch .checks/collect.done ) &
	$(BIN)/ruff check .
	@# gpudiag's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (as on the
	@# project's CI machines) each of the suite's ~470 gpudiag processes compiled them afresh
	@$(COMPILE) gpudiag collectors analyzers reports agent scheduler benchmarks > /dev/null
	@$(MAKE) -s wheel > .checks/wheel.log 2>&1 || { cat .checks/wheel.log; exit 1; }
	@while [ ! -e .checks/collect.done ]; do sleep 0.1; done
	@rc=0; \
	for c in typecheck wheel-run; do \
		( $(MAKE) -s $$c > .checks/$$c.log 2>&1; echo $$? > .checks/$$c.rc ) & \
	done; \
	$(BIN)/python -m pytest -q -n $(PASS1_WORKERS) -m 'not timing and not solo' --junitxml=.checks/pass1.xml || rc=$$?; \
	wait; \
	for c in typecheck wheel-run; do \
		cat .checks/$$c.log; \
		[ "$$(cat .checks/$$c.rc)" = 0 ] || { echo "make test: $$c failed (above)"; rc=1; }; \
	done; \
	$(BIN)/python -m pytest -q -m solo tests/system/alone --junitxml=.checks/solo.xml || rc=$$?; \
	exit $$rc

# the sdist, then a wheel built from it (so the wheel holds only what the sdist ships), with
# this venv's setuptools (pyproject.toml's build requirement)
wheel: $(VENV)/.installed-test
	rm -rf dist
	$(BIN)/python -c "from setuptools import build_meta as b; b.build_sdist('dist')"
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist dist/gpudiag-*.tar.gz

SHARED ?= ../shared
wheel-check: wheel
	$(MAKE) -s wheel-run

# the install-and-analyse half of wheel-check, on the wheel already in dist/ (make test runs it
# beside pytest; building the sdist there would race test_packaging's build over the egg-info)
wheel-run:
	rm -rf .whl/venv
	$(PYTHON) -m venv .whl/venv
	.whl/venv/bin/pip install -q dist/gpudiag-*.whl
	cd .whl && venv/bin/gpudiag analyze $(abspath $(SHARED))/traces/a100-nccl-2rank > analyze.txt
	grep -q VERDICT .whl/analyze.txt && echo "wheel-check: the installed wheel analysed a shared trace"

# the pure tests alone (no daemon, no job started): the edit-test loop
test-unit: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n 2 tests/unit

# predicted vs applied fixes, timed on real CPU jobs: run on a quiet machine (docs/diagnosis.md)
test-timing: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m timing

clean:
	rm -rf $(VENV) runs .bench .pytest_cache dist build .whl .typecheck .mypy_cache .checks
