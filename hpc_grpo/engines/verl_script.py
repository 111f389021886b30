"""Read a verl launch script: its `export`s, assignments and arrays, and the trainer's `--config-name` and overrides.

Users arrive with bash scripts, not recipes (`hpc-grpo import`). The script is never run. A real bash parser was
weighed: bashlex (pure Python) refuses bash arrays (`ACTOR=( ... )`), the shape most of verl's examples keep their
overrides in, and tree-sitter's grammar needs a compiled extension; so this is a small reader of the part of bash
launch scripts use. It splits the text into commands with their line numbers (continuations, quotes, `;`, `&&`,
pipes, here-documents, comments), expands words as bash would from the script's own values only (never from this
machine's environment: the import must not depend on who runs it): `$VAR`, `${VAR:-default}` and its kin, arrays and
`"${NAME[@]}"`, `$((...))` integer arithmetic (evaluated by a small reader of integers and operators, never `eval`).
`if` and `case` are followed where their test compares values the script sets; where it cannot be decided, what the
block sets is marked unknown, and an override that needs it is an error. `$(...)` is never run: it is reported as
not resolved. Every construct it does not follow is one message with its line number.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from dataclasses import dataclass, field

MAIN_MODULE = "verl.trainer.main_ppo"
# Trainer entry points that take main_ppo's Hydra overrides; the module's last part names the trainer.
_ENTRY = re.compile(r"^(verl\.trainer\.main_ppo|(?:verl\.)?(?:recipe|experimental)\.[\w.]*\.main_\w+|[\w.]*\.main_ppo)$")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^({_NAME})(\[[^\]]*\])?(\+?)=(.*)\Z", re.DOTALL)
_PLACEHOLDER = re.compile(r"<[^<>=\s]+>|\bTODO\b|\bFIXME\b|/path/to/|\byour[_-]", re.IGNORECASE)
UNKNOWN = "\x00unknown\x00"  # the value of what the script sets where the reader cannot know it


@dataclass
class Script:
    """What a launch script says. `overrides` keep their order; `config_name` is None when the script names none."""

    config_name: str | None = None
    overrides: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)  # $VAR names and $(...) with no value in the script
    ignored: list[str] = field(default_factory=list)  # commands that set nothing hpc-grpo reads, with their line
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # constructs that hide what an override is: the import refuses
    placeholders: list[tuple[str, str]] = field(default_factory=list)  # (key, value) left for the user to fill
    entry: str = MAIN_MODULE  # the module the script runs
    override_lines: list[int] = field(default_factory=list)  # the script's line of each override
    config_path: str | None = None  # --config-path as written (expanded where the script says)


class _Unsupported(Exception):
    """A construct the reader does not follow (the message names it)."""


# ---- splitting the text into commands -------------------------------------------------------------------------

@dataclass
class _Cmd:
    line: int
    text: str
    after_op: str = ""  # "&&" / "||" when it runs only after another command's status
    words: list[list[tuple[str, str]]] = field(default_factory=list)  # each word: (text, quote) parts


def _heredoc_end(text: str, i: int) -> str | None:
    m = re.match(r"<<-?\s*(['\"]?)(\w+)\1", text[i:])
    return m.group(2) if m else None


def _split_commands(text: str) -> list[_Cmd]:
    """Commands with the line they start on. Array assignments keep their parentheses; `$(...)` is kept whole."""
    cmds: list[_Cmd] = []
    buf: list[str] = []
    line, start, i, n = 1, 1, 0, len(text)
    quote = ""
    depth = 0  # ( ... ) of arrays, $( ... ) and $(( ... ))
    op = ""
    heredocs: list[str] = []

    def flush(next_op: str = "") -> None:
        nonlocal buf, op
        body = "".join(buf).strip()
        if body:
            cmds.append(_Cmd(start, body, op))
        buf = []
        op = next_op

    while i < n:
        ch = text[i]
        if not buf or not "".join(buf).strip():
            start = line
        if quote == "'":
            buf.append(ch)
            if ch == "'":
                quote = ""
        elif ch == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                line += 1
                buf.append(" ")
            else:
                buf.append(text[i:i + 2])
            i += 2
            continue
        elif quote == '"':
            buf.append(ch)
            if ch == '"':
                quote = ""
            elif ch == "\n":
                line += 1
            elif ch == "$" and text.startswith("$(", i):
                depth += 1
                buf.append("(")
                i += 2
                continue
            elif ch == ")" and depth:
                depth -= 1
        elif ch in "'\"":
            quote = ch
            buf.append(ch)
        elif ch == "#" and (not buf or buf[-1][-1:].isspace() or buf[-1][-1:] in "(;"):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif ch == "(":
            depth += 1
            buf.append(ch)
        elif ch == ")" and depth:
            depth -= 1
            buf.append(ch)
        elif ch == "\n":
            line += 1
            if depth:
                buf.append(" ")
            else:
                flush()
                for end in heredocs:  # skip each here-document's body
                    while i + 1 < n:
                        nl = text.find("\n", i + 1)
                        body_line = text[i + 1:nl if nl >= 0 else n]
                        i = nl if nl >= 0 else n
                        line += 1
                        if body_line.strip() == end:
                            break
                heredocs = []
        elif depth:
            buf.append(ch)
        elif ch == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
            marker = _heredoc_end(text, i)
            if marker:
                heredocs.append(marker)
            buf.append(ch)
        elif ch == ";" and not text.startswith(";;", i):
            flush()
        elif ch == ";":
            buf.append(";;")
            i += 2
            continue
        elif (text.startswith("&&", i) or text.startswith("||", i)) and \
                "".join(buf).count("[[") <= "".join(buf).count("]]"):
            flush(text[i:i + 2])
            i += 2
            continue
        else:
            buf.append(ch)
        i += 1
    if quote:
        raise _Unsupported(f"line {start}: a quote opened here is never closed")
    flush()
    return cmds


def _double_quote_end(text: str, i: int) -> int:
    """The index of the '"' that closes the one at i (a `$(...)` inside may hold quotes of its own)."""
    j, depth, n = i + 1, 0, len(text)
    while j < n and (text[j] != '"' or depth):
        if text[j] == "\\":
            j += 1
        elif text.startswith("$(", j):
            depth += 1
            j += 1
        elif text[j] == ")" and depth:
            depth -= 1
        j += 1
    return j


def _closing(text: str, j: int, open_ch: str, close_ch: str) -> int:
    """The index just past the close_ch that balances an open_ch before j (quotes inside are skipped)."""
    depth, q, n = 1, "", len(text)
    while j < n and depth:
        c = text[j]
        if q:
            q = "" if c == q else q
        elif c in "'\"":
            q = c
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
        j += 1
    return j


def _operator(text: str, i: int, chars: str, words: list[list[tuple[str, str]]]) -> int:
    """Append the operator word (a pipe, `&&`, a redirection like `2>&1`) that starts at i; the index past it."""
    j = i
    while j < len(text) and text[j] in chars:
        j += 1
    words.append([(text[i:j], "op")])
    return j


def _words(text: str) -> list[list[tuple[str, str]]]:
    """Words as lists of (text, quote) parts: quote is '' (bare), "'" or '"'. `$(...)` stays inside its word;
    `NAME=(...)` is one word whose bare text keeps the parentheses."""
    words: list[list[tuple[str, str]]] = []
    cur: list[tuple[str, str]] = []
    i, n = 0, len(text)
    started = False

    def add(part: str, quote: str) -> None:
        nonlocal started
        started = True
        if cur and cur[-1][1] == quote:
            cur[-1] = (cur[-1][0] + part, quote)
        else:
            cur.append((part, quote))

    while i < n:
        ch = text[i]
        if ch.isspace():
            if started:
                words.append(cur)
            cur, started = [], False
            i += 1
        elif ch == "'":
            j = text.find("'", i + 1)
            add(text[i + 1:j], "'")
            i = j + 1
        elif ch == '"':
            j = _double_quote_end(text, i)
            add(text[i + 1:j], '"')
            i = j + 1
        elif ch == "\\" and i + 1 < n:
            add(text[i + 1], "'")
            i += 2
        elif ch == "`":
            j = text.find("`", i + 1)
            j = n - 1 if j < 0 else j
            add(text[i:j + 1], "")
            i = j + 1
        elif ch == "<" and started and re.match(r"<[^<>\s]+>", text[i:]):  # key=<fill me>, not a redirection
            m = re.match(r"<[^<>\s]+>", text[i:])
            add(m.group(0), "'")  # type: ignore[union-attr]
            i += m.end()  # type: ignore[union-attr]
        elif text.startswith("${", i):
            j = _closing(text, i + 2, "{", "}")
            add(text[i:j], "")
            i = j
        elif ch == "(" or text.startswith("$(", i):
            j = _closing(text, i + (2 if ch == "$" else 1), "(", ")")
            add(text[i:j], "")
            i = j
        elif ch in "|&<>" and not started or ch in "|&":
            if started:
                words.append(cur)
            cur, started = [], False
            i = _operator(text, i, "|&<>0123456789-", words)
        elif ch in "<>":
            if started and len(cur) == 1 and cur[0][1] == "" and cur[0][0].isdigit():  # 2>&1
                cur, started = [], False
            elif started:
                words.append(cur)
                cur, started = [], False
            i = _operator(text, i, "<>&0123456789-", words)
        else:
            add(ch, "")
            i += 1
    if started:
        words.append(cur)
    return words


# ---- expansion ------------------------------------------------------------------------------------------------

_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
              ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
              ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}


class _Reader:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.values: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.unknown: dict[str, str] = {}  # name -> what sets it where the reader cannot know (the block, its line)
        self.line = 0
        self.used_unknown: list[str] = []

    # -- values
    def _get(self, name: str) -> str | None:
        if name in self.unknown:
            self.used_unknown.append(name)
            return UNKNOWN
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else ""
        return self.values.get(name)

    def _unresolved(self, what: str, written: str | None = None) -> str:
        """Record a name (or `$(...)`) the script gives no value; the text stays as written."""
        if what not in self.script.unresolved:
            self.script.unresolved.append(what)
        return written or what

    def arith(self, expr: str) -> str:
        """`$((expr))`: integers and operators only, names from the script's values."""
        text = re.sub(r"\$\{?(" + _NAME + r")\}?", r"\1", expr.strip())
        try:
            tree = ast.parse(text.replace("/", "//"), mode="eval")
        except SyntaxError:
            raise _Unsupported(f"line {self.line}: $(({expr})) is not integer arithmetic hpc-grpo can read") from None

        def ev(node: ast.AST) -> int:
            if isinstance(node, ast.Expression):
                return ev(node.body)
            if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
                return node.value
            if isinstance(node, ast.Name):
                raw = self._get(node.id)
                if raw is None or raw == "":
                    return 0  # bash reads an unset name as 0
                if raw == UNKNOWN:
                    raise _Unsupported(UNKNOWN)
                if not re.fullmatch(r"[-+]?\d+", raw.strip()):
                    if re.fullmatch(_NAME, raw.strip()):
                        return ev(ast.Name(raw.strip()))
                    raise _Unsupported(f"line {self.line}: $(({expr})) uses {node.id}={raw}, not an integer")
                return int(raw)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
                v = ev(node.operand)
                return -v if isinstance(node.op, ast.USub) else v
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
                a, b = ev(node.left), ev(node.right)
                if b == 0:
                    raise _Unsupported(f"line {self.line}: $(({expr})) divides by zero (a name it uses is not "
                                       "set yet at this line: bash stops here too)")
                return int(a / b)  # bash truncates toward zero
            if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
                a, b = ev(node.left), ev(node.right)
                if isinstance(node.op, ast.Pow) and (b < 0 or b > 64):
                    raise _Unsupported(f"line {self.line}: $(({expr})): exponent {b} out of range")
                return int(_ARITH_OPS[type(node.op)](a, b))
            raise _Unsupported(f"line {self.line}: $(({expr})) is not integer arithmetic hpc-grpo can read")

        try:
            return str(ev(tree))
        except _Unsupported as exc:
            if str(exc) == UNKNOWN:
                return UNKNOWN
            raise

    def _param(self, body: str, quoted: bool) -> list[str] | str:
        """The value of `${body}`: a list for `NAME[@]`, else a string."""
        m = re.fullmatch(rf"({_NAME})\[([@*])\]", body)
        if m:
            name = m.group(1)
            if name in self.unknown:
                self.used_unknown.append(name)
                return [UNKNOWN]
            if name in self.arrays:
                return list(self.arrays[name]) if m.group(2) == "@" or not quoted else " ".join(self.arrays[name])
            if name in self.values:
                return [self.values[name]]
            self._unresolved(name)
            return []
        if re.fullmatch(r"[@*]:\d+(:\d+)?", body):
            self.script.notes.append(f"line {self.line}: ${{{body}}} (the script's own arguments) left out: add "
                                     "them as key=value after `hpc-grpo plan` instead")
            return []
        m = re.fullmatch(rf"({_NAME})(//?|##?|%%?)(.*)", body, re.DOTALL)
        if m and not re.fullmatch(rf"{_NAME}:?[-=+?].*", body, re.DOTALL):
            return self._pattern(m.group(1), m.group(2), m.group(3))
        m = re.fullmatch(rf"#({_NAME})(\[[@*]\])?", body)
        if m:
            name = m.group(1)
            if m.group(2):
                return str(len(self.arrays.get(name, [])))
            return str(len(self._get(name) or ""))
        m = re.fullmatch(rf"({_NAME})\[(\d+)\]", body)
        if m:
            arr = self.arrays.get(m.group(1))
            if arr is None:
                value = self._get(m.group(1)) if m.group(2) == "0" else None
                return value if value is not None else self._unresolved(m.group(1), "${" + body + "}")
            k = int(m.group(2))
            return arr[k] if k < len(arr) else ""
        m = re.fullmatch(rf"({_NAME}|[0-9])(?:(:?[-=+?])(.*))?", body, re.DOTALL)
        if not m:
            raise _Unsupported(f"line {self.line}: ${{{body}}} is a parameter expansion hpc-grpo does not read")
        name, op, word = m.groups()
        value = None if name.isdigit() else self._get(name)
        if name.isdigit():
            self.script.notes.append(f"line {self.line}: ${name} (the script's argument {name}) read as not given")
        if op is None:
            return value if value is not None else self._unresolved(name, "$" + name)
        empty = value is None or (op.startswith(":") and value == "")
        if op.endswith("-") or op.endswith("="):
            if value == UNKNOWN:
                return UNKNOWN
            if empty:
                default = " ".join(w for part in _words(word) for w in self.expand_word(part))
                if op.endswith("="):
                    self.values[name] = default
                return default
            return value  # type: ignore[return-value]
        if op.endswith("+"):
            return "" if empty else " ".join(w for part in _words(word) for w in self.expand_word(part))
        if empty:
            raise _Unsupported(f"line {self.line}: ${{{body}}} stops the script when {name} is unset")
        return value  # type: ignore[return-value]

    def _pattern(self, name: str, op: str, arg: str) -> str:
        """`${NAME/pat/rep}`, `${NAME//pat/rep}`, `${NAME#pat}`, `${NAME%pat}` and their longest forms."""
        value = self._get(name)
        if value is None:
            return self._unresolved(name, "${" + name + op + arg + "}")
        if value == UNKNOWN:
            return UNKNOWN
        if op.startswith("/"):
            pat, _, rep = arg.partition("/")
            pat, rep = self.expand_text(pat), self.expand_text(rep)
            if any(c in pat for c in "*?["):
                raise _Unsupported(f"line {self.line}: ${{{name}{op}{arg}}}: a glob in a replacement pattern is "
                                   "not read")
            return value.replace(pat, rep) if op == "//" else value.replace(pat, rep, 1)
        pat = self.expand_text(arg)
        cuts = range(len(value) + 1)
        if op.startswith("#"):
            hits = [k for k in cuts if fnmatch.fnmatchcase(value[:k], pat)]
            return value[(max(hits) if op == "##" else min(hits)):] if hits else value
        hits = [k for k in cuts if fnmatch.fnmatchcase(value[k:], pat)]
        return value[:(min(hits) if op == "%%" else max(hits))] if hits else value

    def expand_text(self, text: str, quoted: bool = True) -> str:
        """A string with its $ forms expanded (arrays joined by spaces)."""
        fields = self._expand_part(text, quoted)
        return "".join(f if isinstance(f, str) else " ".join(f) for f in fields)

    def _expand_part(self, text: str, quoted: bool) -> list[str | list[str]]:
        """Pieces of expanded text; a list piece is an array's elements (separate words in `"${A[@]}"`)."""
        out: list[str | list[str]] = []
        i, n = 0, len(text)
        lit: list[str] = []

        def push(piece: str | list[str]) -> None:
            if lit:
                out.append("".join(lit))
                lit.clear()
            out.append(piece)

        while i < n:
            ch = text[i]
            if ch == "\\" and quoted and i + 1 < n and text[i + 1] in '$`"\\':
                lit.append(text[i + 1])
                i += 2
                continue
            if ch == "`":
                j = text.find("`", i + 1)
                j = n - 1 if j < 0 else j
                push(self._subst(text[i + 1:j]))
                i = j + 1
                continue
            if ch != "$" or i + 1 >= n:
                lit.append(ch)
                i += 1
                continue
            if text.startswith("$((", i):
                j, depth = i + 3, 2
                while j < n and depth:
                    depth += {"(": 1, ")": -1}.get(text[j], 0)
                    j += 1
                push(self.arith(text[i + 3:j - 2]))
                i = j
            elif text.startswith("$(", i):
                j, depth = i + 2, 1
                while j < n and depth:
                    depth += {"(": 1, ")": -1}.get(text[j], 0)
                    j += 1
                push(self._subst(text[i + 2:j - 1]))
                i = j
            elif text[i + 1] == "{":
                j, depth = i + 2, 1
                while j < n and depth:
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    j += 1
                push(self._param(text[i + 2:j - 1], quoted))
                i = j
            elif text[i + 1] in "@*":
                self.script.notes.append(f"line {self.line}: ${text[i + 1]} (the script's own arguments) left "
                                         "out: add them as key=value after `hpc-grpo plan` instead")
                push([])
                i += 2
            elif text[i + 1] in "#?$!0123456789-":
                push(self._unresolved("$" + text[i + 1]))
                i += 2
            else:
                m = re.match(_NAME, text[i + 1:])
                if not m:
                    lit.append(ch)
                    i += 1
                    continue
                value = self._get(m.group(0))
                push(value if value is not None else self._unresolved(m.group(0), "$" + m.group(0)))
                i += 1 + m.end()
        if lit:
            out.append("".join(lit))
        return out

    def _subst(self, body: str) -> str:
        what = "$(" + body.strip() + ")"
        self.script.notes.append(f"line {self.line}: {what} is a command substitution: not run (hpc-grpo never "
                                 "runs the script), left as written")
        return self._unresolved(what)

    def expand_word(self, word: list[tuple[str, str]], split: bool = True) -> list[str]:
        """One word -> the words it becomes: `"${A[@]}"` gives one per element, an unquoted value splits at
        spaces; quotes removed."""
        result: list[str] = [""]
        produced = False
        for text, quote in word:
            if quote == "'":
                result[-1] += text
                produced = True
                continue
            if quote == "op":
                return [text]
            for piece in self._expand_part(text, quote == '"'):
                if isinstance(piece, list):
                    if not piece:
                        continue
                    result[-1] += piece[0]
                    result += piece[1:]
                    produced = True
                elif quote == '"' or not split or not piece.split() or piece == UNKNOWN or "$(" in piece:
                    result[-1] += piece
                    produced = produced or quote == '"' or bool(piece)
                else:
                    parts = piece.split()
                    lead, trail = piece[:1].isspace(), piece[-1:].isspace()
                    if lead and result[-1]:
                        result.append("")
                    result[-1] += parts[0]
                    for p in parts[1:]:
                        result.append(p)
                    if trail:
                        result.append("")
                    produced = True
        if not produced and result == [""]:
            return []
        return [w for w in result if w or len(result) == 1]

    def expand_words(self, words: list[list[tuple[str, str]]]) -> list[str]:
        return [w for word in words for w in self.expand_word(word)]


# ---- conditions -----------------------------------------------------------------------------------------------

def _decide(words: list[str]) -> bool | None:
    """A `[ ... ]` / `[[ ... ]]` / `test` condition over known values, or None when it cannot be decided here."""
    if words and words[0] == "test":
        body = words[1:]
    elif words and (words[0], words[-1]) in (("[", "]"), ("[[", "]]")):
        body = words[1:-1]
    else:
        return None
    if any(UNKNOWN in w or w.startswith("$") for w in body):
        return None
    if len(body) == 1:
        return body[0] != ""
    if len(body) == 2 and body[0] == "!":
        return body[1] == ""
    if len(body) == 2 and body[0] in ("-n", "-z"):
        return (body[1] != "") == (body[0] == "-n")
    if len(body) == 3:
        a, op, b = body
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(a, b) if words[0] == "[[" else a == b
        if op == "!=":
            return not (fnmatch.fnmatchcase(a, b) if words[0] == "[[" else a == b)
        nums = {"-eq": operator.eq, "-ne": operator.ne, "-gt": operator.gt, "-ge": operator.ge, "-lt": operator.lt,
                "-le": operator.le}
        if op in nums and re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
            return bool(nums[op](int(a), int(b)))
    return None


# ---- the reader -----------------------------------------------------------------------------------------------

@dataclass
class _Frame:
    kind: str  # if / case / loop / func / group
    line: int
    active: bool | None  # False: a branch not taken; None: cannot be decided
    taken: bool = False  # an earlier branch was taken (if / case)
    outer: bool | None = True
    subject: str = ""  # case's word


def _state(frames: list[_Frame]) -> bool | None:
    state: bool | None = True
    for f in frames:
        if f.active is False:
            return False
        if f.active is None:
            state = None
    return state


def parse_script(text: str) -> Script:
    """Everything hpc-grpo needs from a verl launch script (see the module doc). Never raises: what it cannot read
    is in `errors` (an override hidden) or `notes`."""
    script = Script()
    try:
        _read(text, script)
    except _Unsupported as exc:
        script.errors.append(str(exc))
    except RecursionError:
        script.errors.append("the script nests deeper than hpc-grpo reads")
    return script


def _conditional(reader: _Reader, frames: list[_Frame], head: str, cond_words: list[list[tuple[str, str]]],
                 line: int) -> None:
    """`if`/`elif` (decided when the test compares values the script sets), `while`/`until` (never decided)."""
    if cond_words and cond_words[-1] == [("then", "")]:
        cond_words = cond_words[:-1]
    if head in ("while", "until"):
        frames.append(_Frame("loop", line, None))
        return
    reader.used_unknown = []
    try:
        decided = _decide(reader.expand_words(cond_words)) if _state(frames) is not False else False
    except _Unsupported:
        decided = None
    if head == "if":
        frames.append(_Frame("if", line, decided))
        frames[-1].taken = decided is True
    elif frames and frames[-1].kind == "if":
        f = frames[-1]
        if f.taken:
            f.active = False
        elif f.active is not None:
            f.active = decided
            f.taken = decided is True


def _read(text: str, script: Script) -> None:
    reader = _Reader(script)
    frames: list[_Frame] = []
    found = False
    for cmd in _split_commands(text):
        reader.line = cmd.line
        words = _words(cmd.text)
        if not words:
            continue
        first = words[0][0][0] if words[0][0][1] == "" else ""
        head = first
        # -- control structures
        if head in ("if", "elif", "while", "until"):
            _conditional(reader, frames, head, words[1:], cmd.line)
            continue
        if head == "then" or head == "do":
            rest = cmd.text.split(None, 1)[1:] if len(cmd.text.split(None, 1)) > 1 else []
            if not rest:
                continue
            words = _words(rest[0])
            first = words[0][0][0] if words and words[0][0][1] == "" else ""
            head = first
        if head == "else":
            if frames and frames[-1].kind == "if":
                f = frames[-1]
                f.active = False if f.taken else (None if f.active is None and not f.taken else True)
                if f.active is None:
                    pass
            rest = cmd.text.split(None, 1)[1:]
            if not rest:
                continue
            words = _words(rest[0])
            head = words[0][0][0] if words and words[0][0][1] == "" else ""
        if head in ("fi", "done", "esac", "}"):
            kinds = {"fi": ("if",), "done": ("loop",), "esac": ("case",), "}": ("func", "group")}[head]
            if frames and frames[-1].kind in kinds:
                frames.pop()
            continue
        if head == "for":
            frames.append(_Frame("loop", cmd.line, None))
            if len(words) > 1 and re.fullmatch(_NAME, words[1][0][0]):
                reader.unknown[words[1][0][0]] = f"the loop at line {cmd.line}"
            if not cmd.text.rstrip().endswith("do") and " do " not in cmd.text:
                continue
            continue
        if head == "case":
            reader.used_unknown = []
            subject_words = reader.expand_words(words[1:-1]) if words[-1] == [("in", "")] else []
            subject = subject_words[0] if len(subject_words) == 1 and UNKNOWN not in subject_words[0] else None
            frames.append(_Frame("case", cmd.line, False if subject is not None else None, subject=subject or ""))
            if subject is None:
                frames[-1].subject = UNKNOWN
            continue
        if frames and frames[-1].kind == "case":
            m = re.match(r"^\s*\(?\s*([^()]*?)\s*\)\s*(.*)\Z", cmd.text, re.DOTALL)
            if m and not re.match(rf"^{_NAME}\+?=\(", cmd.text):
                f = frames[-1]
                if f.subject == UNKNOWN:
                    f.active = None
                elif f.taken:
                    f.active = False
                else:
                    pats = [reader.expand_text(p.strip().strip("'\"")) for p in m.group(1).split("|")]
                    f.active = any(fnmatch.fnmatchcase(f.subject, p) for p in pats)
                    f.taken = f.active
                body = m.group(2).strip()
                if body.endswith(";;"):
                    body = body[:-2].strip()
                if not body:
                    continue
                words = _words(body)
                head = words[0][0][0] if words and words[0][0][1] == "" else ""
            elif cmd.text.strip() == ";;":
                continue
        if words and words[-1] == [(";;", "")]:
            words = words[:-1]
        if re.match(rf"^(function\s+{_NAME}|{_NAME}\s*\(\s*\))\s*\{{?", cmd.text):
            frames.append(_Frame("func" if "{" in cmd.text else "func-open", cmd.line, False))
            name = re.match(rf"^(?:function\s+)?({_NAME})", cmd.text).group(1)  # type: ignore[union-attr]
            script.notes.append(f"line {cmd.line}: function {name} is not read (the import does not call functions)")
            continue
        if head == "{" and frames and frames[-1].kind == "func-open":
            frames[-1].kind = "func"
            continue
        if head == "{":
            frames.append(_Frame("group", cmd.line, True))
            continue
        state = _state(frames)
        if cmd.after_op:
            state = None if state is not False else False
        if state is False:
            continue
        found = _command(reader, script, words, cmd, state, frames, found) or found
    if not found:
        script.errors.append(f"no trainer call (`python3 -m {MAIN_MODULE} ...`) found: nothing to import")


def _describe(frames: list[_Frame]) -> str:
    for f in reversed(frames):
        if f.active is None:
            return {"if": f"the `if` at line {f.line}", "case": f"the `case` at line {f.line}",
                    "loop": f"the loop at line {f.line}", "func": f"the function at line {f.line}"}.get(
                f.kind, f"the block at line {f.line}")
    return "a command joined by && or ||"


def _command(reader: _Reader, script: Script, words: list[list[tuple[str, str]]], cmd: _Cmd, state: bool | None,
             frames: list[_Frame], found: bool) -> bool:
    """One simple command; True when it is the trainer's call."""
    exported = words[0] == [("export", "")] or words[0] in ([("declare", "")], [("local", "")], [("readonly", "")])
    body = words[1:] if exported else words
    if exported:
        body = [w for w in body if not (len(w) == 1 and w[0][0].startswith("-") and w[0][1] == "")]
    assigns = []
    for w in body:
        text0 = w[0][0] if w[0][1] == "" else ""
        m = _ASSIGN.match(text0)
        if not m:
            break
        assigns.append((m, w))
    rest = body[len(assigns):]
    if exported and rest and not assigns:
        for w in rest:  # `export NAME`: the value set before
            name = "".join(t for t, _ in w)
            if re.fullmatch(_NAME, name) and name in reader.values:
                script.exports[name] = reader.values[name]
        return False
    if assigns and not rest:
        _assign(reader, script, assigns, cmd, state, frames, exported)
        return False
    reader.used_unknown = []
    expanded = reader.expand_words(rest)
    entry, args = _trainer_args(expanded)
    if entry is None:
        raw = cmd.text if len(cmd.text) <= 80 else cmd.text[:77] + "..."
        if any(MAIN_MODULE.rsplit(".", 1)[1] in w or re.search(r"\.main_\w+$", w) for w in expanded) and \
                "-m" not in expanded:
            script.errors.append(f"line {cmd.line}: the trainer call `{raw}` is not `python3 -m <module>`: "
                                 "hpc-grpo cannot read its overrides")
        elif _sets_overrides(expanded) and found:
            script.errors.append(f"line {cmd.line}: `{raw}` sets verl overrides outside the trainer call: bash "
                                 "ended the call before this line (a comment line or text after a `\\` breaks a "
                                 "continuation): join it to the call")
        elif _sets_overrides(expanded):
            script.errors.append(f"line {cmd.line}: `{raw}` passes verl overrides to a command hpc-grpo does "
                                 "not read: import a script that calls `python3 -m verl.trainer.main_ppo`")
        elif expanded[:1] != [":"] and state is not None:
            script.ignored.append(f"line {cmd.line}: {raw}")
        return False
    if state is None:
        script.errors.append(f"line {cmd.line}: the trainer call runs inside {_describe(frames)}, whose path "
                             "cannot be decided without running the script: move the call out of it")
        return True
    if found:
        script.notes.append(f"line {cmd.line}: a second trainer call was ignored: one script, one recipe")
        return True
    for name in dict.fromkeys(reader.used_unknown):
        script.errors.append(f"line {cmd.line}: the trainer call uses ${name}, which {reader.unknown[name]} sets "
                             f"in a way only running the script decides: set {name} outside the block")
    script.entry = entry
    for m, _w in assigns:  # `NAME=value python3 -m ...`: the trainer's environment
        script.exports[m.group(1)] = reader.expand_text(m.group(4))
    it = iter(args)
    for word in it:
        if word.startswith("--config-name"):
            config = word.split("=", 1)[1] if "=" in word else next(it, None)
            script.config_name = config.removesuffix(".yaml") if config else None
        elif word.startswith("--config-path") or word == "-cp":
            path = word.split("=", 1)[1] if "=" in word else next(it, "")
            script.config_path = path
            script.notes.append(f"line {cmd.line}: --config-path {path} ignored: hpc-grpo composes with verl's own "
                                "config folder")
        elif word in ("|", "||", "&&", "&") or word.startswith((">", "<", "2>", "1>", "&>")) or word.startswith("|"):
            break  # a pipe or redirection: the rest is not the trainer's
        elif not word:
            continue
        elif not word.strip() or word == "\\":
            script.errors.append(f"line {cmd.line}: the trainer call has a `\\` followed by a space: bash ends the "
                                 "call there (remove what follows the `\\`)")
        elif "=" in word and not word.startswith("-"):
            if UNKNOWN in word:
                continue  # named by the error above
            script.overrides.append(word)
            script.override_lines.append(cmd.line)
            key, value = word.split("=", 1)
            if _PLACEHOLDER.search(value) or "$" in value or not value:  # an empty variable: left to fill
                script.placeholders.append((key.lstrip("+~"), value))
        else:
            script.errors.append(f"line {cmd.line}: argument {word!r} of the trainer call is not key=value: "
                                 "hpc-grpo does not know what it sets")
    return True


def _assign(reader: _Reader, script: Script, assigns: list[tuple[re.Match[str], list[tuple[str, str]]]], cmd: _Cmd,
            state: bool | None, frames: list[_Frame], exported: bool) -> None:
    """A command of assignments only (`A=1 B=(x y)`, `export A=1`): the reader's values and arrays, or why a
    value is unknown (set inside a block only running the script decides)."""
    for m, w in assigns:
        name, index, plus, first = m.groups()
        parts = [(first, "")] + list(w[1:])
        if state is None:
            reader.unknown[name] = _describe(frames) if not cmd.after_op else f"the && / || list at line {cmd.line}"
            reader.values.pop(name, None)
            reader.arrays.pop(name, None)
            continue
        reader.unknown.pop(name, None)
        if first.startswith("(") and len(parts) == 1 and first.endswith(")"):
            inner = first[1:-1]
            elems = reader.expand_words(_words(_strip_comments(inner)))
            if UNKNOWN in "".join(elems):
                reader.unknown[name] = f"line {cmd.line}, from a value set in a block"
                continue
            reader.arrays[name] = (reader.arrays.get(name, []) if plus else []) + elems
            reader.values.pop(name, None)
            continue
        reader.used_unknown = []
        value = "".join(reader.expand_word(parts, split=False) or [""]) if first or len(parts) > 1 else ""
        if UNKNOWN in value:
            reader.unknown[name] = f"line {cmd.line}, from a value set in a block"
            continue
        if index:
            arr = reader.arrays.setdefault(name, [])
            k = reader.arith(index[1:-1])
            if k.isdigit():
                arr.extend([""] * (int(k) + 1 - len(arr)))
                arr[int(k)] = value
            continue
        if plus and name in reader.arrays:
            reader.arrays[name].append(value)
            continue
        reader.values[name] = (reader.values.get(name, "") if plus else "") + value
        if exported:
            script.exports[name] = reader.values[name]


def _strip_comments(inner: str) -> str:
    """An array's body with its `# ...` comments (to the line's end) removed, quotes respected."""
    out, quote, i = [], "", 0
    while i < len(inner):
        ch = inner[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or inner[i - 1].isspace()):
            j = inner.find("\n", i)
            i = len(inner) if j < 0 else j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _sets_overrides(words: list[str]) -> bool:
    return sum(1 for w in words if re.match(r"^[+~]?(actor_rollout_ref|algorithm|data|trainer|critic|reward_model)\.",
                                            w)) >= 1


def _trainer_args(words: list[str]) -> tuple[str | None, list[str]]:
    """(the trainer module, the words after it), or (None, []) when the command does not run a trainer."""
    for i in range(len(words) - 1):
        if words[i] == "-m" and _ENTRY.match(words[i + 1]):
            return words[i + 1], words[i + 2:]
    return None, []
