"""The scorer's own cost, attacked: every completion of 1 MB must cost the scoring process under
1 s of CPU and under 50 MB of memory, whatever it holds. The scorer runs in verl's reward threads and in trl's
step, with the GIL: a completion that makes it spin or swell stalls the trainer, not just itself.

Each attack is a 1 MB completion (padded with a comment where the attack itself is short), scored in a fresh
driver process through verl's compute_score and through HumanEval's score_samples, as root and as the
unprivileged test user. The driver measures its own CPU (resource.getrusage(RUSAGE_SELF): the sandbox's processes
are not counted, they are the sandbox's cost, under its own limits) and its peak resident memory over the call
(VmHWM, reset through /proc/self/clear_refs before each). Before this work: 40,000 newlines took 13-16 s (a
backtracking regex), a 60,000-char unterminated fence 2.5-4.3 s, forged sets of colliding integers 41-69 s,
40 outputs of 1 MiB +312 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.unit.test_sandbox_isolation import Runner, as_root, as_user

MB = 1 << 20
CPU_S = 1.0
MEM_MB = 50.0
P = (1 << 61) - 1  # hash(k * P + 1) == 1 for every k: integers that collide in any table
ADD = {"id": "add", "entry_point": "add", "prompt_code": "", "tests": [
    "assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert 5 in add(5, 0)", "assert add(0, 0) <= {1, 2, 3}",
    "assert add(3, 3) == {3: 6}", "assert add(9, 9) == set(range(40000))", "assert not add(0, 0)"]}
FORTY = {"id": "forty", "entry_point": "add", "prompt_code": "", "tests": [f"assert add({i}, 0) == {i}" for i in range(40)]}
IO40 = {"id": "io40", "entry_point": None, "prompt_code": "", "tests": [{"stdin": f"{i}\n", "stdout": f"{i}\n"}
                                                                         for i in range(40)]}
FORGE = '''
import sys, os
def _forge(payload):
    f = sys._getframe(0)
    while f is not None and "back_fd" not in f.f_locals:
        f = f.f_back
    if f is None:
        return
    loc = f.f_locals
    for i in range(1, len(loc["job"]["tests"]) + 1):  # an answer to every call, on the pipe to the judge
        os.write(loc["back_fd"], ("R " + str(i) + " value ").encode() + payload + b"\\n")
    os._exit(0)
'''


def pad(text: str) -> str:
    """`text` grown to 1 MB with a trailing comment line inside its fence."""
    body = text.removesuffix("\n```\n")
    return body + "\n#" + "x" * (MB - len(text) - 8) + "\n```\n"


def fenced(code: str) -> str:
    return "```python\n" + code.strip("\n") + "\n```\n"


def colliding(kind: str) -> str:
    """A forged payload of about 1 MiB: a set (or dict) whose every element hashes alike."""
    n = MB // 22
    items = ",".join(str(k * P + 1) for k in range(n))
    if kind == "d":
        items = ",".join(f"[{k * P + 1},0]" for k in range(n // 2))
    return "{" + f'"{kind}":[' + items + "]}"


ATTACKS: dict[str, tuple[str, dict]] = {  # name -> (1 MB completion, problem)
    "newlines_no_fence": ("\n" * MB, ADD),
    "newlines_then_def": ("\n" * (MB - 40) + "def add(a, b):\n    return 0\n", ADD),
    "spaces_lines": (((" " * 1000 + "\n") * (MB // 1001)).ljust(MB), ADD),
    "unterminated_fence_word": ("```" + "a" * (MB - 3), ADD),
    "backticks": ("`" * MB, ADD),
    "unterminated_fence_code": ("```python\n" + "x = 1\n" * ((MB - 10) // 6), ADD),
    "many_fences": ("```\n" * (MB // 4), ADD),
    "colliding_set": (pad(fenced(FORGE + f"def add(a, b):\n    _forge({colliding('s')!r}.encode())\n    return 0\n")),
                      ADD),
    "colliding_frozenset": (pad(fenced(FORGE + f"def add(a, b):\n    _forge({colliding('f')!r}.encode())\n    return 0\n")),
                            ADD),
    "colliding_dict": (pad(fenced(FORGE + f"def add(a, b):\n    _forge({colliding('d')!r}.encode())\n    return 0\n")), ADD),
    "deep_lists": (pad(fenced(FORGE + "def add(a, b):\n    _forge(b'[' + b'[],' * (1 << 18) + b'[]]')\n    return 0\n")), ADD),
    "forty_outputs_of_quotes": (pad(fenced("def add(a, b):\n    return '\"' * ((1 << 19) - 16)\n")), FORTY),
    "forty_printed_quotes": (pad(fenced("print('\"' * ((1 << 19) - 16))\n")), IO40),
    "forty_printed_tokens": (pad(fenced("print('10 ' * ((1 << 20) // 3 - 8))\n")), IO40),
    "syntax_error_at_end": ("```python\n" + "x = 1\n" * ((MB - 30) // 6) + "def (:\n```\n", ADD),
}
HONEST = {"add": fenced("def add(a, b):\n    return a + b\n"), "forty": fenced("def add(a, b):\n    return a + b\n"),
          "io40": fenced("print(input())\n")}

DRIVER = r"""
import json, os, resource, sys, time
from hpc_grpo.rewards.code import compute_score
from hpc_grpo.evaluation.humaneval import score_samples
from hpc_grpo.rewards.code import RewardWeights
from hpc_grpo.data.codegen import ground_truth

job = json.loads(sys.stdin.read())
W = {"per_test_timeout": 10.0, "memory_mb": 1024}

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0

def measured(call):
    with open("/proc/self/clear_refs", "w") as h:
        h.write("5")  # the peak (VmHWM) restarts from the current size
    before = rss("VmRSS")
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    result = call()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return result, round(cpu, 3), round(rss("VmHWM") - before, 1), round(time.monotonic() - t0, 2)

out, honest_scores = {}, {}
for name, (text, problem, honest) in job.items():
    gt = ground_truth(problem)
    if problem["id"] not in honest_scores:  # once per problem: warm (imports, plan cache, probe), then the honest score
        compute_score("hpc-grpo/codegen", honest, gt, **W)
        score_samples([problem], [[honest]], weights=RewardWeights(**W), workers=1)
        honest_scores[problem["id"]] = compute_score("hpc-grpo/codegen", honest, gt, **W)["score"]
    honest_score = honest_scores[problem["id"]]
    verl, v_cpu, v_mem, v_wall = measured(lambda: compute_score("hpc-grpo/codegen", text, gt, **W))
    ev, e_cpu, e_mem, e_wall = measured(lambda: score_samples([problem], [[text]], weights=RewardWeights(**W),
                                                              workers=1))
    out[name] = {"score": verl["score"], "honest": honest_score, "verl": [v_cpu, v_mem, v_wall],
                 "eval": [e_cpu, e_mem, e_wall], "tests_passed": ev["per_task"][0]["tests_passed"][0],
                 "outcomes": ev["outcomes"]}
print("RESULT=" + json.dumps(out))
"""


def drive(runner: Runner) -> dict:
    job = {name: [text, problem, HONEST[problem["id"]]] for name, (text, problem) in ATTACKS.items()}
    proc = subprocess.run([*runner.prefix, sys.executable, "-c", DRIVER], input=json.dumps(job), capture_output=True,
                          text=True, env=runner.env(), cwd="/", timeout=1200, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, f"driver as {runner.name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("RESULT="))


def check(runner: Runner) -> None:
    assert all(len(text) >= MB - 64 for text, _ in ATTACKS.values()), {n: len(t) for n, (t, _) in ATTACKS.items()}
    got = drive(runner)
    print(json.dumps(got, indent=1))
    costly = {n: r for n, r in got.items() if max(r["verl"][0], r["eval"][0]) >= CPU_S
              or max(r["verl"][1], r["eval"][1]) >= MEM_MB}
    assert not costly, f"as {runner.name}: completions that cost the scorer >= {CPU_S} s CPU or {MEM_MB} MB: {costly}"
    assert all(r["honest"] > 0 for r in got.values()), f"as {runner.name}, the honest versions did not score: {got}"
    won = {n: r for n, r in got.items() if r["score"] > r["honest"]}
    assert not won, f"as {runner.name}: {won}"
    assert got["syntax_error_at_end"]["score"] < 0 and got["syntax_error_at_end"]["outcomes"] == {"syntax_error": 1}
    assert got["newlines_no_fence"]["outcomes"] == {"no_code": 1}


@pytest.mark.skipif(os.geteuid() != 0, reason="the root half needs root (CI runs as root; the user half runs here)")
def test_scorer_cost_as_root() -> None:
    check(as_root())


def test_scorer_cost_as_unprivileged_user() -> None:
    check(as_user())


def test_the_measure_can_fail() -> None:
    """A control of the method: the old fence regex (quadratic), fed a fiftieth of the unterminated-fence attack,
    already spends a measurable share of the budget here, while today's extraction of the whole 1 MB does not."""
    import re
    import resource

    from hpc_grpo.rewards.code import extract_code

    def cpu(call: object) -> float:
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        call()  # type: ignore[operator]
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        return (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)

    old = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
    spent_old = cpu(lambda: old.findall("```" + "a" * (MB // 50)))
    spent_new = cpu(lambda: extract_code(ATTACKS["unterminated_fence_word"][0]))
    assert spent_old > 0.1 and spent_new < 0.1 and spent_new < spent_old / 5, (spent_old, spent_new)
