"""hpc_grpo/compat.py's rule, enforced: every shim in its table still does what its row says, no other old name is
accepted, and none outlives its end date (then the shim and its row go). That old pickles and old pkg:// paths load
through the module shims is tests/unit/test_compat_paths.py; that nothing imports them is test_import_rules.py."""

from __future__ import annotations

import ast
import importlib
import os
import socket
from datetime import date
from pathlib import Path

import pytest

import hpc_grpo
from hpc_grpo import compat
from hpc_grpo.config import keys
from hpc_grpo.runstate import runs

MODULES = [s for s in compat.SHIMS if s.kind == compat.MODULE]


def expired(shims: tuple[compat.Shim, ...], today: date) -> list[str]:
    return [f"{s.old} ({s.kind}): past its end date {s.until}; remove it and its row in hpc_grpo/compat.py"
            for s in shims if today > s.until]


def test_no_shim_is_past_its_end_date() -> None:
    found = expired(compat.SHIMS, date.today())
    assert not found, "\n".join(found)


def test_the_date_check_reports_a_shim_one_day_late() -> None:
    shim = compat.SHIMS[0]
    assert expired((shim,), shim.until) == []
    assert expired((shim,), date.fromordinal(shim.until.toordinal() + 1)) == [
        f"{shim.old} ({shim.kind}): past its end date {shim.until}; remove it and its row in hpc_grpo/compat.py"]


@pytest.mark.parametrize("shim", MODULES, ids=[s.old for s in MODULES])
def test_a_module_shim_re_exports_exactly_its_names_from_the_new_home(shim: compat.Shim) -> None:
    old, new = importlib.import_module(shim.old), importlib.import_module(shim.new)
    assert tuple(old.__all__) == shim.names
    for name in shim.names:
        assert getattr(old, name) is getattr(new, name), (shim.old, name)


@pytest.mark.parametrize("shim", MODULES, ids=[s.old for s in MODULES])
def test_a_module_shim_holds_nothing_but_the_re_export(shim: compat.Shim) -> None:
    """A shim that grew code of its own would be a module someone imports; the table would then lie."""
    path = Path(importlib.import_module(shim.old).__file__ or "")
    body = ast.parse(path.read_text()).body
    kinds = [type(n).__name__ for n in body[1:]]  # after the docstring
    assert kinds == ["ImportFrom", "Assign"], (path, kinds)
    assert isinstance(body[1], ast.ImportFrom) and body[1].module == shim.new


def test_the_accepted_old_keys_are_the_tables() -> None:
    table = {s.old: s.new for s in compat.SHIMS if s.kind == compat.KEY}
    assert keys.ACCEPTED_ALIASES == table
    assert all(keys.canonical_key(old) == new for old, new in table.items())


def test_every_module_shim_is_a_file_of_the_package() -> None:
    root = Path(hpc_grpo.__file__).parent
    for shim in MODULES:
        rel = Path(*shim.old.split(".")[1:])
        assert (root / rel.with_suffix(".py")).is_file() or (root / rel / "__init__.py").is_file(), shim.old


def test_a_lock_record_of_the_old_format_names_its_holder(tmp_path: Path) -> None:
    """The RECORD shim: a 'HOST pid N' record is read as that holder, so a live holder on this host is not taken
    over as stale while its job runs."""
    assert any(s.kind == compat.RECORD for s in compat.SHIMS)
    lock = tmp_path / "ckpt.lock"
    lock.write_text(f"{socket.gethostname()} pid {os.getpid()}\n")
    holder = runs._read_holder(lock)
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    assert not holder.stale(now=holder.expires + 10)  # our pid is alive: not stale, whatever the clock says


def test_a_spec_frozen_with_the_old_key_still_loads(tmp_path: Path) -> None:
    """A run created before the rename requeues on today's code: its spec.yaml says checkpoint.keep."""
    from hpc_grpo.config.resolve import load_frozen, resolve_spec
    from hpc_grpo.launch.render import frozen_spec_text

    spec = resolve_spec("tiny-gsm8k", "local", ["checkpoint.keep_last=5"], run_name="old", now=0.0)
    text = frozen_spec_text(spec)
    assert "    keep_last: 5\n" in text
    frozen = tmp_path / "spec.yaml"
    frozen.write_text(text.replace("    keep_last: 5\n", "    keep: 5\n"))
    assert load_frozen(frozen).recipe.checkpoint.keep_last == 5
