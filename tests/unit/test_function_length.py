"""No function in hpc_grpo is over MAX_LINES lines (decorators excluded, docstring and body included): a longer one
holds more than one job, and its parts are then neither named nor testable on their own."""

from __future__ import annotations

import ast
from pathlib import Path

import hpc_grpo

MAX_LINES = 100
PACKAGE = Path(hpc_grpo.__file__).parent


def long_functions(root: Path, limit: int) -> list[str]:
    """'path:line name (N lines)' for every function or method under `root` longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_package_is_over_the_limit() -> None:
    too_long = long_functions(PACKAGE, MAX_LINES)
    assert not too_long, f"functions over {MAX_LINES} lines, split them into functions of one job each:\n" + \
        "\n".join(too_long)


def test_the_walker_finds_a_long_function_and_counts_its_lines(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    body = "\n".join(f"        x{n} = {n}" for n in range(MAX_LINES))  # def line + MAX_LINES body lines
    (pkg / "sub" / "mod.py").write_text(f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions(pkg, MAX_LINES) == [f"pkg/sub/mod.py:6 long ({MAX_LINES + 1} lines)"]
    assert long_functions(pkg, MAX_LINES + 1) == []
