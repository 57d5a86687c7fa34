"""The import direction DESIGN.md promises, read from the source: commands sit on top, and every
package imports only what docs/layout.md's table allows it.

A module below the command line (``reports``, ``scheduler``, ``gpudiag.live``, ...) that imports
a command drags click options and a command's private helpers into code that is not a command,
and two commands that import each other cannot be loaded or changed one at a time (issue 30:
``scheduler_cmd`` and ``scheduler_slurm`` shared ``quota_of`` in a cycle; ``reports/top_view``
read ages through ``commands/queue``'s ``_age``). Every import counts, those inside functions too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

# source folder -> the package it installs as (pyproject.toml's package-dir)
PACKAGES = {"gpudiag": "gpudiag", "collectors": "gpudiag.collectors", "analyzers": "gpudiag.analyzers",
            "reports": "gpudiag.reports", "agent": "gpudiag.agent", "scheduler": "gpudiag.scheduler"}
COMMANDS = "gpudiag.commands"


def source_modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import statement in the file."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: `from . import x`, `from ..pkg import y`
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]).rstrip(".")
            names = [a.name for a in node.names]
            out.append((base, names))
            out += [(f"{base}.{n}", []) for n in names]   # `from pkg import module`
    return out


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_module_below_the_commands_imports_a_command():
    mods = source_modules()
    assert len(mods) > 100 and "gpudiag.reports.top_view" in mods and "gpudiag.commands.queue" in mods
    wrong = [f"{m} imports {name}" for m, path in mods.items() if not _within(m, COMMANDS)
             for name, _ in _imports(m, path) if _within(name, COMMANDS)]
    assert wrong == []


def test_no_command_imports_another_commands_private_helpers_or_imports_in_a_cycle():
    mods = {m: p for m, p in source_modules().items() if _within(m, COMMANDS)}
    graph: dict[str, set[str]] = {}
    private = []
    for m, path in mods.items():
        for name, names in _imports(m, path):
            if name in mods and name != m:
                graph.setdefault(m, set()).add(name)
                private += [f"{m} imports {name}.{n}" for n in names if n.startswith("_")]
    assert private == []

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    assert [m for m in graph if reaches(m, m, set())] == []


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    """The parser this file relies on finds a lazy ``from ... import _private`` (what top_view did)."""
    src = tmp_path / "view.py"
    src.write_text("def age(s):\n    from gpudiag.commands.queue import _age\n    return _age(s)\n")
    assert ("gpudiag.commands.queue", ["_age"]) in _imports("gpudiag.reports.view", src)


# -- docs/layout.md's table, read as the rule ----------------------------------------------------
LAYOUT = REPO / "docs" / "layout.md"
# run inside the job by file, without gpudiag installed (docs/layout.md): standard library and torch
JOB_SIDE = ("torch_bootstrap", "thread_waits", "page_faults", "torch_cupti", "torch_syncs",
            "torch_collectives", "stall_watch", "blackbox", "bootstrap.sitecustomize")


def _table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header starts with ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def layout_rules(text: str) -> dict[str, set[str]]:
    """package -> the packages its modules may import (docs/layout.md's first table); folders
    without a package (benchmarks, tests) are not rules."""
    rules = {}
    for _folder, package, _job, may in _table_rows(text, "folder"):
        if package == "–":
            continue
        rules[package.strip("`")] = set(re.findall(r"`(gpudiag[\w.]*)`", may))
    return rules


def _unit(module: str, units: set[str]) -> str:
    """The most specific package of the table that holds ``module``."""
    return max((u for u in units if _within(module, u)), key=len)


def layering_violations(rules: dict[str, set[str]], mods: dict[str, Path]) -> list[str]:
    wrong = []
    for m, path in mods.items():
        own = _unit(m, set(rules))
        for name, _ in _imports(m, path):
            if name not in mods or name == m:
                continue   # a third-party module, or `from pkg import name` naming a function
            theirs = _unit(name, set(rules))
            if theirs != own and theirs not in rules[own]:
                allowed = ", ".join(sorted(rules[own])) or "nothing"
                wrong.append(f"{m} imports {name} ({own} may import: {allowed})")
    return sorted(set(wrong))


def test_every_import_follows_the_layout_table():
    rules = layout_rules(LAYOUT.read_text())
    assert {"gpudiag", "gpudiag.analyzers", "gpudiag.scheduler.slurm", "gpudiag.commands"} <= set(rules)
    assert rules["gpudiag"] == set() and rules["gpudiag.analyzers"] == {"gpudiag"}
    assert layering_violations(rules, source_modules()) == []


def test_the_layout_check_fails_on_a_planted_violation(tmp_path):
    """An analyzer that imports a report (what DESIGN forbids) is named, with the rule it broke."""
    rules = layout_rules(LAYOUT.read_text())
    src = tmp_path / "planted.py"
    src.write_text("def f():\n    from gpudiag.reports.terminal import render_terminal\n")
    mods = {**source_modules(), "gpudiag.analyzers.planted": src}
    assert layering_violations(rules, mods) == [
        "gpudiag.analyzers.planted imports gpudiag.reports.terminal (gpudiag.analyzers may import: gpudiag)"]


def test_every_module_has_a_row_in_the_layout_and_every_row_a_module():
    rows = {r[0].strip("`") for r in _table_rows(LAYOUT.read_text(), "module")}
    files = {str(p.relative_to(REPO)) for p in source_modules().values()}
    assert sorted(files - rows) == [] and sorted(rows - files) == []


def test_the_job_side_modules_import_no_gpudiag():
    """They run in the job's Python, where gpudiag may not be installed."""
    mods = source_modules()
    wrong = [f"{m} imports {name}" for stem in JOB_SIDE
             for m in [f"gpudiag.collectors.{stem}"] for name, _ in _imports(m, mods[m])
             if name.startswith("gpudiag")]
    assert wrong == []


# being rewritten on the scheduler branch (i44): cleaned in its second pass
PRIVATE_PENDING: set[str] = set()


def _private_attributes(module: str, path: Path, mods: dict[str, Path]) -> list[str]:
    """``alias._name`` where ``alias`` is another of our modules imported under that name
    (``from pkg import mod as alias``, ``import pkg.mod as alias``)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    aliases[a.asname] = a.name
    return [f"{module} imports {aliases[node.value.id]}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and aliases[node.value.id] != module
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def private_imports(mods: dict[str, Path]) -> list[str]:
    """``from other_module import _name`` or ``other_module._name``: a module leaning on
    another's internals, which that module may change without looking for callers."""
    named = [f"{m} imports {name}.{n}" for m, path in mods.items()
             for name, names in _imports(m, path) if name in mods and name != m
             for n in names if n.startswith("_") and not n.startswith("__")]
    used = [w for m, path in mods.items() for w in _private_attributes(m, path, mods)]
    return sorted(set(named + used))


def test_no_module_imports_another_modules_private_names(tmp_path):
    assert [w for w in private_imports(source_modules()) if w not in PRIVATE_PENDING] == []
    assert PRIVATE_PENDING <= set(private_imports(source_modules())), "cleaned: remove from PRIVATE_PENDING"
    src = tmp_path / "planted.py"
    src.write_text("from gpudiag.units import _planted\nfrom gpudiag import units as u\nu._other(1)\n")
    assert private_imports({"gpudiag.units": REPO / "gpudiag" / "units.py", "gpudiag.planted": src}) == [
        "gpudiag.planted imports gpudiag.units._other", "gpudiag.planted imports gpudiag.units._planted"]
