"""Sandbox runner for untrusted code: `python -I -S code_sandbox.py` with one JSON job on stdin.

Policy completions are hostile by accident (loops, fork bombs, huge allocations) and, under a reward
that pays for passing tests, can learn to be hostile on purpose. So each completion's tests run in a
process of their own, started fresh by the scorer (hpc_grpo/rewards/code.py), which this file is.

How the code is isolated (namespaces, a minimal root, no privilege; or limits only, by the recipe's explicit
consent) lives beside this file in sandbox_namespaces.py, loaded by path; this file is the harness: the limits,
the child that runs the solution, the judge that runs the tests (sandbox_judge.py), the report protocol and its
checks.

Always: limits on address space, CPU seconds, file size, open files, processes and core dumps; stdin/stdout/
stderr on /dev/null; a per-test wall deadline enforced from OUTSIDE the code (this runner watches a pipe and
kills the code the moment one test overruns: the first timeout ends the completion, so a looping completion
costs one per-test timeout, not one per test); a whole-job wall deadline.

Stdlib only, run with -I -S (no site-packages, ~15 ms start-up): it must not import hpc_grpo or any
library that the code under test could tamper with. Output: one JSON object on stdout.
`python -I -S code_sandbox.py --probe` prints {"isolation": mode, "why": ...}: what "auto" gets on this node.

The protocol (the scorer's side: hpc_grpo/rewards/code_tests.py): no test runs in the code's process. Function
tests run in the judge (sandbox_judge.py), a process this runner forks before any namespace is made, with limits of
its own; each call a test makes into the solution comes here as plain data (sandbox_values.py), runs, and goes back
as plain data (exact builtin types; an int subclass, an object with a clever __eq__ or anything else is refused).
So the code sees its arguments only: not the test's frame, constants or comparison, and no pipe to this runner.
stdin tests send stdin only; the printed text goes back and the scorer compares it. This runner reads the verdicts
(the judge's, or the code's outputs for stdin tests) and checks the report's shape (the nonce, each test once,
indices in range, bounded sizes: see _Reports); it kills both processes at the first per-test overrun.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import sys
import time

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
values = _sibling("sandbox_values")
judge = _sibling("sandbox_judge")
MAX_DEPTH, VALUE_CAP, _encode, _TooLarge = values.MAX_DEPTH, values.VALUE_CAP, values.encode, values.TooLarge


def _limits(job: dict, n_tests: int) -> None:
    mem = kernel.address_space(int(job["memory_mb"]), int(job.get("max_procs", 32)))  # memory_mb for all together
    cpu = int(job["per_test_timeout"] * (n_tests + 1)) + 1
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, 16 * 1024 * 1024), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(res, (value, value))
    nproc = job.get("nproc_limit")  # set by ns.prepare (its _nproc_limit); root's path is the pool uid by now
    if os.getuid() != 0 and nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _child(job: dict, fds: tuple[int, ...], nonce: str, workdir: str, libc) -> None:  # noqa: ANN001
    """Runs in the forked process (PID 1 of its PID namespace outside limits-only), after ns.enter has isolated
    it and dropped its privileges: stdio on /dev/null, only its pipes open (`fds`: the judge's call and answer pipes,
    or the runner's report pipe for stdin tests), the limits, a bare environment, then the solution."""
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        low = 3
        for fd in sorted(fds):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        os.chdir(workdir)
        why = kernel.fresh_keyring(libc)  # every mode: the scorer's session keyring is never the code's
        if why:
            raise OSError(why)
        _limits(job, len(job["tests"]))
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    except BaseException as exc:  # never run the code with half the limits on
        line = f"D error fatal {type(exc).__name__}\n" if len(fds) == 2 else f"{nonce} fatal {type(exc).__name__}\n"
        os.write(fds[-1], line.encode())
        os._exit(3)
    try:
        if len(fds) == 2:
            _serve(job, fds[0], fds[1])
        else:
            _run_programs(job, fds[0], nonce)
    finally:  # the code may have closed or replaced its pipes: never fall back into the supervisor's code
        os._exit(0)


def _define(job: dict, say) -> dict | None:  # noqa: ANN001
    """The solution's module: setup, the code, then what the prompt gives (its names replace the code's, as in the
    judge). None after say(words) when it failed; a long program is compiled first, before any of it runs."""
    code, glb = job["code"], {"__name__": "solution"}
    if job.get("syntax_check"):  # a long program: compiled here (the scorer's CPU is shared)
        try:
            compile(code, "<completion>", "exec")
        except SyntaxError as exc:
            say(f"error 0 compile {max(0, int(exc.lineno or 1))} {max(0, int(exc.offset or 1))}")
            return None
        except BaseException:  # noqa: BLE001 - null bytes (ValueError), absurd nesting
            say("error 0 compile 0 0")
            return None
    try:
        exec(compile(job.get("setup", "") + "\n" + code, "<completion>", "exec"), glb)  # the sandbox's purpose
        if job.get("given"):
            given: dict = {"__name__": "given"}
            exec(compile(job["given"], "<given>", "exec"), given)
            glb.update((k, v) for k, v in given.items() if not k.startswith("__"))
    except BaseException as exc:  # noqa: BLE001 - any failure of the program is a score, not a crash
        say(f"error 0 {_name(exc)}")
        return None
    return glb


def _serve(job: dict, call_fd: int, back_fd: int) -> None:
    """The solution's side of the judge's calls (sandbox_judge.py): define the program, answer `D ok` (or its
    error), then for each `C seq name args` call the solution's function and answer with its result, encoded as
    plain data (values.encode: exact builtin types), until the judge closes the pipe. Nothing here decides a test."""
    _write, _encode, _decode = os.write, values.encode, values.decode  # bound before the code runs

    def answer(words: str) -> None:
        data = memoryview(f"{words}\n".encode())
        while data:
            data = data[_write(back_fd, data):]

    glb = _define(job, lambda words: answer("D " + words.replace("error 0 ", "error ", 1)))
    if glb is None:
        return
    answer("D ok")
    calls = os.fdopen(call_fd, "rb")
    while True:
        line = calls.readline()
        if not line.endswith(b"\n"):
            return  # the judge is done
        _, seq, name, payload = line[:-1].decode().split(" ", 3)
        try:
            args, kwargs = _decode(payload)
            if name not in glb:
                raise NameError(name)
            value = glb[name](*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, ... : the call failed
            answer(f"R {seq} raised {_name(exc)}")
            continue
        try:
            answer(f"R {seq} value {_encode(value)}")
        except values.TooLarge:
            answer(f"R {seq} toolarge")
        except BaseException:  # noqa: BLE001 - not plain data, nested too deeply, a hostile __hash__, ...
            answer(f"R {seq} unencodable {_name(value)}")


def _run_programs(job: dict, report_fd: int, nonce: str) -> None:
    """stdin/stdout tests: each runs the whole program with its stdin; the printed text goes back (`value i JSON`),
    and the scorer compares it with the expected text, which never enters this process. One report line per phase:
    `ok 0` (or `error 0 compile L C`), then `value i`, `raised i Name` or `toolarge i` per test."""
    import io

    code, tests = job["code"], job["tests"]
    _exec, _compile, _write, _dumps = exec, compile, os.write, json.dumps

    def report(words: str) -> None:
        _write(report_fd, f"{nonce} {words}\n".encode())

    if job.get("syntax_check"):
        try:
            _compile(code, "<completion>", "exec")
        except SyntaxError as exc:
            report(f"error 0 compile {max(0, int(exc.lineno or 1))} {max(0, int(exc.offset or 1))}")
            return
        except BaseException:  # noqa: BLE001
            report("error 0 compile 0 0")
            return
    report("ok 0")
    for i, test in enumerate(tests, start=1):
        if not (isinstance(test, dict) and "stdin" in test):
            report(f"raised {i} NotAStdinTest")  # a function test of a stdin problem: the judge is not started
            continue
        saved = sys.stdin, sys.stdout
        out = io.StringIO()
        sys.stdin, sys.stdout = io.StringIO(str(test["stdin"])), out
        try:
            _exec(_compile(code, "<completion>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:  # a program may end with sys.exit()
            if exc.code not in (None, 0):
                report(f"raised {i} SystemExit")
                continue
        except BaseException as exc:  # noqa: BLE001 - any failure is a failed test
            report(f"raised {i} {_name(exc)}")
            continue
        finally:
            sys.stdin, sys.stdout = saved
        try:
            payload = values.encode(out.getvalue(), _dumps)
        except values.TooLarge:
            report(f"toolarge {i}")
            continue
        report(f"value {i} {payload}")


def _name(obj: object) -> str:
    """The type's name, as one word of a report line (a class may rename itself to anything)."""
    try:
        name = type(obj).__name__
        return "".join(c for c in name[:60] if c.isalnum() or c in "_.") or "?"
    except BaseException:  # noqa: BLE001
        return "?"


def _start_judge(job: dict, nonce: str, judge_fd: int | None, libc) -> tuple[int, int, tuple[int, int]]:  # noqa: ANN001
    """Fork the judge (sandbox_judge.py) before any namespace is made: (its pid, the pipe its verdicts come on,
    the solution's ends of the call pipes). It reads its part of the job from judge_fd (see _read_job), runs as
    this runner's user with its own limits, no capability and no way to a new one; only its three pipes open."""
    call_r, call_w = os.pipe()
    back_r, back_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if judge_fd is not None:
                chunks = []
                while chunk := os.read(judge_fd, 1 << 16):
                    chunks.append(chunk)
                job = {**job, **json.loads(b"".join(chunks))}
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            low = 3
            for fd in sorted((call_w, back_r, verdict_w)):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 1 << 16)
            judge.limits(job, len(job["tests"]), kernel.address_space, libc)
            if os.geteuid() == 0:
                for cap in range(64):
                    libc.prctl(ns.PR_CAPBSET_DROP, cap, 0, 0, 0)
                why = ns._caps(libc, keep=False)
                if why:
                    raise OSError(why)
            judge.run(job, call_w, back_r, verdict_w, nonce, values)
        except BaseException as exc:  # noqa: BLE001 - the judge could not start: no test passes
            os.write(verdict_w, f"{nonce} error 0 judge {_name(exc)}\n".encode())
        finally:
            os._exit(0)
    for fd in (call_w, back_r, verdict_w):
        os.close(fd)
    return pid, verdict_r, (call_r, back_w)


def _end(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def supervise(job: dict, judge_fd: int | None = None) -> dict:
    """Run the job's tests under the limits; return counts, a status and the time taken. Function tests: the
    judge runs them and the solution answers its calls (its verdicts are read here); stdin tests: the solution's
    process runs each program and reports the printed text. judge_fd: where the judge's part of the job waits
    (main's stdin), None when `job` holds it."""
    t0 = time.monotonic()
    tests = job["tests"]
    per_test = float(job["per_test_timeout"])
    wall = float(job.get("wall_timeout") or per_test * (len(tests) + 1) + 1.0)
    nonce = secrets.token_hex(16)
    judged = job.get("judged", not any(isinstance(t, dict) and "stdin" in t for t in tests))
    judge_pid = None
    child_fds: tuple[int, ...]
    libc = ns.libc_handle()
    if judged:
        judge_pid, read_fd, child_fds = _start_judge(job, nonce, judge_fd, libc)
    else:
        read_fd, write_fd = os.pipe()
        child_fds = (write_fd,)
    if judge_fd is not None:  # the judge's part is the judge's: this runner (and the child it forks) never holds it
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, judge_fd)
        os.close(devnull)
    mode, uid, workdir, why = ns.prepare(job, libc, t0 + wall)
    if why:
        _end(judge_pid)
        for fd in (read_fd, *child_fds):
            os.close(fd)
        return {"status": "sandbox_error", "total": len(tests), "outcomes": [None] * len(tests), "isolation": "failed",
                "error": f"{mode}: {why}", "seconds": round(time.monotonic() - t0, 4)}
    isolation = mode
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.close(ready_r)
        ns.enter(libc, mode, uid, ready_w, lambda: kernel.ipc_limits() or kernel.hide_packages(libc))
        _child(job, child_fds, nonce, workdir, libc)  # ns.enter made the pool uid the code's already
        os._exit(0)  # not reached
    for fd in child_fds:
        os.close(fd)
    os.close(ready_w)
    why = ns.await_ready(ready_r, t0 + wall)
    os.close(ready_r)
    if why:
        ns.kill(pid, mode)
        os.waitpid(pid, 0)
        _end(judge_pid)
        os.close(read_fd)
        return {"status": "sandbox_error", "total": len(tests), "outcomes": [None] * len(tests), "isolation": "failed",
                "error": f"{mode}: {why}", "seconds": round(time.monotonic() - t0, 4)}
    reports = _Reports(nonce, len(tests), judged)
    status = _collect(read_fd, reports, per_test, t0 + wall)
    ns.kill(pid, mode)
    _end(judge_pid)
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
    """The judge's verdict lines, or for stdin tests the child's report lines -> one outcome per test. The child
    runs the completion, so every line of its may be forged: only lines with the nonce count, a test reported twice fails, indices outside 1..n, malformed or
    oversize lines are dropped (and counted), and the whole report is bounded (self.cap). A forged line can
    still carry an output, but not decide a pass: the scorer compares outputs with answers the child never had."""

    def __init__(self, nonce: str, n: int, judged: bool = True) -> None:
        self.prefix = nonce.encode() + b" "
        self.n = n
        self.kinds = ("pass", "fail") if judged else ("value", "raised", "toolarge")  # the judge's or the child's
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
        if not (phase0 or (kind in self.kinds and 1 <= idx <= self.n)):
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



def _read_job() -> tuple[dict, int | None]:
    """The job from stdin: `LENGTH\\n` + the runner's part (JSON, LENGTH bytes) + the judge's part (JSON, to the end),
    which this process never reads: the judge, forked first, reads it from fd 0 (the tests, the prelude, the names to
    proxy). So the tests are never in this process's memory, which the solution's process is forked from. One JSON
    object instead (by hand, in tests): the whole job, the judge's part included (then it is in that memory)."""
    first = os.read(0, 1)
    if first == b"{":
        return json.loads(first + sys.stdin.buffer.read()), None
    head = first
    while not head.endswith(b"\n") and len(head) < 20:
        head += os.read(0, 1)
    want = int(head)
    data = b""
    while len(data) < want:
        chunk = os.read(0, want - len(data))
        if not chunk:
            break
        data += chunk
    return json.loads(data), 0


def main() -> int:
    """--probe: one JSON line. A job: one line per test (`V i payload` for a value, as the child sent it; `O i
    JSON` for any other outcome), then `S JSON`, the summary: the scorer reads them one at a time, each capped
    (hpc_grpo/rewards/code_report.py)."""
    if sys.argv[1:] == ["--probe"]:
        sys.stdout.write(json.dumps(ns.probe()) + "\n")
        sys.stdout.flush()
        return 0
    job, judge_fd = _read_job()
    report = supervise(job, judge_fd)
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
