"""The unprivileged user the tests run jobs, the reward and the commands as (nobody trains as root on a cluster)."""

from __future__ import annotations

import pwd
import shutil
import subprocess

import pytest

USER = "hpcgrpo-user"


def ensure_user() -> pwd.struct_passwd:
    """USER, made when missing (idempotent: another session may make it meanwhile). Fails, never skips: CI runs
    as root and must run the unprivileged halves."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.fail(f"useradd is missing: the tests that run as {USER} need it (Debian: passwd)", pytrace=False)
    proc = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", USER],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode not in (0, 9):  # 9: the name exists (made meanwhile)
        pytest.fail(f"useradd {USER} failed ({proc.returncode}): {proc.stderr}", pytrace=False)
    return pwd.getpwnam(USER)
