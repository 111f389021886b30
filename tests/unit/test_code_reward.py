"""The execution reward and its sandbox, against the real thing: every completion really runs in
hpc_grpo/sandbox/code_sandbox.py (namespaces and a uid of its own as root) and the hostile table checks
score 0, the time bound, nothing written outside the sandbox and no process left behind."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from hpc_grpo.rewards.code import (RewardWeights, compute_score, extract_code, make_trl_code_reward,
                                  score_batch, score_completion)

ROOT = os.geteuid() == 0
GT = json.dumps({"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"],
                 "entry_point": "add"})
W = RewardWeights(per_test_timeout=1.0, memory_mb=512)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\n"


def sandbox_pids() -> set[int]:
    """Processes that run as a sandbox uid (61000..61255)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except FileNotFoundError:
                continue
            if 61000 <= uid < 61256:
                out.add(int(entry))
    return out


def lasting_sandbox_pids(before: set[int], grace_s: float = 8.0) -> set[int]:
    """Sandbox-uid processes that were not there before and outlive `grace_s`. Other test sessions on the same
    host run sandboxes too; theirs end within their wall deadline (seconds), a daemon escaped from ours does not."""
    deadline = time.monotonic() + grace_s
    left = sandbox_pids() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left &= sandbox_pids()
    return left


def owner(path: Path) -> int:
    try:
        return path.lstat().st_uid
    except FileNotFoundError:  # removed meanwhile by another session
        return -1


def test_correct_partial_wrong() -> None:
    good = score_completion(fenced("def add(a, b):\n    return a + b"), GT, W)
    assert (good.kind, good.passed, good.total, good.score) == ("passed", 3, 3, 1.0)
    partial = score_completion(fenced("def add(a, b):\n    return a + b if a > 0 else 99"), GT, W)
    assert (partial.passed, partial.kind) == (2, "failed") and partial.score == pytest.approx(2 / 3)
    wrong = score_completion(fenced("def add(a, b):\n    return a * b"), GT, W)  # right only for 2, 2
    assert wrong.passed == 1 and wrong.score == pytest.approx(1 / 3)
    none = score_completion(fenced("def add(a, b):\n    return None"), GT, W)
    assert (none.kind, none.score) == ("failed", 0.0)


def test_penalties_and_style() -> None:
    syntax = score_completion(fenced("def add(a, b)\n    return a + b"), GT, W)
    assert syntax.kind == "syntax_error" and -0.2 <= syntax.score <= -0.1
    late = score_completion(fenced("def add(a, b):\n    return a + b\n\nx = = 1"), GT, W)
    assert late.kind == "syntax_error" and late.score > syntax.score  # breaks later: smaller penalty
    assert score_completion("I cannot solve this.", GT, W).kind == "no_code"
    assert score_completion("I cannot solve this.", GT, W).score == -0.5
    styled = RewardWeights(style_weight=0.5, per_test_timeout=1.0)
    clean = score_completion(fenced("def add(a, b):\n    return a + b"), GT, styled)
    messy = score_completion(fenced("import os\nimport sys\ndef add(a, b):\n    return a + b"), GT, styled)
    assert clean.score == pytest.approx(1.5) and messy.score == pytest.approx(1.0 + 0.5 * 0.6)


def test_extract_code() -> None:
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```\nfirst\n```\n```python\nsecond = 2\n```") == "second = 2\n"
    assert extract_code("def f():\n    return 1") is not None
    assert extract_code("just words") is None and extract_code("```python\n\n```") is None


def test_stdin_stdout_tests() -> None:
    gt = json.dumps({"tests": [{"stdin": "3\n", "stdout": "6\n"}, {"stdin": "5", "stdout": "10"}]})
    assert score_completion(fenced("print(int(input()) * 2)"), gt, W).score == 1.0
    assert score_completion(fenced("print(int(input()) + 3)"), gt, W).score == 0.5


HOSTILE = {
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(10**6)",
    "ignores_signals": "import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
    "alloc_8gib": "x = bytearray(8 * 1024 ** 3)",
    "write_outside": "for p in ('{target}', '/tmp/hpc_grpo_escape_{tag}', '/dev/shm/hpc_grpo_escape_{tag}', '/var/tmp/hpc_grpo_escape_{tag}'):\n    try:\n        open(p, 'w').write('owned')\n    except OSError:\n        pass",
    "socket_loopback": "import socket\ns = socket.socket()\ns.settimeout(0.5)\ns.connect(('127.0.0.1', {port}))\ns.sendall(b'owned')",
    "daemon_escapee": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(0.3)\n        open('{target}', 'w').write('late')\n        time.sleep(10**6)\n    os._exit(0)\ntime.sleep(10**6)",
    "exit_zero_early": "import os\nos._exit(0)",
    "fake_report": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'pass 1\\npass 2\\npass 3\\n')\n    except OSError:\n        pass",
}


@pytest.mark.skipif(not ROOT, reason="namespaces and the uid switch need root (CI runs as root)")
def test_hostile_table(tmp_path: Path) -> None:
    tag = f"{os.getpid()}_{time.time_ns()}"
    target = tmp_path / "escaped.txt"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connections: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connections.append(listener.accept())
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    tmp_before = set(os.listdir("/tmp"))
    pids_before = sandbox_pids()
    names = list(HOSTILE)
    texts = [fenced(HOSTILE[n].format(target=target, tag=tag, port=port)) for n in names]
    t0 = time.monotonic()
    scores = score_batch(texts, [GT] * len(texts), W, workers=2)
    elapsed = time.monotonic() - t0
    time.sleep(0.6)  # the escapee would write after 0.3 s if it had survived
    stop.set()
    thread.join()
    listener.close()
    for name, s in zip(names, scores):
        assert s.score == 0.0, (name, s)
        assert s.detail.get("isolation") == "namespaces+uid", (name, s)
        assert s.seconds <= W.per_test_timeout + 2.5, (name, s)  # one per-test timeout, plus teardown
    assert elapsed < 40
    assert not target.exists()
    assert not any(Path(d, f"hpc_grpo_escape_{tag}").exists() for d in ("/tmp", "/dev/shm", "/var/tmp"))
    assert not connections
    assert not lasting_sandbox_pids(pids_before)
    # other sessions share /tmp: what must not appear is an entry written by a sandbox uid, or a runner's folder
    new = [Path("/tmp", n) for n in set(os.listdir("/tmp")) - tmp_before]
    assert not [p for p in new if p.name.startswith("hpc-grpo-sandbox-") or 61000 <= owner(p) < 61256], new


def test_parallel_batch_and_trl_function() -> None:
    good, bad = fenced("def add(a, b):\n    return a + b"), fenced("def add(a, b):\n    return 0")
    fn = make_trl_code_reward(W, workers=2)
    completions = [[{"role": "assistant", "content": t}] for t in (good, bad, good, "no code here")]
    assert fn(completions, [GT] * 4) == [1.0, pytest.approx(1 / 3), 1.0, -0.5]
    assert fn.__name__ == "code_exec"


def test_compute_score_through_verls_loader(tmp_path: Path) -> None:
    """verl's own loader (verl.trainer.ppo.reward.get_custom_reward_fn) imports and calls our reward
    with the keys the 7B recipe renders."""
    reward_mod = pytest.importorskip("verl.trainer.ppo.reward", reason="verl with tensordict (tools/setup-env.sh dev)")
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://hpc_grpo.rewards.code", "name": "compute_score",
        "reward_kwargs": {"pass_weight": 1.0, "style_weight": 0.1, "per_test_timeout": 1.0}}}})
    fn = reward_mod.get_custom_reward_fn(cfg)
    out = fn(data_source="hpc-grpo/codegen", solution_str=fenced("def add(a, b):\n    return a + b"),
             ground_truth=GT, extra_info={"index": 0})
    assert out["score"] == pytest.approx(1.1) and out["passed"] == 3
    assert fn(data_source="hpc-grpo/codegen", solution_str="nothing", ground_truth=GT)["score"] == -0.5
    assert compute_score("x", fenced("def add(a, b) return"), GT)["syntax_error"] == 1.0


def test_fallback_without_namespaces(tmp_path: Path) -> None:
    """limits-only (grpo.code.isolation=limits-only: no namespaces, no uid switch): limits, per-test kill, and
    every process the code started killed (the forked sleeper too)."""
    import subprocess
    import sys

    from hpc_grpo.rewards.code import SANDBOX
    from hpc_grpo.rewards.code_report import read_report

    pids = tmp_path / "pids"  # limits-only: the code can write there; every process it starts notes its pid
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
            "    time.sleep(10**6)\ndef add(a, b):\n    return a + b\ndef spin():\n    while True:\n        pass\n")
    job = {"code": code, "calls": ["add", "spin"], "entry": "add",
           "tests": [{"test": "assert add(1, 2) == 3"}, {"test": "spin()"}, {"test": "assert add(0, 0) == 0"}],
           "per_test_timeout": 0.5, "memory_mb": 512, "isolation": "limits-only"}
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(SANDBOX)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    report = read_report(proc, json.dumps(job).encode(), len(job["tests"]), 30)
    assert report["isolation"] == "limits-only" and report["status"] == "timeout"
    assert (report["outcomes"], report["total"], report["timed_out_in"]) == ([["pass"], None, None], 3, 2)
    assert report["seconds"] < 3
    started = [int(p) for p in pids.read_text().split()]  # other sessions' sandboxes run meanwhile: only ours count
    assert len(started) == 1
    assert not [p for p in started if Path(f"/proc/{p}").exists()], started


def test_verl_codegen_recipe_renders_the_reward() -> None:
    """The 7B recipe's main_ppo call loads this module's compute_score with the recipe's weights, and a
    passthrough that would point the reward elsewhere is refused (one source per setting)."""
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.config.resolve import resolve_spec

    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib")
    argv = VerlEngine().command(spec).argv
    assert "reward.custom_reward_function.path=pkg://hpc_grpo.rewards.code" in argv
    assert "reward.custom_reward_function.name=compute_score" in argv
    assert "+reward.custom_reward_function.reward_kwargs.style_weight=0.1" in argv
    assert not any(a.startswith("custom_reward_function.") for a in argv)  # the legacy top-level key
    import importlib

    mod = importlib.import_module("hpc_grpo.rewards.code")
    assert callable(getattr(mod, "compute_score"))
    clash = resolve_spec("qwen2.5-7b-codegen", "a100-ib", overrides=["reward.custom_reward_function.path=/x.py"])
    assert any(f.key == "passthrough.reward.custom_reward_function.path" for f in VerlEngine().check(clash))


def test_trl_job_picks_the_execution_reward() -> None:
    from hpc_grpo.job.trl_job import reward_function
    from hpc_grpo.config.resolve import resolve_spec

    fn = reward_function(resolve_spec("tiny-codegen", "local"))
    assert fn.__name__ == "code_exec"
    assert fn([fenced("def add(a, b):\n    return a + b")], [GT]) == [1.0]
    assert reward_function(resolve_spec("tiny-gsm8k", "local")).__name__ == "gsm8k_flexible"
