"""verl's config dataclasses, known without importing verl: the runtime half of plan's verl schema check.

Hydra (engines/verl_schema) accepts any `+key=value` and any value of any type: verl's YAMLs carry no types.
verl's runtime is stricter. Its workers turn config nodes into dataclasses with
`verl.utils.config.omega_conf_to_dataclass`, which for a node with a `_target_` calls Hydra's `instantiate`:
the class's `__init__` gets every key of the node (nested `_target_` nodes are built first, recursively), so a
key the class has no field for fails with "__init__() got an unexpected keyword argument", minutes into the
job. Values are not converted there: a string where a float is annotated reaches the training step as a
string and fails at the first update.

Which nodes are converted (the pinned verl, workers/engine_workers.py `init_model` and the rollout's start):
`actor_rollout_ref.model`, `.actor`, `.rollout` (with every `_target_` node below them) always, and `.ref` when a
reference policy is used (`actor.use_kl_loss` or `algorithm.use_kl_in_reward`, verl's need_reference_policy),
after verl renames its `log_prob_*` keys to the actor's names (REF_RENAMES), and `critic` when verl uses a critic
(ray_trainer's `need_critic`: `critic.enable`, else an adv_estimator of gae). The algorithm and reward nodes carry
`_target_`s but the pinned verl's main_ppo reads them as plain dicts (no omega_conf_to_dataclass on them), so an
unknown key there does not fail the job and plan does not refuse it; their values' rules are engines/verl_values'.
A node without `_target_` is never checked: verl reads it as a plain dict.

How the classes are found: each `_target_` is a dotted class path; its module's source in the installed verl
is parsed with `ast` (following `from .x import *` re-exports and base classes), never imported, so plan stays
free of torch. A class's init fields are its annotated class attributes and those of its bases (ClassVar and
`field(init=False)` excluded; an unannotated attribute such as `_mutable_fields` is not a field). The result
is cached as JSON beside verl_schema's key tree, keyed by verl version, config name and the YAMLs' hash; the
cache records a hash of every source file it read and is rebuilt when one changes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.common.findings import Finding, error, warning
from hpc_grpo.engines.verl_schema import cache_file

ARR = "actor_rollout_ref"
CONVERTED = (f"{ARR}.model", f"{ARR}.actor", f"{ARR}.rollout")
REF = f"{ARR}.ref"
# engine_workers.init_model renames these ref keys to the actor's before converting the ref node.
REF_RENAMES = {
    "log_prob_micro_batch_size": "ppo_micro_batch_size",
    "log_prob_micro_batch_size_per_gpu": "ppo_micro_batch_size_per_gpu",
    "log_prob_use_dynamic_bsz": "use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu": "ppo_max_token_len_per_gpu",
}
# verl's need_reference_policy: either key true means the ref node is converted.
REF_SWITCHES = (f"{ARR}.actor.use_kl_loss", "algorithm.use_kl_in_reward")
CRITIC = "critic"
# verl's need_critic: critic.enable when set, else whether the advantage estimator is gae.
CRITIC_SWITCHES = ("critic.enable", "algorithm.adv_estimator")
# A run whose actor never updates: verl's update loop runs ppo_epochs times over each batch (engine_workers'
# train_batch builds its iterator with `epochs`), so 0 or less trains nothing and raises nothing.
NEVER_UPDATES = {f"{ARR}.actor.ppo_epochs": "the actor makes ppo_epochs passes over each batch"}


# ------------------------------------------------------------------------------------ classes from source
def verl_root(config_dir: Path) -> Path:
    """The installed verl package folder (config_dir is verl/trainer/config)."""
    return config_dir.parent.parent


def _module_file(module: str, root: Path) -> Path | None:
    parts = module.split(".")
    if parts[0] != "verl":
        return None
    base = root.joinpath(*parts[1:])
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _resolve_relative(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


class _Sources:
    """Parsed verl modules, each read once; `files` records what was read for the cache's hash."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.trees: dict[str, tuple[ast.Module, bool] | None] = {}
        self.files: dict[str, str] = {}

    def module(self, name: str) -> tuple[ast.Module, bool] | None:
        if name not in self.trees:
            f = _module_file(name, self.root)
            if f is None:
                self.trees[name] = None
            else:
                data = f.read_bytes()
                self.files[str(f.relative_to(self.root))] = hashlib.sha256(data).hexdigest()
                self.trees[name] = (ast.parse(data), f.name == "__init__.py")
        return self.trees[name]

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """(module, class node) of `name` as seen from `module`, following imports and star re-exports."""
        parsed = self.module(module)
        if parsed is None or depth > 8:
            return None
        tree, is_package = parsed
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                source = _resolve_relative(module, is_package, node)
                for alias in node.names:
                    if alias.name == "*" or (alias.asname or alias.name) == name:
                        found = self.find_class(source, name if alias.name == "*" else alias.name, depth + 1)
                        if found:
                            return found
        return None

    def fields(self, module: str, cls: ast.ClassDef) -> dict[str, str]:
        """Init fields -> annotation source, bases first (a dataclass's field order)."""
        out: dict[str, str] = {}
        for base in cls.bases:
            base_name = ast.unparse(base).rsplit(".", 1)[-1]
            found = self.find_class(module, base_name)
            if found:
                out.update(self.fields(*found))
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            annotation = ast.unparse(node.annotation)
            if "ClassVar" in annotation or _init_false(node.value):
                out.pop(node.target.id, None)
                continue
            out[node.target.id] = annotation
        return out


def _init_false(value: ast.expr | None) -> bool:
    return (isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field")
            and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in value.keywords))


# ------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Table:
    """What plan needs of verl's dataclasses for one config: node path -> class, class -> fields."""

    targets: dict[str, str]  # node path -> _target_
    classes: dict[str, dict[str, str] | None]  # _target_ -> {field: annotation}; None: source not found
    defaults: dict[str, object]  # the REF_SWITCHES' and CRITIC_SWITCHES' defaults

    def node_of(self, key: str) -> str | None:
        """The deepest `_target_` node at or above `key`'s parent."""
        parts = key.split(".")
        for n in range(len(parts) - 1, 0, -1):
            path = ".".join(parts[:n])
            if path in self.targets:
                return path
        return None


def _compose(config_name: str, config_dir: Path, groups: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                tree = OmegaConf.to_container(compose(config_name=config_name, overrides=groups), resolve=False)
                assert isinstance(tree, dict), type(tree)  # a composed config is a mapping
                return tree
    finally:
        GlobalHydra.instance().clear()


def _walk_targets(node: object, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        if prefix and isinstance(node.get("_target_"), str):
            yield prefix, node["_target_"]
        for k, v in node.items():
            yield from _walk_targets(v, f"{prefix}.{k}" if prefix else str(k))


def _lookup(cfg: dict, dotted: str) -> object:
    node: object = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def build_table(config_name: str, config_dir: Path, groups: list[str]) -> tuple[Table, dict[str, str]]:
    """Compose, read each `_target_`'s class from source: (table, {source file: sha256})."""
    cfg = _compose(config_name, config_dir, groups)
    targets = dict(_walk_targets(cfg))
    sources = _Sources(verl_root(config_dir))
    classes: dict[str, dict[str, str] | None] = {}
    for target in sorted(set(targets.values())):
        module, _, name = target.rpartition(".")
        found = sources.find_class(module, name)
        classes[target] = sources.fields(*found) if found else None
    return Table(targets, classes, {k: _lookup(cfg, k) for k in REF_SWITCHES + CRITIC_SWITCHES}), sources.files


def table(config_name: str, config_dir: Path, groups: list[str]) -> Table:
    """The table for this config and config-group choices, from the cache when its source files are unchanged."""
    digest = hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:8]
    cache = cache_file("verl-dataclasses-2", f"{config_name}-{digest}", config_dir)
    root = verl_root(config_dir)
    try:
        data = json.loads(cache.read_text())
        if all(hashlib.sha256((root / f).read_bytes()).hexdigest() == h for f, h in data["files"].items()):
            return Table(data["targets"], data["classes"], data["defaults"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    built, files = build_table(config_name, config_dir, groups)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps({"targets": built.targets, "classes": built.classes,
                                             "defaults": built.defaults, "files": files}))
    except OSError:
        pass  # a read-only home: build every time
    return built


# ------------------------------------------------------------------------------------------------ values
_INT = re.compile(r"^[+-]?\d+$")


def parse_value(text: str) -> object:
    """A Hydra override value as Python (the subset plan judges): null, booleans, numbers, quoted strings,
    flat lists; anything else stays a string. Hydra reads `abc` as the string 'abc' and `1e-3` as a float."""
    v = text.strip()
    low = v.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(v):
        return int(v)
    try:
        return float(v)
    except ValueError:
        pass
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        if "[" in inner or "{" in inner:
            return v  # nested: not judged
        return [parse_value(x) for x in inner.split(",")] if inner else []
    return v


def _split_union(annotation: str) -> list[str]:
    """'Optional[int]' / 'int | None' / 'Union[a, b]' -> its members; anything else -> [itself]."""
    a = annotation.strip()
    for prefix in ("Optional[", "typing.Optional["):
        if a.startswith(prefix) and a.endswith("]"):
            return [*_split_union(a[len(prefix):-1]), "None"]
    for prefix in ("Union[", "typing.Union["):
        if a.startswith(prefix) and a.endswith("]"):
            return [m for part in _top_level(a[len(prefix):-1], ",") for m in _split_union(part)]
    parts = _top_level(a, "|")
    return [p.strip() for p in parts] if len(parts) > 1 else [a]


def _top_level(text: str, sep: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _fits(value: object, member: str) -> bool | None:
    """Does `value` fit one annotation member? None: a type plan does not judge (a class, Any, a Literal...)."""
    base = member.split("[", 1)[0].removeprefix("typing.")
    if member in ("None", "NoneType"):
        return value is None
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "str":
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)  # OmegaConf makes it a str
    if base in ("list", "List", "tuple", "Tuple", "Sequence"):
        return isinstance(value, list)
    if base in ("dict", "Dict", "Mapping"):
        return isinstance(value, dict) or None  # a `{...}` value is kept as text: not judged
    return None


def type_problem(value: object, annotation: str) -> str | None:
    """Why `value` cannot be a field annotated `annotation` (None: it can, or plan does not judge the type)."""
    verdicts = [_fits(value, m) for m in _split_union(annotation)]
    if any(v is not False for v in verdicts):
        return None
    return f"{value!r} is not {annotation}"


# ------------------------------------------------------------------------------------------------ checks
def _ref_in_use(overrides: dict[str, str], tbl: Table) -> bool:
    return any(bool(parse_value(overrides[k])) if k in overrides else bool(tbl.defaults.get(k))
               for k in REF_SWITCHES)


def _critic_in_use(overrides: dict[str, str], tbl: Table) -> bool:
    def value(key: str) -> object:
        return parse_value(overrides[key]) if key in overrides else tbl.defaults.get(key)

    enable = value("critic.enable")
    if enable is not None:
        return bool(enable)
    return value("algorithm.adv_estimator") == "gae"


def check_overrides(overrides: list[str], tbl: Table) -> list[Finding]:
    """Every `key=value` the run sets under a converted node, against the field verl's dataclass has for it."""
    values: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and not key.startswith("~"):
            values[key.lstrip("+")] = value
    roots = CONVERTED + ((REF,) if _ref_in_use(values, tbl) else ()) + ((CRITIC,) if _critic_in_use(values, tbl)
                                                                          else ())
    out: list[Finding] = []
    for key, text in values.items():
        if not any(key == r or key.startswith(r + ".") for r in roots) or "${" in text:
            continue
        node = tbl.node_of(key)
        if node is None:
            continue
        target = tbl.targets[node]
        fields = tbl.classes.get(target)
        name = key[len(node) + 1:].split(".", 1)[0]
        if fields is None or name.startswith("_"):
            continue
        cls = target.rsplit(".", 1)[-1]
        field_name = REF_RENAMES.get(name, name) if node == REF else name
        if field_name not in fields:
            close = _closest(field_name, fields)
            out.append(error(f"engine.{key}", f"verl builds {node} as its dataclass {cls}, which has no field "
                             f"'{field_name}': the job would fail at start-up with \"{cls}.__init__() got an "
                             f"unexpected keyword argument '{field_name}'\"",
                             (f"did you mean {node}.{close}? " if close else "")
                             + f"drop the override, or set a field {cls} has (the class {target} in verl's source)"))
            continue
        if "." in key[len(node) + 1:]:
            continue  # below a plain-dict field (override_config, ...): verl passes it on as a dict
        parsed = parse_value(text)
        problem = type_problem(parsed, fields[field_name])
        if problem:
            out.append(error(f"engine.{key}", f"{cls}.{field_name} is annotated {fields[field_name]}; {problem}: "
                             "verl does not convert it and fails when it first uses the value",
                             f"give {key} a {fields[field_name]} value, unquoted for a number or a boolean "
                             f"(e.g. {key}={_example(fields[field_name])}; a quoted value stays a string)"))
            continue
        if key in NEVER_UPDATES and isinstance(parsed, int) and not isinstance(parsed, bool) and parsed <= 0:
            out.append(warning(f"engine.{key}", f"{key}={parsed}: {NEVER_UPDATES[key]}, so the run never updates "
                               "the model (verl raises nothing: it rolls out and scores, and trains nothing)",
                               f"set {key}=1 (verl's default) or more"))
    return out


def _example(annotation: str) -> str:
    members = [m.split("[", 1)[0] for m in _split_union(annotation)]
    return next((ex for kind, ex in (("bool", "true"), ("int", "1"), ("float", "0.2")) if kind in members), "null")


def _closest(name: str, fields: dict[str, str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.8)
    return found[0] if found else None


def group_choices(overrides: list[str], config_dir: Path) -> list[str]:
    """The overrides that choose config groups (they change which `_target_` a node has)."""
    groups = {p.name for p in config_dir.iterdir() if p.is_dir()}
    out = []
    for item in overrides:
        key = item.partition("=")[0].lstrip("+~")
        if "/" in key or key in groups:
            out.append(item)
    return out


def dataclass_check(config_name: str, overrides: list[str], config_dir: Path) -> list[Finding]:
    """plan's entry: the overrides against verl's dataclasses for this config (see the module doc)."""
    return check_overrides(overrides, table(config_name, config_dir, group_choices(overrides, config_dir)))
