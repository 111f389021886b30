"""Sandbox runner for untrusted code: `python -I -S code_sandbox.py` with one JSON job on stdin.

Policy completions are hostile by accident (loops, fork bombs, huge allocations) and, under a reward
that pays for passing tests, can learn to be hostile on purpose. So each completion's tests run in a
process of their own, started fresh by the scorer (hpc_grpo/rewards/code.py), which this file is:

- As root (the usual case in containers and CI): new network namespace (no interface is up, not even
  loopback, so no socket reaches anything), new mount namespace with private tmpfs on /tmp, /var/tmp
  and /dev/shm (everything written there vanishes with the namespace), new PID namespace (the code
  runs as its PID 1: killing it makes the kernel kill every process it ever started, daemons that
  double-forked and called setsid included), and a uid of its own from a locked pool, so RLIMIT_NPROC
  bounds a fork bomb (root ignores it) and the code cannot write into root's files.
- Always: limits on address space, CPU seconds, file size, open files and core dumps; stdin/stdout/
  stderr on /dev/null; a per-test wall deadline enforced from OUTSIDE the code (this runner watches
  a pipe and kills the code the moment one test overruns: the first timeout ends the completion, so
  a looping completion costs one per-test timeout, not one per test); a whole-job wall deadline.
- Without root: no namespaces and no uid switch; limits, its own process group killed at the end.

Stdlib only, run with -I -S (no site-packages, ~15 ms start-up): it must not import hpc_grpo or any
library that the code under test could tamper with. Output: one JSON object on stdout.
Known limit: the code shares its interpreter with the harness that reports pass/fail, so code that
searches its own process memory for the report nonce could forge a pass; the nonce stops accidents
(printing, os._exit(0), writing to random fds), not a deliberate in-process attack.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import secrets
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_MOVE = 8192

UID_BASE = int(os.environ.get("HPC_GRPO_SANDBOX_UID_BASE", "61000"))
UID_SLOTS = 256
LOCK_DIR = "/run/hpc-grpo-sandbox" if os.path.isdir("/run") else "/var/tmp/hpc-grpo-sandbox"
WORKDIR = "/tmp/work"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _claim_uid() -> tuple[int, int] | None:
    """A uid no other running sandbox uses, held by an flock that dies with this process."""
    os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
    start = secrets.randbelow(UID_SLOTS)
    for i in range(UID_SLOTS):
        slot = (start + i) % UID_SLOTS
        fd = os.open(os.path.join(LOCK_DIR, f"slot-{slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return UID_BASE + slot, fd
        except OSError:
            os.close(fd)
    return None


def _isolate(libc: ctypes.CDLL, uid: int) -> str:
    """Enter new mount/net/pid namespaces and mount private tmpfs; '' when done, else why not."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID) != 0:
        return f"unshare: {os.strerror(ctypes.get_errno())}"
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}"
    for target, size in ((b"/tmp", b"64m"), (b"/var/tmp", b"8m"), (b"/dev/shm", b"8m")):
        if os.path.isdir(target) and libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV,
                                                b"size=" + size + b",mode=1777") != 0:
            return f"mount tmpfs {target.decode()}: {os.strerror(ctypes.get_errno())}"
    why = _expose_python(libc)
    if why:
        return why
    os.makedirs(WORKDIR, mode=0o700)
    os.chown(WORKDIR, uid, uid)
    return ""


def _expose_python(libc: ctypes.CDLL) -> str:
    """Let the sandbox uid import the stdlib when Python lives under a private folder (pyenv in /root).

    Inside our own mount namespace only: the interpreter's prefix is bind-mounted aside, an empty
    tmpfs hides the private folder (so nothing else in it is visible), and the prefix is moved back to
    its old path. The host's permissions are never touched.
    """
    prefix = os.path.realpath(sys.base_prefix)
    parts = prefix.strip("/").split("/")
    private = None
    for i in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if not os.stat(path).st_mode & 0o001:
            private = path
            break
    if private is None:
        return ""
    stage = "/tmp/.hpc-grpo-python"
    os.makedirs(stage)
    steps = ((prefix.encode(), stage.encode(), None, MS_BIND | MS_REC),
             (b"tmpfs", private.encode(), b"tmpfs", MS_NOSUID | MS_NODEV))
    for src, dst, fstype, flags in steps:
        if libc.mount(src, dst, fstype, flags, b"size=1m,mode=0755" if fstype else None) != 0:
            return f"mount {dst.decode()}: {os.strerror(ctypes.get_errno())}"
    os.makedirs(prefix, exist_ok=True)
    if libc.mount(stage.encode(), prefix.encode(), None, MS_MOVE, None) != 0:
        return f"mount --move {prefix}: {os.strerror(ctypes.get_errno())}"
    return ""


def _limits(job: dict, n_tests: int) -> None:
    import resource

    mem = int(job["memory_mb"]) * 1024 * 1024
    cpu = int(job["per_test_timeout"] * (n_tests + 1)) + 1
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, 16 * 1024 * 1024), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(res, (value, value))
    if os.getuid() != 0:  # root ignores RLIMIT_NPROC; a non-root uid is bounded by it
        nproc = int(job.get("max_procs", 32))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _child(job: dict, report_fd: int, nonce: str, uid: int | None, workdir: str) -> None:
    """Runs in the forked process (PID 1 of the new namespace as root): drop privileges, run tests."""
    try:
        if uid is None:
            os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 1 << 16)
        os.chdir(workdir)
        tests = job["tests"]
        _limits(job, len(tests))
        if uid is not None:
            import resource

            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            nproc = int(job.get("max_procs", 32))
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    except BaseException as exc:  # never run the code with half the limits on
        os.write(report_fd, f"{nonce} fatal {type(exc).__name__}\n".encode())
        os._exit(3)
    _run_tests(job, report_fd, nonce)
    os._exit(0)


def _run_tests(job: dict, report_fd: int, nonce: str) -> None:
    """Phase 0 defines the program; then each test; one report line per phase (start, then result)."""
    import io

    code, tests = job["code"], job["tests"]

    def report(words: str) -> None:
        os.write(report_fd, f"{nonce} {words}\n".encode())

    def run(source: str, stdin: str | None, glb: dict) -> str | None:
        saved = sys.stdin, sys.stdout
        out = io.StringIO()
        if stdin is not None:
            sys.stdin, sys.stdout = io.StringIO(stdin), out
        try:
            exec(compile(source, "<completion>", "exec"), glb)  # noqa: S102 - the sandbox's whole purpose
        finally:
            sys.stdin, sys.stdout = saved
        return out.getvalue() if stdin is not None else None

    io_tests = any(isinstance(t, dict) for t in tests)
    glb: dict = {"__name__": "__main__" if io_tests else "solution"}
    report("start 0")
    if not io_tests:  # function tests: define once, then each assert sees the definitions
        try:
            run(job.get("setup", "") + "\n" + code, None, glb)
        except BaseException as exc:  # noqa: BLE001 - any failure of the program is a score, not a crash
            report(f"error 0 {type(exc).__name__}")
            return
    report("ok 0")
    for i, test in enumerate(tests, start=1):
        report(f"start {i}")
        try:
            if isinstance(test, dict):
                got = run(code, str(test.get("stdin", "")), {"__name__": "__main__"})
                ok = (got or "").split() == str(test.get("stdout", "")).split()
            else:
                run(test, None, glb)
                ok = True
        except BaseException as exc:  # noqa: BLE001 - AssertionError, SystemExit, MemoryError, ...
            report(f"fail {i} {type(exc).__name__}")
            continue
        report(f"{'pass' if ok else 'fail'} {i}")


def _kill(pid: int, own_group: bool) -> None:
    """SIGKILL the code. As PID 1 of its namespace that ends every process it started; without
    namespaces its process group is killed (a child that called setsid escapes: the limit of that mode)."""
    try:
        if own_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if own_group:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def supervise(job: dict) -> dict:
    """Run the job's tests under the limits; return counts, a status and the time taken."""
    t0 = time.monotonic()
    tests = job["tests"]
    per_test = float(job["per_test_timeout"])
    wall = float(job.get("wall_timeout") or per_test * (len(tests) + 1) + 1.0)
    nonce = secrets.token_hex(16)
    libc = _libc()
    uid = None
    isolation = "none"
    workdir = None
    if os.geteuid() == 0 and not job.get("no_namespaces"):
        claimed = _claim_uid()
        while claimed is None and time.monotonic() - t0 < wall:  # all 256 uids busy: wait, never run unisolated
            time.sleep(0.05)
            claimed = _claim_uid()
        why = "no free sandbox uid" if claimed is None else _isolate(libc, claimed[0])
        if why:
            return {"status": "sandbox_error", "passed": 0, "total": len(tests), "error": why,
                    "seconds": time.monotonic() - t0, "isolation": "failed"}
        uid, _lock_fd = claimed
        isolation, workdir = "namespaces+uid", WORKDIR
    if workdir is None:
        import tempfile

        workdir = tempfile.mkdtemp(prefix="hpc-grpo-sandbox-")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(job, write_fd, nonce, uid, workdir)
        os._exit(0)  # not reached
    os.close(write_fd)
    results: dict[int, str] = {}
    status, error = "ok", ""
    buf = b""
    current, started = 0, time.monotonic()
    done = False
    while not done:
        now = time.monotonic()
        deadline = min(started + per_test, t0 + wall)
        if now >= deadline:
            status = "timeout"
            break
        ready, _, _ = select.select([read_fd], [], [], deadline - now)
        if not ready:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break  # the code exited (or died): whatever it reported stands
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            words = line.decode("utf-8", "replace").split()
            if len(words) < 3 or words[0] != nonce or not words[2].isdigit():
                continue  # not from the harness
            kind, idx = words[1], int(words[2])
            if kind == "start":
                current, started = idx, time.monotonic()
            elif kind in ("pass", "fail", "ok", "error"):
                results[idx] = kind
                if kind == "error":
                    error = " ".join(words[3:])
                    done = True
            if idx == len(tests) and kind in ("pass", "fail"):
                done = True
    _kill(pid, own_group=uid is None)
    try:
        _, wstatus = os.waitpid(pid, 0)
    except ChildProcessError:
        wstatus = 0
    os.close(read_fd)
    if uid is None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    if results.get(0) == "error":
        status = "program_error"
    elif status == "ok" and len(results) < len(tests) + 1:
        status = "crashed"
        if os.WIFSIGNALED(wstatus):
            error = f"signal {os.WTERMSIG(wstatus)}"
    passed = sum(1 for i in range(1, len(tests) + 1) if results.get(i) == "pass")
    out = {"status": status, "passed": passed, "total": len(tests), "seconds": round(time.monotonic() - t0, 4),
           "isolation": isolation}
    if status == "timeout":
        out["timed_out_in"] = current
    if error:
        out["error"] = error
    return out


def main() -> int:
    job = json.loads(sys.stdin.read())
    sys.stdout.write(json.dumps(supervise(job)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
