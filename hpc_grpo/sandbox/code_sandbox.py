"""Sandbox runner for untrusted code: `python -I -S code_sandbox.py` with one JSON job on stdin.

Policy completions are hostile by accident (loops, fork bombs, huge allocations) and, under a reward
that pays for passing tests, can learn to be hostile on purpose. So each completion's tests run in a
process of their own, started fresh by the scorer (hpc_grpo/rewards/code.py), which this file is.

How the code is isolated (namespaces, a minimal root, no privilege; or limits only, by the recipe's explicit
consent) lives beside this file in sandbox_namespaces.py, loaded by path; this file is the harness: the limits,
the child that runs the tests, the report protocol and its checks.

Always: limits on address space, CPU seconds, file size, open files, processes and core dumps; stdin/stdout/
stderr on /dev/null; a per-test wall deadline enforced from OUTSIDE the code (this runner watches a pipe and
kills the code the moment one test overruns: the first timeout ends the completion, so a looping completion
costs one per-test timeout, not one per test); a whole-job wall deadline.

Stdlib only, run with -I -S (no site-packages, ~15 ms start-up): it must not import hpc_grpo or any
library that the code under test could tamper with. Output: one JSON object on stdout.
`python -I -S code_sandbox.py --probe` prints {"isolation": mode, "why": ...}: what "auto" gets on this node.

The protocol (the scorer's side: hpc_grpo/rewards/code_tests.py): the job holds no expected answer. A split test
is a call (`add(1, 2)`): its result goes back as plain data (exact builtin types; an int subclass, an
object with a clever __eq__ or anything else is refused here, see _encode), and the scorer compares it
with the answer. A stdin test sends stdin only; the printed text goes back. So code that tampers with
this harness in its own interpreter (no-op exec, wrapped os.write, frames walked to the reporting
function, forged report lines) can change what is reported, not what a report is compared with: it
scores no more than code that honestly returns the same outputs. The supervisor still checks the report's
shape (the nonce, each test once, indices in range, bounded sizes: see _Reports).
Weak mode: a test that cannot be split (arbitrary statements) runs as a snippet in the code's own
interpreter and reports `ok` when it raised nothing. Code that searches its own process for the report
nonce and the pipe can forge that `ok`, so such tests are counted per problem ("weak") in the reward's
report.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the sandbox's interpreter imports no more than it needs
    from typing import Any


MAX_DEPTH = 100  # nesting of a returned value
VALUE_CAP = 1 << 20  # bytes of one encoded value (a call's result or a program's stdout)
REPORT_CAP = 8 << 20  # bytes of a report, at least; (tests + 1) x (VALUE_CAP + 4 KiB) when more: past it the code
# is killed and the tests not yet reported fail (no honest harness writes more: only a flood does)


def _sibling(name: str):  # noqa: ANN202 - a module
    """A module beside this file, loaded by path (under -I -S this folder is not on sys.path, and this runner
    must not import hpc_grpo): once per process, so the harness and the tests share one copy."""
    key = "hpc_grpo_sandbox." + name
    if key in sys.modules:
        return sys.modules[key]
    import importlib.util

    spec = importlib.util.spec_from_file_location(key, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     name + ".py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"no module {name}.py beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


ns = _sibling("sandbox_namespaces")
kernel = _sibling("sandbox_kernel")


def _limits(job: dict, n_tests: int) -> None:
    mem = kernel.address_space(int(job["memory_mb"]), int(job.get("max_procs", 32)))  # memory_mb for all together
    cpu = int(job["per_test_timeout"] * (n_tests + 1)) + 1
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, 16 * 1024 * 1024), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(res, (value, value))
    nproc = job.get("nproc_limit")  # set by ns.prepare (its _nproc_limit); root's path is the pool uid by now
    if os.getuid() != 0 and nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _child(job: dict, report_fd: int, nonce: str, workdir: str, libc) -> None:  # noqa: ANN001
    """Runs in the forked process (PID 1 of its PID namespace outside limits-only), after ns.enter has isolated
    it and dropped its privileges: stdio on /dev/null, only the report pipe open, the limits, a bare environment,
    then the tests."""
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 1 << 16)
        os.chdir(workdir)
        why = kernel.fresh_keyring(libc)  # every mode: the scorer's session keyring is never the code's
        if why:
            raise OSError(why)
        tests = job["tests"]
        _limits(job, len(tests))
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    except BaseException as exc:  # never run the code with half the limits on
        os.write(report_fd, f"{nonce} fatal {type(exc).__name__}\n".encode())
        os._exit(3)
    try:
        _run_tests(job, report_fd, nonce)
    finally:  # the code may have closed or replaced the report pipe: never fall back into the supervisor's code
        os._exit(0)


def _run_tests(job: dict, report_fd: int, nonce: str) -> None:
    """Phase 0 defines the program; then each test, one after the other. One report line per phase, its outcome
    (the next phase starts at once: the supervisor's clock for it starts with that line): `ok 0` or `error 0 Name`,
    then `value i JSON` (a call's result or a program's stdout, see _encode), `ok i` (a weak test raised nothing),
    `raised i Name`, `unencodable i Type`, `toolarge i`. Nothing here decides pass or fail."""
    import io

    code, tests = job["code"], job["tests"]
    clean = _Pristine()  # before any of the code runs
    # Bound before the code runs: code that rebinds builtins.exec, os.write or json.dumps changes nothing here.
    # (It can still reach these frames; the protocol, not this, is what keeps a forged report from scoring.)
    _exec, _eval, _compile, _write, _dumps = exec, eval, compile, os.write, json.dumps

    def report(words: str) -> None:
        _write(report_fd, f"{nonce} {words}\n".encode())

    def run(source: str, stdin: str | None, glb: dict) -> str | None:
        saved = sys.stdin, sys.stdout
        out = io.StringIO()
        if stdin is not None:
            sys.stdin, sys.stdout = io.StringIO(stdin), out
        try:
            _exec(_compile(source, "<completion>", "exec"), glb)  # the sandbox's whole purpose
        except SystemExit as exc:  # a program may end with sys.exit(); elsewhere it is a failure
            if stdin is None or exc.code not in (None, 0):
                raise
        finally:
            sys.stdin, sys.stdout = saved
        return out.getvalue() if stdin is not None else None

    if job.get("syntax_check"):  # a long program: compiled here, before any of it runs (the scorer's CPU is shared)
        try:
            _compile(code, "<completion>", "exec")
        except SyntaxError as exc:
            report(f"error 0 compile {max(0, int(exc.lineno or 1))} {max(0, int(exc.offset or 1))}")
            return
        except BaseException:  # noqa: BLE001 - null bytes (ValueError), absurd nesting
            report("error 0 compile 0 0")
            return
    io_tests = any(isinstance(t, dict) and "stdin" in t for t in tests)
    glb: dict = {"__name__": "__main__" if io_tests else "solution"}
    given: dict = clean.namespace("given")
    prelude: dict = clean.namespace("tests")
    if not io_tests:  # function tests: define once, then each test sees the definitions
        try:
            run(job.get("setup", "") + "\n" + code, None, glb)
            if job.get("given"):  # what the prompt gives, again after the code: the code cannot redefine it
                clean.restore()
                run(job["given"], None, given)
                glb.update(clean.names(given))
            if job.get("prelude"):
                clean.restore()
                run(job["prelude"], None, prelude)
        except BaseException as exc:  # noqa: BLE001 - any failure of the program is a score, not a crash
            report(f"error 0 {_name(exc)}")
            return
    report("ok 0")
    entry = job.get("entry") or ""
    for i, test in enumerate(tests, start=1):
        test = test if isinstance(test, dict) else {"exec": test}
        clean.restore()
        try:
            if "call" in test:
                value = _eval(_compile(test["call"], "<test>", "eval"), clean.test_globals(glb, given, prelude, entry))
            elif "stdin" in test:
                value = run(code, str(test["stdin"]), {"__name__": "__main__"})
            else:
                run(test["exec"], None, clean.test_globals(glb, given, prelude, entry))
                report(f"ok {i}")
                continue
        except BaseException as exc:  # noqa: BLE001 - AssertionError, SystemExit, MemoryError, ...
            report(f"raised {i} {_name(exc)}")
            continue
        try:
            payload = _encode(value, _dumps)
        except _TooLarge:
            report(f"toolarge {i}")
            continue
        except BaseException:  # noqa: BLE001 - not plain data, nested too deeply, a hostile __hash__, ...
            report(f"unencodable {i} {_name(value)}")
            continue
        report(f"value {i} {payload}")


class _Pristine:
    """What the tests run with, captured before the code runs and restored before each phase: the builtins, the
    modules checks use (random, math), no trace or profile hook. Each test gets fresh globals holding these
    builtins, the prelude's and the prompt's names, and the solution's names except those that shadow a builtin
    (`all = lambda x: True` in the solution's module reaches no test). What Python cannot protect (a test that
    runs whole beside the code: its frame, its constants, a trace hook set during the call) is in docs/guide.md."""

    def __init__(self) -> None:
        import builtins
        import math
        import random

        self.builtins = dict(builtins.__dict__)
        self.modules = [(m.__dict__, dict(m.__dict__)) for m in (builtins, random, math)]
        self.hooks = (sys.settrace, sys.setprofile)
        self.reseed = random.seed

    def restore(self) -> None:
        for live, saved in self.modules:
            live.update(saved)
        for hook in self.hooks:
            hook(None)
        threading = sys.modules.get("threading")
        if threading is not None:  # its hooks for threads started later
            threading._trace_hook = threading._profile_hook = None  # type: ignore[attr-defined]  # private, untyped
        self.reseed()  # a seed the code set no longer decides a check's random inputs

    def namespace(self, name: str) -> dict:
        return {"__builtins__": dict(self.builtins), "__name__": name}

    def names(self, space: dict) -> dict:
        """A namespace's own names (no dunders), those that shadow a builtin left out."""
        return {k: v for k, v in space.items() if not k.startswith("__") and k not in self.builtins}

    def test_globals(self, solution: dict, given: dict, prelude: dict, entry: str) -> dict:
        out = self.namespace("tests")
        for space in (solution, given, prelude):
            out.update(self.names(space))
        if entry in solution:
            out[entry] = solution[entry]
        return out


def _name(obj: object) -> str:
    """The type's name, as one word of a report line (a class may rename itself to anything)."""
    try:
        name = type(obj).__name__
        return "".join(c for c in name[:60] if c.isalnum() or c in "_.") or "?"
    except BaseException:  # noqa: BLE001
        return "?"


class _TooLarge(Exception):
    """An encoded value over VALUE_CAP bytes."""


def _tagged(x: Any, depth: int, size: list[int]) -> object:
    """x as JSON-ready data, exact builtin types only (type(x) is int: a bool is a bool, an int subclass or
    any other object is refused with TypeError). Tags: {"t": tuple, "s": set, "f": frozenset, "d": dict as
    [[k, v], ...], "b": bytes hex, "c": complex [re, im], "i": a huge int in hex}; lists, str, int, float, bool
    and None are themselves."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    size[0] -= 1
    if size[0] < 0:
        raise _TooLarge()
    t = type(x)
    if t is int and x.bit_length() > 4096:  # past Python's int<->decimal limit: hex has none
        return {"i": hex(x)}
    if x is None or t is bool or t is int or t is float:
        return x
    if t is str:
        if len(x) > VALUE_CAP:
            raise _TooLarge()
        return x
    if t is list:
        return [_tagged(v, depth + 1, size) for v in x]
    if t is tuple:
        return {"t": [_tagged(v, depth + 1, size) for v in x]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [_tagged(v, depth + 1, size) for v in x]}
    if t is dict:
        return {"d": [[_tagged(k, depth + 1, size), _tagged(v, depth + 1, size)] for k, v in x.items()]}
    if t is bytes:
        if len(x) > VALUE_CAP // 2:
            raise _TooLarge()
        return {"b": x.hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise TypeError(t.__name__)


def _encode(value: object, dumps=json.dumps) -> str:  # noqa: ANN001
    """One returned value -> one line of JSON (ASCII, no newline), at most VALUE_CAP bytes."""
    text = dumps(_tagged(value, 0, [VALUE_CAP]), separators=(",", ":"))
    if len(text) > VALUE_CAP:
        raise _TooLarge()
    return text


def supervise(job: dict) -> dict:
    """Run the job's tests under the limits; return counts, a status and the time taken."""
    t0 = time.monotonic()
    tests = job["tests"]
    per_test = float(job["per_test_timeout"])
    wall = float(job.get("wall_timeout") or per_test * (len(tests) + 1) + 1.0)
    nonce = secrets.token_hex(16)
    libc = ns.libc_handle()
    mode, uid, workdir, why = ns.prepare(job, libc, t0 + wall)
    if why:
        return {"status": "sandbox_error", "total": len(tests), "outcomes": [None] * len(tests), "isolation": "failed",
                "error": f"{mode}: {why}", "seconds": round(time.monotonic() - t0, 4)}
    isolation = mode
    read_fd, write_fd = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.close(ready_r)
        ns.enter(libc, mode, uid, ready_w, lambda: kernel.ipc_limits() or kernel.hide_packages(libc))
        _child(job, write_fd, nonce, workdir, libc)  # ns.enter made the pool uid the code's already
        os._exit(0)  # not reached
    os.close(write_fd)
    os.close(ready_w)
    why = ns.await_ready(ready_r, t0 + wall)
    os.close(ready_r)
    if why:
        ns.kill(pid, mode)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return {"status": "sandbox_error", "total": len(tests), "outcomes": [None] * len(tests), "isolation": "failed",
                "error": f"{mode}: {why}", "seconds": round(time.monotonic() - t0, 4)}
    reports = _Reports(nonce, len(tests))
    status = _collect(read_fd, reports, per_test, t0 + wall)
    ns.kill(pid, mode)
    try:
        _, wstatus = os.waitpid(pid, 0)
    except ChildProcessError:
        wstatus = 0
    os.close(read_fd)
    if mode == "limits-only":
        import shutil

        ns.sweep()
        shutil.rmtree(workdir, ignore_errors=True)
    return reports.summary(status, wstatus, t0, isolation)


class _Reports:
    """The child's report lines -> one outcome per test. The child runs the completion, so every line may be
    forged: only lines with the nonce count, a test reported twice fails, indices outside 1..n, malformed or
    oversize lines are dropped (and counted), and the whole report is bounded (self.cap). A forged line can
    still carry an output, but not decide a pass: the scorer compares outputs with answers the child never had."""

    def __init__(self, nonce: str, n: int) -> None:
        self.prefix = nonce.encode() + b" "
        self.n = n
        self.outcomes: list[list[str] | None] = [None] * (n + 1)  # index 0: the program phase (define)
        self.current = 0  # the phase running (0: the program's definition), and since when
        self.started = time.monotonic()
        self.anomalies = 0
        self.read = 0
        self.cap = max(REPORT_CAP, (n + 1) * (VALUE_CAP + 4096))
        self.buf = b""
        self.skipping = False  # inside an oversize line: drop until its newline
        self.error = ""

    def done(self) -> bool:
        return self.outcomes[self.n] is not None or (self.outcomes[0] or [""])[0] == "error"

    def feed(self, chunk: bytes) -> None:
        self.read += len(chunk)
        lines = (self.buf + chunk).split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            if self.skipping:
                self.skipping = False
                continue
            self._line(line)
        if len(self.buf) > VALUE_CAP + 256:  # no honest line is this long (_encode caps a value)
            self.buf, self.skipping = b"", True
            self.anomalies += 1

    def _line(self, line: bytes) -> None:
        if not line.startswith(self.prefix):
            self.anomalies += 1
            return
        parts = line[len(self.prefix):].split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit() or len(parts[1]) > 9:
            self.anomalies += 1
            return
        kind, idx, rest = parts[0].decode("ascii", "replace"), int(parts[1]), parts[2] if len(parts) > 2 else b""
        phase0 = kind in ("ok", "error") and idx == 0
        if not (phase0 or (kind in ("value", "ok", "raised", "unencodable", "toolarge") and 1 <= idx <= self.n)):
            self.anomalies += 1
            return
        try:
            detail = rest.decode("utf-8")
        except UnicodeDecodeError:
            self.anomalies += 1
            return
        if self.outcomes[idx] is not None:  # the harness reports each phase once: a second report is forged
            self.outcomes[idx] = ["error", "reported twice"] if idx == 0 else ["invalid", "reported twice"]
            self.anomalies += 1
            return
        if kind == "value":
            self.outcomes[idx] = ["value", detail]
        else:
            self.outcomes[idx] = [kind, detail[:80]] if detail else [kind]
        if idx + 1 > self.current:  # the next phase runs from now (forward only: a forged line gains at most n resets)
            self.current, self.started = idx + 1, time.monotonic()
        if idx == 0 and kind == "error":
            self.error = detail[:80]

    def summary(self, status: str, wstatus: int, t0: float, isolation: str) -> dict:
        phase0 = self.outcomes[0] or []
        error = self.error
        if phase0[:1] == ["error"]:
            status = "program_error"
            error = phase0[1] if len(phase0) > 1 else "error"
        elif status == "ok" and any(o is None for o in self.outcomes):
            status = "crashed"
            if os.WIFSIGNALED(wstatus):
                error = f"signal {os.WTERMSIG(wstatus)}"
        out = {"status": status, "total": self.n, "outcomes": self.outcomes[1:],
               "seconds": round(time.monotonic() - t0, 4), "isolation": isolation}
        if status == "timeout":
            out["timed_out_in"] = self.current
        if self.anomalies:
            out["anomalies"] = self.anomalies
        if status == "report_too_large":
            error = f"the report passed {self.cap} bytes"
        if error:
            out["error"] = error
        return out


def _collect(read_fd: int, reports: _Reports, per_test: float, wall_end: float) -> str:
    """Read the child's reports until the last test or the program phase ends, the child exits, a test
    overruns per_test (measured here, outside the code), the wall deadline passes, or the report overflows."""
    while not reports.done():
        deadline = min(reports.started + per_test, wall_end)
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        ready, _, _ = select.select([read_fd], [], [], deadline - now)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            return "ok"  # the code exited (or died): whatever it reported stands
        reports.feed(chunk)
        if reports.read > reports.cap:
            return "report_too_large"
    return "ok"



def main() -> int:
    """--probe: one JSON line. A job: one line per test (`V i payload` for a value, as the child sent it; `O i
    JSON` for any other outcome), then `S JSON`, the summary: the scorer reads them one at a time, each capped
    (hpc_grpo/rewards/code_report.py)."""
    if sys.argv[1:] == ["--probe"]:
        sys.stdout.write(json.dumps(ns.probe()) + "\n")
        sys.stdout.flush()
        return 0
    report = supervise(json.loads(sys.stdin.buffer.read()))
    out = sys.stdout.buffer
    for i, outcome in enumerate(report.pop("outcomes")):
        if outcome is None:
            continue
        if outcome[0] == "value":
            out.write(b"V %d %s\n" % (i, outcome[1].encode("utf-8")))
        else:
            out.write(b"O %d %s\n" % (i, json.dumps(outcome).encode()))
    out.write(b"S " + json.dumps(report).encode() + b"\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
