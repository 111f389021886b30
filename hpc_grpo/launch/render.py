"""The one Jinja environment: StrictUndefined, one shell-quote filter, a generated-by header.

Every `{{ ... }}` in a template must pass through the `sh` filter: `finalize` refuses any other
output, so an unquoted value cannot slip into a script even by a template edit.
"""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from hpc_grpo import __version__
from hpc_grpo.cluster import sbatch
from hpc_grpo.evaluation import evaluate
from hpc_grpo.config import registry
from hpc_grpo.config.mounts import job_mounts, mounts_option
from hpc_grpo.runstate import layout
from hpc_grpo.engines import get_engine
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.common.yamlio import SpecError, dump_yaml


class Quoted(str):
    """A string the `sh` filter produced: safe to paste into bash as one word (or words, for lists)."""


# Characters a quoted word must not carry literally: C0 controls and DEL (a newline would end a comment or an
# #SBATCH line early, so the rest of the value would run as code), C1 controls and U+2028/U+2029 (YAML reads
# them as line breaks, and the re-create command is also a comment in spec.yaml).
_ESCAPE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def quote_word(text: str) -> str:
    """One bash word that is exactly `text`, on one line.

    shlex.quote, unless `text` holds a character of _ESCAPE: then bash's ANSI-C form $'...', with each such
    character written as the \\xHH escapes of its UTF-8 bytes (bytes, so the value does not depend on the
    job's locale, as bash's \\u escapes would). NUL cannot be in a bash string at all and is refused.
    """
    if "\0" in text:
        raise SpecError(f"{text!r} contains a NUL character, which no shell variable or argument can hold")
    if not _ESCAPE.search(text):
        return shlex.quote(text)
    body = []
    for ch in text:
        if ch in "\\'":
            body.append("\\" + ch)
        elif _ESCAPE.match(ch):
            body.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
        else:
            body.append(ch)
    return "$'" + "".join(body) + "'"


def sh(value: Any) -> Quoted:
    """Quote for bash. Lists become space-separated quoted words. None is a template bug."""
    if value is None:
        raise jinja2.UndefinedError("a None value reached a template; the spec should have refused it")
    if isinstance(value, (list, tuple)):
        if any(v is None for v in value):
            raise jinja2.UndefinedError(f"a None value in {value!r} reached a template")
        return Quoted(" ".join(quote_word(str(v)) for v in value))
    if isinstance(value, bool):
        value = "true" if value else "false"
    return Quoted(quote_word(str(value)))


def _finalize(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return value
    if not isinstance(value, Quoted):
        raise jinja2.TemplateError(f"unquoted value {value!r} in a template: pipe it through | sh")
    return value


@lru_cache(maxsize=4)
def environment(folder: str | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder or str(registry.template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
        comment_start_string="{##",  # bash's ${#array[@]} must not open a Jinja comment
        comment_end_string="##}",
    )
    env.filters["sh"] = sh
    return env


# --------------------------------------------------------------------------------- the scripts
def submitit_command(folder: Path, python: str) -> str:
    """The command submitit puts on the srun line (SlurmExecutor._submitit_command_str, with python=spec.python)."""
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def recreate_argv(spec: RunSpec) -> list[str]:
    return ["hpc-grpo", "render", f"recipe={spec.recipe.name}", f"cluster={spec.cluster.name}",
            f"--name={spec.run_name}", *spec.overrides]


def recreate_command(spec: RunSpec) -> str:
    """The command line that renders this run again, quoted for bash, on one line."""
    return " ".join(quote_word(p) for p in recreate_argv(spec))


def sbatch_context(spec: RunSpec, command: str, extra: list[tuple[str, Any]] | None = None,
                   job: str = "%j") -> dict[str, Any]:
    """Everything the sbatch header needs, as plain values (the template quotes each): hpc_grpo.cluster.sbatch's
    options. `extra`: more #SBATCH options (the evaluation job's afterany dependency, a chained follow-on's
    afternotok, a sweep's --array); `job`: the job id's pattern in the log names (layout.ARRAY_JOB in an array)."""
    c = spec.cluster
    options = sbatch.options(sbatch.request(spec), layout.log_patterns(spec.path, 0, job), extra)
    for key, value in options:
        # sbatch reads these lines itself: it knows neither $'...' nor a value that goes on past the line.
        if _ESCAPE.search(str(value)):
            raise SpecError(f"#SBATCH --{key} cannot hold control characters or line breaks: {value!r}",
                            key=f"sbatch --{key}")
    container = c.setup.container
    mounts = mounts_option(job_mounts(c.shared_path_list(), c.setup.mounts, spec.run_dir)) if container else ""
    return {"sbatch": options, **sbatch.requeue_mode(c.requeue, chained=c.restart == "chain"),
            "srun_args": sbatch.srun_args(layout.log_patterns(spec.path, "%t", job), container, mounts,
                                          c.setup.container_launcher),
            # a container has no Slurm client: its job asks this script for the requeue (launch.submit.TrainJob)
            "requeue_file_prefix": str(layout.requeue_request(spec.path, "")) if container else None,
            "command": shlex.split(command)}


def common_context(spec: RunSpec) -> dict[str, Any]:
    return {
        "version": __version__,
        "run_name": spec.run_name,
        "run_dir": spec.run_dir,
        "recipe": spec.recipe.name,
        "cluster": spec.cluster.name,
        "recreate": recreate_argv(spec),  # a list: `| sh` quotes each word
        "setup": spec.cluster.setup,
        "env": spec.cluster.env,
        # run-directory names the scripts' comments mention (hpc_grpo.runstate.layout names them)
        "launch_script": layout.LAUNCH_SCRIPT,
        "spec_name": layout.SPEC_FILE,
        "array_run_dir_prefix": None,  # a sweep's job array: its members' folders less the task index
    }


PYTHON_WORDS = ("python", "python3")


def job_driver(spec: RunSpec, argv: list[str]) -> list[str]:
    """A driver given as `python3 -m ...` (launch.driver) runs the job's interpreter, like every other step."""
    if argv and argv[0] in PYTHON_WORDS:
        return [spec.python, *argv[1:]]
    return list(argv)


def launch_context(spec: RunSpec) -> dict[str, Any]:
    engine = get_engine(spec.recipe.engine)
    cmd = engine.command(spec)
    driver = job_driver(spec, spec.recipe.launch.driver or cmd.argv)
    r = spec.recipe
    return {
        "python": spec.python,
        "driver": driver,
        "driver_env": cmd.env,
        "nodes": r.resources.nodes,
        # Ray's GPUs per node: one per training process (verl's CPU mode offers stand-ins, one per CPU worker)
        "gpus_per_node": spec.procs_per_node,
        "ray_cpus": cmd.ray_cpus,
        # set before Ray starts on every node, so every process Ray starts inherits it (verl's CPU plugin)
        "node_env": cmd.node_env,
        "join_timeout_s": r.launch.ray_join_timeout_s,
        "spec_file": str(layout.spec_file(spec.path)),
        "ray_dir": str(layout.ray_dir(spec.path)),
        # no Slurm to say where the node is: the profile's loopback address (the node layout is Slurm's otherwise)
        "local_address": spec.cluster.local_address if spec.cluster.scheduler == "local" else None,
        "ray_ports": spec.cluster.ray_ports,
        # verl's own driver gets the overrides resume preparation writes at job start (a custom one does not)
        "resume_args": spec.recipe.launch.driver is None,
        "resume_args_file": str(layout.state_files(layout.ray_dir("RUN_DIR"), "JOB_ID", "ATTEMPT").resume_args),
    }


def render_sbatch(spec: RunSpec, command: str | None = None, extra: list[tuple[str, Any]] | None = None) -> str:
    """The batch script Slurm receives. `command` is submitit's; render time computes the same one."""
    command = command or submitit_command(layout.submitit_dir(spec.path), spec.python)
    tmpl = environment().get_template("sbatch.sh.j2")
    return tmpl.render(**common_context(spec), **sbatch_context(spec, command, extra))


def render_array_sbatch(pattern: RunSpec, command: str, extra: list[tuple[str, Any]], prefix: str,
                        recreate: list[str]) -> str:
    """A sweep's one batch script for all its members: `pattern` is a member's spec named after the sweep, with
    the run directory of task %a (runstate.layout.member_dir); Slurm fills %A and %a into the log names, and the
    task's own folder is `prefix` + $SLURM_ARRAY_TASK_ID. `extra` holds the --array option; `recreate` is the
    sweep's command line."""
    tmpl = environment().get_template("sbatch.sh.j2")
    context = {**common_context(pattern), "recreate": recreate, "array_run_dir_prefix": prefix}
    return tmpl.render(**context, **sbatch_context(pattern, command, extra, job=layout.ARRAY_JOB))


def render_launch(spec: RunSpec) -> str:
    engine = get_engine(spec.recipe.engine)
    tmpl = environment().get_template(engine.launch_template)
    return tmpl.render(**common_context(spec), **launch_context(spec))


def frozen_spec_text(spec: RunSpec) -> str:
    header = f"# Frozen spec of run {spec.run_name} (hpc-grpo {__version__}). Re-create: {recreate_command(spec)}\n"
    return header + dump_yaml(spec.model_dump(mode="json"))


def render_eval_sbatch(spec: RunSpec, command: str | None = None, extra: list[tuple[str, Any]] | None = None) -> str:
    """The eval job's batch script (`spec`: the run's): the same template with the eval job's resources. Its
    dependency on the training job (`extra`) is known only at submit, which then saves the text Slurm received."""
    command = command or submitit_command(layout.submitit_dir(spec.path), spec.python)
    tmpl = environment().get_template("sbatch.sh.j2")
    # The header's run and re-create command are the run's; the #SBATCH lines are the eval job's.
    return tmpl.render(**common_context(spec), **sbatch_context(evaluate.eval_spec(spec), command, extra))


def render_all(spec: RunSpec) -> dict[str, str]:
    """Every file a run is made from, by path relative to the run directory."""
    files = {
        layout.SPEC_FILE: frozen_spec_text(spec),
        layout.SBATCH_SCRIPT: render_sbatch(spec),
        layout.LAUNCH_SCRIPT: render_launch(spec),
    }
    if evaluate.queued_after_training(spec):
        files[layout.EVAL_SBATCH_SCRIPT] = render_eval_sbatch(spec)
    return files


def write_files(root: Path, files: dict[str, str]) -> list[Path]:
    """Write rendered files under root; scripts are made executable."""
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written
