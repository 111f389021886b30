"""Values reach the job exactly as written, and nothing in them runs; secrets never reach a rendered file.

The property test puts arbitrary text (no NUL: no shell string can hold one) into a cluster env value, an
engine passthrough value and the model path, renders, then lets bash itself evaluate the rendered lines (the
`export FOO=...` line, the `driver=( ... )` array) in a clean environment and prints what it got. The printed
bytes must be the original value, and no `pwned` file may appear. Overrides are YAML-typed, so each value is
passed as a YAML double-quoted scalar that parses back to exactly that string (`yaml_quote`, checked first).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpc_grpo.config import registry
from hpc_grpo.config.verl_keys import format_value
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import load_frozen, resolve_spec
from hpc_grpo.config.secrets import SECRET_ENV
from hpc_grpo.common.yamlio import SpecError, parse_scalar

VERL_RECIPE = "qwen2.5-3b-gsm8k-lora"
CLUSTER = "a100-ib"  # has modules, a venv and env: every _setup.j2 branch but conda and container
BASE = ["cluster.runs_root=/runs"]
PWNED = Path("/tmp/pwned")
SECRETS = {"WANDB_API_KEY": "sk-secret-123", "HF_TOKEN": "hf_secret_456"}


def pinned(mp: pytest.MonkeyPatch) -> None:
    mp.setenv("HOME", "/home/user")
    mp.setenv("USER", "user")
    for var in ("HPC_GRPO_PATH", *SECRET_ENV):
        mp.delenv(var, raising=False)


def yaml_quote(value: str) -> str:
    """A YAML double-quoted scalar that parses back to exactly `value`."""
    out = []
    for ch in value:
        o = ord(ch)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def clean_bash(script: str, cwd: Path) -> bytes:
    """Run `script` with bash in an empty environment (C locale: the quoting must not need UTF-8)."""
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                          capture_output=True, check=False)
    assert proc.returncode == 0, f"bash failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}\n{script}"
    return proc.stdout


def export_line(text: str, key: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith(f"export {key}=")]
    assert len(lines) == 1, f"expected one `export {key}=` line, found {lines}"
    return lines[0]


def driver_block(text: str) -> str:
    """The `driver=(` ... `)` array of a launch script, as written (quoted values never span lines)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.fullmatch(r"\s*driver=\(", ln))
    end = next(i for i in range(start + 1, len(lines)) if re.fullmatch(r"\s*\)", lines[i]))
    return "\n".join(lines[start:end + 1])


def driver_argv(text: str, cwd: Path) -> list[str]:
    out = clean_bash(driver_block(text) + '\nprintf "%s\\0" "${driver[@]}"', cwd)
    return [a.decode("utf-8") for a in out.split(b"\0")[:-1]]


def bash_n(path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"bash -n {path}: {proc.stderr}"


def pwned_state() -> int | None:
    return PWNED.stat().st_mtime_ns if PWNED.exists() else None


# ------------------------------------------------------------------------------ the property test
NASTY = [
    "$(touch /tmp/pwned)", "$(touch pwned)", "`touch pwned`", "'", '"', "\n", "\r", "\t", ";", "&&", "|", "*",
    "~", "~root", "\\", "\\n", "$HOME", "${HOME}", "$", "!", "#", " ", "-", "--", "=", "%j", "{a,b}", "[x]",
    "é", "日本", "😀", "\u2028", "\x85", "\x1b[31m", "\x7f", "'$(touch pwned)'", '"$(touch pwned)"', ")", "(",
    "<", ">", "&", "$'x'", "null", "True",
]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)
VALUES = st.one_of(
    TEXT,
    st.lists(st.one_of(st.sampled_from(NASTY), TEXT), min_size=1, max_size=6).map("".join),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=VALUES)
@example(value="$(touch /tmp/pwned)")
@example(value="`touch pwned`; touch pwned && touch pwned | touch pwned")
@example(value="it's \"quoted\" \\ *\n~ é 😀")
@example(value="\n#SBATCH --nodes=99\ntouch pwned\n")
def test_values_survive_the_shell_exactly(value: str) -> None:
    quoted = yaml_quote(value)
    assert parse_scalar(quoted) == value  # the override carries exactly this string
    before = pwned_state()
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        pinned(mp)
        cwd = Path(tmp)
        overrides = [*BASE, f"cluster.env.FOO={quoted}", f"passthrough.+trainer.foo={quoted}"]
        spec = resolve_spec(VERL_RECIPE, CLUSTER, overrides, run_name="golden", now=0.0)
        assert spec.cluster.env["FOO"] == value
        assert spec.recipe.passthrough["+trainer.foo"] == value
        files = render_all(spec)
        for path in write_files(cwd / "run", files):
            if path.suffix == ".sh":
                bash_n(path)

        # (a) the cluster env value, as bash exports it
        line = export_line(files["scripts/sbatch.sh"], "FOO")
        assert clean_bash(line + '\nprintf %s "$FOO"', cwd).decode("utf-8") == value

        # (b) the passthrough value: one argv element of the driver, exactly the Hydra override hpc-grpo built
        argv = driver_argv(files["scripts/launch.sh"], cwd)
        assert argv.count("+trainer.foo=" + format_value(value)) == 1, argv
        assert argv[:3] == [spec.python, "-m", "verl.trainer.main_ppo"]

        # The frozen spec reads back to the same values (its header comment holds the overrides).
        frozen = load_frozen(cwd / "run" / "spec.yaml")
        assert frozen.cluster.env["FOO"] == value and frozen.recipe.passthrough["+trainer.foo"] == value

        # (c) the model path; `~` and `$VAR` are expanded at resolve time, and `$` naming no variable is refused
        try:
            spec_c = resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, f"model.path={quoted}"], run_name="golden", now=0.0)
        except SpecError as exc:
            assert "$" in value or value.startswith("~") or "model.path" in str(exc), exc
        else:
            path = spec_c.recipe.model.path
            if "$" not in value and not value.startswith("~"):
                assert path == value
            files_c = render_all(spec_c)
            argv_c = driver_argv(files_c["scripts/launch.sh"], cwd)
            assert "actor_rollout_ref.model.path=" + format_value(path) in argv_c, argv_c
            for path_c in write_files(cwd / "run_c", files_c):
                if path_c.suffix == ".sh":
                    bash_n(path_c)

        assert not (cwd / "pwned").exists(), "a value ran as a command"
    assert pwned_state() == before, "/tmp/pwned was created or touched"


def test_frozen_spec_keeps_nel(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        spec = resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, 'cluster.env.FOO="a\\x85b"'], run_name="golden", now=0.0)
    assert spec.cluster.env["FOO"] == "a\x85b"
    write_files(tmp_path, render_all(spec))
    assert load_frozen(tmp_path / "spec.yaml").cluster.env["FOO"] == "a\x85b"


# ------------------------------------------------------------------------------ line-based contexts
def test_a_raw_newline_in_an_override_cannot_leave_the_header_comment(tmp_path: Path) -> None:
    """The re-create command in the header is a comment: a newline in an override (typed on the command line)
    must not end it, or the rest of the override would run as code before anything else."""
    raw = "passthrough.+trainer.foo=x\ntouch pwned #\n$(touch pwned)"
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        spec = resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, raw], run_name="golden", now=0.0)
        files = render_all(spec)
    write_files(tmp_path / "run", files)
    for rel in ("scripts/sbatch.sh", "scripts/launch.sh"):
        lines = files[rel].splitlines()
        body = lines.index("set -euo pipefail")
        assert all(ln.startswith("#") for ln in lines[:body]), lines[:body]
        clean_bash("\n".join(lines[:body]), tmp_path)  # the header alone: comments only, runs nothing
        bash_n(tmp_path / "run" / rel)
    assert not (tmp_path / "pwned").exists()
    first, second = files["spec.yaml"].splitlines()[:2]
    assert first.startswith("# Frozen spec") and not second.startswith((" ", "\t")) and ":" in second
    assert load_frozen(tmp_path / "run" / "spec.yaml").overrides == [*BASE, raw]


@pytest.mark.parametrize("override", [
    "cluster.partition=" + yaml_quote("gpu\n#SBATCH --nodes=99"),
    "cluster.partition=" + yaml_quote("gpu\n"),
    "cluster.runs_root=" + yaml_quote("/runs/x\ny"),
])
def test_sbatch_lines_refuse_line_breaks(override: str) -> None:
    """#SBATCH lines are read by sbatch, not bash: no quoting can carry a line break there."""
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        with pytest.raises(SpecError):
            render_all(resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, override], run_name="golden", now=0.0))


def test_a_run_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        with pytest.raises(SpecError):
            render_all(resolve_spec(VERL_RECIPE, CLUSTER, BASE, run_name="golden\n", now=0.0))


def test_nul_is_refused() -> None:
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        spec = resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, 'cluster.env.FOO="a\\x00b"'], run_name="golden", now=0.0)
        with pytest.raises(SpecError, match="NUL"):
            render_all(spec)


# ------------------------------------------------------------------------------------- secrets
def all_pairs() -> list[tuple[str, str]]:
    with mock.patch.dict(os.environ):
        os.environ.pop("HPC_GRPO_PATH", None)
        return [(r, c) for r in registry.list_names("recipes") for c in registry.list_names("clusters")]


def assert_no_secret(text: str, where: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name}'s value leaked into {where}"


def test_secrets_never_reach_a_rendered_file_library() -> None:
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        for name, secret in SECRETS.items():
            mp.setenv(name, secret)
        for recipe, cluster in all_pairs():
            for rel, text in render_all(resolve_spec(recipe, cluster, BASE, run_name="golden")).items():
                assert_no_secret(text, f"{recipe}__{cluster}/{rel}")


def test_secrets_never_reach_a_rendered_file_cli(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`hpc-grpo render ... -o DIR` with both secrets exported, for the golden set's pairs (each recipe on one
    cluster, each cluster with one recipe: tests/unit/test_golden.GOLDEN_SET; every pair goes through the library
    in the test above); pairs whose plan has errors write nothing (exit 1), the others write the run's files; no
    secret in any file or in the output. The CLI runs in this process (tests/cli_run.py): the secrets are in its
    environment all the same, and a process per pair cost CI a Python start-up and a cold interpreter probe each."""
    from tests.cli_run import run_cli
    from tests.unit.test_golden import GOLDEN_SET

    for name, secret in SECRETS.items():
        monkeypatch.setenv(name, secret)
    monkeypatch.setenv("USER", "user")
    # A runs root that does not exist here: plan cannot measure its free space, so the disk check does not
    # refuse big models for this machine's disk.
    runs_root = "cluster.runs_root=/hpc-grpo-no-such-root/runs"
    rendered = 0
    for recipe, cluster in sorted(GOLDEN_SET):
        where, out = f"{recipe}__{cluster}", isolated / f"{recipe}__{cluster}"
        code, text = run_cli(monkeypatch, capsys, "render", f"recipe={recipe}", f"cluster={cluster}", "--name",
                             "golden", "-o", str(out), "--no-schema", runs_root)
        assert code in (0, 1, None), f"{where}: exit {code}\n{text}"
        assert_no_secret(text, f"{where}'s output")
        files = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
        if code in (0, None):
            rendered += 1
            names = {str(p.relative_to(out)) for p in files}
            assert names - {"scripts/eval_sbatch.sh"} == {"spec.yaml", "scripts/sbatch.sh", "scripts/launch.sh"}
        else:
            assert "Nothing rendered" in text and not files, f"{where}: {text}"
        for f in files:
            assert_no_secret(f.read_text(encoding="utf-8"), f"{where}/{f.relative_to(out)}")
    assert rendered, "no pair rendered, so the test checked nothing"


@pytest.mark.parametrize("name", SECRET_ENV)
def test_a_secret_in_a_cluster_env_is_refused(name: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        with pytest.raises(SpecError, match="secret"):
            resolve_spec(VERL_RECIPE, CLUSTER, [*BASE, f"cluster.env.{name}=x"], run_name="golden")


def test_a_cluster_profile_with_a_secret_is_refused(tmp_path: Path) -> None:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "leaky.yaml").write_text(
        "name: leaky\nscheduler: slurm\ngpus_per_node: 8\nenv:\n  NCCL_DEBUG: WARN\n  WANDB_API_KEY: sk-secret-123\n",
        encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        pinned(mp)
        mp.setenv("HPC_GRPO_PATH", str(tmp_path))
        with pytest.raises(SpecError, match="WANDB_API_KEY"):
            resolve_spec(VERL_RECIPE, "leaky", BASE, run_name="golden")
