"""The test protocol's pieces: how asserts split (and which stay weak), the scorer's constant evaluator, decoding and
judging returned data, the sandbox's strict encoder and its checks on the report's shape (forged, repeated,
out-of-range, oversize lines)."""

from __future__ import annotations

import ast
import json
import os

import pytest

from hpc_grpo.rewards.code_tests import NotConstant, decode_value, judge, plan_for, trusted_value
from hpc_grpo.rewards.code_values import UDict, USet, values_equal


def exact(back: object, value: object) -> bool:
    """The decoded value has the original's exact types all the way down (sets and dicts as USet/UDict)."""
    if isinstance(value, (set, frozenset)):
        return type(back) is USet and back.frozen == (type(value) is frozenset) and len(back.items) == len(value)
    if isinstance(value, dict):
        return type(back) is UDict and len(back.pairs) == len(value)
    if isinstance(value, (list, tuple)):
        return type(back) is type(value) and all(exact(b, v) for b, v in zip(back, value))
    return type(back) is type(value) and repr(back) == repr(value)


from hpc_grpo.sandbox import code_sandbox as sb  # noqa: E402


def plan(*tests: object, entry: str = "f") -> list[tuple[dict[str, str], tuple[object, ...]]]:
    """(job, check) per test; a cmp check's last field (the expected value's encoded length) is checked apart."""
    out = []
    for t in plan_for({"tests": list(tests), "entry_point": entry}).tests:
        if t.check[0] == "cmp":
            assert t.check[4] == len(sb._encode(t.check[2]))
        out.append((t.job, t.check[:4] if t.check[0] == "cmp" else t.check))
    return out


@pytest.mark.parametrize("source,job,check", [
    ("assert f(1, 2) == 3", {"call": "f(1, 2)"}, ("cmp", "==", 3, True)),
    ("assert 3 == f(1, 2), 'message'", {"call": "f(1, 2)"}, ("cmp", "==", 3, False)),
    ("assert f([1, 2]) != [2, 1]", {"call": "f([1, 2])"}, ("cmp", "!=", [2, 1], True)),
    ("assert f(2) is True", {"call": "f(2)"}, ("cmp", "is", True, True)),
    ("assert f(2) is not None", {"call": "f(2)"}, ("cmp", "is not", None, True)),
    ("assert f('a') in ('a', 'b')", {"call": "f('a')"}, ("cmp", "in", ("a", "b"), True)),
    ("assert f(5 * 17)", {"call": "f(5 * 17)"}, ("truth", True)),
    ("assert not f(4)", {"call": "f(4)"}, ("truth", False)),
    ("assert abs(f(1.33) - 0.33) < 1e-6", {"call": "f(1.33)"}, ("close", "abs", 0.33, "<", 1e-6)),
    ("assert math.fabs(2.0/3.0 - f(x=1)) <= 1e-6", {"call": "f(x=1)"}, ("close", "fabs", 2 / 3, "<=", 1e-6)),
    ("assert math.isclose(f(1), 0.5, rel_tol=1e-3)", {"call": "f(1)"}, ("isclose", 0.5, (("rel_tol", 1e-3),))),
    ("assert sorted(f(3))[0] == -(2 ** 3)", {"call": "sorted(f(3))[0]"}, ("cmp", "==", -8, True)),
    ("assert set(f((1, 2))) == set([1, 2])", {"call": "set(f((1, 2)))"}, ("cmp", "==", {1, 2}, True)),
    ("assert f(*[1, 2]) == {'a': (1,)}", {"call": "f(*[1, 2])"}, ("cmp", "==", {"a": (1,)}, True)),
])
def test_split_forms(source: str, job: dict[str, str], check: tuple[object, ...]) -> None:
    assert plan(source) == [(job, check)]


@pytest.mark.parametrize("source", [
    "x = f(1)\nassert x == 2",  # two statements
    "assert f(1) == 2 and f(2) == 3",  # a boolean operator
    "assert f(1) - 0.5 < 1e-6",  # the expected value would ride along inside the call
    "assert all(f(x) == x for x in range(3))",  # a comparison inside the call
    "assert f(1) == g(2)",  # no constant side
    "assert f(1) is 5",  # `is` with a value that is not a singleton
    "assert f(1) == 2 ** 10 ** 9",  # too large for the scorer to evaluate
    "assert f(1) == 1 == 1",  # chained
    "for i in range(3):\n    assert f(i) == i",
    "this is not python",
])
def test_what_stays_weak(source: str) -> None:
    assert plan(source) == [({"exec": source}, ("ok",))]


def test_stdin_tests_send_no_stdout() -> None:
    assert plan({"stdin": "3\n", "stdout": "6\n"}) == [({"stdin": "3\n"}, ("stdout", "6\n"))]


def test_humaneval_check_split_and_weak_remainder() -> None:
    check = """
METADATA = {'author': 'jt'}
import math

def check(candidate):
    assert True, 'this always holds'
    assert candidate([1, 2]) == 3
    assert abs(candidate([0.5]) - 0.5) < 1e-6
    total = sum(range(10))
    assert candidate(list(range(10))) == total
    assert candidate([total]) == 45
    for x in range(3):
        assert candidate([x]) == x
"""
    p = plan_for({"tests": [check], "entry_point": "total_of"})
    jobs = [t.job for t in p.tests]
    assert jobs[:2] == [{"call": "total_of([1, 2])"}, {"call": "total_of([0.5])"}]
    assert p.tests[0].check == ("cmp", "==", 3, True, 1) and p.tests[1].check[0] == "close"
    assert len(p.tests) == 3 and p.weak == 1  # `total` is the test's own variable: those asserts stay together
    weak = jobs[2]["exec"]
    assert "candidate(list(range(10))) == total" in weak and "candidate([total]) == 45" in weak
    assert "== 3" not in weak and "0.5) < 1e-06" not in weak  # split answers stay out of the weak remainder
    assert weak.rstrip().endswith("check(total_of)")
    assert "METADATA" in p.prelude and "import math" in p.prelude and "def check" not in p.prelude


def test_trusted_value_is_bounded_and_never_runs_names() -> None:
    ev = lambda s: trusted_value(ast.parse(s, mode="eval").body)  # noqa: E731
    assert ev("[1, -2.5, 'a', (None, True), {1: b'x'}]") == [1, -2.5, "a", (None, True), {1: b"x"}]
    assert ev("6.0/5.0") == 1.2 and ev("tuple([2, 6])") == (2, 6) and ev("'ab' * 2") == "abab"
    assert ev("float('inf')") == float("inf") and ev("frozenset({1})") == frozenset({1})
    for bad in ("x", "f(1)", "open('/etc/passwd')", "2 ** 10 ** 9", "'a' * 10 ** 9", "[1] * 10 ** 7",
                "list(range(10 ** 9))", "(1).__class__", "{**a}", "'%s' % 1", "[*a]"):
        with pytest.raises(NotConstant):
            ev(bad)


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 2 ** 80, 1.5, float("inf"), "é\u2028\n", b"\x00\xff",
                                   1 + 2j, [1, [2, []]], (1, (2,)), {1, 2}, frozenset({"a"}), {"k": [1], (1, 2): None},
                                   [True, 1, 1.0]])
def test_encode_decode_roundtrip_keeps_exact_types(value: object) -> None:
    text = sb._encode(value)
    assert "\n" not in text and text.isascii()
    back = decode_value(text)
    assert values_equal(back, value) and exact(back, value)


def test_huge_ints_travel_in_hex() -> None:
    """Past Python's 4,300-digit limit of int <-> decimal text (a factorial, say), the value still comes back."""
    for value in (-(7 ** 20000), [3 ** 9000, 1]):
        text = sb._encode(value)
        assert '"i":"-0x' in text or '"i":"0x' in text
        assert values_equal(decode_value(text), value)


class IntSub(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value", [IntSub(3), [IntSub(3)], {"a": IntSub(1)}, object(), type("S", (str,), {})("x"),
                                   type("L", (list,), {})(), range(3), iter([1]), Exception("x")])
def test_encoder_refuses_anything_but_exact_builtins(value: object) -> None:
    with pytest.raises(TypeError):
        sb._encode(value)


def test_encoder_bounds_depth_and_size() -> None:
    nested: list[object] = []
    for _ in range(sb.MAX_DEPTH + 5):
        nested = [nested]
    with pytest.raises(ValueError):
        sb._encode(nested)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises((ValueError, RecursionError)):
        sb._encode(loop)
    with pytest.raises(sb._TooLarge):
        sb._encode("x" * (sb.VALUE_CAP + 1))
    with pytest.raises(sb._TooLarge):
        sb._encode([0] * (sb.VALUE_CAP // 2))


@pytest.mark.parametrize("payload", ['{"t": 1}', '{"x": [1]}', '{"t": [1], "s": [2]}', '{"s": [[1]]}',
                                     '{"d": [[[1], 2]]}', '{"d": [[1, 2, 3]]}', '{"b": "zz"}', '{"c": ["1", 2]}',
                                     "[" * 5000 + "]" * 5000, "not json", '{"c": [1]}'])
def test_decode_refuses_forged_shapes(payload: str) -> None:
    with pytest.raises(ValueError):
        decode_value(payload)


def test_judge_compares_like_the_original_assert() -> None:
    t = lambda s: plan_for({"tests": [s], "entry_point": "f"}).tests[0]  # noqa: E731
    v = lambda x: ["value", sb._encode(x)]  # noqa: E731
    assert judge(t("assert f(1) == 1"), v(True)) and judge(t("assert f(1) == 1"), v(1.0))  # Python's == on builtins
    assert not judge(t("assert f(1) is True"), v(1)) and judge(t("assert f(1) is True"), v(True))
    assert judge(t("assert abs(f(1) - 0.3) < 1e-9"), v(0.1 + 0.2)) and not judge(t("assert abs(f(1) - 0.3) < 1e-9"), v(0.4))
    assert not judge(t("assert abs(f(1) - 0.3) < 1e-9"), v(float("nan")))
    assert not judge(t("assert abs(f(1) - 0.3) < 1e-9"), v("0.3"))  # a TypeError in the original: a failure
    assert judge(t("assert not f(1)"), v([])) and not judge(t("assert not f(1)"), v([0]))
    assert judge(t("assert f(1) in [1, 2]"), v(2)) and not judge(t("assert f(1) < 3"), v("a"))
    stdout = plan_for({"tests": [{"stdin": "", "stdout": "6\n"}]}).tests[0]
    assert judge(stdout, v(" 6 \n")) and not judge(stdout, v("7"))
    for forged in (["ok"], ["raised", "AssertionError"], ["invalid", "reported twice"], None, [], ["value"],
                   ["value", 3], ["value", "{bad"], ["unencodable", "AlwaysEq"], ["toolarge"]):
        assert not judge(t("assert f(1) == 1"), forged), forged
    weak = plan_for({"tests": ["x = f(1)\nassert x"], "entry_point": "f"}).tests[0]
    assert judge(weak, ["ok"]) and not judge(weak, v(True))


def lines(nonce: str, *words: str) -> bytes:
    return b"".join(f"{nonce} {w}\n".encode() for w in words)


def test_report_shape_is_checked() -> None:
    r = sb._Reports("n0", 3)
    r.feed(lines("n0", "ok 0", "value 1 3", "ok 2", "ok 2", "value 9 1", "value 0 1", "start 1", "bogus 3 x",
                 "value 3x 1") + b"no nonce here\n" + lines("other", "value 3 3"))
    assert r.outcomes == [["ok"], ["value", "3"], ["invalid", "reported twice"], None]
    assert r.current == 3 and r.anomalies == 8 and not r.done()  # test 3 runs: its clock started at `ok 2`
    r.feed(b"n0 value 3 " + b"1" * 1000)  # split across reads
    r.feed(b"1\n")
    assert r.outcomes[3] == ["value", "1" * 1001] and r.done()
    out = r.summary("ok", 0, 0.0, "none")
    assert out["status"] == "ok" and out["anomalies"] == 8 and out["total"] == 3 and len(out["outcomes"]) == 3


def test_oversize_line_dropped_and_phase0_twice_is_an_error() -> None:
    r = sb._Reports("n0", 1)
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


def test_sandbox_end_to_end_reports_plain_outputs() -> None:
    """The real runner: values come back encoded, a forged line for a test counts as reported twice."""
    import subprocess
    import sys

    from hpc_grpo.rewards.code import SANDBOX
    from hpc_grpo.rewards.code_report import read_report

    code = ("import sys\ndef f(x):\n    if x == 2:\n        fr = sys._getframe(1)\n"
            "        while 'nonce' not in fr.f_locals:\n            fr = fr.f_back\n"
            "        loc = fr.f_locals\n        import os\n"
            "        os.write(loc['report_fd'], f\"{loc['nonce']} value 3 42\\n\".encode())\n"
            "    return [x, (x,), {x}]\n")
    job = {"code": code, "tests": [{"call": "f(1)"}, {"call": "f(2)"}, {"call": "f(3)"}, {"exec": "assert f(1)"}],
           "per_test_timeout": 2.0, "memory_mb": 512}
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(SANDBOX)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    report = read_report(proc, json.dumps(job).encode(), len(job["tests"]), 60)
    assert report["status"] == "ok", report
    assert report["outcomes"][:2] == [["value", '[1,{"t":[1]},{"s":[1]}]'], ["value", '[2,{"t":[2]},{"s":[2]}]']]
    assert report["outcomes"][2:] == [["invalid", "reported twice"], ["ok"]] and report["anomalies"] == 1
