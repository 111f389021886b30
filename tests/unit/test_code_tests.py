"""The test protocol's pieces: how a problem's tests are planned (one per snippet, one per independent assert of a
HumanEval check plus its remainder, the names that become proxies, what the prompt gives), the plain data that
crosses between the judge and the solution (exact builtin types, bounded), the judge's end of the pipes against
forged lines, the scorer's reading of outcomes, and the runner's checks on the report's shape."""

from __future__ import annotations

import json
import os

import pytest

from hpc_grpo.rewards.code_tests import given_code, plan_for
from hpc_grpo.rewards.code_values import judge
from hpc_grpo.sandbox import code_sandbox as sb

values, judge_mod = sb.values, sb.judge


def test_a_snippet_is_one_judged_test_and_its_calls_are_proxied() -> None:
    p = plan_for({"tests": ["assert f(1) == 2", "x = g(1)\nassert all(f(i) == i for i in range(x))",
                            {"stdin": "3\n", "stdout": "6\n"}], "entry_point": "f"})
    assert [t.job for t in p.tests] == [{"test": "assert f(1) == 2"},
                                        {"test": "x = g(1)\nassert all(f(i) == i for i in range(x))"}, {"stdin": "3\n"}]
    assert [t.check for t in p.tests] == [("judged",), ("judged",), ("stdout", "6\n")]  # no expected value leaves
    assert "f" in p.calls and "g" in p.calls and "range" not in p.calls and "all" not in p.calls


def test_humaneval_check_one_test_per_independent_assert_and_the_rest() -> None:
    check = """
METADATA = {'author': 'jt'}
import math

def helper(x):
    return x + 1

def check(candidate):
    assert True, 'this always holds'
    assert candidate([1, 2]) == 3
    assert abs(candidate([0.5]) - 0.5) < 1e-6
    total = sum(range(10))
    assert candidate(list(range(10))) == total
    assert helper(candidate([total])) == 46
    for x in range(3):
        assert candidate([x]) == x
"""
    p = plan_for({"tests": [check], "entry_point": "total_of"})
    jobs = [t.job["test"] for t in p.tests]
    assert jobs[:2] == ["assert total_of([1, 2]) == 3", "assert abs(total_of([0.5]) - 0.5) < 1e-06"]
    assert len(jobs) == 3  # `total` is check's own variable: what uses it runs together, as check(total_of)
    assert "candidate(list(range(10))) == total" in jobs[2] and jobs[2].rstrip().endswith("check(total_of)")
    assert "== 3" not in jobs[2]
    assert "METADATA" in p.prelude and "def helper" in p.prelude and "def check" not in p.prelude
    assert "total_of" in p.calls and "helper" not in p.calls and "math" not in p.calls  # the prelude defines them


def test_given_code_leaves_out_the_entry_and_stubs() -> None:
    prompt = ("import string\n\ndef encode(s):\n    return s[::-1]\n\n"
              "def decode(s):\n    \"\"\"The inverse.\"\"\"\n\n"
              "def other(s):\n    pass\n\nclass Solution:\n    def run(self):\n        ...\n")
    given = given_code(prompt, "decode")
    assert "import string" in given and "def encode" in given
    assert "def decode" not in given and "def other" not in given and "Solution" not in given
    p = plan_for({"tests": ["assert decode(encode('ab')) == 'ab'"], "entry_point": "decode", "prompt_code": prompt})
    assert p.given == given and "encode" not in p.calls and "decode" in p.calls


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 2 ** 80, 1.5, float("inf"), "é\u2028\n", b"\x00\xff",
                                   1 + 2j, [1, [2, []]], (1, (2,)), {1, 2}, frozenset({"a"}), {"k": [1], (1, 2): None},
                                   [True, 1, 1.0]])
def test_encode_decode_roundtrip_keeps_exact_types(value: object) -> None:
    text = values.encode(value)
    assert "\n" not in text and text.isascii()
    back = values.decode(text)
    assert back == value and repr(back) == repr(value)

    def types(x: object) -> object:
        if isinstance(x, (list, tuple)):
            return (type(x), [types(v) for v in x])
        if isinstance(x, dict):
            return (dict, sorted(map(repr, (types(k) for k in x))), sorted(map(repr, (types(v) for v in x.values()))))
        if isinstance(x, (set, frozenset)):
            return (type(x), sorted(map(repr, (types(v) for v in x))))
        return type(x)

    assert types(back) == types(value)


def test_huge_ints_travel_in_hex() -> None:
    """Past Python's 4,300-digit limit of int <-> decimal text (a factorial, say), the value still comes back."""
    for value in (-(7 ** 20000), [3 ** 9000, 1]):
        text = values.encode(value)
        assert '"i":"-0x' in text or '"i":"0x' in text
        assert values.decode(text) == value


class IntSub(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value", [IntSub(3), [IntSub(3)], {"a": IntSub(1)}, object(), type("S", (str,), {})("x"),
                                   type("L", (list,), {})(), range(3), iter([1]), Exception("x"), (i for i in [1])])
def test_encoder_refuses_anything_but_exact_builtins(value: object) -> None:
    with pytest.raises(TypeError):
        values.encode(value)


def test_encoder_bounds_depth_and_size() -> None:
    nested: list[object] = []
    for _ in range(values.MAX_DEPTH + 5):
        nested = [nested]
    with pytest.raises(ValueError):
        values.encode(nested)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises((ValueError, RecursionError)):
        values.encode(loop)
    with pytest.raises(values.TooLarge):
        values.encode("x" * (values.VALUE_CAP + 1))
    with pytest.raises(values.TooLarge):
        values.encode([0] * (values.VALUE_CAP // 2))


@pytest.mark.parametrize("payload", ['{"t": 1}', '{"x": [1]}', '{"t": [1], "s": [2]}', '{"s": [[1]]}',
                                     '{"d": [[[1], 2]]}', '{"d": [[1, 2, 3]]}', '{"b": "zz"}', '{"c": ["1", 2]}',
                                     "[" * 5000 + "]" * 5000, "not json", '{"c": [1]}'])
def test_decode_refuses_forged_shapes(payload: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        values.decode(payload)


def channel_with(lines: bytes) -> judge_mod.Channel:
    """The judge's end of the pipes, the solution's answers already written (what a forging solution could write)."""
    call_r, call_w = os.pipe()
    back_r, back_w = os.pipe()
    os.write(back_w, lines)
    os.close(back_w)
    ch = judge_mod.Channel(call_w, back_r, values)
    ch.unread = call_r  # type: ignore[attr-defined]  # kept open: the calls fit in the pipe's buffer
    return ch


def test_the_judges_channel_against_forged_lines() -> None:
    ch = channel_with(b"D ok\nR 1 value 3\nR 1 value 4\nR 2 value [1]\nR 9 value 0\n")
    assert ch.definition() == ""
    assert ch.call("f", (1,), {}) == 3  # the first answer to call 1 is its value (the solution could return it)
    assert ch.call("f", (2,), {}) == [1]  # a second answer to call 1 is an old line: skipped
    with pytest.raises(judge_mod.SolutionError):
        ch.call("f", (3,), {})  # an answer to a call not made yet: the solution's calls end here
    with pytest.raises(judge_mod.SolutionError):
        ch.call("f", (4,), {})
    raised = channel_with(b"D ok\nR 1 raised ValueError\nR 2 raised StopIteration\nR 3 unencodable AlwaysEq\n"
                          b"R 4 value {\"s\": [1]}\nR 5 value [")
    raised.definition()
    with pytest.raises(ValueError):
        raised.call("f", (), {})
    with pytest.raises(judge_mod.SolutionError):  # never StopIteration: inside map() it would end the iteration
        raised.call("f", (), {})
    with pytest.raises(judge_mod.SolutionError):
        raised.call("f", (), {})
    got = raised.call("f", (), {})
    assert type(got) is set and got == {1}
    with pytest.raises(judge_mod.SolutionError):  # no newline: the process ended mid-line
        raised.call("f", (), {})
    assert channel_with(b"D error NameError\n").definition() == "NameError"
    assert channel_with(b"").definition().startswith("crashed")
    with pytest.raises(TypeError):  # arguments cross by value, plain data only
        channel_with(b"D ok\n").call("f", (object(),), {})


def test_scorer_reads_verdicts_and_compares_stdout() -> None:
    p = plan_for({"tests": ["assert f(1) == 1", {"stdin": "", "stdout": "6\n"}], "entry_point": "f"})
    fn, io = p.tests
    assert judge(fn, ["pass"]) and not judge(fn, ["fail", "AssertionError"])
    for forged in (["value", "true"], ["ok"], None, [], ["pass", "x"]):
        assert not judge(fn, forged), forged
    v = lambda x: ["value", values.encode(x)]  # noqa: E731
    assert judge(io, v(" 6 \n")) and not judge(io, v("7")) and not judge(io, v(6)) and not judge(io, ["pass"])


def lines(nonce: str, *words: str) -> bytes:
    return b"".join(f"{nonce} {w}\n".encode() for w in words)


def test_report_shape_is_checked() -> None:
    r = sb._Reports("n0", 3)
    r.feed(lines("n0", "ok 0", "pass 1", "fail 2 AssertionError", "pass 2", "pass 9", "pass 0", "start 1",
                 "bogus 3 x", "value 3 1", "pass 3x") + b"no nonce here\n" + lines("other", "pass 3"))
    assert r.outcomes == [["ok"], ["pass"], ["invalid", "reported twice"], None]
    assert r.current == 3 and r.anomalies == 9 and not r.done()  # test 3 runs: its clock started at test 2's line
    r.feed(b"n0 fail 3 " + b"A" * 50)  # split across reads
    r.feed(b"B\n")
    assert r.outcomes[3] == ["fail", "A" * 50 + "B"] and r.done()
    programs = sb._Reports("n0", 1, judged=False)  # stdin tests: the child's lines, never a verdict
    programs.feed(lines("n0", "ok 0", "pass 1", "value 1 \"6\""))
    assert programs.outcomes == [["ok"], ["value", '"6"']] and programs.anomalies == 1
    out = r.summary("ok", 0, 0.0, "none")
    assert out["status"] == "ok" and out["anomalies"] == 9 and out["total"] == 3 and len(out["outcomes"]) == 3


def test_oversize_line_dropped_and_phase0_twice_is_an_error() -> None:
    r = sb._Reports("n0", 1, judged=False)
    r.feed(b"n0 value 1 " + b"9" * (sb.VALUE_CAP + 1000))  # no honest line is that long
    r.feed(b"9" * 10 + b"\n" + lines("n0", "ok 0", "ok 0"))
    assert r.outcomes[1] is None and r.outcomes[0] == ["error", "reported twice"] and r.done()
    assert r.summary("ok", 0, 0.0, "none")["status"] == "program_error"


def test_collect_bounds_the_whole_report() -> None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child that floods the pipe with lines that are not the harness's
        os.close(read_fd)
        try:
            while True:
                os.write(write_fd, b"x" * 65535 + b"\n")
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        reports = sb._Reports("n0", 2)
        status = sb._collect(read_fd, reports, per_test=30.0, wall_end=float("inf"))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read_fd)
    assert status == "report_too_large" and sb.REPORT_CAP < reports.read <= sb.REPORT_CAP + (1 << 16)
    assert sb._Reports("n0", 100).cap == 101 * (sb.VALUE_CAP + 4096)  # room for every test's largest value


def test_runner_end_to_end_judges_with_proxies() -> None:
    """The real runner: the judge runs loops, comprehensions and the prompt's helper; a solution that writes a forged
    answer on its pipe only answers its own call (as returning it would), the harness's own answer then skipped;
    one that raises fails that test and no other."""
    code = ("import sys, os\ndef f(x):\n    if x == 2:\n        fr = sys._getframe(1)\n"
            "        back = fr.f_locals.get('back_fd')\n        if back is not None:\n"
            "            os.write(back, b'R 2 value [2]\\n')\n"
            "    if x == 3:\n        raise KeyError(x)\n    return [x, (x,), {x}]\n")
    tests = ["assert f(1) == [1, (1,), {1}]", "assert f(2) == [2]", "assert [f(i)[0] for i in (0, 1)] == [0, 1]",
             "try:\n    f(3)\nexcept KeyError:\n    pass\nelse:\n    raise AssertionError", "assert rev(f(4)[1]) == (4,)"]
    plan = plan_for({"tests": tests, "entry_point": "f", "prompt_code": "def rev(t):\n    return t[::-1]\n"})
    job = {"code": code, "tests": [t.job for t in plan.tests], "calls": list(plan.calls), "entry": "f",
           "given": plan.given, "per_test_timeout": 2.0, "memory_mb": 512}
    report = run_job(job, len(tests))
    assert report["status"] == "ok", report
    assert report["outcomes"] == [["pass"]] * 5, report


def run_job(job: dict, n: int) -> dict:
    import subprocess
    import sys

    from hpc_grpo.rewards.code import SANDBOX
    from hpc_grpo.rewards.code_report import read_report

    proc = subprocess.Popen([sys.executable, "-I", "-S", str(SANDBOX)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    return read_report(proc, json.dumps(job).encode(), n, 60)


def test_the_judge_is_bounded() -> None:
    """The judge has limits of its own: memory (a GiB in a test is a MemoryError there, a failed test), no eval or
    exec for the tests (a returned string is never run there) and the per-test deadline, enforced from outside it
    (a test that never ends is a timeout, the judge killed)."""
    job = {"code": "def f(x):\n    return x\n", "calls": ["f"], "entry": "f", "per_test_timeout": 1.0, "memory_mb": 512,
           "tests": [{"test": "assert f(1) == 1"}, {"test": "x = bytearray(1 << 30)"}, {"test": "eval(f('1'))"},
                     {"test": "while True:\n    f(1)"}, {"test": "assert f(2) == 2"}]}
    report = run_job(job, 5)
    assert report["outcomes"][:3] == [["pass"], ["fail", "MemoryError"], ["fail", "NameError"]], report  # no eval
    assert report["status"] == "timeout" and report["timed_out_in"] == 4 and report["outcomes"][3:] == [None, None]
    assert report["seconds"] < 5
