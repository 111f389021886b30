"""The judge: the process that runs a problem's tests, beside the sandboxed process that runs the solution.

Loaded by path beside code_sandbox.py (stdlib only, like it). The tests are trusted (they come with the data set)
and run here whole: loops, `all(...)`, comprehensions, helper variables, HumanEval's `check(candidate)`. Every name
a test calls that the data set does not define (the entry point, any function of the solution) is a Proxy: calling
it sends the arguments, by value, to the solution's process and returns its result decoded as exact builtin values
(sandbox_values.py: no subclass, no object with its own __eq__ crosses). So every comparison happens here, where
the solution cannot reach: it sees its arguments and nothing else, not the test's frame, constants or expected
values. What the prompt gives (HumanEval/38's `encode_cyclic`, a fence's helpers) runs here too: a round-trip test
`decode(encode('hello')) == 'hello'` sends the solution only `decode('ifmmp')`.

The judge is its own process, forked by the runner before the solution's namespaces are made, with its own
limits (CPU seconds, address space, files) and no capability; the runner kills it at the end and enforces the
per-test deadline on its verdict lines from outside. Its verdicts go to the runner, one line per phase:
`ok 0` | `error 0 WORDS` (the solution's definition, then the given code and the test module's prelude),
then `pass i` | `fail i Name` per test.

The pipes (one line each, read with a byte cap):
    judge -> solution   C <seq> <name> <encoded [args tuple, kwargs dict]>
    solution -> judge   D ok | D error WORDS          (the definition, once)
                        R <seq> value <encoded> | R <seq> raised Name | R <seq> unencodable Name | R <seq> toolarge
Every line from the solution may be forged by it: a line for an old call is skipped, anything else ends its calls
(each later call raises). A forged value is a value the solution could have returned: it decides no verdict.
"""

from __future__ import annotations

import builtins
import os
import resource
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from typing import Any

JUDGE_MB = 256  # the judge's memory above the interpreter: tests, and decoded values of at most VALUE_CAP bytes each
LINE_SLACK = 256  # a response line's words besides its value
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
# What the solution raised, raised again here by the same builtin class; anything else is a SolutionError. Never
# StopIteration: raised from inside map() it would end the iteration (`all(map(candidate, xs))` would hold).
RERAISED = frozenset({"ArithmeticError", "AssertionError", "AttributeError", "EOFError", "Exception", "IndexError",
                      "KeyError", "LookupError", "MemoryError", "NameError", "NotImplementedError", "OSError",
                      "OverflowError", "RecursionError", "RuntimeError", "TypeError", "UnicodeError",
                      "UnicodeDecodeError", "UnicodeEncodeError", "UnboundLocalError", "ValueError",
                      "ZeroDivisionError"})
# Not in the tests' builtins: a test that handed a returned string to one of these would run the solution's text in
# the judge, beside the verdicts.
WITHHELD = ("eval", "exec", "compile", "breakpoint", "input")
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_. ")


class SolutionError(Exception):
    """The solution's call failed in a way no builtin exception of the judge stands for (or its process ended)."""


def _words(raw: bytes, cap: int = 80) -> str:
    """Untrusted words, as safe words of a report line."""
    text = raw[:cap].decode("ascii", "replace")
    return "".join(c for c in text if c in _WORD).strip() or "?"


class Channel:
    """The judge's end of the pipes to the solution's process: one call at a time."""

    def __init__(self, call_fd: int, back_fd: int, values: Any) -> None:
        self.out, self.values = call_fd, values
        self.inp = os.fdopen(back_fd, "rb")
        self.cap = values.VALUE_CAP + LINE_SLACK
        self.seq = 0
        self.broken = ""

    def _line(self) -> bytes:
        line = self.inp.readline(self.cap)
        if not line.endswith(b"\n"):
            self.broken = "the solution's process ended" if not line else "an oversize line"
            raise SolutionError(self.broken)
        return line[:-1]

    def definition(self) -> str:
        """'' when the solution's program defined itself, else the words of its error."""
        try:
            line = self._line()
        except SolutionError as exc:
            return f"crashed {_words(str(exc).encode())}"
        kind, _, rest = line.partition(b" ")
        if kind == b"D" and rest == b"ok":
            return ""
        if kind == b"D" and rest.startswith(b"error "):
            return _words(rest[6:])
        self.broken = "a malformed first line"
        return "malformed"

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        if self.broken:
            raise SolutionError(self.broken)
        self.seq += 1
        data = f"C {self.seq} {name} {self.values.encode((args, kwargs))}\n".encode()  # TypeError: not plain data
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.out, view):]
        except OSError:  # EPIPE: the solution's process has ended
            self.broken = "the solution's process ended"
            raise SolutionError(self.broken) from None
        want = str(self.seq).encode()
        while True:
            parts = self._line().split(b" ", 3)
            if len(parts) >= 3 and parts[0] == b"R" and parts[1].isdigit() and len(parts[1]) < 10 \
                    and int(parts[1]) < self.seq:
                continue  # an old call's line (the harness answering after a forged line): nothing to decide
            if len(parts) < 3 or parts[:2] != [b"R", want]:
                self.broken = "a malformed line"
                raise SolutionError(self.broken)
            kind, rest = parts[2], parts[3] if len(parts) > 3 else b""
            if kind == b"value":
                try:
                    return self.values.decode(rest.decode("ascii"))
                except (ValueError, TypeError, UnicodeDecodeError, MemoryError) as exc:
                    raise SolutionError(f"undecodable value: {type(exc).__name__}") from None
            if kind == b"raised":
                exc_name = _words(rest, 60)
                raise getattr(builtins, exc_name)() if exc_name in RERAISED else SolutionError(exc_name)
            raise SolutionError(_words(kind + b" " + rest))


class Proxy:
    """A function of the solution, as a test sees it: arguments go out by value, a plain value comes back."""

    __slots__ = ("__name__", "_channel")

    def __init__(self, name: str, channel: Channel) -> None:
        self.__name__, self._channel = name, channel

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<solution function {self.__name__}>"


class LazyModule:
    """A standard-library module a test names without importing it (the solution's `import math` was its source
    when the tests ran beside the code): imported here, at its first use."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> object:
        return getattr(__import__(self._name), attr)


def namespace(job: dict, channel: Channel) -> dict:
    """The tests' module: a Proxy for every name they call that the data set does not define (job["calls"]), then
    the problem's setup, what the prompt gives and the test module's prelude, run here; the entry point last."""
    own = {k: v for k, v in vars(builtins).items() if k not in WITHHELD}
    base: dict = {"__builtins__": own, "__name__": "tests"}
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    for name in job.get("calls", ()):
        base[name] = LazyModule(name) if name in stdlib else Proxy(name, channel)
    for label in ("setup", "given", "prelude"):
        if job.get(label):
            exec(compile(job[label], f"<{label}>", "exec"), base)  # trusted: the data set's and the prompt's code
    entry = job.get("entry") or ""
    if entry:
        base[entry] = Proxy(entry, channel)
    return base


def limits(job: dict, n_tests: int, address_space: Any, libc: Any) -> None:
    """CPU seconds for every test, memory, no core, small files; no way to a new privilege; dies with the runner;
    not dumpable (a process of the same user, the code under limits-only, cannot read its memory or trace it)."""
    cpu = int(float(job["per_test_timeout"]) * (n_tests + 1)) + 1
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, address_space(JUDGE_MB, 1)),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(res, (value, value))
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def run(job: dict, call_fd: int, back_fd: int, verdict_fd: int, nonce: str, values: Any) -> None:
    """The judge's whole life: the solution's definition, the namespace, then each test in turn."""
    def report(words: str) -> None:
        os.write(verdict_fd, f"{nonce} {words}\n".encode())

    channel = Channel(call_fd, back_fd, values)
    why = channel.definition()
    if why:
        report(f"error 0 {why}")
        return
    try:
        base = namespace(job, channel)
    except BaseException as exc:  # noqa: BLE001 - the given code or the prelude failed: no test can run
        report(f"error 0 given {_words(type(exc).__name__.encode())}")
        return
    report("ok 0")
    for i, test in enumerate(job["tests"], start=1):
        source = test.get("test") if isinstance(test, dict) else None
        if source is None:
            report(f"fail {i} not_a_function_test")
            continue
        try:
            exec(compile(source, "<test>", "exec"), dict(base))  # a fresh module per test
        except BaseException as exc:  # noqa: BLE001 - AssertionError, a failed call, anything: the test failed
            why = f"{type(exc).__name__} {exc}" if isinstance(exc, SolutionError) else type(exc).__name__
            report(f"fail {i} {_words(why.encode())}")
            continue
        report(f"pass {i}")
