"""tools/ci_summary.py: the closing table of tools/run-tests.sh and its one total line, read from real JUnit files
that pytest writes here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "tools" / "ci_summary.py"

CASES = '''
import time, pytest
def test_slow(): time.sleep(0.3)
def test_fails(): assert False
def test_quick(): pass
def test_skipped(): pytest.skip("why")
'''


def test_the_table_adds_phases_and_sorts_tests_by_time(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    report = tmp_path / "report"
    report.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--junitxml={report / 'unit.xml'}", str(tmp_path / "test_cases.py")],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout  # one test fails on purpose
    (report / "phases").write_text("setup 240 0\nunit 90 1\nslurm 600 0\n")
    out = subprocess.run([sys.executable, str(SUMMARY), str(report / "phases"), str(report)],
                         capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert "setup           4.0  ok" in lines and "unit            1.5  exit 1" in lines, out
    assert "total          15.5" in lines, out
    slowest = lines.index("the 15 slowest tests (seconds)")
    assert lines[slowest + 1].endswith("test_cases::test_slow"), out
    assert lines[-1] == "total: 2 passed, 1 failed, 1 skipped", out


def test_side_by_side_phases_report_the_wall_clock(tmp_path: Path) -> None:
    (tmp_path / "phases").write_text("setup 240 0\nslurm 1500 0\nunit 300 0\nlocal 900 0\n")
    out = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path / "phases"), str(tmp_path), "1800",
                          "slurm | unit, local"], capture_output=True, text=True, check=True).stdout
    assert "total          30.0  (wall clock)" in out.splitlines(), out  # not the 49 minutes the phases add up to
    assert "slurm | unit, local" in out and out.strip().splitlines()[-1] == "total: 0 passed, 0 failed, 0 skipped"
