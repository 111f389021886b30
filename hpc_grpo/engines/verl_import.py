"""A verl launch script -> a recipe that runs the same verl config (`hpc-grpo import`).

Each override is routed as the command line routes it (engines.verl_keymap): a plain copy of a recipe key becomes
that key, a key hpc-grpo sets itself is dropped with the setting that decides it, the rest is passthrough. Then the
two configs main_ppo would run, the script's and the recipe's, are composed with verl's real Hydra config and
compared leaf by leaf: what the base recipe changes behind the script's back (its defaults for val_before_train,
offloads, dynamic batch, the reward...) is set back to the script's value, and what hpc-grpo owns (paths in the run
directory, its loggers) is listed as changed, with the reason. A silent change is the bug this exists to prevent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.common.yamlio import SpecError, dump_yaml, load_yaml_file, parse_scalar
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.secrets import SECRET_ENV, secret_in
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines.verl import (
    CONFIG_NAMES,
    OWN_SECTIONS,
    RESUME_KEYS,
    VerlEngine,
    modelled_overrides,
    owned_refusal,
)
from hpc_grpo.engines.verl_keymap import inverse_map
from hpc_grpo.config.verl_keys import VERL_VERSION, bare_key, format_value, real_fix, real_key_for
from hpc_grpo.engines.verl_schema import composed_leaves, verl_config_dir
from hpc_grpo.engines.verl_script import MAIN_MODULE, Script, parse_script

# The shipped recipe each backend starts from when --recipe is not given.
DEFAULT_BASE = {"fsdp": "qwen2.5-3b-gsm8k-lora", "megatron": "qwen2.5-72b-megatron"}
SLURM_ENV = {"CUDA_VISIBLE_DEVICES": "Slurm gives the job its GPUs; each node's processes see them"}
MAX_ROUNDS = 12
_MISSING = object()
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\Z")
UNUSABLE = "dropped (verl would refuse it)"


@dataclass
class Row:
    """One override or export of the script: where it went and why."""

    item: str
    went: str
    why: str = ""


@dataclass
class Imported:
    name: str
    base: str
    backend: str
    config_name: str
    recipe: dict[str, Any]  # dotted recipe key -> value, only where it differs from the base
    passthrough: dict[str, Any]
    env: dict[str, str]  # exports for cluster.env
    rows: list[Row]
    changed: list[Row]  # composed leaves the recipe runs differently from the script, with the reason
    compared: str  # how the comparison was made, or why it was not
    script: Script
    spec: RunSpec | None = None

    def yaml_text(self, source: str) -> str:
        """The recipe file: `extends` the base and holds only what differs, with what changed in comments."""
        data: dict[str, Any] = {"name": self.name, "extends": self.base}
        for key, value in self.recipe.items():
            node = data
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        if self.passthrough:
            data["passthrough"] = dict(self.passthrough)
        head = [(f"# Imported by `hpc-grpo import` from {source} (verl --config-name {self.config_name}), based on "
                 f"recipe {self.base}."), f"# Composed and compared with verl's config: {self.compared}."]
        if self.changed:
            head.append("# Runs differently from the script (hpc-grpo decides these):")
            head += [f"#   {r.item}: {r.why}" for r in self.changed]
        if self.env:
            head.append("# The script's exports: add them to your cluster profile's env (or on the command line):")
            head += [f"#   cluster.env.{k}={v}" for k, v in self.env.items()]
        if self.script.unresolved:
            head.append(f"# Not resolved in the script (left as written): {', '.join(self.script.unresolved)}")
        if self.script.placeholders:
            head.append("# Values to fill before it runs (the script left them to its user):")
            head += [f"#   {key}={value}" for key, value in self.script.placeholders]
        return "\n".join(head) + "\n" + dump_yaml(data)


def _placement(spec: RunSpec) -> dict[str, str]:
    """verl key -> the resources key hpc-grpo renders it from (trainer.nnodes -> resources.nodes ...)."""
    return {bare_key(o.key): o.source for o in modelled_overrides(spec) if o.source.startswith(OWN_SECTIONS)}


def _recipe_value(spec: RunSpec, key: str) -> Any:
    node: Any = spec.recipe
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _candidate(base: str, cluster: str, recipe: dict[str, Any], passthrough: dict[str, Any]) -> RunSpec:
    items = [f"{k}={format_value(v)}" for k, v in recipe.items()]
    items += [f"passthrough.{k}={format_value(v)}" for k, v in passthrough.items()]
    return resolve_spec(base, cluster, items, run_name="imported", now=0.0)


def typed_value(raw: str) -> Any:
    """A script's value typed as Hydra types it: YAML's rules, and `3e-6` is a float (YAML 1.1 reads a string)."""
    value = parse_scalar(raw)
    if isinstance(value, str) and _FLOAT.match(value):
        return float(value)
    return value


def _route(script: Script, spec: RunSpec, rows: list[Row]) -> tuple[dict[str, Any], dict[str, Any]]:
    """First pass: each override to a recipe key, a resources key, passthrough, or dropped (with the reason)."""
    exact, place = inverse_map(spec), _placement(spec)
    owned = {bare_key(o.key): o for o in modelled_overrides(spec)}
    recipe: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    for item in script.overrides:
        key, raw = item.split("=", 1)
        value = typed_value(raw)
        bare = bare_key(key)
        target = exact.get(bare) or place.get(bare)
        if secret_in(key, value):
            rows.append(Row(key, UNUSABLE, "a secret: export it in the shell you submit from (not written)"))
        elif real_key_for(key) is not None:
            rows.append(Row(item, UNUSABLE, f"not a verl {VERL_VERSION} key: {real_fix(real_key_for(key) or '')}"))
        elif target is not None:
            recipe[target] = value
            rows.append(Row(item, f"{target}={format_value(value)}"))
        elif bare in RESUME_KEYS:
            rows.append(Row(item, "dropped", owned_refusal(value, None)[0]))
        elif bare in owned:
            src = owned[bare].source
            same = format_value(owned[bare].value) == format_value(value)
            why = ("hpc-grpo sets the same" if same else owned_refusal(value, owned[bare])[0] if src.startswith(
                ("engine", "run ")) else f"hpc-grpo renders it from recipe key {src}: see what still differs")
            rows.append(Row(item, "dropped", why))
        else:
            passthrough[key] = value
            rows.append(Row(item, "passthrough"))
    return recipe, passthrough


def _exports(script: Script, spec: RunSpec, rows: list[Row]) -> dict[str, str]:
    command = VerlEngine().command(spec)
    ours = {**command.env, **command.node_env}
    env: dict[str, str] = {}
    for name, value in script.exports.items():
        if name in SECRET_ENV:
            rows.append(Row(f"export {name}", "dropped", "a secret: export it in the shell you submit from "
                                                          "(not written)"))
        elif name in ours:
            rows.append(Row(f"export {name}={value}", "dropped", "hpc-grpo sets it for the job"))
        elif name in SLURM_ENV:
            rows.append(Row(f"export {name}={value}", "dropped", SLURM_ENV[name]))
        else:
            env[name] = value
            rows.append(Row(f"export {name}={value}", f"cluster.env.{name}"))
    return env


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(p for p in a.keys() | b.keys() if a.get(p, _MISSING) != b.get(p, _MISSING))


def _fitting(base: str, cluster: str, recipe: dict[str, Any], passthrough: dict[str, Any], rows: list[Row]) -> RunSpec:
    """The candidate spec; a script value its recipe key refuses (a list of files for data.train_files) is taken out
    and its row says why, so the user sets that key by hand."""
    while True:
        try:
            return _candidate(base, cluster, recipe, passthrough)
        except SpecError as exc:
            if exc.key not in recipe:
                raise
            value = recipe.pop(exc.key)
            for row in rows:
                if row.went == f"{exc.key}={format_value(value)}":
                    row.went, row.why = "dropped", f"recipe key {exc.key} refuses it ({exc}): set {exc.key} by hand"


def _composable(config: str, folder: Any, base: str, cluster: str, recipe: dict[str, Any],
                passthrough: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """passthrough plus the extra keys verl's config takes (a leaf inside an interpolated node, like the reference's
    override_transformer_config, cannot be set on its own: it stays listed as changed)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def composes(p: dict[str, Any]) -> bool:
        try:
            composed_leaves(config, VerlEngine().command(_candidate(base, cluster, recipe, p)).overrides, folder)
        except (HydraException, OmegaConfBaseException):
            return False
        return True

    if composes({**passthrough, **extra}):
        return {**passthrough, **extra}
    for key, value in extra.items():
        if composes({**passthrough, key: value}):
            passthrough = {**passthrough, key: value}
    return passthrough


def _settle(theirs: dict[str, Any], config: str, folder: Any, base: str, cluster: str, recipe: dict[str, Any],
            passthrough: dict[str, Any], spec: RunSpec) -> tuple[dict[str, Any], dict[str, Any], RunSpec]:
    """Set back every composed leaf the recipe changes behind the script's back, where a recipe key or passthrough
    can: recipe keys first (they move interpolated leaves too), then passthrough for what no recipe key models.
    A derived key's source field is tried at the script's value and kept only when fewer leaves differ."""
    def differ(s: RunSpec) -> list[str]:
        return _diff(theirs, composed_leaves(config, VerlEngine().command(s).overrides, folder))

    tried: set[str] = set()
    diff = differ(spec)
    for _ in range(MAX_ROUNDS):
        exact, place = inverse_map(spec), _placement(spec)
        owned = {bare_key(o.key): o for o in modelled_overrides(spec)}
        moved = False
        for path in (p for p in diff if p in theirs):
            field_ = exact.get(path) or place.get(path)
            derived = field_ is None and path in owned and not owned[path].source.startswith(("engine", "run "))
            if derived and owned[path].source not in tried:
                field_ = owned[path].source
                tried.add(field_)
            if field_ is None or format_value(recipe.get(field_, _MISSING)) == format_value(theirs[path]):
                continue
            value = theirs[path]
            now = _recipe_value(spec, field_)
            if derived and isinstance(now, bool) and not isinstance(value, bool):
                value = not now  # a flag that renders several keys (recompute): try it the other way
            trial = {**recipe, field_: value}
            try:
                trial_spec = _candidate(base, cluster, trial, passthrough)
            except SpecError:
                continue
            if derived:
                trial_diff = differ(trial_spec)
                if len(trial_diff) >= len(diff):
                    continue
            recipe, spec, moved = trial, trial_spec, True
        if not moved:
            extra = {p: theirs[p] for p in diff if p in theirs and p not in owned and p not in exact and p not in place
                     and p not in RESUME_KEYS}  # where the job resumes from is the job's (hpc-grpo resume)
            if not extra:
                break
            passthrough = _composable(config, folder, base, cluster, recipe, passthrough, extra)
            spec = _candidate(base, cluster, recipe, passthrough)
            if not set(extra) & set(passthrough):
                break
        diff = differ(spec)
    return recipe, passthrough, spec


def _hydra_safe(script: Script, leave_out: set[str]) -> list[str]:
    """The script's overrides as verl's Hydra would get them, a value left to fill (`<path>`) quoted so that it
    parses (it is compared as the text it is)."""
    fill = {key for key, _ in script.placeholders}
    out = []
    for item in script.overrides:
        key, raw = item.split("=", 1)
        if key in leave_out:
            continue
        out.append(f"{key}={format_value(typed_value(raw))}" if key.lstrip("+~") in fill else item)
    return out


def _refuse_unknown(script: Script, config: str, folder: Any, rows: list[Row]) -> None:
    """Take out each override verl's main_ppo config would refuse (a key it does not have, a value Hydra cannot
    parse), with its row: a key of another trainer (DAPO's main_dapo) is named as that trainer's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def refusal(items: list[str]) -> str | None:
        try:
            composed_leaves(config, items, folder)
        except (HydraException, OmegaConfBaseException) as exc:
            return str(exc).splitlines()[0][:160]
        return None

    if refusal(_hydra_safe(script, set())) is None:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    defaults = composed_leaves(config, [], folder)
    nodes = {".".join(p.split(".")[:k]) for p in defaults for k in range(1, p.count(".") + 2)}
    parser = OverridesParser.create()

    def cheap(item: str) -> str | None:
        """Why verl's config refuses an override, decided without composing where it can be."""
        try:
            parser.parse_overrides([item])
        except (HydraException, OmegaConfBaseException) as exc:
            return f"Hydra cannot parse it: {str(exc).splitlines()[0][:120]}"
        key = item.split("=", 1)[0]
        if not key.startswith(("+", "~")) and key not in nodes:
            return f"no key {key} in verl's {config} config (add it with +{key}=... if it is new)"
        return None

    cheap_why = {item: cheap(next(iter(_hydra_safe(Script(overrides=[item], placeholders=script.placeholders),
                                                   set())))) for item in script.overrides}
    rest = Script(overrides=[i for i in script.overrides if cheap_why[i] is None], placeholders=script.placeholders)
    composes = refusal(_hydra_safe(rest, set())) is None
    keep: list[str] = []
    lines: list[int] = []
    other = script.entry != MAIN_MODULE

    def at(line: int) -> str:
        return f"line {line}" if line else "the script's own config"
    for item, line in zip(script.overrides, script.override_lines or [0] * len(script.overrides)):
        why = cheap_why[item] if composes else (cheap_why[item] or refusal(
            _hydra_safe(Script(overrides=[item], placeholders=script.placeholders), set())))
        if why is None:
            keep.append(item)
            lines.append(line)
        elif other:
            rows.append(Row(item, UNUSABLE, f"{at(line)}: {script.entry.rsplit('.', 1)[-1]}'s own key, not "
                                            f"main_ppo's (hpc-grpo runs {MAIN_MODULE}): {why}"))
        else:
            rows.append(Row(item, UNUSABLE, f"{at(line)}: verl's config refuses it: {why}"))
    script.overrides, script.override_lines = keep, lines


def _config_folder(written: str, source: Path | None) -> Path | None:
    """The folder a script's --config-path names: as written when it exists, else its tail after any part the
    script did not resolve ($PROJECT_DIR/...), found below one of the script's own parent folders."""
    path = Path(written).expanduser()
    if path.is_absolute() and path.is_dir():
        return path
    parts = [p for p in path.parts if p not in ("/", ".")]
    while parts and ("$" in parts[0] or parts[0] == ".."):
        parts = parts[1:]
    if not parts or source is None:
        return None
    tail = Path(*parts)
    return next((a / tail for a in source.resolve().parents if (a / tail).is_dir()), None)


def _own_config(script: Script, config: str, source: Path | None, folder: Path | None) -> str:
    """A script's own Hydra config (`--config-path P --config-name X`, X extending verl's ppo_trainer or
    ppo_megatron_trainer): its values become overrides before the script's, and verl's config it extends is
    returned. SpecError, with the reason, for one that cannot be read this way."""
    where = _config_folder(script.config_path or "", source) if script.config_path else None
    file = where / f"{config}.yaml" if where else None
    if file is None or not file.is_file():
        raise SpecError(f"--config-name {config} is not verl's ppo_trainer or ppo_megatron_trainer, and its file was "
                        f"not found from --config-path {script.config_path or '(none)'} next to the script: import "
                        "a script that runs one of verl's configs, or keep the script beside its config folder",
                        key="--config-name")
    data, _ = load_yaml_file(file)
    parents = [d for d in data.pop("defaults", []) if d != "_self_"]
    data.pop("hydra", None)
    if len(parents) != 1 or parents[0] not in CONFIG_NAMES.values():
        raise SpecError(f"{file}: its defaults {parents} are not exactly one of verl's ppo_trainer or "
                        "ppo_megatron_trainer (and _self_): hpc-grpo composes only those", key="--config-name")
    base = str(parents[0])
    known: set[str] = set()
    if folder is not None:
        leaves = composed_leaves(base, [], folder)
        known = {".".join(p.split(".")[:k]) for p in leaves for k in range(1, p.count(".") + 2)}
    items: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            items.append(f"{'' if prefix in known or folder is None else '+'}{prefix}={format_value(node)}")

    walk(data, "")
    given = {o.split("=", 1)[0].lstrip("+") for o in script.overrides}
    items = [i for i in items if i.split("=", 1)[0].lstrip("+") not in given]  # the script's own value wins
    script.overrides = items + script.overrides
    script.override_lines = [0] * len(items) + script.override_lines
    script.notes.append(f"--config-name {config}: the script's own config {file} extends verl's {base}; its "
                        f"{len(items)} values are imported as overrides (the script's own override wins)")
    return base


GLOBAL_MICRO = {"actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size":
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size":
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"}


def _per_gpu_micro(script: Script, rows: list[Row]) -> None:
    """verl's deprecated global micro batches (`ppo_micro_batch_size=M`) as the per-GPU form hpc-grpo renders:
    verl divides M by the GPUs per sequence-parallel group (world size / ulysses SP) at start-up, so the per-GPU
    value is that quotient; one that does not divide is left for plan to refuse with its reason."""
    values = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in script.overrides}

    def integer(key: str, default: int) -> int | None:
        value = typed_value(values[key]) if key in values else default
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    nodes, gpus = integer("trainer.nnodes", 1), integer("trainer.n_gpus_per_node", 8)
    sp = integer("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)
    if not (nodes and gpus and sp) or (nodes * gpus) % sp:
        return
    groups = nodes * gpus // sp
    for i, item in enumerate(script.overrides):
        key, raw = item.split("=", 1)
        per_gpu = GLOBAL_MICRO.get(key.lstrip("+"))
        value = typed_value(raw)
        if per_gpu is None or per_gpu in values or not isinstance(value, int) or value % groups:
            continue
        script.overrides[i] = f"{per_gpu}={value // groups}"
        rows.append(Row(item, f"{per_gpu}={value // groups}", f"verl's deprecated global form: verl divides it by "
                                                                f"{groups} GPUs (world / ulysses SP) at start-up"))


def import_script(text: str, name: str, base: str | None = None, cluster: str = "local",
                  source: Path | None = None) -> Imported:
    """The recipe a verl launch script becomes (see the module doc); SpecError for what cannot be imported.
    source: the script's file, to find a config folder its --config-path names."""
    script = parse_script(text)
    if script.errors:
        raise SpecError("the script cannot be imported as written (the import never guesses what an override is):\n"
                        + "\n".join(f"  {e}" for e in script.errors), key="SCRIPT")
    config = script.config_name or "ppo_trainer"
    backends = {v: k for k, v in CONFIG_NAMES.items()}
    if config not in backends:
        config = _own_config(script, config, source, verl_config_dir())
    if config not in backends:
        raise SpecError(f"--config-name {config} is not one hpc-grpo runs (it runs {', '.join(backends)}): "
                        "import a script that starts GRPO with one of them", key="--config-name")
    backend = backends[config]
    base = base or DEFAULT_BASE[backend]
    spec = resolve_spec(base, cluster, [], run_name="imported", now=0.0)
    if spec.recipe.engine != "verl" or spec.recipe.backend != backend:
        raise SpecError(f"recipe {base} is {spec.recipe.engine}/{spec.recipe.backend}, the script is verl/{backend}: "
                        f"choose a verl {backend} recipe with --recipe", key="--recipe")
    rows: list[Row] = []
    folder = verl_config_dir()
    if script.entry != MAIN_MODULE:
        script.notes.append(f"the script runs {script.entry}; the recipe runs {MAIN_MODULE}: the keys they share "
                            f"are imported, each of {script.entry.rsplit('.', 1)[-1]}'s own is listed as dropped")
    _per_gpu_micro(script, rows)
    if folder is not None:
        _refuse_unknown(script, config, folder, rows)
    elif script.entry != MAIN_MODULE:
        raise SpecError(f"the script runs {script.entry}: telling its own keys from main_ppo's needs verl's config, "
                        "not installed here (install the dev extras)", key="SCRIPT")
    recipe, passthrough = _route(script, spec, rows)
    env = _exports(script, spec, rows)
    spec = _fitting(base, cluster, recipe, passthrough, rows)
    changed: list[Row] = []
    if folder is None:
        compared = "not done (verl's config or hydra is not installed here): the base recipe's defaults may differ"
    else:
        unusable = {r.item.split("=", 1)[0] for r in rows if r.went == UNUSABLE}
        theirs = composed_leaves(config, _hydra_safe(script, unusable), folder)
        recipe, passthrough, spec = _settle(theirs, config, folder, base, cluster, recipe, passthrough, spec)
        ours = composed_leaves(config, VerlEngine().command(spec).overrides, folder)
        owned = {bare_key(o.key): o for o in modelled_overrides(spec)}
        for path in _diff(theirs, ours):
            script_value = format_value(theirs.get(path)) if path in theirs else "(not in verl's config)"
            why = (owned_refusal(theirs.get(path), owned[path])[0] if path in owned
                   else "hpc-grpo's recipe renders it differently")
            changed.append(Row(path, f"{script_value} -> {format_value(ours.get(path))}", why))
        compared = f"verl {config}, {len(theirs)} leaves, {len(changed)} differ"
    owned_now = {bare_key(o.key): o for o in modelled_overrides(spec)}
    for key, value in list(passthrough.items()):
        mine = owned_now.get(bare_key(key))
        if mine is None:
            continue
        del passthrough[key]  # plan refuses a key hpc-grpo renders, set to another value: the recipe decides it
        if format_value(mine.value) != format_value(value):
            changed.append(Row(bare_key(key), f"{format_value(value)} -> {format_value(mine.value)}",
                               owned_refusal(value, mine)[0]))
    if folder is not None and changed:
        compared = f"verl {config}, {len(theirs)} leaves, {len(changed)} differ"
    if passthrough != dict(spec.recipe.passthrough or {}):
        spec = _candidate(base, cluster, recipe, passthrough)
    base_spec = resolve_spec(base, cluster, [], run_name="imported", now=0.0)
    recipe = {k: v for k, v in recipe.items()
              if format_value(_recipe_value(base_spec, k)) != format_value(_recipe_value(spec, k))}
    return Imported(name=name, base=base, backend=backend, config_name=config, recipe=recipe, passthrough=passthrough,
                    env=env, rows=rows, changed=changed, compared=compared, script=script, spec=spec)
