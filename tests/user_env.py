"""A Python environment that any local user can run: gpudiag from this checkout, its runtime
dependencies and torch, for tests where a second user's job runs real gpudiag and torch code.

The test venv may live where other users cannot read it (under root's home). Here its runtime
packages — the requirement closure of ``gpudiag`` and ``torch``, as installed in the test venv,
nothing else (no HTA, no jupyterlab) — are hard-linked (copied where links cannot cross file
systems) into a world-readable folder under ``/var/tmp``, keyed by their versions, and kept
across runs (about 25 000 files, 1 GB: once per dependency change, seconds with links). Each
test session then makes a bare venv on the base interpreter that points at them with a ``.pth``
file and holds a fresh copy of gpudiag's own packages, so it always runs the code under test.

Also what the root daemon's tests with second users share: a folder every user can reach
(``open_folder``; the fixtures ``module_base`` and ``user_python``, imported by name into a test
module), a second user's submit (``user_job``) and a second user's process forked from this one
(``fork_as``, its report read by ``child_report``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpudiag.agent.signals import closed_to_others

CACHE_ENV = "GPUDIAG_TEST_USER_ENV_CACHE"
DEFAULT_CACHE = Path("/var/tmp/gpudiag-test-user-env")
ROOTS = ("gpudiag", "torch")   # what a second user's job imports; their closure is copied


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> list[md.Distribution]:
    """The installed distributions ``ROOTS`` need at run time (no extras), gpudiag excluded:
    its code is copied fresh from the checkout."""
    seen: dict[str, md.Distribution] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if _norm(name) in seen:
            continue
        dist = md.distribution(name)
        seen[_norm(name)] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [d for n, d in sorted(seen.items()) if n != "gpudiag"]


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    mode = src.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, stat.S_IMODE(mode) | stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0))


def _check_cache_root(root: Path) -> None:
    """Root runs this code later: the cache must be root's and closed to others' writes."""
    st = root.stat()
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AssertionError(f"{root}: not owned by uid {os.geteuid()} or writable by others; "
                             f"remove it or name another folder in ${CACHE_ENV}")


def dependencies() -> Path:
    """The world-readable folder holding the runtime closure (built once per versions)."""
    root = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    root.mkdir(mode=0o755, exist_ok=True)
    _check_cache_root(root)
    dists = runtime_closure()
    key = hashlib.sha256(f"{sys.version}|{sorted(f'{d.name}=={d.version}' for d in dists)}".encode())
    done = root / f"site-{key.hexdigest()[:16]}"
    if done.is_dir():
        return done
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    partial = root / f".{done.name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for dist in dists:
        for f in dist.files or []:
            src = Path(dist.locate_file(f)).resolve()
            if site not in src.parents or not src.is_file():
                continue  # console scripts and the like, outside site-packages
            _link_or_copy(src, partial / src.relative_to(site))
    for d, _, _ in os.walk(partial):
        os.chmod(d, 0o755)
    try:
        os.rename(partial, done)
    except OSError:   # another session built it meanwhile: use theirs
        shutil.rmtree(partial, ignore_errors=True)
    return done


def _copy_gpudiag(site: Path) -> None:
    """gpudiag's packages as installed from this checkout: ``gpudiag`` itself and each
    subpackage kept in a top-level folder of its own (setuptools ``package-dir``: collectors/,
    agent/, scheduler/, ...), found by asking the import system where it loads them from."""
    import gpudiag

    top = Path(gpudiag.__file__).parent
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(top, site / "gpudiag", ignore=ignore)
    for folder in sorted(top.parent.iterdir()):
        if folder == top or not (folder / "__init__.py").is_file():
            continue
        spec = importlib.util.find_spec(f"gpudiag.{folder.name}")
        if spec is not None and spec.origin and Path(spec.origin).parent == folder:
            shutil.copytree(folder, site / "gpudiag" / folder.name, ignore=ignore)
    # its metadata too, as an install leaves it: gpudiag's version is read from it
    version = md.version("gpudiag")
    info = site / f"gpudiag-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gpudiag\nVersion: {version}\n")


def interpreter() -> Path:
    """This Python, or the system's of the same minor version (same ABI, so the same binary
    wheels) where this one lives in a folder other users cannot reach (pyenv under /root)."""
    base = Path(sys._base_executable).resolve()
    if closed_to_others(base.parent) is None:
        return base
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    alt = shutil.which(v, path="/usr/local/bin:/usr/bin:/bin")
    if alt and closed_to_others(Path(alt).resolve().parent) is None:
        return Path(alt).resolve()
    raise AssertionError(f"other users cannot run {base} ({closed_to_others(base.parent)}) and there is no "
                         f"{v} in /usr/local/bin, /usr/bin or /bin: install one (e.g. Debian's {v})")


def make_user_env(folder: Path) -> Path:
    """A venv in ``folder`` (which every user must be able to reach) that runs gpudiag and torch
    for anyone; returns its python. Made by hand (pyvenv.cfg, a link to the interpreter, an
    empty site-packages) since a system Python may come without its venv module's extras."""
    deps = dependencies()
    py = interpreter()
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (folder / "bin").mkdir()
    os.symlink(py, folder / "bin" / "python")
    (folder / "pyvenv.cfg").write_text(f"home = {py.parent}\ninclude-system-site-packages = false\n"
                                       f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    (site / "gpudiag-test-deps.pth").write_text(f"{deps}\n")
    _copy_gpudiag(site)
    for d, _, files in os.walk(folder):
        os.chmod(d, 0o755)
        for f in files:
            p = Path(d) / f
            if not p.is_symlink():
                os.chmod(p, p.stat().st_mode | stat.S_IROTH)
    return folder / "bin" / "python"


# -- the root daemon's tests with second users (test_local_scheduler_hostile/_limits, test_one_box_signals)

# what a second user's job is given: no variable of the test's own environment
PATH_ENV = {"PATH": "/usr/bin:/bin"}


@contextmanager
def open_folder(prefix: str) -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp_path is private to root), removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def module_base() -> Iterator[Path]:
    """A folder every user can reach, for the whole module (it holds ``user_python``'s venv)."""
    with open_folder("gpudiag-users-") as d:
        yield d


@pytest.fixture(scope="module")
def user_python(module_base: Path) -> Path:
    """The python of a venv in ``module_base`` that every user can run (``make_user_env``)."""
    return make_user_env(module_base / "venv")


def user_job(user: pwd.struct_passwd, sock: Path, cmd: list[str], gpus: int = 1, **extra: object) -> int:
    """Submit ``cmd`` to the daemon at ``sock`` as ``user`` (a reserved job, 1 s grace, started
    in /), through the protocol as their own client would; returns the job's id."""
    from gpudiag.scheduler.local.protocol import call
    from tests.system.local_scheduler.test_local_scheduler import run_as

    answer = run_as(user.pw_uid, user.pw_gid, lambda: call(sock, {
        "op": "submit", "gpus": gpus, "tier": "reserved", "grace_s": 1, "env": PATH_ENV, "cwd": "/",
        "cmd": cmd, **extra}))
    assert isinstance(answer, dict) and answer["ok"], answer
    return int(answer["id"])


def fork_as(uid: int, gid: int, work: Callable[[], object], *, alarm_s: float = 0,
            on_error: Callable[[str], object] = lambda e: {"error": e}) -> tuple[int, int]:
    """``work()`` in a fork of this process that has become ``uid``:``gid`` with no other groups,
    as a second user's process would be (this interpreter lives where other users cannot start
    it, so a fork is how a second user's client runs here); ``alarm_s`` (whole seconds, 0: none)
    ends one that hangs. Returns (its pid, the fd of its report: ``work``'s value as JSON, or
    ``on_error("Type: message")`` of what it raised); ``child_report`` reads it and reaps it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            signal.alarm(int(alarm_s))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps(work())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = json.dumps(on_error(f"{type(e).__name__}: {e}"))
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    return pid, r


def child_report(child: tuple[int, int]) -> object:
    """What a ``fork_as`` child reported (``{}`` where it wrote nothing), once it has ended."""
    pid, fd = child
    with os.fdopen(fd, "rb") as f:
        out = json.loads(f.read() or b"{}")
    os.waitpid(pid, 0)
    return out
