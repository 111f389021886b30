"""Read a verl launch script: its `export`s and assignments, and main_ppo's `--config-name` and overrides.

Users arrive with bash scripts, not recipes (`hpc-grpo import`). This is not a shell: it joins line continuations,
expands `$VAR` / `${VAR}` / `${VAR:-default}` from the script's own assignments (never from this machine's
environment: the import must not depend on who runs it), splits words as the shell would (shlex) and says what it
could not resolve. Commands other than assignments and main_ppo's call are ignored, and said so.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

MAIN_MODULE = "verl.trainer.main_ppo"
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.DOTALL)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*)|([@*#?0-9]))")


@dataclass
class Script:
    """What a launch script says. `overrides` keep their order; `config_name` is None when the script names none."""

    config_name: str | None = None
    overrides: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)  # $VAR names with no value in the script
    ignored: list[str] = field(default_factory=list)  # lines that are neither assignments nor main_ppo's call
    notes: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined at a trailing backslash; blank lines and whole-line comments dropped."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\") and not raw.rstrip().endswith("\\\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append(line)
    if pending.strip():
        out.append(pending.strip())
    return out


def _expand(line: str, values: dict[str, str], script: Script) -> str:
    """`$VAR` forms replaced by the script's values, outside single quotes; unknown names kept and recorded."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "'" and quote != '"':
            quote = "" if quote == "'" else "'"
        elif ch == '"' and quote != "'":
            quote = "" if quote == '"' else '"'
        elif ch == "$" and quote != "'":
            m = _VAR.match(line, i)
            if m:
                name, default, plain, special = m.groups()
                if special:
                    if special == "@" or special == "*":
                        script.notes.append(f"${special} (the script's own arguments) left out: add them as "
                                            "key=value after `hpc-grpo plan` instead")
                        i = m.end()
                        continue
                    out.append(m.group(0))
                else:
                    var = name or plain
                    if var in values:
                        out.append(values[var])
                    elif default is not None:
                        out.append(default)
                    else:
                        out.append(m.group(0))
                        if var not in script.unresolved:
                            script.unresolved.append(var)
                i = m.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _main_args(words: list[str]) -> list[str] | None:
    """The words after `-m verl.trainer.main_ppo`, or None when the line does not run it."""
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == MAIN_MODULE:
            return words[i + 2:]
    return None


def parse_script(text: str) -> Script:
    """Everything hpc-grpo needs from a verl launch script (see the module doc)."""
    script = Script()
    values: dict[str, str] = {}
    found = False
    for line in _logical_lines(text):
        expanded = _expand(line, values, script)
        try:
            words = shlex.split(expanded, comments=True)
        except ValueError as exc:
            script.ignored.append(f"{line[:60]}... ({exc})")
            continue
        if not words:
            continue
        exported = words[0] == "export"
        assignments = words[1:] if exported else words
        if assignments and all(_ASSIGN.match(w) for w in assignments):
            for word in assignments:
                name, value = _ASSIGN.match(word).groups()  # type: ignore[union-attr]
                values[name] = value
                if exported:
                    script.exports[name] = value
            continue
        args = _main_args(words)
        if args is None:
            script.ignored.append(line if len(line) <= 80 else line[:77] + "...")
            continue
        if found:
            script.notes.append("a second main_ppo call was ignored: one script, one recipe")
            continue
        found = True
        it = iter(args)
        for word in it:
            if word.startswith("--config-name"):
                name = word.split("=", 1)[1] if "=" in word else next(it, None)
                script.config_name = name.removesuffix(".yaml") if name else None
            elif word.startswith("--config-path"):
                path = word.split("=", 1)[1] if "=" in word else next(it, "")
                script.notes.append(f"--config-path {path} ignored: hpc-grpo composes with verl's own config folder")
            elif not word:
                continue  # "$@" with no arguments
            elif "=" in word:
                script.overrides.append(word)
            else:
                script.notes.append(f"argument {word!r} is not key=value: left out")
    if not found:
        script.notes.append(f"no `python3 -m {MAIN_MODULE}` call found")
    return script
