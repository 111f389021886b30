"""runs.checkpoint_lock without flock: an O_EXCL lock file with a lease, taken over from gone holders only."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.runstate import layout


def _no_flock(*_args: object) -> None:
    raise OSError(errno.ENOLCK, "No locks available")  # Lustre mounted without flock


def _writer(run_dir: str, log: str, rounds: int) -> None:
    fcntl.flock = _no_flock  # in this process too (forked children inherit the patch; say it anyway)
    for _ in range(rounds):
        with runs.checkpoint_lock(Path(run_dir), timeout_s=60):
            with open(log, "a") as f:
                f.write(f"start {os.getpid()}\n")
            time.sleep(0.05)
            with open(log, "a") as f:
                f.write(f"end {os.getpid()}\n")


def _write_holder(run_dir: Path, host: str, pid: int, expires: float, token: str = "theirs") -> Path:
    path = run_dir / layout.CHECKPOINT_LOCK
    path.write_text(json.dumps({"host": host, "pid": pid, "token": token, "expires": expires}))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_processes_exclude_each_other_without_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    _write_holder(tmp_path, runs._HOST, _dead_pid(), time.time() + 3600)  # all start by taking over a dead holder
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), str(log), 4)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 3 * 4 * 2
    for start, end in zip(lines[::2], lines[1::2]):
        assert start.startswith("start ") and end == "end " + start.split()[1], lines  # never interleaved
    assert not (tmp_path / layout.CHECKPOINT_LOCK).exists()
    assert not list(tmp_path.glob("*.aside"))


@pytest.mark.parametrize("holder", ["dead pid on this host", "expired lease on another host"])
def test_gone_holder_is_taken_over(tmp_path: Path, holder: str) -> None:
    if holder.startswith("dead"):
        _write_holder(tmp_path, runs._HOST, _dead_pid(), time.time() + 3600)
    else:
        _write_holder(tmp_path, "node-elsewhere", 4242, time.time() - 1)
    t0 = time.monotonic()
    with runs.checkpoint_lock(tmp_path, timeout_s=5):
        rec = json.loads((tmp_path / layout.CHECKPOINT_LOCK).read_text())
        assert (rec["host"], rec["pid"]) == (runs._HOST, os.getpid())
    assert time.monotonic() - t0 < 1.0


def test_a_record_that_does_not_parse_holds_until_its_file_is_a_lease_old(tmp_path: Path) -> None:
    """A record being written (or one hpc-grpo did not write) names no holder: its file's age stands in for a lease."""
    lock = tmp_path / layout.CHECKPOINT_LOCK
    lock.write_text(f"{runs._HOST} pid {_dead_pid()}\n")
    with pytest.raises(TimeoutError, match="unknown host"):
        with runs.checkpoint_lock(tmp_path, timeout_s=0.3):
            pass
    old = time.time() - runs.LEASE_S - 10
    os.utime(lock, (old, old))
    with runs.checkpoint_lock(tmp_path, timeout_s=5):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("holder", ["live pid on this host", "fresh lease on another host"])
def test_live_holder_is_not_taken_over(tmp_path: Path, holder: str) -> None:
    host, pid = (runs._HOST, os.getppid()) if holder.startswith("live") else ("node-elsewhere", 4242)
    # this host's live pid wins even past its lease; another host's fresh lease wins
    path = _write_holder(tmp_path, host, pid, time.time() + (-10 if holder.startswith("live") else 3600))
    with pytest.raises(TimeoutError, match=f"held by {host} pid {pid}"):
        with runs.checkpoint_lock(tmp_path, timeout_s=0.3):
            pass
    assert json.loads(path.read_text())["token"] == "theirs"


def test_release_leaves_a_lock_taken_over_by_someone_else(tmp_path: Path) -> None:
    with runs.checkpoint_lock(tmp_path, timeout_s=5):
        taker = tmp_path / "taker"
        taker.mkdir()
        _write_holder(taker, "node-elsewhere", 7, time.time() + 60, token="taker")  # a takeover: a new file there
        os.replace(taker / layout.CHECKPOINT_LOCK, tmp_path / layout.CHECKPOINT_LOCK)
    assert json.loads((tmp_path / layout.CHECKPOINT_LOCK).read_text())["token"] == "taker"
    assert not list(tmp_path.glob("*.aside"))


def _expires(path: Path) -> float:
    """The lease's expiry as a waiter reads it. The holder rewrites its record in place (truncate, then write) every
    LEASE_S / 4, so a read can land between the two and see a partial record, which the lock itself reads as a
    record being written (runs._read_holder); read again a moment later, as a waiter's next poll does."""
    for _ in range(100):
        try:
            return float(json.loads(path.read_text())["expires"])
        except ValueError:
            time.sleep(0.005)
    raise AssertionError(f"{path} held no whole record in 100 reads")


def test_holder_refreshes_its_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "LEASE_S", 0.4)
    path = tmp_path / layout.CHECKPOINT_LOCK
    with runs.checkpoint_lock(tmp_path, timeout_s=5):
        first = _expires(path)
        time.sleep(0.5)  # past the first expiry: only a refresh keeps the lease alive
        assert _expires(path) > time.time()
        assert _expires(path) > first
    assert not path.exists()


def test_submit_lock_holds_without_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit` takes the same lease lock on its own file: on a mount that refuses flock it still locks, and a
    second holder waits (here: times out naming the first)."""
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    run = tmp_path / "run"
    with runs.submit_lock(run):
        assert (run / layout.SUBMIT_LOCK).is_file()
        with pytest.raises(TimeoutError, match=f"pid {os.getpid()}"):
            with runs.submit_lock(run, timeout_s=0.2):
                pass
    assert not (run / layout.SUBMIT_LOCK).exists()
