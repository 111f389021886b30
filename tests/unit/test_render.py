"""Rendered scripts are valid bash and shellcheck-clean; the Jinja environment cannot emit an unquoted value.

Every recipe x cluster pair (discovered at collection time) is rendered with the golden inputs (run name
"golden", runs_root /runs, HOME=/home/user, USER=user); each script must pass `bash -n` and
`shellcheck --shell=bash -S style` with no finding at all. shellcheck missing: the tests fail when CI=true,
otherwise they are skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import jinja2
import pytest

from hpc_grpo import __version__
from hpc_grpo.config import registry
from hpc_grpo.engines import get_engine
from hpc_grpo.launch.render import common_context, environment, recreate_argv, render_all, sh, write_files
from hpc_grpo.config.resolve import resolve_spec

TEMPLATES = registry.template_dir()
RUN_NAME = "golden"
OVERRIDES = ["cluster.runs_root=/runs"]


def discover_pairs() -> list[tuple[str, str]]:
    with mock.patch.dict(os.environ):
        os.environ.pop("HPC_GRPO_PATH", None)
        return [(r, c) for r in registry.list_names("recipes") for c in registry.list_names("clusters")]


PAIRS = discover_pairs()
IDS = [f"{r}__{c}" for r, c in PAIRS]


@pytest.fixture
def pinned_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("USER", "user")
    for var in ("HPC_GRPO_PATH", "WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def shellcheck() -> Iterator[str]:
    exe = shutil.which("shellcheck")
    if exe is None:
        reason = "shellcheck is not installed (apt-get install -y shellcheck)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + ": CI must run the shellcheck tests")
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    yield exe


def render_to(tmp_path: Path, recipe: str, cluster: str, overrides: list[str] | None = None) -> dict[str, Path]:
    spec = resolve_spec(recipe, cluster, [*OVERRIDES, *(overrides or [])], run_name=RUN_NAME, now=0.0)
    files = render_all(spec)
    written = write_files(tmp_path / f"{recipe}__{cluster}", files)
    return {str(p.relative_to(tmp_path / f"{recipe}__{cluster}")): p for p in written}


def scripts_of(written: dict[str, Path]) -> list[Path]:
    scripts = [p for rel, p in written.items() if rel.endswith(".sh")]
    assert scripts, "render_all wrote no scripts"
    return scripts


def run_shellcheck(exe: str, scripts: list[Path]) -> None:
    proc = subprocess.run([exe, "--shell=bash", "-S", "style", "--format=gcc", *map(str, scripts)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"shellcheck findings:\n{proc.stdout}{proc.stderr}"


def bash_n(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"bash -n {script}:\n{proc.stderr}"


# ------------------------------------------------------------------------------- rendered scripts
@pytest.mark.parametrize(("recipe", "cluster"), PAIRS, ids=IDS)
def test_scripts_are_valid_bash(recipe: str, cluster: str, tmp_path: Path, pinned_env: None) -> None:
    for script in scripts_of(render_to(tmp_path, recipe, cluster)):
        bash_n(script)


@pytest.mark.parametrize(("recipe", "cluster"), PAIRS, ids=IDS)
def test_scripts_are_shellcheck_clean(recipe: str, cluster: str, tmp_path: Path, pinned_env: None,
                                      shellcheck: str) -> None:
    run_shellcheck(shellcheck, scripts_of(render_to(tmp_path, recipe, cluster)))


def yaml_quote(value: str) -> str:
    """A YAML double-quoted scalar that parses back to exactly `value` (overrides are YAML-typed)."""
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


HOSTILE = "it's \"$(touch pwned)\" `touch pwned`; a && b | c * ~ \\ é\n\ttab\x1b\u2028"
HOSTILE_PATH = "/opt/it's \"`touch pwned`\"; a && b | c * \\ é\n\x1b\u2028"  # venv/conda: no `$`, no `~`


def test_hostile_values_stay_shellcheck_clean(tmp_path: Path, pinned_env: None, shellcheck: str) -> None:
    """Every kind of setup line (modules, venv, conda, container, env) with values that need quoting."""
    recipe = next(r for r, _ in PAIRS if resolve_spec(r, "local", OVERRIDES).recipe.engine == "verl")
    overrides = [
        f"cluster.setup.modules=[{yaml_quote(HOSTILE)}, cuda/12.4]",
        f"cluster.setup.venv={yaml_quote(HOSTILE_PATH)}",
        f"cluster.setup.conda={yaml_quote(HOSTILE_PATH)}",
        f"cluster.setup.container={yaml_quote(HOSTILE)}",
        f"cluster.env.HOSTILE={yaml_quote(HOSTILE)}",
        f"passthrough.+trainer.hostile={yaml_quote(HOSTILE)}",
    ]
    written = render_to(tmp_path, recipe, "a100-ib", overrides)
    text = written["scripts/sbatch.sh"].read_text(encoding="utf-8")
    assert "module load $'it" in text and "conda activate $'/opt/it" in text and "export HOSTILE=$'it" in text
    for script in scripts_of(written):
        bash_n(script)
    run_shellcheck(shellcheck, scripts_of(written))
    assert not (tmp_path / "pwned").exists()


def test_every_script_template_is_rendered_by_some_pair(pinned_env: None) -> None:
    used = {"sbatch.sh.j2"} | {get_engine(resolve_spec(r, "local", OVERRIDES).recipe.engine).launch_template
                               for r in {r for r, _ in PAIRS}}
    shipped = {p.name for p in TEMPLATES.glob("*.sh.j2")}
    assert shipped <= used, f"templates no pair renders (so nothing checks them): {sorted(shipped - used)}"


@pytest.mark.parametrize(("recipe", "cluster"), PAIRS, ids=IDS)
def test_generated_by_header(recipe: str, cluster: str, tmp_path: Path, pinned_env: None) -> None:
    written = render_to(tmp_path, recipe, cluster)
    spec = resolve_spec(recipe, cluster, OVERRIDES, run_name=RUN_NAME)
    argv = recreate_argv(spec)
    assert argv == ["hpc-grpo", "render", f"recipe={recipe}", f"cluster={cluster}", f"--name={RUN_NAME}", *OVERRIDES]
    for script in scripts_of(written):
        lines = script.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "#!/bin/bash", script
        assert lines[1] == (f"# Generated by hpc-grpo {__version__} for run {RUN_NAME} "
                            f"(recipe {recipe}, cluster {cluster})."), script
        assert lines[2] == "# Do not edit: re-create it with", script
        assert lines[3].startswith("#   "), script
        # The re-create line is a command one can paste: it splits back into the exact argv.
        assert shlex.split(lines[3].removeprefix("#   ")) == argv, lines[3]
    first = written["spec.yaml"].read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(f"# Frozen spec of run {RUN_NAME}") and first.endswith(shlex.join(argv)), first


# ------------------------------------------------------------------------------- template sources
EXPR_RE = re.compile(r"\{\{(.*?)\}\}", re.S)


def template_sources() -> list[Path]:
    found = sorted(TEMPLATES.glob("*.j2"))
    assert found, f"no templates in {TEMPLATES}"
    return found


@pytest.mark.parametrize("template", template_sources(), ids=lambda p: p.name)
def test_every_expression_ends_in_sh(template: Path) -> None:
    source = template.read_text(encoding="utf-8")
    exprs = EXPR_RE.findall(source)
    bad = [e.strip() for e in exprs if not re.search(r"\|\s*sh\s*-?$", e.strip())]
    assert not bad, f"{template.name}: expressions not ending in `| sh`: {bad}"
    # The block tags cannot smuggle output past finalize either.
    assert not re.search(r"\{%-?\s*(raw|filter|autoescape)\b", source), f"{template.name}: raw/filter block"


def test_template_sources_parse() -> None:
    env = environment()
    for template in template_sources():
        env.get_template(template.name)  # a syntax error raises here


# ------------------------------------------------------------------------------- the environment
def test_finalize_refuses_unquoted_output() -> None:
    env = environment()
    assert env.from_string("x={{ v | sh }}").render(v="a b") == "x='a b'"
    with pytest.raises(jinja2.TemplateError, match=r"\| sh"):
        env.from_string("x={{ v }}").render(v="a b")
    with pytest.raises(jinja2.TemplateError, match=r"\| sh"):
        env.from_string("x={{ v | sh | upper }}").render(v="a")  # a later filter undoes the quoting
    with pytest.raises(jinja2.TemplateError, match=r"\| sh"):
        env.from_string("x={{ n }}").render(n=3)
    with pytest.raises(jinja2.TemplateError, match=r"\| sh"):
        env.from_string('x={{ "literal" }}').render()


def test_finalize_in_a_fresh_environment_built_from_the_settings() -> None:
    """The refusal comes from the settings (finalize, undefined), not from the file loader."""
    real = environment()
    env = jinja2.Environment(loader=jinja2.DictLoader({"t.sh": "echo {{ v }}\n", "ok.sh": "echo {{ v | sh }}\n"}),
                             undefined=real.undefined, finalize=real.finalize, autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             comment_start_string="{##", comment_end_string="##}")
    env.filters["sh"] = sh
    assert env.get_template("ok.sh").render(v="$(id)") == "echo '$(id)'\n"
    with pytest.raises(jinja2.TemplateError, match="unquoted value"):
        env.get_template("t.sh").render(v="$(id)")


def test_strict_undefined() -> None:
    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("x={{ missing | sh }}").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{% if missing %}x{% endif %}").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{% for a in missing %}{{ a | sh }}{% endfor %}").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("x={{ v | sh }}").render(v=None)  # None is a template bug, not the word 'None'


def test_a_real_template_with_a_missing_variable_raises(pinned_env: None) -> None:
    spec = resolve_spec(PAIRS[0][0], PAIRS[0][1], OVERRIDES, run_name=RUN_NAME)
    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("sbatch.sh.j2").render(**common_context(spec))  # no sbatch/srun values


def test_bash_comment_syntax_is_not_a_jinja_comment() -> None:
    assert environment().from_string('n="${#a[@]}"').render() == 'n="${#a[@]}"'


def test_sh_quotes() -> None:
    assert sh("plain") == "plain"
    assert sh("a b") == "'a b'"
    assert sh(True) == "true" and sh(False) == "false"
    assert sh(["a", "b c"]) == "a 'b c'"
    assert sh("a\nb") == "$'a\\x0ab'"  # one line, whatever the value holds
    assert sh("it's\t\\") == "$'it\\'s\\x09\\\\'"
    with pytest.raises(jinja2.UndefinedError):
        sh(["a", None])


def test_join_timeout_names_the_missing_nodes() -> None:
    from hpc_grpo.job.ray_wait import missing_nodes

    expect = ["node1=127.0.0.11", "node2=127.0.0.12", "node3=127.0.0.13"]
    assert missing_nodes(expect, {"127.0.0.11", "127.0.0.13"}) == ["node2 (127.0.0.12)"]
    assert missing_nodes(expect, {"127.0.0.11", "127.0.0.12", "127.0.0.13"}) == []
