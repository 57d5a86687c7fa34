"""gpudiag's job bootstrap: put on PYTHONPATH by ``gpudiag profile``; arms when torch loads.

Python imports the first ``sitecustomize`` on sys.path at start-up. This one installs an
import hook that calls ``gpudiag.collectors.torch_bootstrap.arm(torch)`` right after ``import
torch`` finishes, then hands over to any other ``sitecustomize`` further down sys.path, so a
site's own customisation still runs. Processes that never import torch pay nothing.

The bootstrap module is loaded from the file beside this folder under its own name,
``gpudiag.collectors.torch_bootstrap`` (it needs only the standard library and torch): the job's
``sys.path`` is never extended, so a job with its own ``collectors`` or ``agent`` package sees
exactly the modules it would see without gpudiag, and a job whose Python has torch but not
gpudiag (gpudiag installed with pipx, the job in conda) is still observed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_MODULE = "gpudiag.collectors.torch_bootstrap"


def _load_bootstrap() -> types.ModuleType:
    mod = sys.modules.get(_MODULE)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(
        _MODULE, os.path.join(os.path.dirname(_HERE), "torch_bootstrap.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"gpudiag: cannot load {_MODULE} from {os.path.dirname(_HERE)}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[_MODULE]
        raise
    return mod


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            real_exec(module)
            try:
                _load_bootstrap().arm(module)
            except Exception as e:  # noqa: BLE001 - never break the job
                sys.stderr.write(f"gpudiag: bootstrap not armed: {e}\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]  # the hook: this loader, this once
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize we shadowed, if there is one."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_gpudiag_next_sitecustomize", candidate)
            if spec and spec.loader:
                try:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                except Exception as e:  # noqa: BLE001 - the site's own file: any error, reported
                    sys.stderr.write(f"gpudiag: the site's sitecustomize failed: {e}\n")
            return


if os.environ.get("GPUDIAG_RUN_DIR") and "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchWatcher())
_chain_next_sitecustomize()
