"""Where `make test`'s wall time goes: each lane's summed test time, and its CPU seconds (the
``cpu_s`` property tests/conftest.py records), from the JUnit files the Makefile writes
(.checks/pass1.xml, .checks/solo.xml).

A lane (a folder of tests/system, or one module of tests/unit) runs on one xdist worker, so the
first pass can end no sooner than its longest lane, nor sooner than all lanes' time over the
workers. Printed with the ratio of the pass's wall time to that bound: near 1 the pass is as
short as its lanes allow, and only shorter lanes (or more workers) shorten it.

    python benchmarks/suite_lanes.py [.checks]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

WORKERS = 5  # the Makefile's `-n 5`
# folders each of whose modules is a lane (tests/conftest.py's PER_MODULE)
PER_MODULE = ("unit", "system/jobs")


def lane(classname: str) -> str:
    """tests.system.slurm.test_x -> system/slurm; tests.unit.test_y -> unit/test_y."""
    parts = classname.split(".")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    modules = [p for p in parts if p.startswith("test_")]
    if not modules:
        return "/".join(parts)
    at = parts.index(modules[0])
    folder = "/".join(parts[:at])
    return f"{folder}/{modules[0]}" if folder in PER_MODULE else folder


def cpu_of(case: ET.Element) -> float:
    """The test's CPU seconds (tests/conftest.py's ``cpu_s`` property), 0 where not recorded."""
    for prop in case.iter("property"):
        if prop.get("name") == "cpu_s":
            return float(prop.get("value", 0.0))
    return 0.0


def read(path: Path) -> tuple[float, dict[str, float], dict[str, float]]:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"{path}: no <testsuite> in it; is it pytest's --junitxml output?")
    lanes: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    for case in suite.iter("testcase"):
        lanes[lane(case.get("classname", ""))] += float(case.get("time", 0.0))
        cpu[lane(case.get("classname", ""))] += cpu_of(case)
    return float(suite.get("time", 0.0)), dict(lanes), dict(cpu)


def main(folder: Path) -> None:
    for name in ("pass1.xml", "solo.xml"):
        path = folder / name
        if not path.exists():
            print(f"{path}: missing (run `make test` first)")
            continue
        wall, lanes, cpu = read(path)
        total = sum(lanes.values())
        workers = WORKERS if name == "pass1.xml" else 1
        bound = max(max(lanes.values(), default=0.0), total / workers)
        print(f"{name}: wall {wall:.0f} s, tests {total:.0f} s over {workers} worker(s); "
              f"bound {bound:.0f} s; wall/bound {wall / bound if bound else float('nan'):.2f}")
        print(f"  CPU: {sum(cpu.values()):.0f} s in all, {sum(cpu.values()) / wall if wall else 0:.2f} "
              "cores over the wall time")
        big = sorted(lanes.items(), key=lambda kv: -kv[1])
        merged_unit = sum(v for k, v in big if k.startswith("unit/"))
        rows = [kv for kv in big if not kv[0].startswith("unit/")][:12]
        rows.append(("unit (all modules)", merged_unit))
        unit_cpu = sum(v for k, v in cpu.items() if k.startswith("unit/"))
        for k, v in rows:
            c = unit_cpu if k == "unit (all modules)" else cpu.get(k, 0.0)
            print(f"  {k:<34} {v:7.1f} s, CPU {c:7.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".checks"))
