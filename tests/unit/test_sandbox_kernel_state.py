"""Kernel state shared with the scorer or with the next sample: SysV shared memory, message
queues and semaphores, POSIX message queues, the scorer's own 0600 segment, the scorer's session keyring and keys
planted for the next sample.

A driver process plays the scorer, as root and as the unprivileged test user (tests/unix_user.py, through
setpriv): it joins a session keyring of its own holding an `hf_...` key (as pam_keyinit or a Kerberos KEYRING
cache would), makes a 0600 segment holding a secret, then scores each attack TWICE in a row (an object made by the
first sample is what the second looks for) through verl's compute_score and through HumanEval's score_samples.
`add` answers right only when the attack worked, so a working attack scores 1 and a blocked one 0. Each attack
first runs unsandboxed, twice, as the same user: it must work there (the test can fail). After the table: no IPC
object of the attacks' on the host, no planted key in any keyring the scorer can reach, the user's key count back
where it was, no process left.
"""

from __future__ import annotations

import ctypes
import json
import secrets
import subprocess
import sys
import time

import pytest

from tests.unit.test_sandbox_isolation import Runner, as_root, as_user, completion, kill_marked, marked

# One xdist worker for both sandbox tables: they start daemons and count the machine's SysV IPC keys, which a
# table running beside them on the other worker would change (tools/run-tests.sh runs unit tests with -n 2).
pytestmark = pytest.mark.xdist_group("sandbox-kernel-state")

ROOT = __import__("os").geteuid() == 0
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
# Each snippet sets `ok` when it found what an earlier sample (or the scorer) left; else it leaves it for the next.
ATTACKS = {
    "sysv_shm_across_samples": LIBC + """
if libc.shmget($KEY, 0, 0) >= 0:
    ok = True
else:
    sid = libc.shmget($KEY, 64 << 20, 0o1666)
    addr = libc.shmat(sid, None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value):
        ctypes.memset(addr, 1, 64 << 20)  # pinned memory, if the segment outlived the sample
        libc.shmdt(ctypes.c_void_p(addr))""",
    "sysv_msg_across_samples": LIBC + """
if libc.msgget($KEY, 0) >= 0:
    ok = True
else:
    libc.msgget($KEY, 0o1666)""",
    "sysv_sem_across_samples": LIBC + """
if libc.semget($KEY, 0, 0) >= 0:
    ok = True
else:
    libc.semget($KEY, 1, 0o1666)""",
    "posix_mq_across_samples": LIBC + """
fd = libc.mq_open($MQ, 0)
if fd >= 0:
    ok = True
else:
    libc.mq_open($MQ, 0o100, 0o666, None)  # O_CREAT""",
    "daemon_holds_a_segment": LIBC + """
import os, time
if libc.shmget($KEY2, 0, 0) >= 0:
    ok = True
elif os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("/proc/self/comm", "w").write($MARK)
        sid = libc.shmget($KEY2, 4096, 0o1600)  # private (no IPC_RMID until the holder is gone)
        libc.shmat(sid, None, 0)
        time.sleep(120)
    os._exit(0)
else:
    time.sleep(0.3)""",
    "scorer_shm_segment": LIBC + """
for line in open("/proc/sysvipc/shm").read().splitlines()[1:]:
    addr = libc.shmat(int(line.split()[1]), None, 0o10000)  # SHM_RDONLY
    if addr not in (None, ctypes.c_void_p(-1).value):
        ok = ok or $SECRET.encode() in ctypes.string_at(addr, 64)
        libc.shmdt(ctypes.c_void_p(addr))""",
    "scorer_session_key": LIBC + """
for ring in (-3, -4, -5):  # session, user, user-session keyrings
    k = libc.syscall($KEYCTL, 10, ctypes.c_long(ring), b"user", $HF.encode(), 0)  # KEYCTL_SEARCH
    if k > 0:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall($KEYCTL, 11, k, buf, 256, 0)  # KEYCTL_READ
        ok = ok or $SECRET.encode() in buf.raw[:max(n, 0)]""",
    "key_across_samples": LIBC + """
for ring in (-3, -4, -5):
    if libc.syscall($KEYCTL, 10, ctypes.c_long(ring), b"user", $PLANT.encode(), 0) > 0:
        ok = True
if not ok:
    for ring in (-3, -4, -5):
        libc.syscall($ADD_KEY, b"user", $PLANT.encode(), b"left", 4, ctypes.c_long(ring))""",
}
SYS = {"x86_64": (250, 248), "aarch64": (219, 217)}  # keyctl, add_key

DRIVER = r"""
import ctypes, json, os, subprocess, sys, tempfile, time
from hpc_grpo.rewards.code import compute_score, extract_code
from hpc_grpo.evaluation.humaneval import score_samples
from hpc_grpo.rewards.code import RewardWeights
from hpc_grpo.data.codegen import ground_truth

job = json.loads(sys.stdin.read())
keyctl, add_key = job["sys"]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
out = {"control": {}, "verl": {}, "eval": {}}
assert libc.syscall(keyctl, 1, job["ring"].encode(), 0, 0, 0) > 0  # KEYCTL_JOIN_SESSION_KEYRING, named
secret = job["secret"].encode()
assert libc.syscall(add_key, b"user", job["hf"].encode(), secret, len(secret), ctypes.c_long(-3)) > 0
sid = libc.shmget(job["scorer_key"], 4096, 0o1600)
addr = libc.shmat(sid, None, 0)
ctypes.memmove(addr, secret, len(secret))
W = {"per_test_timeout": 2.0, "memory_mb": 512}
problem = {"id": "add", "entry_point": "add", "prompt_code": "", "tests": ["assert add(1, 2) == 3"]}
gt = ground_truth(problem)

def cleanup():  # what the controls left on the host, so that the sandboxed table starts clean
    for get, ctl, args in ((libc.shmget, libc.shmctl, (0, 0)), (libc.msgget, libc.msgctl, (0,)),
                           (libc.semget, libc.semctl, (0, 0))):
        for key in job["keys"]:
            i = get(key, *args)
            if i >= 0:
                ctl(i, 0, None)  # IPC_RMID
    for name in job["mqs"]:
        libc.mq_unlink(name.encode())
    for ring in (-3, -4, -5):
        for _ in range(3):
            k = libc.syscall(keyctl, 10, ctypes.c_long(ring), b"user", job["plant"].encode(), 0)
            if k > 0:
                libc.syscall(keyctl, 9, k, ctypes.c_long(ring), 0, 0)  # KEYCTL_UNLINK from that keyring

try:
    if job["control"]:
        for name, text in job["completions"].items():
            program = extract_code(text) + "\nprint(add(1, 2) == 3)\n"
            runs = []
            for _ in range(2):
                with tempfile.TemporaryFile("w+") as sink:  # a file, not a pipe: a surviving daemon keeps it open
                    subprocess.run([sys.executable, "-I", "-S", "-c", program], stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, timeout=60)
                    sink.seek(0)
                    runs.append(sink.read().strip().endswith("True"))
            out["control"][name] = runs
        cleanup()
    else:  # the sandbox runs honest code here (else every attack would "fail" with it)
        honest = job["honest"]
        out["honest"] = [compute_score("hpc-grpo/codegen", honest, gt, **W)["score"],
                         score_samples([problem], [[honest]], weights=RewardWeights(**W), workers=1)["pass@1"]]
        for name, text in job["completions"].items():
            out["verl"][name] = [compute_score("hpc-grpo/codegen", text, gt, **W)["score"] for _ in range(2)]
            out["eval"][name] = [score_samples([problem], [[text]], weights=RewardWeights(**W), workers=1)["pass@1"]
                                 for _ in range(2)]
    time.sleep(0.5)
    left = {"keys": [ring for ring in (-3, -4, -5)
                     if libc.syscall(keyctl, 10, ctypes.c_long(ring), b"user", job["plant"].encode(), 0) > 0],
            "shm": [k for k in job["keys"] if libc.shmget(k, 0, 0) >= 0],
            "msg": [k for k in job["keys"] if libc.msgget(k, 0) >= 0],
            "sem": [k for k in job["keys"] if libc.semget(k, 0, 0) >= 0],
            "mq": [n for n in job["mqs"] if libc.mq_open(n.encode(), 0) >= 0]}
    out["left"] = left
finally:
    libc.shmdt(ctypes.c_void_p(addr))
    libc.shmctl(sid, 0, None)
print("RESULT=" + json.dumps(out))
"""


def drive(runner: Runner, job: dict) -> dict:
    proc = subprocess.run([*runner.prefix, sys.executable, "-c", DRIVER], input=json.dumps(job), capture_output=True,
                          text=True, env=runner.env(), cwd="/", timeout=600, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, f"driver as {runner.name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT="))


def key_count(uid: int) -> int:
    """The user's keys, as the kernel counts them (/proc/key-users: `uid: usage nkeys/nikeys ...`)."""
    for line in open("/proc/key-users"):
        who, _, rest = line.partition(":")
        if int(who) == uid:
            return int(rest.split()[1].split("/")[0])
    return 0


def pool_keys() -> int:
    """Keys held by the sandbox's pool uids (61000.., root's path)."""
    total = 0
    for line in open("/proc/key-users"):
        who, _, rest = line.partition(":")
        if 61000 <= int(who) < 61000 + 256:
            total += int(rest.split()[1].split("/")[0])
    return total


def run_table(runner: Runner) -> None:
    import os

    machine = os.uname().machine
    if machine not in SYS:
        pytest.fail(f"no keyctl/add_key numbers for {machine} in this test", pytrace=False)
    tag = secrets.token_hex(4)
    base = 0x4000_0000 | int(tag[:6], 16) << 4
    keys = {"KEY": base + 1, "SCORER": base + 2, "KEY2": base + 3}
    job = {"sys": SYS[machine], "ring": f"hpcgrpo-scorer-{tag}", "hf": f"hf_{tag}", "secret": f"hf_secret_{tag}",
           "plant": f"planted_{tag}", "scorer_key": keys["SCORER"], "keys": [keys["KEY"], keys["KEY2"]],
           "mqs": [f"/hpcgrpo-{tag}"]}
    mark = f"hpcgrpo{tag}"
    values = {"$KEY2": str(keys["KEY2"]), "$MARK": repr(mark), "$KEY": str(keys["KEY"]),
              "$MQ": repr(job["mqs"][0].encode()), "$SECRET": repr(job["secret"]), "$HF": repr(job["hf"]), "$PLANT": repr(job["plant"]), "$KEYCTL": str(SYS[machine][0]),
              "$ADD_KEY": str(SYS[machine][1])}
    completions = {}
    for name, snippet in ATTACKS.items():
        for k, v in sorted(values.items(), key=lambda kv: -len(kv[0])):  # $KEYCTL before $KEY
            snippet = snippet.replace(k, v)
        completions[name] = completion(snippet)
    try:
        table(runner, job, completions, mark)
    finally:  # whatever a failed run left (the assertions above are made before this)
        kill_marked({mark})
        for key in keys.values():
            subprocess.run(["ipcrm", "-M", hex(key), "-Q", hex(key), "-S", hex(key)], capture_output=True, check=False)
        ctypes.CDLL(None).mq_unlink(job["mqs"][0].encode())


def table(runner: Runner, job: dict, completions: dict[str, str], mark: str) -> None:
    """Controls (unsandboxed, twice), then the sandboxed table (twice per attack and path), then what is left."""
    def fewer(then: tuple[int, int]) -> bool:  # other sessions' processes may drop keys meanwhile, never ours add
        return key_count(runner.uid) <= then[0] and pool_keys() <= then[1]

    try:
        got = drive(runner, {**job, "completions": completions, "control": True})
    finally:
        kill_marked({mark})  # the control's daemon (unsandboxed, it survives: that is the control)
    failed = {n: r for n, r in got["control"].items() if not r[1]}
    assert not failed, f"as {runner.name}, unsandboxed, these attacks did not work on the second run: {failed}"
    assert not any(got["left"].values()), f"the controls' objects were not cleaned: {got['left']}"
    # counted now: the driver's searches made the user's own user and user-session keyrings, which stay
    before = (key_count(runner.uid), pool_keys())

    got = drive(runner, {**job, "completions": completions, "control": False, "honest": completion("ok = True")})
    assert got["honest"] == [1.0, 1.0], f"as {runner.name}, honest code did not score in the sandbox: {got['honest']}"
    won = {n: (got["verl"][n], got["eval"][n]) for n in ATTACKS if max(got["verl"][n] + got["eval"][n]) > 0}
    assert not won, f"as {runner.name}: attacks that scored (verl's two runs, HumanEval's two runs): {won}"
    assert not any(got["left"].values()), f"as {runner.name}, left on the host: {got['left']}"
    deadline = time.monotonic() + 30  # the kernel frees a dead namespace's keys from a work queue
    while not fewer(before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert fewer(before), f"keys left behind (/proc/key-users): {before} -> {(key_count(runner.uid), pool_keys())}"
    assert not marked({mark}), "the sandboxed daemon outlived its sample"


@pytest.mark.skipif(not ROOT, reason="the root half needs root (CI runs as root; the user half runs here)")
def test_kernel_state_as_root() -> None:
    run_table(as_root())


def test_kernel_state_as_unprivileged_user() -> None:
    run_table(as_user())
