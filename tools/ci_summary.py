"""The closing lines of tools/run-tests.sh: its phases with their minutes, the slowest tests, and one total line.

Why a script: the suite runs as several pytest phases (unit tests in parallel, then the Slurm and local tests), each
with its own JUnit file, and a reader of CI wants one table and one verdict, not five summaries to add up.

    python tools/ci_summary.py PHASES_FILE JUNIT_DIR [WALL_SECONDS [NOTE]]

PHASES_FILE holds one `name seconds exit_status` line per phase, in order; JUNIT_DIR the phases' JUnit XML files;
WALL_SECONDS the whole run's time (phases that ran side by side add up to more), NOTE a line saying which did.
Standard library only: it must run whatever the environment's state.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

SLOWEST = 15


@dataclass(frozen=True)
class Case:
    name: str
    seconds: float
    outcome: str  # passed, failed, error, skipped


def read_phases(path: Path) -> list[tuple[str, float, int]]:
    rows = []
    for line in path.read_text().splitlines():
        name, seconds, status = line.split()
        rows.append((name, float(seconds), int(status)))
    return rows


def read_cases(folder: Path) -> list[Case]:
    cases = []
    for xml in sorted(folder.glob("*.xml")):
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "passed"
            for child, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
                if case.find(child) is not None:
                    outcome = label
                    break
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append(Case(name, float(case.get("time") or 0.0), outcome))
    return cases


def render(phases: list[tuple[str, float, int]], cases: list[Case], wall_s: float | None = None,
           note: str = "") -> str:
    total_s = sum(s for _, s, _ in phases) if wall_s is None else wall_s
    lines = ["", "hpc-grpo CI phases", f"{'phase':<10} {'minutes':>8}  status"]
    for name, seconds, status in phases:
        lines.append(f"{name:<10} {seconds / 60:>8.1f}  {'ok' if status == 0 else f'exit {status}'}")
    lines.append(f"{'total':<10} {total_s / 60:>8.1f}  {'(wall clock)' if wall_s is not None else ''}".rstrip())
    if note:
        lines.append(note)
    lines += ["", f"the {SLOWEST} slowest tests (seconds)"]
    for case in sorted(cases, key=lambda c: c.seconds, reverse=True)[:SLOWEST]:
        lines.append(f"{case.seconds:>8.1f}  {case.name}")
    count = {k: sum(c.outcome == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    lines += ["", f"total: {count['passed']} passed, {count['failed'] + count['error']} failed, "
                  f"{count['skipped']} skipped"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    phases_file, junit_dir = Path(argv[1]), Path(argv[2])
    wall = float(argv[3]) if len(argv) > 3 else None
    print(render(read_phases(phases_file), read_cases(junit_dir), wall, argv[4] if len(argv) > 4 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
