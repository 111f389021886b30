"""pytest imports test modules by basename (rootdir-relative packages are not used here): two test files with one
name in different folders stop the whole run at collection ("import file mismatch"), as a fresh clone showed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_its_own_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == [], "rename one of each pair (e.g. test_X_slurm.py)"
